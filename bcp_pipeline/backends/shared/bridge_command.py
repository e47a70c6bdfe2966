"""A Megatron-Bridge pretrain's two commands, as every backend's job runs them: the data list written into the
run's folder (data_list.py: `dataset.data_path=[weight,prefix,...]` from the preprocess manifests, or with a
held-out split, `dataset.blend_per_split=[train, validation, null]`), then, on every
rank, the entry program (stages/bridge_pretrain.py) with the recipe, that file and the rendered overrides, started by
stages/rank_start.py: it binds the rank to its GPU's NUMA node (the section's `numa_binding`; NVIDIA's launcher binds
by default, numa_mapping) and, where asked (BCP's multi-node jobs), first waits for the rendezvous to answer.

`values` are the backend's ${...} values as its job sees them; `runtime` the job's time limit on that backend
(its `train.exit_duration_in_mins` is derived from it: config/bridge.py).
"""

from __future__ import annotations

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.config import bridge
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.errors import SubmissionError


def trains_with_bridge(request: JobRequest, backend: str) -> bool:
    """A stage job of a megatron_bridge: stage whose backend section gives no command of its own."""
    return (
        request.kind == "stage" and request.stage.megatron_bridge is not None and not request.resources(backend).command
    )


def data_list_file(request: JobRequest, values: dict[str, str]) -> str:
    return f"{bridge.run_dir(request.stage, values, request.run_id)}/{bridge.DATA_LIST_FILE}"


def data_list_argv(request: JobRequest, values: dict[str, str]) -> list[str]:
    """Writes the data list override into the run's folder (atomically: every rank reads it whole)."""
    section, out = request.stage.megatron_bridge, data_list_file(request, values)
    return bridge.DATA_LIST.argv(section, values, python=values["python"], code=values["code"], out=out)


RANK_STARTER = "rank_start.py"  # stages/rank_start.py: NUMA binding, the wait for the rendezvous, then exec


def rank_argv(
    request: JobRequest,
    backend: str,
    values: dict[str, str],
    runtime: str | None,
    *,
    wait_for_master: int | None = None,
) -> list[str]:
    """One rank's command: the rank starter (its NUMA binding as the backend section's `numa_binding` says; with
    `wait_for_master`, a wait of at most that many seconds for the rendezvous on a later node), then the entry
    program, the recipe, the data list file and every override."""
    try:
        overrides = bridge.bridge_overrides(request.stage, values=values, runtime=runtime, run_id=request.run_id)
    except ValueError as exc:
        raise SubmissionError(f"stage {request.stage.name}: {exc}") from None
    section = request.stage.megatron_bridge
    problem = bridge.hub_access_error(request.stage, (backend,))
    if problem:
        raise SubmissionError(f"stage {request.stage.name}: {problem}")
    nsys = ["--nsys-output", substitute(section.nsys_output, values)] if section.nsys_output else []
    hub = ["--hf-home", substitute(section.hf_home, values)] if section.hf_home else []
    wait = [] if wait_for_master is None else ["--wait-for-master", str(wait_for_master)]
    numa = "auto" if request.resources(backend).numa_binding else "off"
    starter = [values["python"], "-u", f"{values['code']}/{RANK_STARTER}", *wait, "--gpu-numa", numa, "--"]
    return [
        *starter,
        values["python"],
        "-u",
        f"{values['code']}/{bridge.ENTRY_PROGRAM}",
        "--recipe",
        section.recipe,
        *nsys,
        *hub,
        "--overrides-file",
        data_list_file(request, values),
        *overrides,
    ]


def gpus_per_node(request: JobRequest, backend: str) -> int:
    """The training's ranks a node on `backend` (one a GPU); SubmissionError naming the stage where unknown."""
    try:
        return bridge.training_layout(request.stage, backend)[1]
    except ValueError as exc:
        raise SubmissionError(f"stage {request.stage.name}: {exc}") from None
