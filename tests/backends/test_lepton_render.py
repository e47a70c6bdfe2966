"""The Lepton backend without a service: golden `plan`s (what `run` creates), every bundled job as NVIDIA's SDK models
take it, the workers' ranks from Lepton's own variables, secrets by name, the state map, bad input refused."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
from support.golden_files import REPO, assert_golden, normalize

from bcp_pipeline.backends.contract import JobRequest, JobState
from bcp_pipeline.backends.lepton import code, render
from bcp_pipeline.backends.lepton.backend import LeptonBackend
from bcp_pipeline.backends.lepton.states import STATE_MAP, status_of
from bcp_pipeline.cli.main import main
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.errors import SubmissionError

PIPELINES = ("demo", "slimpajama-8b", "slimpajama-8b-bridge", "slimpajama-126m")


def plan(capsys: pytest.CaptureFixture, pipeline: str, *sets: str) -> str:
    capsys.readouterr()
    args = [a for s in sets for a in ("--set", s)]
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", pipeline, "--backend", "lepton", *args]) == 0
    # stages/' content hash names its folder: a change to any stage program would otherwise touch every golden
    digest = code.code_hash(REPO / "stages")
    return capsys.readouterr().out.replace(digest, "<CODE>").replace(f"bp-code-{digest[:8]}-", "bp-code-<CODE>-")


@functools.cache
def loaded(pipeline_name: str, overrides: tuple[str, ...]):
    """pipelines.yaml loaded and checked once per pipeline and overrides (loading is the costly part here)."""
    return load_and_check(REPO / "pipelines.yaml", overrides=list(overrides), pipeline=pipeline_name)


def requests(pipeline_name: str, *overrides: str) -> tuple[LeptonBackend, list[JobRequest]]:
    config = loaded(pipeline_name, overrides)
    pipeline = config.pipeline(pipeline_name)
    backend = LeptonBackend(
        config.options["lepton"],
        config_dir=REPO,
        stages_dir=config.stages_dir,
        run_dir=REPO / ".bcp-pipeline/runs/RUN",
        workspace_name=pipeline.workspace.name,
    )
    made = [
        JobRequest(
            run_id="RUN",
            pipeline=pipeline,
            stage=stage,
            kind=kind,
            program="verify.py" if kind == "verify" else stage.program,
            args=tuple(stage.args),
        )
        for stage in pipeline.stages.values()
        for kind in ("stage", "verify")
    ]
    return backend, made


def test_plan_demo_golden(capsys: pytest.CaptureFixture) -> None:
    assert_golden("lepton/plan-demo.txt", normalize(plan(capsys, "demo")))


def test_the_bridge_pretrain_is_one_torchrun_a_worker_meeting_at_worker_0(capsys: pytest.CaptureFixture) -> None:
    shown = plan(capsys, "slimpajama-8b-bridge")
    pretrain = shown[shown.index("# stage pretrain (") : shown.index("# estimates")]
    assert_golden("lepton/pretrain-bridge.txt", normalize(pretrain))
    assert "torch.distributed.run --nproc_per_node=8 --tee=3 --nnodes=8" in pretrain
    assert '--node_rank=\\"$LEPTON_JOB_WORKER_INDEX\\"' in pretrain and "bridge_pretrain.py" in pretrain
    assert '"completions": 8' in pretrain and '"intra_job_communication": true' in pretrain
    assert "lep job create --name bp-pretrain-" in pretrain


def test_every_bundled_job_is_what_the_sdk_models_hold_and_its_checks_accept() -> None:
    job_models = pytest.importorskip("leptonai.api.v2.types.job")
    from leptonai.api.v2.job_validation import validate_job_create

    for name in PIPELINES:
        backend, made = requests(name)
        for request in made:
            payload = backend.render(request).payload["job"]
            model = job_models.LeptonJob(**payload)
            validate_job_create(model)  # the SDK's own checks before create: name, env names, mounts, labels
            dumped = model.model_dump(by_alias=True, exclude_none=True, mode="json")
            # every key and value as the SDK holds them: nothing dropped or changed by its models
            assert {key: dumped["spec"].get(key) for key in payload["spec"]} == payload["spec"], request.label
            assert dumped["metadata"]["labels"] == payload["metadata"]["labels"]
            assert len(payload["metadata"]["id"]) <= 36


def test_ranks_come_from_the_workers_own_variables() -> None:
    """WORKER_LAUNCHER as a worker runs it: worker 1 of 2, 2 processes -> ranks 2 and 3 of 4, lines prefixed."""
    program = [
        sys.executable,
        "-c",
        "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'])",
    ]
    env = {
        "PATH": "/usr/bin:/bin",
        "BCP_PIPELINE_PROCESSES": "2",
        "LEPTON_JOB_WORKER_INDEX": "1",
        "LEPTON_JOB_TOTAL_WORKERS": "2",
    }
    done = subprocess.run(
        ["bash", "-c", render.WORKER_LAUNCHER, "w", *program], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank2]:2 4 0", "[rank3]:3 4 1"]
    failing = subprocess.run(
        ["bash", "-c", render.WORKER_LAUNCHER, "w", "sh", "-c", "exit 7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert failing.returncode == 7  # the program's own code, not the line prefixer's
    outside = subprocess.run(
        ["bash", "-c", render.WORKER_LAUNCHER, "w", "true"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert outside.returncode != 0 and "not a Lepton worker" in outside.stderr


def test_secrets_are_referenced_by_name_never_by_value() -> None:
    backend, made = requests("demo", "download.lepton.secrets=[hf-token:HF_TOKEN]")
    request = next(r for r in made if r.stage.name == "download" and r.kind == "stage")
    envs = backend.render(request).payload["job"]["spec"]["envs"]
    assert {"name": "HF_TOKEN", "value_from": {"secret_name_ref": "hf-token"}} in envs
    assert not any(e["name"] == "HF_TOKEN" and "value" in e for e in envs)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("download.lepton.secrets=[hf-token]", "lepton secret 'hf-token' must be SECRET:ENV"),
        ("download.lepton.env={'bad-name': 'x'}", "lepton env name 'bad-name' is not a valid variable name"),
    ],
)
def test_bad_sections_are_refused_naming_the_stage(override: str, says: str) -> None:
    backend, made = requests("demo", override)
    request = next(r for r in made if r.stage.name == "download" and r.kind == "stage")
    with pytest.raises(SubmissionError, match="stage download") as refused:
        backend.render(request)
    assert says in str(refused.value)


def test_job_ids_fit_the_sdk_s_rule_and_differ_by_attempt() -> None:
    backend, made = requests("demo")
    request = made[0]
    long = JobRequest(
        run_id="r", pipeline=request.pipeline, stage=request.stage, kind="verify", program="p", args=(), attempt=2
    )
    ids = {render.job_id(request), render.job_id(long)}
    assert len(ids) == 2 and all(len(i) <= 36 and i[0].isalpha() and i == i.lower() for i in ids)


def test_every_native_state_is_mapped_and_an_unknown_one_is_not_finished() -> None:
    job_types = pytest.importorskip("leptonai.api.v2.types.job")
    assert {s.value.upper() for s in job_types.LeptonJobState} == set(STATE_MAP)

    def job(state: str, **extra) -> dict:
        return {"metadata": {"id": "j"}, "status": {"state": state, **extra}}

    assert status_of(job("Completed")).state is JobState.SUCCEEDED
    assert status_of(job("Stopped")).state is JobState.CANCELLED
    assert status_of(job("Deleted")).state is JobState.CANCELLED
    assert status_of(job("Queueing")).state is JobState.QUEUED
    assert status_of(job("Restarting")).state is JobState.RUNNING
    assert status_of(job("SomethingNew")).state is JobState.UNKNOWN
    assert not status_of(job("SomethingNew")).state.finished
    archived = job("Archived", job_history=[{"state": "Running"}, {"state": "Failed"}], failed=1)
    assert status_of(archived).state is JobState.FAILED and "1 failed" in status_of(archived).detail
    assert status_of(job("Archived")).state is JobState.UNKNOWN


def test_the_docs_example_plans_on_lepton(tmp_path, capsys: pytest.CaptureFixture) -> None:
    """docs/backends/lepton.md's example merged over the bundled pipelines (as test_docs merges the EKS one): it
    plans on Lepton, the download with its secret by name, the training on 8 H100 workers of 8 ranks."""
    import json

    import yaml

    page = (REPO / "docs" / "backends" / "lepton.md").read_text()
    example = yaml.safe_load(page.split("### A DGX Cloud Lepton example", 1)[1].split("```yaml", 1)[1].split("```")[0])

    def merged(base: dict, extra: dict) -> dict:
        out = dict(base)
        for key, value in extra.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    raw = merged(yaml.safe_load((REPO / "pipelines.yaml").read_text()), example)
    raw["stages_dir"] = str(REPO / "stages")
    config = tmp_path / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    capsys.readouterr()
    assert main(["--config", str(config), "plan", "slimpajama-8b-bridge", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["backend"] == "lepton"
    jobs = {job["stage"]: job["job"]["spec"] for job in plan["jobs"] if job["kind"] == "stage"}
    assert {"name": "HF_TOKEN", "value_from": {"secret_name_ref": "hf-token"}} in jobs["download"]["envs"]
    assert jobs["pretrain"]["resource_shape"] == "gpu.8xh100-sxm" and jobs["pretrain"]["completions"] == 8
    assert jobs["pretrain"]["affinity"] == {"allowed_dedicated_node_groups": ["h100-ng"]}
    assert jobs["pretrain"]["queue_config"] == {"priority_class": "mid-4000"}
