"""How one rank's lines are told apart in a pod's log, which all the pod's ranks share (pure constants and one
pure helper of render.py): every line a rank prints starts `[rankN]:`, torchrun's own form, so `logs --rank N` and
`logs --follow --rank N` take them out of pods/log (shared/logs.py rank_lines), and `kubectl logs` shows them as
they came. Per-rank files on the workspace would need a pod to read them back: the workspace is a volume of the
cluster, not a folder of the orchestrator's, and the pods' logs are what the API serves."""

from __future__ import annotations

from typing import Any

# Starts the pod's processes: LOCAL_RANK 0..P-1, each with its global RANK, and waits for all of them; the pod's
# exit status is the first non-zero one (pipefail: the program's, not its line prefixer's), so the pod failure policy
# sees a failed program's own exit code. Each line a rank prints (stdout and stderr) starts `[rankN]:`, torchrun's
# own form (RANK_LINE_PREFIX), so `logs --rank N` can take one rank's lines out of the pod's shared log.
POD_LAUNCHER = ('set -o pipefail; P=$BCP_PIPELINE_PROCESSES; pids=""; for local in $(seq 0 $((P - 1))); do '
                'rank=$((JOB_COMPLETION_INDEX * P + local)); '
                '{ RANK=$rank LOCAL_RANK=$local "$@" 2>&1 | while IFS= read -r line || [ -n "$line" ]; do '
                'printf "[rank%s]:%s\\n" "$rank" "$line"; done; } & pids="$pids $!"; done; '
                'code=0; for pid in $pids; do wait "$pid"; status=$?; [ "$code" = 0 ] && code=$status; done; '
                'exit "$code"')
# torchrun (Megatron-Bridge pods, PyTorchJobs) writes its ranks' lines so too: `--tee 3` copies each rank's stdout and
# stderr to the console, each line headed by this template of torch.distributed.elastic (`[rank${rank}]:`).
TORCHRUN_PREFIX_ENV = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
TORCHRUN_TEE = "--tee=3"


def with_torchrun_prefix(container: dict[str, Any]) -> None:
    """The torchrun container's rank line prefix (TORCHRUN_PREFIX_ENV), unless the stage's env sets its own."""
    given = {e["name"] for e in container["env"]}
    container["env"] += [{"name": key, "value": value} for key, value in TORCHRUN_PREFIX_ENV.items()
                         if key not in given]
