"""A stage of the bundled demo as a Kubernetes job request, with --set overrides, and the backend that renders it
(no cluster): what the Kubernetes unit tests render."""

from __future__ import annotations

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.kubernetes.backend import KubernetesBackend
from bcp_pipeline.config.preflight import load_and_check
from support.golden_files import REPO


def request_for(stage: str, *overrides: str, kind: str = "stage") -> tuple[KubernetesBackend, JobRequest]:
    """The demo's `stage` (its stage job, or with kind="verify" its verification) as run demo-RUN would submit it."""
    config = load_and_check(REPO / "pipelines.yaml", overrides=list(overrides), pipeline="demo")
    pipeline = config.pipeline("demo")
    backend = KubernetesBackend(config.options["kubernetes"], config_dir=REPO, stages_dir=config.stages_dir,
                                run_dir=REPO / ".bcp-pipeline/runs/demo-RUN", workspace_name="demo")
    program = "verify.py" if kind == "verify" else pipeline.stages[stage].program
    return backend, JobRequest(run_id="demo-RUN", pipeline=pipeline, stage=pipeline.stages[stage], kind=kind,
                               program=program, args=tuple(pipeline.stages[stage].args))
