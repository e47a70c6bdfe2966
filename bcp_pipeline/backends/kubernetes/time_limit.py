"""The stage's time limit on Kubernetes, kept by each pod's container itself (pure constants and one pure helper of
render.py): why not the Job's activeDeadlineSeconds is said below and in docs/backends/kubernetes.md, "Time limit"."""

from __future__ import annotations

# The stage's time limit, kept by the container itself: its command runs under this timer, started with the
# container, so the limit counts from when the pod runs (as BCP's and Slurm's count from the job's start), not from
# the Job's creation as activeDeadlineSeconds would (a Job waiting for capacity would lose its runtime to the
# queue). Past the limit every process of the container gets SIGTERM (SIGKILL comes with the container's end) and it
# exits TIME_LIMIT_EXIT, which the pod failure policy turns into a failed Job that states.py reads as timed out (a
# continuation continues it). SIGTERM to the container (a deletion) goes to every process too: as PID 1, bash
# would otherwise ignore it. A program's own exit with TIME_LIMIT_EXIT is reported as 1, so it cannot pass for one.
TIME_LIMIT_EXIT = 124  # as timeout(1)'s
TIME_LIMITER = ('limit=$1; shift; trap \'trap "" TERM; kill -TERM 0\' TERM; "$@" & child=$!; '
                'while kill -0 "$child" 2>/dev/null && [ "$SECONDS" -lt "$limit" ]; do sleep 1; done; '
                'if kill -0 "$child" 2>/dev/null; then echo "bcp-pipeline: the stage time limit of $limit s, counted '
                'from the start of this container, ran out: stopping it" >&2; trap "" TERM; kill -TERM 0; '
                'for _ in $(seq 30); do kill -0 "$child" 2>/dev/null || break; sleep 1; done; '
                f'exit {TIME_LIMIT_EXIT}; fi; wait "$child"; code=$?; if [ "$code" = {TIME_LIMIT_EXIT} ]; then '
                f'echo "bcp-pipeline: the stage exited {TIME_LIMIT_EXIT}, the status of the time limit: reported as 1"'
                ' >&2; code=1; fi; exit "$code"')


def time_limited(command: list[str], seconds: int | None) -> list[str]:
    """`command` run under the container's own timer (TIME_LIMITER) where the stage has a time limit."""
    if seconds is None:
        return command
    return ["bash", "-c", TIME_LIMITER, "bcp-pipeline-time-limit", str(seconds), *command]
