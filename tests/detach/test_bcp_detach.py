"""`run --detach` on the emulated BCP: the orchestrator runs as a driver job, through ngcsdk, inside the emulator
(tests/fakes/ngc_api.py, an EMULATOR of the NGC API, named so), while the laptop (this test) only looks at it.

The driver's job gets the API key only from the BCP secret the job names; these tests give the emulator a canary
key and look for it everywhere afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
from ngc_control import FakeNgc
from support.bcp_emulation import needs_ngcsdk
from support.cli import cli
from support.golden_files import REPO
from support.pipeline_fixtures import bcp_chain_config, stall_stage, wait_for, write_chain_project

from bcp_pipeline.backends.profile import profile_key, save_profile
from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = needs_ngcsdk

SECRET = "bcp-pipeline-ngc"
DRIVER_LABEL = "bcpp_kind_driver"


@pytest.fixture
def project(tmp_path, fake):
    fake.set_secret(SECRET, {"api_key": fake.api_key})
    text = bcp_chain_config(fake.transport).replace(
        "poll_max_seconds: 0.3}", "poll_max_seconds: 0.3, driver: {total_runtime: 1h, handover_before: 10m}}"
    )
    # Slow enough that a test can kill the driver while `second` runs.
    text = text.replace("--name, second]", "--name, second, --sleep, '0.3']")
    return write_chain_project(tmp_path / "project", text)


def local_state(config: Path):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def driver_jobs(fake: FakeNgc) -> list[dict]:
    return sorted(
        (r["job"] for r in fake.jobs().values() if DRIVER_LABEL in _labels(r["job"])), key=lambda job: job["id"]
    )


def stage_jobs(fake: FakeNgc) -> list[dict]:
    return [r["job"] for r in fake.jobs().values() if DRIVER_LABEL not in _labels(r["job"])]


def _labels(job: dict) -> list[str]:
    return job.get("labels", {}).get("userLabels", {}).get("values", []) or job["jobDefinition"].get("userLabels", [])


def wait_for_driver(fake: FakeNgc, statuses: set[str], index: int = -1, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        drivers = driver_jobs(fake)
        if drivers and len(drivers) > (index if index >= 0 else 0):
            job = drivers[index]
            if job["jobStatus"]["status"] in statuses:
                return job
        time.sleep(0.2)
    raise AssertionError(
        f"no driver reached {statuses}; drivers: "
        f"{[(j['id'], j['jobStatus']['status']) for j in driver_jobs(fake)]}\n{_driver_logs(fake)}"
    )


def _driver_logs(fake: FakeNgc) -> str:
    return "\n".join(
        (fake.home / "jobs" / str(j["id"]) / "results" / "0" / "joblog.log").read_text(errors="replace")[-3000:]
        for j in driver_jobs(fake)
    )


def status_json(config: Path, capsys, run_id: str) -> dict:
    capsys.readouterr()
    assert cli(config, "status", run_id, "--json") == 0
    return json.loads(capsys.readouterr().out)


def submissions_per_stage(fake: FakeNgc) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for job in stage_jobs(fake):
        labels = _labels(job)
        stage = next(label for label in labels if label.startswith("bcpp_stage_"))[len("bcpp_stage_") :]
        kind = next(label for label in labels if label.startswith("bcpp_kind_"))[len("bcpp_kind_") :]
        counts[(stage, kind)] = counts.get((stage, kind), 0) + 1
    return counts


def assert_once_per_attempt(fake: FakeNgc, state) -> None:
    """From the emulator's records: each stage job was submitted once per attempt the run recorded."""
    counts = submissions_per_stage(fake)
    for name, stage in state.stages.items():
        name = name.replace("-", "_")  # as in its label
        assert counts.get((name, "stage"), 0) == stage.attempts == len([j for j in stage.jobs if j.kind == "stage"]), (
            name,
            counts,
        )


@pytest.mark.both_transports
def test_detached_run_completes_under_the_driver_job(fake, project, capsys):
    # `second` waits until this test has seen it running through `status` (a loaded machine could otherwise run
    # the whole chain between two status calls).
    stall = stall_stage(fake.workspace_path("main"), "second")
    started = time.monotonic()
    assert cli(project, "run", "chain", "--backend", "bcp", "--detach") == 0
    assert time.monotonic() - started < 30
    out = capsys.readouterr().out
    run_id = local_state(project).run_id
    assert f"run {run_id} (chain) is detached: driver job" in out and f"bcp-pipeline status {run_id}" in out
    # No orchestrator here: main() returned; the stages run under the driver job.
    seen_running = False
    deadline = time.monotonic() + 400  # an upper bound only: CI's machine is loaded by a cold build beside it
    while time.monotonic() < deadline:
        payload = status_json(project, capsys, run_id)
        if payload["stages"]["second"]["status"] == "running":
            seen_running = True
            stall.unlink(missing_ok=True)
        if payload["status"] == "succeeded":
            break
        assert payload["driver"]["jobs"], payload
        time.sleep(0.5)
    assert seen_running, ("status never showed `second` running", payload, _driver_logs(fake))
    assert payload["status"] == "succeeded", (payload, _driver_logs(fake))
    driver = wait_for_driver(fake, {"FINISHED_SUCCESS"})
    assert len(driver_jobs(fake)) == 1
    state = local_state(project)
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    assert_once_per_attempt(fake, state)
    assert state.stages["third"].verification["checks"][0]["found"] == 3
    # The workspace holds the driver's state, and the stages' outputs.
    ws = fake.workspace_path("main")
    assert json.loads((ws / ".bcp-pipeline/runs" / run_id / "state.json").read_text())["status"] == "succeeded"
    assert (ws / "third/item-0002.txt").is_file()
    # The final table, from the laptop.
    capsys.readouterr()
    assert cli(project, "status", run_id) == 0
    table = capsys.readouterr().out
    assert "third" in table and "succeeded" in table and f"driver: job {driver['id']} FINISHED_SUCCESS" in table
    assert cli(project, "logs", run_id, "driver") == 0
    assert f"run {run_id} succeeded" in capsys.readouterr().out
    assert cli(project, "cancel", run_id) == 0  # issue 50, item 12e: it said "its driver and 0 job(s) stopped"
    assert capsys.readouterr().out.strip() == (
        f"run {run_id} had already finished (succeeded): nothing to stop (no driver job was running)"
    )
    assert local_state(project).driver_owned  # left as it was
    assert cli(project, "logs", run_id, "second", "--rank", "0") == 0
    if importlib.util.find_spec("plotly"):
        assert cli(project, "report", run_id) == 0
        html = (project.parent / ".bcp-pipeline/runs" / run_id / "report.html").read_text()
        assert "chain.third-verify" in html and fake.api_key not in html
    # The key: in no call log, request log, job definition, job log, state or workspace file, nor the plan.
    assert cli(project, "plan", "chain", "--backend", "bcp", "--detach") == 0
    assert fake.api_key not in capsys.readouterr().out
    for root in (fake.home, project.parent):
        for path in root.rglob("*"):
            if path.is_file() and path.name != "secrets.json":
                assert fake.api_key not in path.read_text(errors="replace"), path
    definition = json.dumps(driver["jobDefinition"])
    assert "NGC_CLI_API_KEY" in definition and SECRET in definition  # only the secret's name


def workspace_state(fake: FakeNgc, run_id: str) -> dict:
    path = fake.workspace_path("main") / ".bcp-pipeline/runs" / run_id / "state.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def wait_until(predicate, timeout: float = 300, what: str = "condition", fake: FakeNgc | None = None):
    """pipeline_fixtures.wait_for, with the driver jobs' logs in the failure."""
    try:
        return wait_for(predicate, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_driver_logs(fake) if fake else ''}") from None


def stage_status(fake: FakeNgc, run_id: str, stage: str) -> str | None:
    return (workspace_state(fake, run_id).get("stages", {}).get(stage) or {}).get("status")


def detach(project: Path, capsys) -> str:
    assert cli(project, "run", "chain", "--backend", "bcp", "--detach") == 0
    capsys.readouterr()
    return local_state(project).run_id


def kill_driver(fake: FakeNgc, status: str = "KILLED_BY_SYSTEM") -> dict:
    import ngc_control

    driver = wait_for_driver(fake, {"RUNNING"})
    ngc_control.stop_job(fake.home, driver["id"], status, details="killed by the test")
    return wait_for_driver(fake, {status})


def wait_for_success(project: Path, capsys, run_id: str, fake: FakeNgc, timeout: float = 400) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        payload = status_json(project, capsys, run_id)
        if payload["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.5)
    assert payload["status"] == "succeeded", (payload, _driver_logs(fake))
    return payload


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_killed_driver_then_resume_detach_completes_with_no_duplicate_job(fake, project, capsys):
    run_id = detach(project, capsys)
    wait_until(lambda: stage_status(fake, run_id, "second") == "running", what="second running", fake=fake)
    killed = kill_driver(fake)
    capsys.readouterr()
    assert cli(project, "status", run_id) == 0
    out = capsys.readouterr().out
    assert f"driver: job {killed['id']} KILLED_BY_SYSTEM" in out and f"resume {run_id} --detach" in out
    assert cli(project, "resume", run_id, "--detach") == 0
    wait_for_success(project, capsys, run_id, fake)
    wait_for_driver(fake, {"FINISHED_SUCCESS"}, index=1)  # it saves the final state, then its job ends
    assert [d["jobStatus"]["status"] for d in driver_jobs(fake)] == ["KILLED_BY_SYSTEM", "FINISHED_SUCCESS"]
    state = local_state(project)
    assert_once_per_attempt(fake, state)
    assert state.stages["second"].attempts == 1  # the second driver re-attached to the job the first one started


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_driver_killed_between_submit_and_saving_the_job_id(fake, project, capsys):
    """The service created `second`'s job, but the driver died before the answer (its id) reached it."""
    fake.hold_queued(name="chain.first-verify")
    run_id = detach(project, capsys)
    wait_until(
        lambda: any(j["jobDefinition"]["name"] == "chain.first-verify" for j in stage_jobs(fake)),
        what="first's verification job",
        fake=fake,
    )
    fake.delay_requests(30, method="POST", path="/v2/org/*/jobs", after=True)  # the next submit: second's
    fake.release()
    wait_until(lambda: stage_status(fake, run_id, "second") == "submitting", what="second submitting", fake=fake)
    wait_until(
        lambda: any("chain.second" == j["jobDefinition"]["name"] for j in stage_jobs(fake)),
        what="second's job created",
        fake=fake,
    )
    kill_driver(fake)
    assert stage_status(fake, run_id, "second") == "submitting"
    assert cli(project, "resume", run_id, "--detach") == 0
    wait_for_success(project, capsys, run_id, fake)
    state = local_state(project)
    assert_once_per_attempt(fake, state)
    assert submissions_per_stage(fake)[("second", "stage")] == 1
    second_driver_log = (fake.home / "jobs" / str(driver_jobs(fake)[1]["id"]) / "results/0/joblog.log").read_text()
    assert "second: re-attached to stage job" in second_driver_log


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_driver_hands_over_to_its_successor_before_its_runtime_ends(fake, project, capsys):
    # The hand-over is due 8 s into each driver's 30 s; the 22 s left are for the successor's submission and the
    # old driver's end, which a loaded machine (CI's, beside a cold build) needs. `third` is held until a successor
    # exists, so that the run cannot end before a hand-over however fast or slow the stages are.
    project.write_text(
        project.read_text().replace(
            "driver: {total_runtime: 1h, handover_before: 10m}", "driver: {total_runtime: 30s, handover_before: 22s}"
        )
    )
    fake.hold_queued(name="chain.third", times=None)
    run_id = detach(project, capsys)
    wait_until(lambda: len(driver_jobs(fake)) >= 2, what="a successor driver job", fake=fake)
    fake.release()
    fake.clear_rules()
    wait_for_success(project, capsys, run_id, fake)
    wait_until(
        lambda: all(d["jobStatus"]["status"] == "FINISHED_SUCCESS" for d in driver_jobs(fake)),
        what="every driver job ended well",
        fake=fake,
    )
    drivers = driver_jobs(fake)
    assert len(drivers) >= 2, _driver_logs(fake)
    assert "successor driver job" in (fake.home / "jobs" / str(drivers[0]["id"]) / "results/0/joblog.log").read_text()
    status_json(project, capsys, run_id)  # the local mirror as the last driver left it (one may have started
    state = local_state(project)  # after the run succeeded, and recorded its term after the last refresh)
    assert_once_per_attempt(fake, state)
    # Never two drivers at once: each drove the run only after the one before it had ended (the emulator's
    # record of its end), and the terms the drivers recorded do not overlap.
    terms = state.detached["drivers"]
    assert [t["job_id"] for t in terms] == [str(d["id"]) for d in drivers]
    for before, after, record in zip(terms, terms[1:], drivers):
        ended = (
            max(
                h["timestamp"]
                for h in fake.jobs()[record["id"]]["jobStatusHistory"]
                if h["status"] == "FINISHED_SUCCESS"
            )
            / 1000
        )
        assert before["until"] <= after["since"] and ended <= after["since"] + 0.05, (terms, ended)


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_resumed_driver_counts_the_runtime_it_spent_before_its_preemption(fake, project, capsys):
    """--total-runtime bounds cumulative RUNNING time. Preempted after 24 s of a 60 s runtime whose hand-over is
    due at 40 s, the resumed driver must hand over 16 s later, not 40 s (which would reach 64 s and end it
    FAILED_RUN_LIMIT_EXCEEDED, with no successor). The 20 s between the hand-over and the limit are for a loaded
    machine's submission of the successor."""
    project.write_text(
        project.read_text().replace(
            "driver: {total_runtime: 1h, handover_before: 10m}", "driver: {total_runtime: 60s, handover_before: 20s}"
        )
    )
    fake.hold_queued(name="chain.third", times=None)  # the run cannot end before the hand-over is due
    run_id = detach(project, capsys)
    driver = wait_for_driver(fake, {"RUNNING"})
    time.sleep(24)  # more than handover_before: measured from its own restart, the old clock would overrun
    fake.preempt(driver["id"])
    wait_for_driver(fake, {"PREEMPTED"})
    assert cli(project, "resume", run_id, "--detach") == 0
    first = wait_for_driver(fake, {"FINISHED_SUCCESS", "FAILED_RUN_LIMIT_EXCEEDED", "FAILED"}, index=0, timeout=120)
    log = (fake.home / "jobs" / str(driver["id"]) / "results/0/joblog.log").read_text()
    assert first["jobStatus"]["status"] == "FINISHED_SUCCESS", log[-2000:]
    assert "s of its runtime spent before this start" in log and "successor driver job" in log
    fake.release()
    fake.clear_rules()
    wait_for_success(project, capsys, run_id, fake)
    assert len(driver_jobs(fake)) == 2
    assert_once_per_attempt(fake, local_state(project))


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
@pytest.mark.emulator(variants={"runonce_preemption": "not_resumable"})
def test_a_preempted_driver_bcp_will_not_resume_is_replaced_by_a_new_one(fake, project, capsys):
    """Where `check` found that BCP does not resume a preempted RUNONCE job (the driver is one), `resume --detach`
    kills the preempted driver and submits a new one, which goes on from the state the first left."""
    save_profile(
        project.parent / ".bcp-pipeline",
        profile_key("bcpp-test-org", "bcpp-test-ace"),
        {
            "key": "bcpp-test-org-bcpp-test-ace",
            "checked_at": 0.0,
            "rows": [],
            "facts": {"probe": {"runonce_preemption": "not_resumable"}},
        },
    )
    fake.hold_queued(name="chain.second", times=1)  # the run is mid-way when its driver is preempted
    run_id = detach(project, capsys)
    driver = wait_for_driver(fake, {"RUNNING"})
    wait_until(
        lambda: any(j["job"]["jobDefinition"]["name"] == "chain.second" for j in fake.jobs().values()),
        what="second's job, held queued",
        fake=fake,
    )
    fake.preempt(driver["id"])
    wait_for_driver(fake, {"PREEMPTED"})
    assert cli(project, "resume", run_id, "--detach") == 0
    assert fake.requests("PATCH", "/v2/org/*/jobs/*/resume") == []
    assert fake.status(int(driver["id"])) == "KILLED_BY_USER"
    fake.release()  # the new driver found second's job and waits for it
    wait_for_success(project, capsys, run_id, fake)
    assert len(driver_jobs(fake)) == 2
    assert_once_per_attempt(fake, local_state(project))


def test_status_says_when_the_drivers_log_cannot_be_read(fake, project, capsys):
    """Reading the driver's log is how the laptop learns the run's state: a failure is shown, never swallowed."""
    run_id = detach(project, capsys)
    driver = wait_for_driver(fake, {"RUNNING"})
    wait_until(lambda: stage_status(fake, run_id, "first"), what="a first state line", fake=fake)
    fake.fail_requests(1, method="GET", path=f"*/resultsets/{driver['id']}/replicas/*/file/joblog.log", status=403)
    assert cli(project, "status", run_id) == 0
    captured = capsys.readouterr()
    assert f"could not refresh job states: could not read the log of driver job {driver['id']}" in captured.err
    # (NVIDIA's client says no more than that: the ngc CLI exits 1 silently, ngcsdk raises a bare NgcException)
    wait_for_success(project, capsys, run_id, fake)


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_resume_without_detach_takes_the_run_back_to_this_machine(fake, project, capsys):
    run_id = detach(project, capsys)
    wait_until(lambda: stage_status(fake, run_id, "second") == "running", what="second running", fake=fake)
    assert cli(project, "resume", run_id) == 0
    out = capsys.readouterr().out
    assert f"run {run_id} taken back from its driver job(s)" in out
    assert [d["jobStatus"]["status"] for d in driver_jobs(fake)] == ["KILLED_BY_USER"]
    state = local_state(project)
    assert state.status == "succeeded" and state.detached["owner"] == "local"
    assert_once_per_attempt(fake, state)
    assert state.stages["second"].attempts == 1


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_cancel_stops_the_driver_and_the_runs_jobs_then_resume_detach_finishes(fake, project, capsys):
    # `second` is held until it has been cancelled: on a loaded machine it finished before the kill reached it
    # (2026-12-06), and a stage that ended first is rightly not cancelled.
    stall = stall_stage(fake.workspace_path("main"), "second")
    run_id = detach(project, capsys)
    wait_until(lambda: stage_status(fake, run_id, "second") == "running", what="second running", fake=fake)
    assert cli(project, "resume", run_id, "--detach") == 1  # one driver per run
    assert "is already driven by driver job" in capsys.readouterr().err
    assert cli(project, "cancel", run_id) == 0
    ended = {record["job"]["jobStatus"]["status"] for record in fake.jobs().values()}
    assert ended <= {"KILLED_BY_USER", "FINISHED_SUCCESS"} and "KILLED_BY_USER" in ended, ended
    assert local_state(project).stages["second"].status is StageStatus.CANCELLED
    stall.unlink()
    assert cli(project, "resume", run_id, "--detach") == 0
    wait_for_success(project, capsys, run_id, fake)
    assert len(driver_jobs(fake)) == 2


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_driver_without_ngcsdk_and_no_way_to_install_it_fails_fast_and_says_why(fake, project, capsys, tmp_path):
    import subprocess
    import sys

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    project.write_text(
        project.read_text().replace(
            "handover_before: 10m}", f"handover_before: 10m, python: {bare / 'bin' / 'python'}}}"
        )
    )
    run_id = detach(project, capsys)
    driver = wait_for_driver(fake, {"FAILED"}, timeout=60)
    assert cli(project, "status", run_id) == 0
    out = capsys.readouterr().out
    assert f"driver: job {driver['id']} FAILED" in out
    assert "the driver's image lacks ngcsdk==4.19.1, pyyaml" in out and "pip install" in out
    assert not stage_jobs(fake)


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_preempted_driver_is_resumed_by_resume_detach(fake, project, capsys):
    run_id = detach(project, capsys)
    wait_until(lambda: stage_status(fake, run_id, "second") == "running", what="second running", fake=fake)
    driver = wait_for_driver(fake, {"RUNNING"})
    fake.preempt(driver["id"])
    wait_for_driver(fake, {"PREEMPTED"})
    assert cli(project, "status", run_id) == 0
    assert "the driver was preempted" in capsys.readouterr().out
    assert cli(project, "resume", run_id, "--detach") == 0
    assert f"driver job {driver['id']} resumed" in capsys.readouterr().out
    wait_for_success(project, capsys, run_id, fake)
    assert len(driver_jobs(fake)) == 1
    assert_once_per_attempt(fake, local_state(project))


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_the_demo_pipeline_runs_detached(fake, tmp_path, capsys):
    """The bundled demo DAG (sample -> ... -> a small GPT pretrained on CPU), every stage submitted by the driver."""
    pytest.importorskip("megatron.core", reason="the demo's smoke pretrain needs the [pretrain] extra")
    import shutil

    fake.set_secret(SECRET, {"api_key": fake.api_key})
    fake.create_workspace("demo")
    project_dir = tmp_path / "demo"
    shutil.copytree(REPO / "stages", project_dir / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    config = project_dir / "pipelines.yaml"
    config.write_text(
        (REPO / "pipelines.yaml")
        .read_text()
        .replace(
            "\nbackends:\n", "\nbackends:\n  bcp: {transport: sdk, poll_min_seconds: 0.2, poll_max_seconds: 0.5}\n", 1
        )
    )
    started = time.monotonic()
    assert (
        cli(
            config,
            "run",
            "demo",
            "--backend",
            "bcp",
            "--detach",
            "--set",
            "vars.steps=6",
            "--set",
            "pretrain.args=[--data-dir, '${data}/preprocessed', --results, '${workspace}/results', "
            "--run-name, '${train_run}', --steps, '${steps}', --checkpoint-every, '3', --hidden, '64']",
        )
        == 0
    )
    assert time.monotonic() - started < 30
    run_id = local_state(config).run_id
    payload = wait_for_success(config, capsys, run_id, fake, timeout=400)
    counts = {name: [c["found"] for c in s["verification"]["checks"]] for name, s in payload["stages"].items()}
    assert counts["download"] == [8] and counts["concat"] == [2] and counts["tokenize-preprocess"] == [2, 2]
    assert payload["stages"]["pretrain"]["verification"]["steps"] == 6
    assert len(driver_jobs(fake)) == 1
    assert_once_per_attempt(fake, local_state(config))


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_wrong_key_in_the_secret_fails_the_driver_at_once_and_status_names_the_secret(fake, project, capsys):
    fake.set_secret(SECRET, {"api_key": "not-the-right-key"})
    run_id = detach(project, capsys)
    driver = wait_for_driver(fake, {"FAILED"}, timeout=60)
    assert cli(project, "status", run_id) == 0
    out = capsys.readouterr().out
    assert f"driver: job {driver['id']} FAILED" in out
    assert "the driver cannot call the NGC API with the key from BCP secret bcp-pipeline-ngc" in out
    assert not stage_jobs(fake)


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_missing_secret_fails_run_detach_with_nvidias_message(fake, tmp_path, capsys):
    project = write_chain_project(tmp_path / "project", bcp_chain_config(fake.transport))
    assert cli(project, "run", "chain", "--backend", "bcp", "--detach") == 1
    assert "Secret 'bcp-pipeline-ngc' not found" in capsys.readouterr().err
    assert not driver_jobs(fake)


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_429_on_the_drivers_credential_check_is_retried_and_the_driver_goes_on(fake, project, capsys):
    """NVIDIA's client never retries a 429: once read as a wrong key, it ended the driver before it started."""
    project.write_text(
        project.read_text().replace("handover_before: 10m}", "handover_before: 10m}, retry_backoff_seconds: 0.05")
    )
    fake.hold_queued(name="chain.driver")
    run_id = detach(project, capsys)
    fake.fail_requests(2, method="GET", path="/v2/org/*/jobs", status=429, message="Too Many Requests")
    fake.release()  # the driver's first call (its credential check, a job list) meets the two 429s
    wait_until(
        lambda: stage_status(fake, run_id, "first") not in (None, "pending"), what="the driver driving", fake=fake
    )
    log = (fake.home / "jobs" / str(driver_jobs(fake)[0]["id"]) / "results/0/joblog.log").read_text()
    assert "the first NGC API call: " in log and "attempt 2/5 failed, retrying" in log, log[-2000:]
    assert [r["status"] for r in fake.requests("GET", "/v2/org/*/jobs")].count(429) == 2
    wait_for_success(project, capsys, run_id, fake)
    assert len(driver_jobs(fake)) == 1
