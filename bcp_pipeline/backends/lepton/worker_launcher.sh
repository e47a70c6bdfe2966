# shellcheck shell=bash
# Starts a Lepton worker's processes (render.py container_command: `bash -c` of these lines joined by spaces, then
# `bcp-pipeline-worker COMMAND...`): the ranks from the worker's own variables, RANK = LEPTON_JOB_WORKER_INDEX x P +
# LOCAL_RANK and WORLD_SIZE = LEPTON_JOB_TOTAL_WORKERS x P (P: BCP_PIPELINE_PROCESSES); the worker's exit status is
# the first non-zero one of its processes (pipefail: the program's, not its line prefixer's). Each line a rank
# prints starts `[rankN]:`, torchrun's own form, so `logs --rank N` takes one rank's lines out of the worker's log.

set -o pipefail; P=$BCP_PIPELINE_PROCESSES;
W=${LEPTON_JOB_WORKER_INDEX:?not a Lepton worker}; N=${LEPTON_JOB_TOTAL_WORKERS:?not a Lepton worker};
export WORLD_SIZE=$((N * P)) LOCAL_WORLD_SIZE=$P NODE_RANK=$W; pids="";
for local in $(seq 0 $((P - 1))); do
rank=$((W * P + local));
{ RANK=$rank LOCAL_RANK=$local "$@" 2>&1 | while IFS= read -r line || [ -n "$line" ]; do printf "[rank%s]:%s\n" "$rank" "$line"; done; } &
pids="$pids $!"; done;
code=0;
for pid in $pids; do wait "$pid"; status=$?; [ "$code" = 0 ] && code=$status; done;
exit "$code"
