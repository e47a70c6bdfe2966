"""`bcp-pipeline check` with its probe jobs on the NGC API EMULATOR (tests/fakes/), once per transport: what each
row shows, what the probes cost announced before the first one is submitted, and no probe job outliving `check`,
also under Ctrl-C. The row readers are also given values the tool does not know: those are `different`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import project
from support.pipeline_fixtures import sigint_as_from_a_terminal

from bcp_pipeline.backends.bcp import probe_findings
from bcp_pipeline.check.run import CheckRequest, run_check

FINISHED = {"FINISHED_SUCCESS", "KILLED_BY_USER", "FAILED", "KILLED_BY_SYSTEM", "FAILED_RUN_LIMIT_EXCEEDED"}


def bcp_project(tmp_path, fake):
    fake.create_workspace("demo")
    return project(tmp_path / "project", f"  bcp: {{transport: {fake.transport}}}\n")


@pytest.mark.both_transports
def test_where_the_last_ranks_lines_land():
    def rank(number: int, world: int = 2) -> str:
        return f"BCPP-RANK rank={number} world={world} replica={number} slurm=unset/unset/unset\n"

    row = probe_findings.last_rank_row(plan(), {0: rank(0) + rank(1), 1: ""})  # replica 0's bcprun starts all
    assert row.verdict.value == "ok" and "rank 1 printed in the log of replica 0" in row.showed
    row = probe_findings.last_rank_row(plan(), {0: rank(0), 1: rank(1)})  # each replica's bcprun its own ranks
    assert row.verdict.value == "ok" and "rank 1 printed in the log of replica 1" in row.showed
    three = {0: rank(0, 3), 1: rank(2, 3), 2: rank(1, 3)}  # a log neither `status` nor the report reads
    row = probe_findings.last_rank_row(plan(3), three)
    assert row.verdict.value == "different" and "rank 2 printed in the log of replica 1" in row.showed
    assert "`bcp-pipeline logs RUN pretrain --rank 1`" in row.meaning
    assert probe_findings.last_rank_row(plan(), {0: rank(0), 1: None}).verdict.value == "could not check"


@needs_ngcsdk
def test_probe_jobs_on_the_emulator(tmp_path, fake):
    config = bcp_project(tmp_path, fake)
    announced = []

    def announce(line: str) -> None:  # the cost is said before anything is submitted
        announced.append((line, len(fake.jobs())))

    result, path = run_check(
        CheckRequest(config_file=config, state_root=tmp_path / "state", pipeline="demo", backend="bcp"),
        dict(os.environ),
        announce,
    )
    verdicts = {row.topic: row.verdict.value for row in result.rows}
    probe_topics = [
        "replicas",
        "job environment",
        "bcprun",
        "last rank's lines",
        "nsys file names",
        "python",
        "workspace mount",
        "labels",
        "status history",
        "job logs",
        "kill",
        "preemption",
    ]
    assert {t: verdicts[t] for t in probe_topics} == dict.fromkeys(probe_topics, "ok"), [
        r.as_json() for r in result.rows if r.verdict.value != "ok"
    ]
    assert announced and announced[0][1] == 0 and "instance-minutes" in announced[0][0]
    probe = result.facts["probe"]
    assert probe["instance"] == "dgxa100.80g.1.norm" and probe["replicas"] == 2  # the ACE's smallest, multinode
    assert probe["commandline_runs"] == "per_replica"
    assert probe["bcprun"]["present"] and probe["bcprun"]["in_single_replica_jobs"]
    assert probe["bcprun"]["slurm_variables"] == "unset"  # the bcprun stand-in sets none (the real one: unknown)
    assert probe["kill_seconds"] is not None and probe["runonce_preemption"] == "resumable"  # the emulator's default
    jobs = fake.jobs()
    assert len(jobs) == 2 and {fake.status(j) for j in jobs} == {"FINISHED_SUCCESS", "KILLED_BY_USER"}
    assert not any(fake.workspace_path("demo").glob(".bcpp-check-*"))  # the marker is removed by the second job
    assert path.is_file()


@needs_ngcsdk
def test_a_check_without_jobs_keeps_what_the_probe_jobs_found(tmp_path, fake):
    config = bcp_project(tmp_path, fake)

    def check(jobs: bool):
        return run_check(
            CheckRequest(config_file=config, state_root=tmp_path / "state", pipeline="demo", backend="bcp", jobs=jobs),
            dict(os.environ),
        )

    full, path = check(True)
    probed = {row.topic: row.verdict.value for row in full.rows}
    assert probed["bcprun"] == "ok" and full.facts["probe"]["bcprun"]["present"]
    free, again = check(False)
    assert again == path and len(fake.jobs()) == 2  # no new job
    saved = json.loads(path.read_text())
    rows = {row["topic"]: row for row in saved["rows"]}
    assert set(rows) >= set(probed)  # nothing unlearnt
    assert rows["bcprun"]["verdict"] == "ok" and "(as of the check of " in rows["bcprun"]["showed"]
    assert saved["facts"]["probe"] == full.facts["probe"]
    assert any("that --no-jobs cannot make" in note and "bcprun" in note for note in free.notes), free.notes


@needs_ngcsdk
def test_ctrl_c_kills_the_probe_jobs(tmp_path, fake):
    """`check` as a real subprocess, interrupted while its probe job is held QUEUED by the emulator."""
    config = bcp_project(tmp_path, fake)
    fake.hold_queued(name="bcp-pipeline.check")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "check", "demo", "--backend", "bcp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        preexec_fn=sigint_as_from_a_terminal,
    )
    try:
        deadline = time.monotonic() + 60
        while not fake.jobs():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "instance-minutes" in out.split("\n")[0]  # announced first
    statuses = {job_id: fake.status(job_id) for job_id in fake.jobs()}
    assert statuses and set(statuses.values()) <= FINISHED, statuses
    assert not (tmp_path / "project" / ".bcp-pipeline" / "checks").is_dir() or not list(
        (tmp_path / "project" / ".bcp-pipeline" / "checks").glob("*.json")
    )


# -- values the tool does not know are `different`, never ok ---------------------------------------------------------
def plan(replicas: int = 2) -> probe_findings.ProbePlan:
    return probe_findings.ProbePlan(
        instance="i",
        replicas=replicas,
        image="x",
        workspace=None,
        mount=None,
        bcprun_flags=["--nnodes", str(replicas), "--npernode", "1"],
        token="t",
    )


def test_an_unknown_array_type_is_different():
    logs = {r: f"BCPP-PROBE replica={r} size=2 job=7 type=PyTorchJobV2 shell=/bin/bash\n" for r in range(2)}
    row = probe_findings.env_row(plan(), logs, "7")
    assert (
        row.verdict.value == "different" and "NGC_ARRAY_TYPE=PyTorchJobV2 (not a value this tool knows)" in row.showed
    )
    logs = {r: f"BCPP-PROBE replica={r} size=2 job=7 type=PyTorchJob shell=/bin/bash\n" for r in range(2)}
    assert probe_findings.env_row(plan(), logs, "7").verdict.value == "ok"  # NVIDIA's scripts' spelling


def test_an_unknown_status_in_the_history_is_different():
    row = probe_findings.history_row(["CREATED", "QUEUED", "WARMING_UP", "RUNNING", "FINISHED_SUCCESS"])
    assert row.verdict.value == "different" and "not known: WARMING_UP" in row.showed
    kill = probe_findings.kill_row(3.0, ["PENDING_TERMINATION", "TERMINATED_GRACEFULLY"])
    assert kill.verdict.value == "different"
    assert probe_findings.kill_row(3.0, ["PENDING_TERMINATION", "KILLED_BY_USER"]).verdict.value == "ok"


def test_ranks_that_are_not_each_their_own_are_different():
    logs = {
        0: "BCPP-BCPRUN present /x\nBCPP-RANK rank=0 world=1\nBCPP-BCPRUN-EXIT 0\n",
        1: "BCPP-BCPRUN present /x\nBCPP-RANK rank=0 world=1\nBCPP-BCPRUN-EXIT 0\n",
    }
    row = probe_findings.bcprun_row(plan(), logs, "BCPP-SINGLE bcprun=/x\n")
    assert row.verdict.value == "different" and "0/1, 0/1" in row.showed
    row = probe_findings.bcprun_row(
        plan(),
        {0: logs[0].replace("world=1", "world=2"), 1: logs[1].replace("rank=0 world=1", "rank=1 world=2")},
        "BCPP-SINGLE bcprun=absent\n",
    )
    assert row.verdict.value == "ok" and "absent in a one-replica job" in row.showed  # not needed there
    row = probe_findings.bcprun_row(plan(), {0: "BCPP-BCPRUN absent\n", 1: "BCPP-BCPRUN absent\n"}, "")
    assert row.verdict.value == "different" and "bcprun absent in the 2-replica job" in row.showed


def test_what_bcprun_sets_for_nsys_file_names():
    def rank(node: int, proc: int, slurm: str) -> str:
        return f"BCPP-RANK rank={proc} world=2 replica={node} slurm={slurm}\n"

    unique = {0: rank(0, 0, "7/0/0"), 1: rank(1, 1, "7/1/1")}
    assert probe_findings.nsys_names_row(unique).verdict.value == "ok"
    assert probe_findings.slurm_variables(unique) == "set"
    unset = {0: rank(0, 0, "unset/unset/unset"), 1: rank(1, 1, "unset/unset/unset")}
    assert probe_findings.nsys_names_row(unset).verdict.value == "ok"
    assert probe_findings.slurm_variables(unset) == "unset"
    same = {0: rank(0, 0, "7/0/0"), 1: rank(1, 1, "7/0/0")}
    row = probe_findings.nsys_names_row(same)
    assert row.verdict.value == "different" and "7/0/0, 7/0/0" in row.showed
    assert probe_findings.nsys_names_row({0: "", 1: None}).verdict.value == "could not check"


def test_a_commandline_on_neither_model_is_different():
    ended = type("S", (), {"native": "FINISHED_SUCCESS", "detail": ""})()
    logs = {0: "", 1: "BCPP-PROBE replica=1 size=2\n"}  # only replica 1: neither every replica nor the launcher
    assert probe_findings.replicas_row(plan(), logs, ended).verdict.value == "different"
    assert probe_findings.replicas_row(plan(), {0: "BCPP-PROBE replica=0\n", 1: ""}, ended).verdict.value == "ok"


@needs_ngcsdk
def test_no_probe_job_where_it_would_fail_on_what_the_look_ups_showed(tmp_path, fake):
    """No workspace `demo`: the probe would mount it, so it is not submitted (nothing paid for a known failure)."""
    config = project(tmp_path / "project", f"  bcp: {{transport: {fake.transport}}}\n")
    result, _ = run_check(
        CheckRequest(config_file=config, state_root=tmp_path / "state", pipeline="demo", backend="bcp"),
        dict(os.environ),
    )
    rows = {row.topic: row for row in result.rows}
    assert rows["workspace"].verdict.value == "different"
    assert rows["probe job"].verdict.value == "could not check" and "workspace" in rows["probe job"].showed
    assert fake.jobs() == {}
