# shellcheck shell=bash
# Starts a pod's processes (render.py pod_spec: `bash -c` of these lines joined by spaces, then `bcp-pipeline-pod
# COMMAND...`): LOCAL_RANK 0..P-1, each with its global RANK, and waits for all of them; the pod's exit status is
# the first non-zero one (pipefail: the program's, not its line prefixer's), so the pod failure policy sees a failed
# program's own exit code. Each line a rank prints (stdout and stderr) starts `[rankN]:`, torchrun's own form, so
# `logs --rank N` can take one rank's lines out of the pod's shared log (shared/logs.py rank_lines).

set -o pipefail; P=$BCP_PIPELINE_PROCESSES; pids="";
for local in $(seq 0 $((P - 1))); do
rank=$((JOB_COMPLETION_INDEX * P + local));
{ RANK=$rank LOCAL_RANK=$local "$@" 2>&1 | while IFS= read -r line || [ -n "$line" ]; do printf "[rank%s]:%s\n" "$rank" "$line"; done; } &
pids="$pids $!"; done;
code=0;
for pid in $pids; do wait "$pid"; status=$?; [ "$code" = 0 ] && code=$status; done;
exit "$code"
