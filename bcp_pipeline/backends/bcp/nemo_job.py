"""A NeMo launcher pretrain on BCP: the launcher's overrides as the job passes them, and the job script's inputs
(shared/nemo_script.py renders it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from bcp_pipeline.backends.bcp.paths import code_destination, job_values
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared import nemo_script as training_script
from bcp_pipeline.backends.shared.command import placeholder_values
from bcp_pipeline.backends.shared.nemo_script import TrainingJob
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.resources import BcpOptions, BcpResources
from bcp_pipeline.errors import SubmissionError


def nemo_launcher_overrides(request: JobRequest, options: BcpOptions, stages_dir: Path) -> list[str]:
    """The NeMo launcher's Hydra overrides exactly as the stage's job passes them, with its node count written out
    (the job passes `${NGC_ARRAY_SIZE}`), the run's id as RUN (its NeMo run name holds it; no composition depends
    on it) and without the data list (the job builds that from the manifests). What `check`'s NeMo probe composes,
    and what a profile's finding about it is matched against, whichever run it is rendered for."""
    from bcp_pipeline.config.nemo import launcher_overrides

    resources: BcpResources = request.resources("bcp")
    values = {**job_values(request, options, stages_dir), "run_id": "RUN"}
    try:
        return launcher_overrides(
            request.stage,
            cluster_type="bcp",
            nodes=str(request.rank_layout("bcp").nodes),
            runtime=resources.total_runtime,
            values=values,
            backend="bcp",
        )
    except ValueError as exc:
        raise SubmissionError(f"stage {request.stage.name}: {exc}") from None


def training_job(request: JobRequest, options: BcpOptions, stages_dir: Path) -> TrainingJob:
    """The NeMo pretrain job's script inputs, every path written from the script's WORKSPACE / RESULTS arguments."""
    from bcp_pipeline.config.nemo import DATA_LIST, DATA_LIST_FILE, launcher_dir, launcher_overrides, nemo_run_name

    stage, resources = request.stage, request.resources("bcp")
    values = placeholder_values(
        request,
        workspace=training_script.WORKSPACE,
        results=training_script.RESULTS,
        code=f"{training_script.WORKSPACE}/{code_destination(options, stages_dir)}",
        python=options.python,
    )
    try:
        overrides = launcher_overrides(
            stage,
            cluster_type="bcp",
            nodes=training_script.NODES,
            runtime=resources.total_runtime,
            values=values,
            backend="bcp",
        )
        launcher = launcher_dir(stage, "bcp")
    except ValueError as exc:
        raise SubmissionError(f"stage {stage.name}: {exc}") from None
    data_list_file = f"{training_script.RESULTS}/{DATA_LIST_FILE}"
    run_name = nemo_run_name(stage, request.run_id)
    return TrainingJob(
        title=f"stage {stage.name} of pipeline {request.pipeline.name}, run {request.run_id}",
        launcher_dir=launcher,
        overrides=overrides,
        data_list_file=data_list_file,
        data_list_argv=DATA_LIST.argv(stage.nemo, values, python="python3", code=values["code"], out=data_list_file),
        results_dir=substitute(stage.nemo.results_dir, values).rstrip("/"),
        run_name=run_name,
        log_file=f"{training_script.RESULTS}/{run_name}.log",
        replicas=request.rank_layout("bcp").nodes,
    )


def nemo_overrides_digest(image: str, overrides: list[str]) -> str:
    """Names one launcher composition: the image and the overrides given to it."""
    return hashlib.sha256("\n".join([image, *overrides]).encode()).hexdigest()[:16]
