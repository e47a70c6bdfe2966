"""`python -m bcp_pipeline`: the same command as the `bcp-pipeline` console script."""

import sys

from .cli.main import main

sys.exit(main())
