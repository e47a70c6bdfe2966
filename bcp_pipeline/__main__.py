"""`python -m bcp_pipeline`: the same command as the `bcp-pipeline` console script."""

import sys

from bcp_pipeline.cli.main import main

sys.exit(main())
