"""A PyTorchJob's Master ends last (pure constants and one pure helper of render.py), so `cleanPodPolicy: Running`
frees a failed job's GPUs without deleting a finished job's Workers, with their logs.

The training operator ends a Master + Worker PyTorchJob when its Master pod ends: succeeded when the Master
succeeded, failed when any pod failed. With `cleanPodPolicy: Running` it then deletes the pods still running (or
pending) and keeps the ended ones. On a failure that is what a user wants (a rank's crash leaves no other pod
holding its GPUs while it waits at a collective). On a success the Workers are still exiting when the Master has
ended: torchrun's ranks leave together, but each pod's agent exits on its own, and a Worker deleted then takes its
log with it (Megatron-Bridge prints its training log from the last rank, a Worker; `logs --rank N` reads it).

So each pod of such a job runs its command under MASTER_LAST: a pod whose command succeeded writes a mark for its
node rank (PET_NODE_RANK, the operator's) in a folder of the attempt on the workspace (the job's name is unique to
the attempt) and ends; the Master (node rank 0) waits for the marks of every pod (at most END_WAIT_SECONDS), then
END_GRACE_SECONDS more, in which the Workers' containers have exited and their pods are Succeeded, and only then
ends. A command that fails ends its pod at once, with its own exit status. The timer of the stage's time limit
(time_limit.py) keeps running around it, so the wait is bounded by the limit too.
"""

from __future__ import annotations

END_WAIT_SECONDS = 600  # the Master waits this long at most for the other pods' marks (a Worker ending slowly)
END_GRACE_SECONDS = 10  # then this long, for the Workers' pods to be reported ended (a kubelet's status update)

# As PID 1 (no time limit around it), bash would ignore the SIGTERM of a deletion: the trap passes it to the whole
# process group, as time_limit.TIME_LIMITER does. `wait` is repeated while the command lives (a trap interrupts it).
MASTER_LAST = ('ends=$1 pods=$2 wait_s=$3 grace_s=$4; shift 4; trap \'trap "" TERM; kill -TERM 0\' TERM; '
               '"$@" & child=$!; while :; do wait "$child"; code=$?; kill -0 "$child" 2>/dev/null || break; done; '
               '[ "$code" = 0 ] || exit "$code"; '
               'mkdir -p "$ends" 2>/dev/null && : > "$ends/pod-$PET_NODE_RANK" || '
               'echo "bcp-pipeline: could not mark this pod ended in $ends" >&2; '
               '[ "$PET_NODE_RANK" = 0 ] || exit 0; '
               'for _ in $(seq "$wait_s"); do [ "$(ls "$ends" 2>/dev/null | wc -l)" -ge "$pods" ] && break; sleep 1; '
               'done; sleep "$grace_s"; exit 0')


def master_last(command: list[str], ends_dir: str, pods: int, *, wait_seconds: int = END_WAIT_SECONDS,
                grace_seconds: int = END_GRACE_SECONDS) -> list[str]:
    """`command` under MASTER_LAST: its pod's end marked in `ends_dir`, the Master waiting for all `pods`."""
    return ["bash", "-c", MASTER_LAST, "bcp-pipeline-master-last", ends_dir, str(pods), str(wait_seconds),
            str(grace_seconds), *command]
