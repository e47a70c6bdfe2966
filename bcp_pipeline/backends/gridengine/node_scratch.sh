# shellcheck shell=bash
# gridengine.node_scratch (render.py node_scratch): Grid Engine's per-job folder on the host's own disk (the queue's
# tmpdir, e.g. a node's SSD, made for the job and removed when it ends), named to the stage programs
# (stages/_scratch.py). Grid Engine sets it as TMPDIR and TMP; a loader in secure-execution mode drops TMPDIR
# (glibc's unsecure variables), as on the test cell.

# Node-local scratch (gridengine.node_scratch): the job's $TMPDIR on this host, removed when the job ends.
scratch="${TMPDIR:-${TMP:-}}"
if [ ! -d "$scratch" ] || [ ! -w "$scratch" ]; then
  echo "bcp-pipeline: gridengine.node_scratch: this job has no writable \$TMPDIR or \$TMP (${scratch:-unset}) on $(hostname); set the queue's tmpdir, or drop node_scratch" >&2
  exit 1
fi
export BCP_PIPELINE_SCRATCH="$scratch" TMPDIR="$scratch"
