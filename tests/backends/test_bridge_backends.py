"""The Megatron-Bridge pretrain of the bundled slimpajama-8b-bridge as each backend renders it (`plan`, no cluster):
what the expert review (../shared/notes/bridge-review.md, findings 4, 7-12, 15) found missing or wrong at a real
site, each asserted on the rendered job, and each knob that changes it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from support.cli import cli

from bcp_pipeline.backends.kubernetes.render import STOP_SECONDS_ENV, TIME_LIMIT_EXIT, time_limited

CONFIG = Path(__file__).resolve().parents[2] / "pipelines.yaml"
PIPELINE = "slimpajama-8b-bridge"


def plan(capsys, backend: str, *sets: str) -> tuple[int, dict | None, str]:
    """(exit status, the plan as JSON where it rendered, stderr)."""
    capsys.readouterr()
    args = [word for item in sets for word in ("--set", item)]
    code = cli(CONFIG, "plan", PIPELINE, "--backend", backend, "--json", *args)
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def errors_at_a_line(err: str) -> list[str]:
    """The errors naming a place in the config (file:line), as a refusal does."""
    return [line for line in err.splitlines() if line.startswith("bcp-pipeline: error: ") and "pipelines.yaml:" in line]


def job(planned: dict, stage: str = "pretrain") -> dict:
    [found] = [j for j in planned["jobs"] if j["stage"] == stage and j["kind"] == "stage"]
    return found


def script(capsys, backend: str, *sets: str, stage: str = "pretrain") -> str:
    code, planned, err = plan(capsys, backend, *sets)
    assert code == 0, err
    return job(planned, stage)["printable"]


# -- Slurm --------------------------------------------------------------------------------------------------------


def sbatch(text: str) -> dict[str, str]:
    return dict(line[len("#SBATCH ") :].partition("=")[::2] for line in text.splitlines() if line.startswith("#SBATCH"))


def training_srun(text: str) -> list[str]:
    """The training's `srun` (its continuation lines joined) as words."""
    start = text.index("srun --kill-on-bad-exit")
    return shlex.split(text[start : text.index("\ncode=$?", start)].replace("\\\n", " "))


def test_slurm_pyxis_mounts_the_folder_each_task_writes_its_exit_file_into(capsys):
    """Finding 4: under Pyxis the task wrapper runs inside the container and writes rank-N.exit into the run's
    logs; unmounted, every rank reads as `none` and a finished job is reported failed."""
    text = script(capsys, "slurm")
    logs = shlex.split(re.search(r"^logs=(.*)$", text, re.M).group(1))[0]
    assert 'export BCP_PIPELINE_TASK_EXITS="$logs/$SLURM_JOB_ID"' in text
    for srun in (training_srun(text), shlex.split(text[text.index("srun --nodes=1") :].splitlines()[0])):
        [mounts] = [w.split("=", 1)[1] for w in srun if w.startswith("--container-mounts=")]
        same_path = [m.split(":")[0] for m in mounts.split(",") if m.split(":")[0] == m.split(":")[1]]
        assert any(logs == folder or logs.startswith(folder + "/") for folder in same_path), (logs, mounts)


def test_slurm_a_bridge_training_takes_whole_nodes_their_cores_and_a_sigterm_before_its_end(capsys):
    """Findings 7 and 8: --exclusive, --mem=0, a rank's share of the DGX A100's 128 cores, SIGTERM 15 min before
    --time ends; each overridable; a data stage keeps Slurm's defaults."""
    flags = sbatch(text := script(capsys, "slurm"))
    assert "--exclusive" in flags and flags["--mem"] == "0" and flags["--cpus-per-task"] == "16"
    assert flags["--signal"] == "TERM@900" and flags["--time"] == "5-00:00:00", text[:2000]
    given = sbatch(
        script(
            capsys,
            "slurm",
            "pretrain.slurm.exclusive=false",
            "pretrain.slurm.mem=900G",
            "pretrain.slurm.cpus_per_node=112",
            "pretrain.slurm.save_seconds=1800",
        )
    )
    assert "--exclusive" not in given and given["--mem"] == "900G" and given["--cpus-per-task"] == "14"
    assert given["--signal"] == "TERM@1800"
    assert sbatch(script(capsys, "slurm", "pretrain.slurm.cpus_per_task=4"))["--cpus-per-task"] == "4"
    assert "--signal" not in sbatch(script(capsys, "slurm", "pretrain.slurm.save_seconds=0"))
    data = sbatch(script(capsys, "slurm", stage="download"))
    assert data["--cpus-per-task"] == "1" and "--exclusive" not in data and "--signal" not in data


def test_slurm_starts_the_bridge_rank_itself_not_through_bootstrap_and_lets_the_starter_bind_it(capsys):
    """Finding 15 (no bootstrap.sh, which may pip-install into the NeMo image) and 11 (NUMA binding by GPU
    locality: srun's own binding off); `numa_binding: false` leaves the binding to srun."""
    srun = training_srun(script(capsys, "slurm"))
    program = srun[srun.index("bcp-pipeline-task") + 1 :]
    assert not any(word.endswith("bootstrap.sh") for word in srun)
    assert program[:3] == ["python3", "-u", str(CONFIG.parent / "stages/rank_start.py")]
    assert program[3:8] == ["--gpu-numa", "auto", "--", "python3", "-u"] and program[8].endswith("bridge_pretrain.py")
    assert "--cpu-bind=none" in srun
    off = training_srun(script(capsys, "slurm", "pretrain.slurm.numa_binding=false"))
    assert "--cpu-bind=none" not in off and off[off.index("--gpu-numa") + 1] == "off"


# -- BCP ----------------------------------------------------------------------------------------------------------


def bcp_rank_line(capsys, *sets: str) -> list[str]:
    code, planned, err = plan(capsys, "bcp", *sets)
    assert code == 0, err
    [text] = job(planned)["files"].values()
    return shlex.split(text.split("rank=(\n", 1)[1].splitlines()[0])


def test_bcp_ranks_of_later_replicas_wait_for_the_rendezvous_and_every_rank_is_bound(capsys):
    """Finding 12 (NVIDIA's pause_and_prime_dns_connections: a bounded wait on the later replicas) and 11."""
    words = bcp_rank_line(capsys)
    assert words[2].endswith("/rank_start.py")
    assert words[3:8] == ["--wait-for-master", "300", "--gpu-numa", "auto", "--"]
    assert words[8:10] == ["python3", "-u"] and words[10].endswith("/bridge_pretrain.py")
    one = bcp_rank_line(capsys, "pretrain.bcp.replicas=1")  # one replica: torchrun --standalone, nothing to wait for
    assert "--wait-for-master" not in one and one[3:6] == ["--gpu-numa", "auto", "--"]
    assert bcp_rank_line(capsys, "pretrain.bcp.numa_binding=false")[5:7] == ["--gpu-numa", "off"]


# -- Kubernetes ---------------------------------------------------------------------------------------------------


def pod(planned: dict, stage: str = "pretrain") -> dict:
    manifests = job(planned, stage)["manifests"]
    [spec] = [m["spec"]["template"]["spec"] for m in manifests if m["kind"] == "Job"]
    return spec


def test_kubernetes_training_pods_have_time_to_save_after_sigterm(capsys):
    """Finding 8: the pod's grace period (15 min + the wrappers' 30 s), torchrun's wait for its ranks and the
    time limiter's after its SIGTERM all cover an 8B save; kubernetes.termination_grace sets them."""
    code, planned, err = plan(capsys, "kubernetes")
    assert code == 0, err
    spec = pod(planned)
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert spec["terminationGracePeriodSeconds"] == 930
    assert env[STOP_SECONDS_ENV] == "900" and env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "900"
    assert "terminationGracePeriodSeconds" not in pod(planned, "download")  # a data stage: the kubelet's 30 s
    _, longer, _ = plan(capsys, "kubernetes", "pretrain.kubernetes.termination_grace=30M")
    assert pod(longer)["terminationGracePeriodSeconds"] == 1830


def test_the_time_limiter_gives_its_processes_the_pod_s_stop_time_after_its_sigterm(tmp_path):
    """The limiter's wait after its SIGTERM is BCP_PIPELINE_STOP_SECONDS (a training's grace), not a fixed 30 s: a
    rank still saving 3 s after the limit is waited for, one that never ends is left after the stop time."""
    saved = tmp_path / "saved"
    # Its output elsewhere: the run below ends with the limiter, not when a rank left behind closes the pipes.
    saving = ["bash", "-c", f"exec >/dev/null 2>&1; trap 'sleep 3; touch {saved}; exit 0' TERM; sleep 60 & wait"]

    def run(stop: str) -> tuple[int, float]:
        started = time.monotonic()
        done = subprocess.run(
            time_limited(saving, 1),
            capture_output=True,
            text=True,
            timeout=90,
            start_new_session=True,
            env={**os.environ, STOP_SECONDS_ENV: stop},
        )
        return done.returncode, time.monotonic() - started

    code, took = run("20")
    assert code == TIME_LIMIT_EXIT and saved.exists() and took < 15, took  # waited for the save, no longer
    saved.unlink()
    code, took = run("1")
    assert code == TIME_LIMIT_EXIT and not saved.exists() and took < 3.5, took  # the stop time bounds the wait


def test_kubernetes_refuses_a_stock_ngc_image_without_stages_and_plans_the_bundled_file(capsys):
    """Finding 9: the stock NeMo image has no /opt/bcp-pipeline/stages, the in-image default code_dir; the bundled
    file reads stages/ from the workspace claim instead, and an image of one's own with the default plans."""
    code, planned, err = plan(capsys, "kubernetes", "backends.kubernetes.code_dir=/opt/bcp-pipeline/stages")
    lines = errors_at_a_line(err)
    assert code == 2 and len(lines) == 1, err
    for words in (
        "nvcr.io/nvidia/nemo:26.08",
        "/opt/bcp-pipeline/stages",
        "kubernetes.image",
        "backends.kubernetes.code_dir",
        "stages.pretrain.kubernetes",
    ):
        assert words in lines[0], (words, lines[0])
    own = "123456789012.dkr.ecr.us-east-1.amazonaws.com/bcp-pipeline:26.08"
    assert (
        plan(
            capsys,
            "kubernetes",
            "backends.kubernetes.code_dir=/opt/bcp-pipeline/stages",
            f"pretrain.kubernetes.image={own}",
        )[0]
        == 0
    )
    code, planned, err = plan(capsys, "kubernetes")  # as bundled
    assert code == 0, err
    args = pod(planned)["containers"][0]["args"]
    assert args[0] == "/mount_workspace/.bcp-pipeline/stages/rank_start.py", args[:3]


def test_kubernetes_warns_of_gpu_pods_on_an_efa_instance_type_without_efa(capsys):
    p5 = "pretrain.kubernetes.node_selector={node.kubernetes.io/instance-type: p5.48xlarge}"
    code, planned, err = plan(capsys, "kubernetes", p5)
    assert code == 0, err
    said = [line for line in job(planned)["printable"].splitlines() if line.startswith("# warning:")]
    assert len(said) == 1 and "p5.48xlarge" in said[0] and "kubernetes.efa" in said[0], said
    for quiet in (
        (p5, "pretrain.kubernetes.efa=32"),
        ("pretrain.kubernetes.node_selector={node.kubernetes.io/instance-type: g5.48xlarge}",),
    ):
        _, planned, _ = plan(capsys, "kubernetes", *quiet)
        assert "# warning:" not in job(planned)["printable"]


# -- Grid Engine --------------------------------------------------------------------------------------------------


def test_gridengine_as_bundled_asks_for_tsubame_nodes_and_runs_a_sif_from_the_workspace(capsys):
    """Finding 10: a whole-node request, 4 ranks on each 4-GPU host (processes_per_node), a .sif every host reads."""
    text = script(capsys, "gridengine")
    assert "#$ -l node_f=16" in text and "#$ -l h_rt=24:00:00" in text
    assert re.search(r"^logs=\S+ nodes=16 per_node=4$", text, re.M)
    workspace = CONFIG.parent / ".bcp-pipeline/workspaces/nemo-framework"
    assert f' {workspace}/images/nemo-26.08.sif "$@"; }}' in text
    assert '--nproc_per_node "$per_node"' in text


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (
            ["pretrain.gridengine.resources=[]"],
            ["asks the cell for nothing", "gridengine.resources", "gridengine.parallel_environment", "node_f=16"],
        ),
        (
            ["pretrain.gridengine.container_image=docker://nvcr.io/nvidia/nemo:26.08"],
            [
                "every host would pull",
                "apptainer build nemo.sif docker://nvcr.io/nvidia/nemo:26.08",
                "gridengine.container_image",
            ],
        ),
    ],
)
def test_gridengine_refuses_a_multi_host_training_that_asks_for_no_hosts_or_pulls_its_image(capsys, sets, said):
    code, _, err = plan(capsys, "gridengine", *sets)
    lines = errors_at_a_line(err)
    assert code == 2 and len(lines) == 1, err
    assert "stages.pretrain.gridengine" in lines[0]
    for words in said:
        assert words in lines[0], (words, lines[0])


def test_gridengine_a_parallel_environment_or_one_host_is_enough(capsys):
    assert (
        plan(
            capsys, "gridengine", "pretrain.gridengine.resources=[]", "backends.gridengine.parallel_environment=pe_node"
        )[0]
        == 0
    )
    one = script(
        capsys,
        "gridengine",
        "pretrain.gridengine.nodes=1",
        "pretrain.gridengine.resources=[]",
        "pretrain.gridengine.container_image=docker://nvcr.io/nvidia/nemo:26.08",
        "pretrain.megatron_bridge.model=gpt3/126m",
    )
    assert "docker://nvcr.io/nvidia/nemo:26.08" in one
