#!/usr/bin/env bash
# Job bootstrap for BCP: make sure the stage programs' pinned packages are importable, then run the program.
#
#   bash /mount_workspace/.bcp-pipeline/code/HASH/bootstrap.sh python3 /mount_workspace/.../download.py ARGS...
#
# bcprun starts many processes per node; a per-node lock lets the first one install what is missing while the
# others wait, then every process checks again and runs. A failed install stops the job with a clear message.
#
# Where the interpreter's site-packages is read-only (an Apptainer image: a SIF's root file system always is), the
# packages go to a writable folder instead, put first on PYTHONPATH (which Apptainer passes into the container):
# $BCP_PIPELINE_PACKAGES, else $HOME/.cache/bcp-pipeline/stage-packages (Apptainer binds $HOME by default), one
# subfolder per Python version and requirements digest. A writable site-packages (BCP's Docker containers) is
# installed into as before.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:?usage: bootstrap.sh PYTHON PROGRAM [ARGS...]}"
modules="zstandard requests tenacity tiktoken numpy pyarrow"
version=$("$python" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')
digest=$({ cat "$here/requirements.txt" "$here/requirements-nodeps.txt" 2>/dev/null || true; } | sha256sum | cut -c1-12)
prefix="${BCP_PIPELINE_PACKAGES:-${HOME:-/tmp}/.cache/bcp-pipeline/stage-packages}/$version-$digest"
use_prefix() {  # an earlier job's (or another rank's) install into $prefix
  case ":${PYTHONPATH:-}:" in *":$prefix:"*) ;; *) export PYTHONPATH="$prefix${PYTHONPATH:+:$PYTHONPATH}";; esac
}
if [ -d "$prefix" ]; then use_prefix; fi

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
  if [ -d "$prefix" ]; then use_prefix; fi
  if ! have_packages; then
    site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    target=()
    if [ ! -w "$site" ]; then  # a read-only image: never pip into it
      target=(--target "$prefix")
      echo "bootstrap: $site is read-only (a container image); installing into $prefix" >&2
      mkdir -p "$prefix" || { echo "bootstrap: cannot create $prefix: set BCP_PIPELINE_PACKAGES to a writable" \
        "folder the job sees (a bound one)" >&2; exit 86; }
      use_prefix
    fi
    echo "bootstrap: installing the stage packages from $here/requirements.txt" >&2
    if ! "$python" -m pip install --quiet "${target[@]}" -r "$here/requirements.txt" \
        || ! "$python" -m pip install --quiet "${target[@]}" --no-deps -r "$here/requirements-nodeps.txt"; then
      echo "bootstrap: could not install $here/requirements.txt with $python -m pip${target:+ into $prefix};" \
           "use an image that has them (modules: $modules) or allow pip to reach PyPI from the job" >&2
      exit 86
    fi
  fi
  flock -u 9
fi
exec "$@"
