"""A stage of the bundled demo as a Kubernetes job request, with --set overrides, and the backend that renders it
(no cluster): what the Kubernetes unit tests render."""

from __future__ import annotations

from support.golden_files import REPO

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.kubernetes.backend import KubernetesBackend
from bcp_pipeline.config.preflight import load_and_check


def request_for(stage: str, *overrides: str, kind: str = "stage") -> tuple[KubernetesBackend, JobRequest]:
    """The demo's `stage` (its stage job, or with kind="verify" its verification) as run demo-RUN would submit it."""
    config = load_and_check(REPO / "pipelines.yaml", overrides=list(overrides), pipeline="demo")
    pipeline = config.pipeline("demo")
    backend = KubernetesBackend(
        config.options["kubernetes"],
        config_dir=REPO,
        stages_dir=config.stages_dir,
        run_dir=REPO / ".bcp-pipeline/runs/demo-RUN",
        workspace_name="demo",
    )
    program = "verify.py" if kind == "verify" else pipeline.stages[stage].program
    return backend, JobRequest(
        run_id="demo-RUN",
        pipeline=pipeline,
        stage=pipeline.stages[stage],
        kind=kind,
        program=program,
        args=tuple(pipeline.stages[stage].args),
    )


def every_bundled_stage_as_a_pytorchjob(namespace: str) -> list[dict]:
    """Every stage of every bundled pipeline (NeMo launcher pretrains too) rendered as a PyTorchJob in `namespace`,
    and in each pipeline one stage no engine constrains as an elastic one of 2 pods: what a server-side dry run
    holds against the operator's CRD and its webhook."""
    from pathlib import Path

    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.config.load import load_config
    from bcp_pipeline.engine.submitter import planned_requests

    found = []
    for name in load_config(REPO / "pipelines.yaml").pipelines:
        stages = load_config(REPO / "pipelines.yaml", pipeline=name).pipeline(name).stages
        plain = next(s for s in stages if stages[s].engine is None)
        loaded = load_config(
            REPO / "pipelines.yaml",
            pipeline=name,
            overrides=[f"{stage}.kubernetes.launcher=pytorchjob" for stage in stages]
            + [f"{plain}.kubernetes.replicas=2", f"{plain}.kubernetes.elastic_policy={{min_replicas: 1}}"],
        )
        loaded.options["kubernetes"].namespace = namespace
        pipeline = loaded.pipeline(name)
        backend = make_backend("kubernetes", loaded, pipeline, Path("/tmp/none/runs") / f"{name}-RUN")
        for request in planned_requests(pipeline, f"{name}-RUN"):
            found += [obj for obj in backend.render(request).payload["manifests"] if obj["kind"] == "PyTorchJob"]
    return found
