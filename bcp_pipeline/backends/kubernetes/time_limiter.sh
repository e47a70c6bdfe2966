# shellcheck shell=bash
# The stage's time limit, kept by the container itself (render.py time_limited: `bash -c` of these lines joined by
# spaces, then `bcp-pipeline-time-limit SECONDS COMMAND...`). Its command runs under this timer, started with the
# container, so the limit counts from when the pod runs (as BCP's and Slurm's count from the job's start), not from
# the Job's creation as activeDeadlineSeconds would (a Job waiting for capacity would lose its runtime to the
# queue). Past the limit every process of the container gets SIGTERM, has BCP_PIPELINE_STOP_SECONDS (default 30; a
# training pod's: its grace period, time for a checkpoint save) to end, SIGKILL coming with the container's end, and
# it exits @TIME_LIMIT_EXIT@ (render.py TIME_LIMIT_EXIT), which the pod failure policy turns into a failed Job that
# states.py reads as timed out (a continuation continues it). SIGTERM to the container (a deletion) goes to every
# process too: as PID 1, bash would otherwise ignore it. A program's own exit with TIME_LIMIT_EXIT is reported as 1,
# so it cannot pass for one.

limit=$1; shift;
trap 'trap "" TERM; kill -TERM 0' TERM;
"$@" & child=$!;
while kill -0 "$child" 2>/dev/null && [ "$SECONDS" -lt "$limit" ]; do sleep 1; done;
if kill -0 "$child" 2>/dev/null; then
echo "bcp-pipeline: the stage time limit of $limit s, counted from the start of this container, ran out: stopping it" >&2;
trap "" TERM; kill -TERM 0;
for _ in $(seq "${BCP_PIPELINE_STOP_SECONDS:-30}"); do kill -0 "$child" 2>/dev/null || break; sleep 1; done;
exit @TIME_LIMIT_EXIT@; fi;
wait "$child"; code=$?;
if [ "$code" = @TIME_LIMIT_EXIT@ ]; then
echo "bcp-pipeline: the stage exited @TIME_LIMIT_EXIT@, the status of the time limit: reported as 1" >&2; code=1; fi;
exit "$code"
