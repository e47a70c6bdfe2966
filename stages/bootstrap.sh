#!/usr/bin/env bash
# Job bootstrap for BCP: make sure the stage programs' pinned packages are importable, then run the program.
#
#   bash /mount_workspace/.bcp-pipeline/code/HASH/bootstrap.sh python3 /mount_workspace/.../download.py ARGS...
#
# bcprun starts many processes per node; a per-node lock lets the first one install what is missing while the
# others wait, then every process checks again and runs. A failed install stops the job with a clear message.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:?usage: bootstrap.sh PYTHON PROGRAM [ARGS...]}"
modules="zstandard requests tenacity tiktoken numpy pyarrow"

have_packages() {
  "$python" - "$modules" <<'PY' >/dev/null 2>&1
import importlib.util, sys
missing = [m for m in sys.argv[1].split() if importlib.util.find_spec(m) is None]
sys.exit(1 if missing else 0)
PY
}

if ! have_packages; then
  exec 9>"/tmp/bcp-pipeline-bootstrap-$(id -u).lock"
  flock 9
  if ! have_packages; then
    echo "bootstrap: installing the stage packages from $here/requirements.txt" >&2
    if ! "$python" -m pip install --quiet -r "$here/requirements.txt" \
        || ! "$python" -m pip install --quiet --no-deps -r "$here/requirements-nodeps.txt"; then
      echo "bootstrap: could not install $here/requirements.txt with $python -m pip;" \
           "use an image that has them (modules: $modules) or allow pip to reach PyPI from the job" >&2
      exit 86
    fi
  fi
  flock -u 9
fi
exec "$@"
