"""The Grid Engine backend on the test cell set up as TSUBAME4 is (tests/support/sge_cluster.py's `tsubame_cell`:
`scripts/sge-cluster start --site tsubame`): whole nodes by `-l node_f=N`, which the site's JSV turns into N hosts
(the user names no parallel environment), the group only as `qsub -g GROUP` (the site's qsub wrapper: a stand-in,
tests/fakes/tsubame_qsub) and accounting lagging by minutes (tests/fakes/slow_qacct, a fake). Grid Engine, its
JSV mechanism, the two hosts, Open MPI and torchrun are real.

- the site's rules themselves, on the cell: what qsub and the JSV accept and refuse;
- the demo's data stages, one of them over both hosts (started by mpirun, TSUBAME4's way) with only `-l node_f=2`,
  equal to a local run byte for byte;
- a NeMo pretrain over both hosts (the launcher, the training script and Apptainer stand-ins) with `-l node_f=2`;
- `check`, which verifies each job as the site's JSV changes it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support.cli import cli
from support.ge_nemo import nemo_project
from support.pipeline_fixtures import DEMO_SPREAD, GE_OPTIONS, REPO, logs_and_status, without_training
from support.sge_cluster import TSUBAME_GROUP, SgeCell, tsubame_cell  # noqa: F401 (the fixture)

from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = pytest.mark.usefixtures("tsubame_cell")
# Open MPI refuses to run as root (the test cell's jobs are root's) unless both are set: a site's users never need them.
MPIRUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
SITE_OPTIONS = {**GE_OPTIONS, "submit_args": ["-g", TSUBAME_GROUP]}


def qsub(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["qsub", "-terse", *args], input=script, capture_output=True, text=True, timeout=60)


def job_script(tmp_path: Path, *directives: str, body: str = "true") -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "#$ -S /bin/bash",
            "#$ -j y",
            f"#$ -o {tmp_path}/job-$JOB_ID.log",
            *[f"#$ {d}" for d in directives],
            body,
            "",
        ]
    )


def test_node_f_gives_whole_hosts_without_a_parallel_environment_and_the_site_s_rules_hold(
    tsubame_cell: SgeCell, tmp_path: Path
) -> None:
    """`-l node_f=2` alone: the JSV makes the job parallel over both hosts ($PE_HOSTFILE, NHOSTS 2), the group
    given by `qsub -g` reaches it; what TSUBAME4 refuses is refused, in its words, and nothing of it submitted."""
    shown = tmp_path / "shown"
    body = f'echo "$NHOSTS $(sort $PE_HOSTFILE | cut -d" " -f1,2 | tr "\\n" " ")" > {shown}'
    ran = qsub(job_script(tmp_path, "-l node_f=2", "-l h_rt=0:30:00", body=body), "-sync", "y", "-g", TSUBAME_GROUP)
    assert ran.returncode == 0, ran.stderr
    assert shown.read_text().split() == ["2", *[w for host in sorted(tsubame_cell.hosts) for w in (host, "1")]]
    refused = {
        "a #$ -g line": (
            job_script(tmp_path, f"-g {TSUBAME_GROUP}", "-l node_f=1", "-l h_rt=0:05:00"),
            [],
            "Unknown option: line 5 of the job script",
        ),
        "another's group": (
            job_script(tmp_path, "-l node_f=1", "-l h_rt=0:05:00"),
            ["-g", "tga-other"],
            "not a TSUBAME group of yours",
        ),
        "no resource type": (job_script(tmp_path, "-l h_rt=0:05:00"), [], "no resource type"),
        "a parallel environment": (
            job_script(tmp_path, "-l node_f=2", "-l h_rt=0:05:00", "-pe pe_node 2"),
            [],
            "do not name a parallel environment",
        ),
        "no h_rt": (job_script(tmp_path, "-l node_f=1"), [], "Job is rejected. h_rt must be specified."),
        "a trial run over 10 minutes": (
            job_script(tmp_path, "-l node_f=1", "-l h_rt=0:11:00"),
            [],
            "Job is rejected, h_rt can not be longer than 10 mins with this group",
        ),
    }
    for what, (script, args, words) in refused.items():
        res = qsub(script, *args)
        assert res.returncode != 0 and words in res.stderr and not res.stdout.strip(), (what, res)
    trial = qsub(job_script(tmp_path, "-l node_f=1", "-l h_rt=0:10:00"), "-h")  # a trial run: up to 10 minutes
    assert trial.returncode == 0, trial.stderr
    subprocess.run(["qdel", trial.stdout.strip()], check=True, capture_output=True)


def demo_data_project(root: Path, backend: str) -> Path:
    """The demo's data stages as a TSUBAME4 user writes them: whole nodes (node_f) everywhere, no parallel
    environment named, the group in submit_args; download over both hosts by mpirun (world 2 x 2, as the local run's
    2 replicas x 2 processes), the others array jobs of one node a task."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    without_training(demo["stages"])
    demo["defaults"]["gridengine"] = {"resources": ["node_f=1"], "h_rt": "30m"}  # the verification jobs' too
    for stage, (nodes, per_node) in DEMO_SPREAD.items():
        demo["stages"][stage]["gridengine"] = {"nodes": nodes, "processes_per_node": per_node}
    demo["stages"]["download"]["gridengine"].update(
        distributed=True, resources=["node_f=2"], start_hosts="mpirun", env=MPIRUN_AS_ROOT
    )
    raw = {
        "version": 1,
        "stages_dir": str(REPO / "stages"),
        "backends": {"gridengine": SITE_OPTIONS},
        "pipelines": {"demo": {**demo, "backend": backend}},
    }
    root.mkdir(parents=True)
    (root / "pipelines.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root / "pipelines.yaml"


def workspace_files(config: Path) -> dict[str, bytes]:
    root = config.parent / ".bcp-pipeline/workspaces/demo"
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".completions" not in p.parts
    }


def test_the_demo_s_data_stages_with_one_over_both_hosts_by_node_f_match_a_local_run(
    tsubame_cell: SgeCell, tmp_path: Path
) -> None:
    reference = demo_data_project(tmp_path / "local", "local")
    assert cli(reference, "run", "demo") == 0
    config = demo_data_project(tmp_path / "ge", "gridengine")
    assert cli(config, "run", "demo") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert all(stage.status is StageStatus.SUCCEEDED for stage in state.stages.values())
    assert workspace_files(config) == workspace_files(reference)
    # download's job named no parallel environment; the JSV's gave it both hosts, one mpirun launcher each.
    job = state.stages["download"].jobs[0].job_id
    logs = config.parent / ".bcp-pipeline/runs" / state.run_id / "logs"
    script = (logs / job / "job.sh").read_text()
    assert "#$ -l node_f=2" in script and "#$ -pe" not in script and "#$ -g" not in script
    assert sorted((logs / job / "hostfile").read_text().splitlines()) == sorted(
        f"{host} slots=1" for host in tsubame_cell.hosts
    )
    # Accounting lags by minutes here: every job's end was read from its own exit record.
    jobs = [job for stage in state.stages.values() for job in stage.jobs]
    assert all("own exit record" in job.detail for job in jobs), [job.detail for job in jobs]


def test_a_nemo_pretrain_over_both_hosts_by_node_f_trains(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The TSUBAME4 NeMo example of docs/backends/gridengine.md on the cell: two whole nodes by `-l node_f=2`, no
    parallel environment, the group by `qsub -g`; both hosts' torchruns meet and train the 30 steps."""
    config = nemo_project(tmp_path, nodes=2)
    raw = yaml.safe_load(config.read_text())
    options = raw["backends"]["gridengine"]
    del options["parallel_environment"]
    options["submit_args"] = ["-g", TSUBAME_GROUP]
    raw["pipelines"]["nemo"]["stages"]["pretrain"]["gridengine"]["resources"] = ["node_f=2"]
    raw["pipelines"]["nemo"]["verification"] = {"gridengine": {"resources": ["node_f=1"], "h_rt": "10m"}}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert cli(config, "run", "nemo", "--backend", "gridengine") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 1
    assert stage.progress["done"] == 30, stage.progress
    job = next(job for job in stage.jobs if job.kind == "stage")
    logs = config.parent / ".bcp-pipeline/runs" / state.run_id / "logs" / job.job_id
    script = (logs / "job.sh").read_text()
    assert "#$ -l node_f=2" in script and "#$ -pe" not in script and "torchrun --nnodes" in script
    assert sorted(p.name for p in logs.glob("rank-*.log")) == ["rank-00000.log", "rank-00001.log"]
    composed = yaml.safe_load(next((config.parent / "ws/main/results").glob("gpt-*/gpt-*_hydra.yaml")).read_text())
    assert composed["trainer"]["num_nodes"] == 2
    log, status = logs_and_status(config, state.run_id, "pretrain", capsys)
    assert "global_step=29.000" in log and re.search(r"30/30 steps", status), status


def test_check_verifies_each_job_as_the_site_s_jsv_changes_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`qsub -w v` judges a job before the server-side JSV changes it (-l node_f=2 would read as two node_f of one
    host): on this cell check submits each job's requests to start a day later, verifies it with `qalter -w v` and
    deletes it. What the JSV refuses (no resource type) and what the cell cannot give (node_f=3 of 2 hosts) are
    named; the probe job runs with download's requests, which stay valid."""
    config = demo_data_project(tmp_path / "p", "gridengine")
    capsys.readouterr()
    assert cli(config, "check", "demo", "--json") == 0
    rows = {row["topic"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert all(row["verdict"] == "ok" for row in rows.values()), rows
    assert "16 accepted (through the cell's JSV" in rows["qsub -w v"]["showed"], rows["qsub -w v"]
    broken = demo_data_project(tmp_path / "q", "gridengine")  # a project of its own: no earlier check's findings
    raw = yaml.safe_load(broken.read_text())
    raw["pipelines"]["demo"]["stages"]["concat"]["gridengine"]["resources"] = ["node_f=3"]
    raw["pipelines"]["demo"]["stages"]["extract"]["gridengine"]["resources"] = []
    del raw["pipelines"]["demo"]["defaults"]["gridengine"]["resources"]
    broken.write_text(yaml.safe_dump(raw, sort_keys=False))
    cli(broken, "check", "demo", "--json", "--no-jobs")
    row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["topic"] == "qsub -w v")
    assert row["verdict"] == "could not check" and "server-side JSV" in row["showed"], row  # nothing submitted
    assert cli(broken, "check", "demo", "--json") == 1
    row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["topic"] == "qsub -w v")
    assert row["verdict"] == "different", row
    assert re.search(r"stage concat: .*only offers 2 slots", row["showed"]), row["showed"]
    assert "stage extract: Unable to run job: no resource type" in row["showed"], row["showed"]
    listed = subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True, check=True).stdout
    assert not listed.strip(), listed  # every verified job deleted
