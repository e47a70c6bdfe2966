"""The Lepton backend end to end: NVIDIA's own SDK (leptonai 0.47.1) against the Lepton API EMULATOR
(tests/fakes/lepton_api.py, one for the module), the orchestrator as the user runs it.

1. the demo's data stages give the local run's bytes; the orchestrator SIGKILLed while the download's job is
   queued, `run` again re-attaches to that job (no second one) and the run ends with those bytes;
2. a failed worker, a worker the service retried (max_failure_retry), a quota refused at create time, a job stopped
   by someone else and a job the service lost each end the stage as they should, the service's reason in `status`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml
from support.cli import cli, latest
from support.pipeline_fixtures import REPO, start_orchestrator, wait_for, without_training

from bcp_pipeline.engine.state import StageStatus

pytest.importorskip("leptonai.api.v2.client", reason="NVIDIA's Lepton SDK (pip install 'bcp-pipeline[lepton]')")
sys.path.insert(0, str(REPO / "tests" / "fakes"))
from lepton_control import FakeLepton  # noqa: E402


def demo_config(root: Path, backends: dict) -> Path:
    """The bundled demo's data stages (no pretrain) in a project of its own, with these backend options."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    without_training(demo["stages"])
    raw = {
        "version": raw.get("version", 1),
        "stages_dir": str(REPO / "stages"),
        "backends": {**(raw.get("backends") or {}), **backends},
        "pipelines": {"demo": demo},
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "pipelines.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root / "pipelines.yaml"


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` by relative path, but the completion records (times, hosts) and the backend's own
    `.bcp-pipeline` folder (stages/ copied there)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and ".completions" not in p.relative_to(root).parts
        and ".bcp-pipeline" not in p.relative_to(root).parts
    }


def options(folder: str) -> dict:
    """backends.lepton for a test: its own folder of the emulated storage, quick polls, this interpreter."""
    return {
        "lepton": {
            "python": sys.executable,
            "poll_seconds": 0.1,
            "poll_max_seconds": 0.3,
            "image": "nvcr.io/nvidia/pytorch:25.01-py3",
            "storage_path": f"/{folder}",
            "node_group": "ng-demo",
        }
    }


@pytest.fixture(scope="module")
def lepton(tmp_path_factory: pytest.TempPathFactory):
    with FakeLepton(tmp_path_factory.mktemp("lepton-emulator")) as fake:
        yield fake


@pytest.fixture
def lepton_env(lepton, monkeypatch: pytest.MonkeyPatch) -> FakeLepton:
    for key, value in lepton.env().items():
        monkeypatch.setenv(key, value)
    lepton.settings(rules=[], quota_cpu=64, quota_gpu=8)
    return lepton


def test_the_demo_gives_the_local_bytes_and_a_killed_orchestrator_re_attaches(
    lepton_env: FakeLepton, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    local = demo_config(tmp_path / "local", {})
    assert cli(local, "run", "demo", "--backend", "local") == 0
    expected = tree(local.parent / ".bcp-pipeline/workspaces/demo")

    config = demo_config(tmp_path / "p", options("demo"))
    lepton_env.settings(rules=[{"prefix": "bp-download-", "hold": True}])  # the download's job stays Queueing
    orchestrator = start_orchestrator(config, "run", "demo", "--backend", "lepton")
    try:
        held = wait_for(
            lambda: [
                i for i, j in lepton_env.jobs().items() if i.startswith("bp-download-") and j["state"] == "Queueing"
            ],
            timeout=120,
            what="the download's job queued",
        )
        time.sleep(0.5)  # its id recorded
        orchestrator.kill()  # SIGKILL: no clean-up at all
        orchestrator.communicate(timeout=30)
        assert lepton_env.jobs()[held[0]]["state"] == "Queueing"  # the job outlived its orchestrator
        again = start_orchestrator(config, "run", "demo", "--backend", "lepton")
        time.sleep(2)
        assert again.poll() is None, again.communicate()[0]  # re-attached and waiting on the queued job
        lepton_env.release("bp-download-")
        output, _ = again.communicate(timeout=240)
        assert again.returncode == 0, output
    finally:
        for process in (orchestrator, locals().get("again")):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate(timeout=30)
    state = latest(config)
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    downloads = [
        i
        for i, j in lepton_env.jobs().items()
        if i.startswith("bp-download-")
        and not i.startswith("bp-download-validation-")  # the held-out split's own stage
        and j["labels"]["bcp-pipeline.run"] == state.run_id
    ]
    assert sorted(downloads) == sorted({held[0], *[i for i in downloads if "-v-" in i]}), downloads
    assert tree(lepton_env.storage("demo/demo")) == expected
    capsys.readouterr()
    assert cli(config, "logs", state.run_id, "download") == 0
    shown = capsys.readouterr().out
    assert "[rank3]:" in shown and "==> worker" in shown, shown  # 2 workers x 2 processes, each rank's lines
    assert cli(config, "logs", state.run_id, "download", "--follow", "--rank", "3") == 0  # worker 1's, then ends
    followed = capsys.readouterr().out
    rank3 = [line.removeprefix("[rank3]:") for line in shown.splitlines() if line.startswith("[rank3]:")]
    assert followed.splitlines() == rank3, followed


def one_stage(root: Path, folder: str, lepton: dict | None = None) -> Path:
    """A pipeline of one quick stage (the demo's sample) on Lepton, with these extra lepton: keys."""
    raw = yaml.safe_load(demo_config(root, options(folder)).read_text())
    demo = raw["pipelines"]["demo"]
    demo["stages"] = {"sample": {**demo["stages"]["sample"], "lepton": {"replicas": 2, **(lepton or {})}}}
    config = root / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def status_text(config: Path, capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    cli(config, "status")
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("case", "section", "rules", "ends", "says"),
    [
        (
            "failed-worker",
            {},
            [{"prefix": "bp-sample-", "fail_worker": 1, "code": 3, "times": 1}],
            StageStatus.FAILED,
            "BackoffLimitExceeded: worker 1 exited with code 3",
        ),
        (
            "retried-worker",
            {"max_failure_retry": 1},
            [{"prefix": "bp-sample-", "fail_worker": 1, "times": 1}],
            StageStatus.SUCCEEDED,
            None,
        ),
        ("quota", {"replicas": 2, "resource_shape": "gpu.8xh100-sxm"}, [], StageStatus.FAILED, "ResourceQuotaExceeded"),
        ("unknown-shape", {"resource_shape": "gpu.9xh900"}, [], StageStatus.FAILED, "is not supported"),
    ],
)
def test_the_service_s_outcomes_end_the_stage_with_its_reason(
    lepton_env: FakeLepton, tmp_path: Path, capsys: pytest.CaptureFixture, case, section, rules, ends, says
) -> None:
    config = one_stage(tmp_path / "p", case, section)
    lepton_env.settings(rules=rules)
    run = start_orchestrator(config, "run", "demo", "--backend", "lepton")
    output, _ = run.communicate(timeout=120)
    state = latest(config)
    assert state.stages["sample"].status is ends, output[:3000]
    if says:
        assert says in status_text(config, capsys)


@pytest.mark.parametrize(("case", "ends"), [("stopped", StageStatus.CANCELLED), ("lost", StageStatus.FAILED)])
def test_a_job_stopped_by_a_user_or_lost_by_the_service(
    lepton_env: FakeLepton, tmp_path: Path, capsys: pytest.CaptureFixture, case, ends
) -> None:
    from leptonai.api.v2.client import APIClient

    config = one_stage(tmp_path / "p", case)
    lepton_env.settings(rules=[{"prefix": "bp-sample-", "hold": True}])
    orchestrator = start_orchestrator(config, "run", "demo", "--backend", "lepton")
    try:
        job = wait_for(
            lambda: [
                i for i, j in lepton_env.jobs().items() if i.startswith("bp-sample-") and j["state"] == "Queueing"
            ],
            timeout=60,
            what="the job queued",
        )[0]
        time.sleep(0.5)
        if case == "stopped":  # as `lep job stop` does it
            APIClient().job.update(job, spec={"spec": {"stopped": True}})
        else:
            lepton_env.vanish(job)
        lepton_env.settings(rules=[])  # a job submitted again runs
        output, _ = orchestrator.communicate(timeout=120)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
            orchestrator.communicate(timeout=30)
    stage = latest(config).stages["sample"]
    shown = status_text(config, capsys)
    assert stage.status is ends, (output, shown)
    assert ("Stopped" if case == "stopped" else "lost") in shown, shown


def test_check_reads_the_workspace_and_runs_a_probe_job(
    lepton_env: FakeLepton, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = one_stage(tmp_path / "p", "check", {"secrets": ["hf-token:HF_TOKEN"]})
    lepton_env.settings(secrets={"hf-token": "not-shown"})
    capsys.readouterr()
    assert cli(config, "check", "demo", "--backend", "lepton") == 0, capsys.readouterr().out
    shown = capsys.readouterr().out
    assert "5 ok, 0 different, 0 could not check" in shown, shown
    assert "storage=ok" in shown and "not-shown" not in shown, shown
    lepton_env.settings(secrets={})  # the secret gone: its row says so, and no probe job runs with --no-jobs
    before = set(lepton_env.jobs())
    cli(config, "check", "demo", "--backend", "lepton", "--no-jobs")
    shown = capsys.readouterr().out
    assert "missing: hf-token" in shown, shown  # (the probe row: the last check's, so dated)
    assert set(lepton_env.jobs()) == before


def test_a_poll_is_one_list_call_whatever_the_number_of_jobs(lepton_env: FakeLepton, tmp_path: Path) -> None:
    """Held jobs of one run, listed in pages of 2 (the SDK follows them): a poll asks only `GET /jobs`, the pages
    of one list call, however many jobs it asks about."""
    from bcp_pipeline.backends.contract import JobRequest
    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.config.load import load_config

    loaded = load_config(demo_config(tmp_path / "p", options("poll")))
    pipeline = loaded.pipeline("demo")
    backend = make_backend("lepton", loaded, pipeline, tmp_path / "p/.bcp-pipeline/runs/demo-poll")
    lepton_env.settings(rules=[{"prefix": "bp-", "hold": True}], page_size_cap=2)
    ids: list[str] = []
    try:
        ids = [
            backend.submit(
                backend.render(
                    JobRequest(
                        run_id="demo-poll",
                        pipeline=pipeline,
                        stage=stage,
                        kind="stage",
                        program=stage.program,
                        args=tuple(stage.args),
                    )
                )
            )
            for stage in pipeline.stages.values()
        ]
        lepton_env.requests(clear=True)
        for count in (1, len(ids)):
            statuses = backend.poll(ids[:count])
            assert set(statuses) == set(ids[:count]) and all(s.native == "Queueing" for s in statuses.values())
        asked = lepton_env.requests()
        assert {tuple(call) for call in asked} == {("GET", "/jobs")}, asked
    finally:
        backend.cancel(ids)
        lepton_env.settings(page_size_cap=50)
        lepton_env.release("bp-")
