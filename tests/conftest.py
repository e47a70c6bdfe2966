"""Shared test set-up: the stage programs are importable as top-level modules, as they are inside jobs."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = REPO / "stages"
if str(STAGES) not in sys.path:
    sys.path.insert(0, str(STAGES))

# The emulated BCP's fixtures (`fake`, once per transport), for every test module.
from bcp_emulation import fake, ngc_tls_dir  # noqa: E402,F401


def pytest_configure(config):
    config.addinivalue_line("markers", "emulator(api_key=None, variants=None): start the `fake` NGC API emulator "
                                       "as another variant of the service (tests/fakes/README.md)")
