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
#
# The fast BPE engine (stages/requirements-fast.txt, --no-deps) is installed the same way but best effort, once per
# node and requirements: where it cannot be, the job goes on and tokenize-preprocess uses tiktoken (its log says).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:?usage: bootstrap.sh PYTHON PROGRAM [ARGS...]}"
modules="zstandard requests tenacity tiktoken numpy pyarrow"
fast_module="gigatoken"
version=$("$python" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')
digest=$({ cat "$here/requirements.txt" "$here/requirements-nodeps.txt" "$here/requirements-fast.txt" 2>/dev/null \
  || true; } | sha256sum | cut -c1-12)
prefix="${BCP_PIPELINE_PACKAGES:-${HOME:-/tmp}/.cache/bcp-pipeline/stage-packages}/$version-$digest"
use_prefix() {  # an earlier job's (or another rank's) install into $prefix
  case ":${PYTHONPATH:-}:" in *":$prefix:"*) ;; *) export PYTHONPATH="$prefix${PYTHONPATH:+:$PYTHONPATH}";; esac
}
if [ -d "$prefix" ]; then use_prefix; fi

have_packages() {  # [MODULES]: each importable (default: the required ones)
  "$python" - "${1:-$modules}" <<'PY' >/dev/null 2>&1
import importlib.util, sys
missing = [m for m in sys.argv[1].split() if importlib.util.find_spec(m) is None]
sys.exit(1 if missing else 0)
PY
}

pip_target() {  # sets `target`: --target $prefix where the interpreter's site-packages is read-only
  local site
  site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  target=()
  if [ ! -w "$site" ]; then  # a read-only image: never pip into it
    target=(--target "$prefix")
    echo "bootstrap: $site is read-only (a container image); installing into $prefix" >&2
    mkdir -p "$prefix" || { echo "bootstrap: cannot create $prefix: set BCP_PIPELINE_PACKAGES to a writable" \
      "folder the job sees (a bound one)" >&2; exit 86; }
    use_prefix
  fi
}

if ! have_packages; then
  exec 9>"/tmp/bcp-pipeline-bootstrap-$(id -u).lock"
  flock 9
  if [ -d "$prefix" ]; then use_prefix; fi
  if ! have_packages; then
    pip_target
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

fast_tried="/tmp/bcp-pipeline-fast-bpe-$(id -u)-$version-$digest"  # one try per node: a failure is not retried
if [ -f "$here/requirements-fast.txt" ] && [ ! -e "$fast_tried" ] && ! have_packages "$fast_module"; then
  exec 9>"/tmp/bcp-pipeline-bootstrap-$(id -u).lock"
  flock 9
  if [ ! -e "$fast_tried" ] && ! have_packages "$fast_module"; then
    pip_target
    echo "bootstrap: installing the fast BPE engine from $here/requirements-fast.txt" >&2
    if ! "$python" -m pip install --quiet --timeout 30 --retries 1 "${target[@]}" --no-deps --require-hashes \
        -r "$here/requirements-fast.txt"; then
      echo "bootstrap: could not install $fast_module (the fast BPE engine); tokenize-preprocess tokenizes with" \
           "tiktoken (the same ids, about 15x the CPU)" >&2
    fi
    touch "$fast_tried" 2>/dev/null || true
  fi
  flock -u 9
fi
exec "$@"
