# shellcheck shell=bash
# A PyTorchJob's pod under MASTER_LAST (render.py master_last: `bash -c` of these lines joined by spaces, then
# `bcp-pipeline-master-last ENDS_DIR PODS WAIT_S GRACE_S COMMAND...`), so `cleanPodPolicy: Running` frees a failed
# job's GPUs without deleting a finished job's Workers, with their logs.
#
# The training operator ends a Master + Worker PyTorchJob when its Master pod ends: succeeded when the Master
# succeeded, failed when any pod failed. With `cleanPodPolicy: Running` it then deletes the pods still running (or
# pending) and keeps the ended ones. On a failure that is what a user wants (a rank's crash leaves no other pod
# holding its GPUs while it waits at a collective). On a success the Workers are still exiting when the Master has
# ended: torchrun's ranks leave together, but each pod's agent exits on its own, and a Worker deleted then takes its
# log with it (Megatron-Bridge prints its training log from the last rank, a Worker; `logs --rank N` reads it).
#
# So a pod whose command succeeded writes a mark for its node rank (PET_NODE_RANK, the operator's) in ENDS_DIR (a
# folder of the attempt on the workspace: the job's name is unique to the attempt) and ends; the Master (node rank
# 0) waits for the marks of every pod (at most WAIT_S), then GRACE_S more, in which the Workers' containers have
# exited and their pods are Succeeded, and only then ends. A command that fails ends its pod at once, with its own
# exit status. The time limit's timer (time_limiter.sh) keeps running around it, so the wait is bounded by the limit
# too. As PID 1 (no time limit around it), bash would ignore the SIGTERM of a deletion: the trap passes it to the
# whole process group, as time_limiter.sh does. `wait` is repeated while the command lives (a trap interrupts it).

ends=$1 pods=$2 wait_s=$3 grace_s=$4; shift 4;
trap 'trap "" TERM; kill -TERM 0' TERM;
"$@" & child=$!;
while :; do wait "$child"; code=$?; kill -0 "$child" 2>/dev/null || break; done;
[ "$code" = 0 ] || exit "$code";
mkdir -p "$ends" 2>/dev/null && : > "$ends/pod-$PET_NODE_RANK" ||
echo "bcp-pipeline: could not mark this pod ended in $ends" >&2;
[ "$PET_NODE_RANK" = 0 ] || exit 0;
# shellcheck disable=SC2012  # counts the marks pod-0..pod-N this script writes: names without odd characters
for _ in $(seq "$wait_s"); do [ "$(ls "$ends" 2>/dev/null | wc -l)" -ge "$pods" ] && break; sleep 1;
done; sleep "$grace_s"; exit 0
