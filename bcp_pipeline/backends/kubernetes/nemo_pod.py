"""A NeMo launcher pretrain's pod on Kubernetes (pure: values in, the pod's script out; `plan` prints it in the
manifest, golden-tested in tests/golden/kubernetes/): the Grid Engine way (backends/gridengine/training.py), in pods.

Every pod of the stage's Indexed Job (or PyTorchJob) runs this script in the NeMo image:

1. The first pod (completion index 0; a PyTorchJob's Master, PET_NODE_RANK 0) writes the data list from the
   preprocess manifests (stages/data_list.py), then runs NVIDIA's launcher in its debug mode (NEMO_LAUNCHER_DEBUG=1,
   the BCP job script's step: shared/nemo_script.launcher_debug_step), which composes the training config
   `<results>/<run>/<run>_hydra.yaml` and runs nothing, then marks it composed for this attempt.
2. The other pods wait for that mark. Why once, on one pod, rather than a compose in each: the launcher writes the
   config into the NeMo run's own folder (beside its checkpoints) with every path in it resolved from
   `base_results_dir`, so a pod composing into a folder of its own would train into folders of its own, and
   pods composing into one folder would rewrite the file while another reads it. Only the launcher reads the
   data list, so only the first pod writes it. The mark is a file holding the Job's name, which is unique to the
   attempt (`-aN`): a waiting pod never takes an earlier attempt's config for this one's. A pod waits at most
   COMPOSE_WAIT_SECONDS, then fails: an Indexed Job keeps its other pods when its first fails, and a pod must not
   hold its GPUs for ever waiting on one that is gone (a PyTorchJob's operator deletes them: cleanPodPolicy Running).
3. Every pod: one torchrun of its ranks, a rank a GPU (the Indexed Job's static rendezvous at the index-0 pod, as
   Megatron-Bridge's pods; the training operator's PET_* variables in a PyTorchJob), running NeMo's
   megatron_gpt_pretraining.py `--config-path=<results>/<run> --config-name=<run>_hydra.yaml` (the pod's args).

The overrides are config/nemo.py's, as on BCP, Slurm and Grid Engine: this run's own NeMo run name (a continuation
resumes its `-last` checkpoint), `+training.exp_manager.max_time_per_run` = the Job's deadline minus
nemo.time_margin, `trainer.num_nodes` x `trainer.devices` = pods x GPUs a pod. Failure: the script runs under
`set -euo pipefail` and ends in `exec torchrun`, which exits non-zero when a rank fails, so the pod fails with the
training, and the Job with the pod (backoffLimit).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared.nemo_script import launcher_debug_step, shell_word
from bcp_pipeline.config import nemo
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.errors import SubmissionError

# How long a pod other than the first waits for the composed config: the first pod may still be pulling the NeMo
# image (tens of GB) when the others start; composing itself takes seconds.
COMPOSE_WAIT_SECONDS = 1800
COMPOSED_MARK = ".bcp-pipeline-composed"  # in the run's folder: the name of the Job that composed the config there


@dataclass(frozen=True, kw_only=True)
class NemoPod:
    """What the pod's script needs, every path as the pod sees it."""

    title: str  # e.g. "run RUN, stage pretrain"
    job: str  # the Job's (or PyTorchJob's) name: unique to the attempt
    node_index: str  # shell text: this pod's node rank ("$JOB_COMPLETION_INDEX", or the operator's "$PET_NODE_RANK")
    data_list_argv: list[str]  # builds the data list into data_list_file
    data_list_file: str
    launcher_dir: str
    overrides: list[str]  # the launcher's Hydra overrides, without the data list
    config_dir: str  # where the launcher writes the composed config (the NeMo run's folder)
    config_name: str
    torchrun: str  # shell text: torchrun with this pod's rendezvous arguments; the training is "$@"


def trainer_args(trainer: str, config_dir: str, config_name: str) -> list[str]:
    """The pod's args: NeMo's training script with the composed config (torchrun runs it with `python -u`)."""
    return [trainer, f"--config-path={config_dir}", f"--config-name={config_name}"]


def render(pod: NemoPod) -> str:
    """The script `bash -c` runs in each pod (its args: the training, trainer_args)."""
    config = f"{pod.config_dir}/{pod.config_name}"
    mark = f"{pod.config_dir}/{COMPOSED_MARK}"
    job = pod.job
    assert re.fullmatch(r"[a-z0-9-]+", job), job  # a DNS label (render.job_name): one shell word as it is
    lines = [
        f"# bcp-pipeline {pod.title}: NVIDIA's NeMo launcher composes the training config on the first pod, then",
        "# torchrun in every pod runs NeMo's training (bcp_pipeline/backends/kubernetes/nemo_pod.py).",
        "set -euo pipefail",
        "export PYTHONUNBUFFERED=1",
        f"node={pod.node_index} mark={shell_word(mark)}",
        'if [ "$node" = 0 ]; then',
        "  # The data list: every .bin/.idx pair of the preprocess manifests, weighted by tokens.",
        f"  mkdir -p {shell_word(pod.data_list_file.rsplit('/', 1)[0])}",
        "  " + " ".join(shell_word(word) for word in pod.data_list_argv),
        "  # The training config as the launcher composes it (debug mode: written, nothing run).",
        *(f"  {line}" for line in launcher_debug_step(pod.overrides, pod.data_list_file, pod.launcher_dir, config)),
        f"  test -s {shell_word(config)} || "
        f"{{ echo {shell_word(f'bcp-pipeline: the NeMo launcher wrote no {config}')} >&2; exit 1; }}",
        f'  printf "%s\\n" {job} > "$mark.tmp" && mv -f "$mark.tmp" "$mark"  # composed, for this attempt',
        "else",
        "  waited=0  # for the first pod's config of this attempt",
        f'  until [ "$(cat "$mark" 2>/dev/null)" = {job} ]; do',
        f'    if [ "$waited" -ge {COMPOSE_WAIT_SECONDS} ]; then',
        f'      echo "bcp-pipeline: pod $node: the first pod composed no training config for job {job} in '
        f'{COMPOSE_WAIT_SECONDS} s ($mark)" >&2',
        "      exit 1",
        "    fi",
        "    sleep 2; waited=$((waited + 2))",
        "  done",
        "fi",
        "# The training: this pod's ranks, a rank a GPU; the pod's status is torchrun's.",
        f'exec {pod.torchrun} "$@"',
    ]
    return "\n".join(lines) + "\n"


def trains_with_nemo(request: JobRequest) -> bool:
    """A stage job of a nemo: stage whose kubernetes section gives no command of its own."""
    return request.kind == "stage" and request.stage.nemo is not None and not request.resources("kubernetes").command


def gpus_per_pod(request: JobRequest) -> int:
    """The training's ranks a pod, one a GPU: kubernetes.gpus, else nemo.gpus_per_node or the BCP instance's."""
    given = request.resources("kubernetes").gpus
    try:
        return given or nemo.gpus_per_node(request.stage, request.stage.bcp.instance)
    except ValueError as exc:
        raise SubmissionError(f"{request.label}: {exc}; or set kubernetes.gpus") from None


def nemo_pod(
    request: JobRequest,
    values: dict[str, str],
    *,
    job: str,
    pods: int,
    gpus: int,
    deadline_seconds: int | None,
    torchrun: str,
    node_index: str,
) -> tuple[NemoPod, list[str]]:
    """The pod's script inputs and its args (the training) for the stage's job `job` of `pods` pods x `gpus`;
    `values`: the backend's ${...} values as the pod sees them."""
    stage = request.stage
    section = stage.nemo
    assert section is not None
    runtime = None if deadline_seconds is None else f"{deadline_seconds}s"
    try:
        overrides = nemo.launcher_overrides(
            stage,
            cluster_type="bcp",
            nodes=str(pods),
            runtime=runtime,
            values=values,
            backend="kubernetes",
            devices=str(gpus),
        )
        launcher = nemo.launcher_dir(stage, "kubernetes")
    except ValueError as exc:
        raise SubmissionError(f"{request.label}: {exc}") from None
    config_dir, config_name = nemo.composed_config(
        substitute(section.results_dir, values), nemo.nemo_run_name(stage, request.run_id)
    )
    data_list_file = f"{values['results']}/{nemo.DATA_LIST_FILE}"
    data_list_argv = nemo.DATA_LIST.argv(
        section, values, python=values["python"], code=values["code"], out=data_list_file
    )
    pod = NemoPod(
        title=f"run {request.run_id}, stage {stage.name}",
        job=job,
        node_index=node_index,
        data_list_argv=data_list_argv,
        data_list_file=data_list_file,
        launcher_dir=launcher,
        overrides=overrides,
        config_dir=config_dir,
        config_name=config_name,
        torchrun=torchrun,
    )
    trainer = f"{section.nemo_dir.rstrip('/')}/{nemo.PRETRAINING_SCRIPT}"
    return pod, trainer_args(trainer, config_dir, config_name)
