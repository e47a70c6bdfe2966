"""The Grid Engine backend on a real two-host Son of Grid Engine cell (tests/support/sge_cluster.py: this machine, and
`node2` in its own network, UTS and mount namespaces on a private bridge; the workspace on the shared file system).

- the DDP smoke pretrain over a parallel environment, one `qrsh -inherit` launcher per host, equal to one process;
- a running task deleted with `qdel`, then `resume`, byte-identical again;
- what Grid Engine refuses or cannot start: an unknown resource, an unknown parallel environment, a job in `Eqw`,
  a job deleted while held (no accounting record);
- `cancel` of a run on the cell.
What every backend must do the same way (the demo's data stages as array jobs on both hosts, byte-identical to a
local run, with `status`, `logs` and `report`; a killed orchestrator's job re-attached by `resume`; one qstat a poll)
is tests/e2e/test_backend_conformance.py's `TestGridEngine`. Where Grid Engine cannot run here, the fixture skips
these tests and prints why.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.cli import cli
from support.ddp_pretrain import RUN_NAME, assert_trained_like_one_process, data_dir, rank_logs, reference, stage_job  # noqa: F401 (fixtures)
from support.ddp_pretrain import write_project as write_ddp_project
from support.fake_sif import write_fake_sif
from support.ge_nemo import nemo_project
from support.pipeline_fixtures import DEMO_SPREAD as SPREAD  # (array tasks, ranks per task)
from support.pipeline_fixtures import (
    GE_CHAIN,
    REPO,
    logs_and_status,
    start_orchestrator,
    wait_for,
    without_training,
    write_chain_project,
)
from support.pipeline_fixtures import GE_OPTIONS as OPTIONS
from support.sge_cluster import SgeCell, sge_cell  # noqa: F401 (the fixture)

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = pytest.mark.usefixtures("sge_cell")


def demo_project(root: Path, backend: str, **stage_extra: dict) -> Path:
    """The bundled demo pipeline without its pretrain stage (data stages only), on `backend`."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    without_training(demo["stages"])
    for stage, (nodes, per_node) in SPREAD.items():
        demo["stages"][stage]["gridengine"] = {
            "nodes": nodes,
            "processes_per_node": per_node,
            **stage_extra.get(stage, {}),
        }
    raw = {
        "version": 1,
        "stages_dir": str(REPO / "stages"),
        "backends": {"gridengine": OPTIONS},
        "pipelines": {"demo": {**demo, "backend": backend}},
    }
    root.mkdir(parents=True)
    config = root / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the completion records (they hold times and hosts), by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".completions" not in p.parts
    }


# Open MPI refuses to run as root (the test cell's jobs are root's) unless both of these are set: a site's users
# never need them.
MPIRUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.mark.parametrize("launcher, start_hosts", [("ranks", "qrsh"), ("torchrun", "qrsh"), ("ranks", "mpirun")])
def test_ddp_pretrain_over_a_parallel_environment_trains_as_one_process(
    sge_cell: SgeCell, tmp_path: Path, data_dir: Path, reference: dict, launcher: str, start_hosts: str
) -> None:
    """The smoke trainer over both hosts, its ranks started by the job script or (the TSUBAME way, as the NeMo
    training below) by one torchrun a host meeting at the first host (c10d); each host's part started by `qrsh
    -inherit`, or (TSUBAME4's multi-node scripts) by Open MPI's `mpirun -npernode 1 -hostfile`."""
    config = write_ddp_project(tmp_path / "p", data_dir)
    raw = yaml.safe_load(config.read_text())
    raw["backends"]["gridengine"] = {**OPTIONS, "workspace_dir": "ws", "parallel_environment": "pe_node"}
    raw["pipelines"]["ddp"]["stages"]["pretrain"]["gridengine"] = {
        "nodes": 2,
        "processes_per_node": 1,
        "distributed": True,
        "launcher": launcher,
        "start_hosts": start_hosts,
        **({"env": MPIRUN_AS_ROOT} if start_hosts == "mpirun" else {}),
    }
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert cli(config, "run", "ddp", "--backend", "gridengine") == 0
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    assert stage.sharding == {"replicas": 2, "processes": 1}
    job = stage_job(stage)
    logs = rank_logs(config, job)
    # One slot per host (pe_node): each rank was started on its own host, and rank 1 met rank 0 at the first host
    # of $PE_HOSTFILE, one of the cell's two, across the bridge.
    met = re.search(r"^rank 1 of 2: met at (\S+):\d+ \(gloo, cpu\)", logs[1], re.MULTILINE)
    assert met and met.group(1) in sge_cell.hosts, logs[1]
    assert_trained_like_one_process(
        config.parent / "ws/main/results" / RUN_NAME / "train_summary.json", logs, reference
    )
    store = RunStore(config.parent / ".bcp-pipeline")
    job_logs = store.run_dir(store.latest().run_id) / "logs"
    assert (job_logs / job / "task-1.exit").read_text() == "0\n"  # the job's own exit record, with either start
    if start_hosts == "mpirun":
        hostfile = (job_logs / job / "hostfile").read_text().splitlines()
        assert sorted(hostfile) == sorted(f"{host} slots=1" for host in sge_cell.hosts), hostfile
        assert "may start the other hosts with ssh" not in (job_logs / f"sge-{job}.log").read_text()  # qrsh found


def alive(pid: int) -> bool:
    """The process runs (a zombie, killed but not yet reaped, counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_qdel_ends_every_host_s_ranks_started_by_mpirun(sge_cell: SgeCell, tmp_path: Path) -> None:
    """Open MPI under Grid Engine starts the other host by `qrsh -inherit` (tight integration): deleting the job ends
    the ranks on both hosts, and Grid Engine's accounting says the job was deleted while running."""
    pids = tmp_path / "pids"
    pids.mkdir()
    config = demo_project(
        tmp_path / "p",
        "gridengine",
        download={
            "nodes": 2,
            "processes_per_node": 2,
            "distributed": True,
            "parallel_environment": "pe_node",
            "start_hosts": "mpirun",
            "env": MPIRUN_AS_ROOT,
            "command": ["bash", "-c", f'echo "$$ $(hostname)" > {pids}/rank-$RANK; exec sleep 300'],
        },
    )
    backend, pipeline = backend_for(config)
    from bcp_pipeline.backends.contract import JobRequest

    stage = pipeline.stages["download"]
    request = JobRequest(
        run_id="manual", pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
    )
    job = backend.submit(backend.render(request))
    wait_for(
        lambda: len(list(pids.glob("rank-*"))) == 4 and all(p.read_text().endswith("\n") for p in pids.glob("rank-*")),
        timeout=90,
        what="the 4 ranks on both hosts",
    )
    started = {p.name: p.read_text().split() for p in pids.glob("rank-*")}
    assert {host for _, host in started.values()} == set(sge_cell.hosts), started
    assert all(alive(int(pid)) for pid, _ in started.values())
    subprocess.run(["qdel", job], check=True, capture_output=True)
    wait_for(
        lambda: not any(alive(int(pid)) for pid, _ in started.values()), timeout=30, what="every rank ended by qdel"
    )
    status = poll_until(backend, job)
    assert status.state is JobState.CANCELLED, status


def backend_for(config: Path):
    loaded = load_config(config)
    pipeline = loaded.pipelines["demo"]
    run_dir = config.parent / ".bcp-pipeline/runs/manual"
    return make_backend("gridengine", loaded, pipeline, run_dir), pipeline


def submit_sleeper(backend, pipeline, tmp_path: Path, *directives: str) -> str:
    """A bare job script through the backend's own submit (the stage renderer is tested above)."""
    from bcp_pipeline.backends.contract import JobRequest, Submission

    request = JobRequest(
        run_id="manual", pipeline=pipeline, stage=pipeline.stages["sample"], kind="stage", program="sample.py", args=()
    )
    script = "\n".join(
        [
            "#!/bin/bash",
            "#$ -N manual.sleeper",
            "#$ -j y",
            f"#$ -o {tmp_path}/sleeper.log",
            *[f"#$ {d}" for d in directives],
            "sleep 30",
            "",
        ]
    )
    return backend.submit(Submission(request=request, printable=script))


def poll_until(backend, job_id: str, timeout: float = 60):
    found = {}

    def finished() -> bool:
        found.update(backend.poll([job_id]))
        return job_id in found and found[job_id].state.finished

    wait_for(finished, timeout=timeout)
    return found[job_id]


def test_a_job_deleted_while_held_is_cancelled_and_one_deleted_while_running_too(tmp_path: Path) -> None:
    config = demo_project(tmp_path / "p", "gridengine")
    backend, pipeline = backend_for(config)
    held = submit_sleeper(backend, pipeline, tmp_path, "-h")
    assert backend.poll([held])[held].state is JobState.QUEUED  # hqw
    backend.cancel([held])
    status = poll_until(backend, held)
    assert status.state is JobState.CANCELLED and "deleted before it started" in status.detail

    running = submit_sleeper(backend, pipeline, tmp_path)
    wait_for(
        lambda: backend.poll([running]).get(running) and backend.poll([running])[running].state is JobState.RUNNING,
        timeout=30,
    )
    backend.cancel([running])
    status = poll_until(backend, running)
    assert status.state is JobState.CANCELLED and "failed 100" in status.detail, status


def test_a_job_grid_engine_cannot_start_is_an_error_with_its_reason_not_pending(tmp_path: Path) -> None:
    config = demo_project(tmp_path / "p", "gridengine")
    backend, pipeline = backend_for(config)
    job = submit_sleeper(backend, pipeline, tmp_path, f"-o {tmp_path}/no/such/folder/x.log")
    status = poll_until(backend, job, timeout=30)
    assert status.state is JobState.FAILED and status.native == "Eqw", status
    assert "no/such/folder" in status.detail and "it was deleted" in status.detail, status.detail
    listed = subprocess.run(["qstat", "-j", job], capture_output=True, text=True)
    assert listed.returncode != 0  # deleted, not left in Eqw for ever


@pytest.mark.parametrize("directive, words", [("-l node_h=2", "unknown resource"), ("-pe no_such_pe 2", "no_such_pe")])
def test_requests_the_cell_refuses_fail_the_run_with_grid_engine_s_words(
    tmp_path: Path, capsys: pytest.CaptureFixture, directive: str, words: str
) -> None:
    config = demo_project(tmp_path / "p", "gridengine")
    raw = yaml.safe_load(config.read_text())
    raw["pipelines"]["demo"]["stages"]["sample"]["gridengine"] = {"extra_args": [directive]}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert cli(config, "run", "demo") != 0
    printed = capsys.readouterr()
    said = printed.out + printed.err
    assert words in said and "qsub" in said, said


def test_a_task_deleted_while_the_orchestrator_was_killed_then_resume_matches_a_local_run(tmp_path: Path) -> None:
    reference = write_chain_project(tmp_path / "local", GE_CHAIN)
    assert cli(reference, "run", "chain", "--backend", "local") == 0
    config = write_chain_project(tmp_path / "ge", GE_CHAIN)
    first = config.parent / "ws/main/first"
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "gridengine")
    # Array task 2 (rank 1) has written item 1 and sleeps before item 3: kill the orchestrator, delete that task.
    wait_for(lambda: (first / "item-0001.txt").exists(), timeout=90, what="rank 1's first item")
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.communicate(timeout=30)
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    job = state.stages["first"].jobs[-1].job_id
    subprocess.run(["qdel", job, "-t", "2"], check=True, capture_output=True)
    done = {p.name for p in first.glob("item-*.txt")}
    # The resumed orchestrator finds the job again, reads its end from qacct (task 2: failed 100), and the
    # stage runs again (its finished items kept); a run that stopped at the failed stage is resumed once more.
    codes = [cli(config, "resume")]
    if codes[0] != 0:
        codes.append(cli(config, "resume"))
    assert codes[-1] == 0, codes
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    assert state.stages["first"].attempts == 2 and done <= {p.name for p in first.glob("item-*.txt")}
    assert tree(config.parent / "ws/main") == tree(reference.parent / "ws/main")


def test_site_set_up_lines_and_scheduling_options_reach_the_cell(tmp_path: Path) -> None:
    """gridengine.setup runs on every host before its ranks (each array task here), and -R y, -p and -tc are
    directives the real cell accepts: the chain runs to the local result with them, its two tasks one at a time."""
    reference = write_chain_project(tmp_path / "local", GE_CHAIN)
    assert cli(reference, "run", "chain", "--backend", "local") == 0
    config = write_chain_project(tmp_path / "ge", GE_CHAIN)
    marker = tmp_path / "setup-ran"
    setup = f"first.gridengine.setup=['echo \"task $SGE_TASK_ID on $(hostname)\" >> {marker}', 'export SITE=ready']"
    assert (
        cli(
            config,
            "run",
            "chain",
            "--backend",
            "gridengine",
            "--set",
            setup,
            "--set",
            "first.gridengine.reserve=true",
            "--set",
            "first.gridengine.priority=-5",
            "--set",
            "first.gridengine.array_concurrency=1",
        )
        == 0
    )
    assert sorted(line.split(" on ")[0] for line in marker.read_text().splitlines()) == ["task 1", "task 2"]
    assert tree(config.parent / "ws/main") == tree(reference.parent / "ws/main")
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    accounting = subprocess.run(
        ["qacct", "-j", state.stages["first"].jobs[0].job_id], capture_output=True, text=True, check=True
    ).stdout
    tasks = {}
    for record in accounting.split("=" * 62)[1:]:
        fields = dict(line.split(None, 1) for line in record.strip().splitlines() if len(line.split(None, 1)) == 2)
        tasks[int(fields["taskid"])] = [
            time.mktime(time.strptime(fields[key].strip(), "%a %b %d %H:%M:%S %Y"))
            for key in ("start_time", "end_time")
        ]
    assert tasks[2][0] >= tasks[1][1] or tasks[1][0] >= tasks[2][1], (tasks, accounting)  # -tc 1: one at a time


def test_check_probes_both_hosts_and_names_what_the_cell_refuses(
    sge_cell: SgeCell, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = demo_project(tmp_path / "p", "gridengine")
    raw = yaml.safe_load(config.read_text())
    raw["backends"]["gridengine"].update(parallel_environment="pe_node", container="apptainer")
    raw["pipelines"]["demo"]["stages"]["download"]["gridengine"].update(
        distributed=True, container_image="docker://nvcr.io/nvidia/nemo:24.05"
    )
    raw["pipelines"]["demo"]["stages"]["extract"]["gridengine"]["resources"] = ["node_h=1"]
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    capsys.readouterr()
    assert cli(config, "check", "demo", "--json") == 1
    result = json.loads(capsys.readouterr().out)
    rows = {row["topic"]: row for row in result["rows"]}
    assert rows["qmaster"]["verdict"] == "ok"
    assert rows["qsub -w v"]["verdict"] == "different" and 'unknown resource "node_h"' in rows["qsub -w v"]["showed"]
    assert "stage extract" in rows["qsub -w v"]["showed"] and "stage download" not in rows["qsub -w v"]["showed"]
    # the same request read against the cell's complexes (qconf -sc): node_h is none of them, h_rt is
    assert rows["requested resources"]["verdict"] == "different", rows["requested resources"]
    assert "node_h (extract): no such complex" in rows["requested resources"]["showed"]
    assert "requestable: h_rt" in rows["requested resources"]["showed"]
    environments = rows["parallel environments"]
    assert environments["verdict"] == "ok" and "allocation_rule 1" in environments["showed"]
    assert rows["hosts"]["verdict"] == "ok" and set(result["facts"]["hosts"]) == set(sge_cell.hosts)
    assert rows["shared folder"]["verdict"] == "ok"
    assert "pulled on every host" in rows["container images"]["meaning"]
    # No Apptainer on the cell's hosts (the stand-in is for the jobs of other tests, not installed here).
    assert rows["apptainer"]["verdict"] == "different" and "apptainer none" in rows["apptainer"]["showed"]


def test_check_without_a_parallel_environment_probes_with_the_stage_s_own_requests_by_mpirun(
    sge_cell: SgeCell, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """TSUBAME's set-up: no parallel environment configured; the distributed stage's own requests make the job
    parallel (here its extra_args' `-pe pe_node 2`, as a site's `-l node_f=2` does), and its hosts start by mpirun.
    The probe asks what the stage asks and reaches both hosts the stage's way."""
    config = demo_project(tmp_path / "p", "gridengine")
    raw = yaml.safe_load(config.read_text())
    raw["pipelines"]["demo"]["stages"]["download"]["gridengine"].update(
        distributed=True, extra_args=["-pe pe_node 2"], start_hosts="mpirun", env=MPIRUN_AS_ROOT
    )
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    capsys.readouterr()
    cli(config, "check", "demo", "--json")
    result = json.loads(capsys.readouterr().out)
    rows = {row["topic"]: row for row in result["rows"]}
    assert rows["hosts"]["verdict"] == "ok", rows["hosts"]["showed"]
    assert "(started by mpirun)" in rows["hosts"]["showed"] and "nhosts=2" in rows["hosts"]["showed"]
    assert set(result["facts"]["hosts"]) == set(sge_cell.hosts)
    assert rows["shared folder"]["verdict"] == "ok", rows["shared folder"]
    assert any(
        "the 2 hosts stage download asks for (-pe pe_node 2; no parallel environment), started by mpirun" in note
        for note in result["notes"]
    ), result["notes"]


def test_a_stage_in_an_apptainer_image_sees_the_workspace_at_mount_workspace(tmp_path: Path) -> None:
    """The rendered `apptainer exec` line run by the stand-in (tests/fakes/apptainer_bin): a bind missing or wrong
    would leave the workspace without the stage's items (they would go to the machine's own /mount_workspace)."""
    reference = write_chain_project(tmp_path / "local", GE_CHAIN)
    assert cli(reference, "run", "chain", "--backend", "local", "--only", "first") == 0
    config = write_chain_project(tmp_path / "ge", GE_CHAIN)
    # A fake SIF (a valid header) whose files are this Python's environment, read-only in the container.
    image = write_fake_sif(tmp_path / "images" / "stages.sif", contents=[sys.prefix])
    raw = yaml.safe_load(config.read_text())
    raw["backends"]["gridengine"].update(container="apptainer", python=sys.executable)
    stand_in = REPO / "tests" / "fakes" / "apptainer_bin"
    raw["pipelines"]["chain"]["stages"]["first"]["gridengine"].update(
        container_image=str(image), env={"PATH": f"{stand_in}:/usr/local/bin:/usr/bin:/bin"}
    )
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert cli(config, "run", "chain", "--backend", "gridengine", "--only", "first") == 0
    assert tree(config.parent / "ws/main") == tree(reference.parent / "ws/main")
    assert {p.name for p in (config.parent / "ws/main/first").glob("item-*.txt")} == {
        f"item-{i:04d}.txt" for i in range(6)
    }


def host_of_task(job_id: str, task: str) -> str:
    """The host an array task runs on, from `qstat -xml` (`queue_name` all.q@HOST of its running entry)."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.fromstring(
        subprocess.run(["qstat", "-u", "*", "-xml"], capture_output=True, text=True, check=True).stdout
    )
    for entry in root.iter("job_list"):
        fields = {child.tag: (child.text or "").strip() for child in entry}
        if fields.get("JB_job_number") == job_id and fields.get("tasks") == task:
            return fields["queue_name"].split("@", 1)[1]
    raise AssertionError(f"task {task} of job {job_id} is not running")


def test_an_exec_daemon_killed_mid_stage_then_restarted_the_run_goes_on_to_a_local_run_s_result(
    sge_cell: SgeCell, tmp_path: Path
) -> None:
    """Grid Engine's jobs outlive their exec daemon (the shepherd stays); the restarted execd reports what ended
    meanwhile, and the orchestrator, which saw the job running the whole time (never finished), goes on."""
    reference = write_chain_project(tmp_path / "local", GE_CHAIN)
    assert cli(reference, "run", "chain", "--backend", "local") == 0
    config = write_chain_project(tmp_path / "ge", GE_CHAIN)
    first = config.parent / "ws/main/first"
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "gridengine")
    wait_for(lambda: (first / "item-0001.txt").exists(), timeout=90, what="rank 1's first item")
    job = RunStore(config.parent / ".bcp-pipeline").latest().stages["first"].jobs[-1].job_id
    host = host_of_task(job, "2")  # where rank 1 runs (array task 2)
    killed = sge_cell.script("kill-execd", host)
    assert killed.returncode == 0 and f"killed sge_execd@{host}" in killed.stderr, killed.stderr
    time.sleep(8)  # the task ends meanwhile, with nobody to tell qmaster
    restarted = sge_cell.script("start-execd", host)
    assert restarted.returncode == 0, restarted.stderr
    output, _ = orchestrator.communicate(timeout=240)
    assert orchestrator.returncode == 0, output
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    assert tree(config.parent / "ws/main") == tree(reference.parent / "ws/main")


def test_cancel_deletes_the_run_s_jobs_on_the_cell(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_chain_project(tmp_path / "ge", GE_CHAIN)
    first = config.parent / "ws/main/first"
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "gridengine")
    try:
        wait_for(lambda: (first / "item-0001.txt").exists(), timeout=90, what="rank 1's first item")
        state = RunStore(config.parent / ".bcp-pipeline").latest()
        job = state.stages["first"].jobs[-1].job_id
        capsys.readouterr()
        assert cli(config, "cancel", state.run_id) == 0
        assert job in capsys.readouterr().out
        orchestrator.communicate(timeout=120)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    # Grid Engine no longer lists the job, and its accounting says it was deleted while running.
    wait_for(
        lambda: subprocess.run(["qstat", "-j", job], capture_output=True).returncode != 0,
        timeout=30,
        what="the job gone from qstat",
    )
    # (qacct has the record about a second after qstat lost the job)
    wait_for(
        lambda: re.search(
            r"^failed\s+100", subprocess.run(["qacct", "-j", job], capture_output=True, text=True).stdout, re.MULTILINE
        ),
        timeout=30,
        what="qacct's record: failed 100 (deleted while running)",
    )
    assert not (first / "item-0005.txt").exists()


def test_a_nemo_pretrain_over_both_hosts_trains_and_shows_its_loss(
    sge_cell: SgeCell, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = nemo_project(tmp_path, nodes=2)
    assert cli(config, "run", "nemo", "--backend", "gridengine") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 1
    assert stage.progress["done"] == 30 and stage.progress["unit"] == "steps", stage.progress
    # The config the launcher composed, for this run's own NeMo run, is what NeMo's script trained with.
    run_dir = config.parent / "ws/main/results" / f"gpt-{state.run_id}"
    composed = yaml.safe_load((run_dir / f"gpt-{state.run_id}_hydra.yaml").read_text())
    assert composed["trainer"]["num_nodes"] == 2 and composed["trainer"]["devices"] == 1
    assert composed["exp_manager"]["max_time_per_run"] == "0:00:01:00"  # h_rt 2m minus the 1m margin
    assert {p.name.split("-step=")[1].split("-")[0] for p in (run_dir / "results/checkpoints").iterdir()} == {
        "10",
        "20",
        "30",
    }
    # Both hosts' torchruns met (c10d at the first host of $PE_HOSTFILE); node 1's went through `qrsh -inherit`.
    logs = config.parent / ".bcp-pipeline/runs" / state.run_id / "logs" / stage_job(stage)
    assert "torchrun --nnodes" in (logs / "job.sh").read_text()
    assert sorted(p.name for p in logs.glob("rank-*.log")) == ["rank-00000.log", "rank-00001.log"]
    log, status = logs_and_status(config, state.run_id, "pretrain", capsys)
    assert "reduced_train_loss=" in log and "global_step=29.000" in log
    assert f"30/30 steps, loss {stage.progress['loss']:.3g}" in status, status


def test_a_crashed_nemo_training_fails_its_stage_with_its_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = nemo_project(tmp_path, extra=", +training.standin.crash_at_step=12")
    assert cli(config, "run", "nemo", "--backend", "gridengine") == 1
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.FAILED and stage.attempts == 1 and "steps_after_attempt" not in stage.extra
    assert "RuntimeError: CUDA error: an illegal memory access" in stage.error, stage.error
    capsys.readouterr()
    assert cli(config, "status") == 0
    assert "RuntimeError: CUDA error: an illegal memory access" in capsys.readouterr().out
    assert cli(config, "logs", state.run_id, "pretrain") == 0
    assert "RuntimeError: CUDA error" in capsys.readouterr().out


def test_every_nemo_continuation_on_grid_engine_trains_under_the_per_run_limit(tmp_path: Path) -> None:
    """h_rt 25 s, margin 21 s: each job trains 4 s (NeMo's per-run timer), about 200 steps at 0.02 s a step, and
    stops cleanly before h_rt; 300 steps take two jobs or more, each of which trains from the last checkpoint."""
    config = nemo_project(tmp_path, steps=300, runtime="25s", margin="21s")
    assert cli(config, "run", "nemo", "--backend", "gridengine") == 0
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    history = [*stage.extra["steps_after_attempt"], stage.verification["steps"]]  # the last attempt's: verified
    gains = [after - before for before, after in zip([0, *history], history)]
    assert stage.status is StageStatus.SUCCEEDED and len(history) >= 2 and all(gain > 0 for gain in gains), history
    assert history[-1] == 300 and stage.attempts == len(history)
    assert all(job.native == "done" for job in stage.jobs if job.kind == "stage")  # none hit h_rt
