"""A PyTorchJob's pods end Master last (render.master_last, master_last.sh), so `cleanPodPolicy: Running` deletes a
failed job's pods still running and never a finished job's Workers: what is rendered, and the wrapper itself run by
bash. The real training operator's cleanup of a failed job is tests/e2e/test_kubernetes_pretrain.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from support.k8s_requests import request_for

from bcp_pipeline.backends.kubernetes.render import MASTER_LAST, manifests, master_last

PYTORCHJOB = ("pretrain.kubernetes.launcher=pytorchjob",)


def pytorchjob(*overrides: str) -> dict:
    backend, request = request_for("pretrain", *PYTORCHJOB, *overrides)
    (obj,) = manifests(request, backend.options)
    return obj


def command_of(obj: dict, replica: str) -> list[str]:
    return obj["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]["command"]


def test_a_master_and_workers_job_cleans_running_pods_and_every_pod_ends_master_last() -> None:
    obj = pytorchjob("pretrain.kubernetes.replicas=3")
    assert obj["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    for replica in ("Master", "Worker"):
        command = command_of(obj, replica)
        start = command.index(MASTER_LAST)  # inside the time limit's timer: the wait is bounded by the limit too
        ends, pods = command[start + 2 : start + 4]
        assert ends == f"/mount_workspace/.bcp-pipeline/results/demo-RUN/pretrain/.pods-ended/{obj['metadata']['name']}"
        assert pods == "3" and obj["metadata"]["name"].endswith("-a1")  # a folder of this attempt's own


def test_a_one_pod_job_has_nothing_to_wait_for_and_an_elastic_one_keeps_its_pods() -> None:
    alone = pytorchjob("pretrain.kubernetes.replicas=1")
    assert alone["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert MASTER_LAST not in command_of(alone, "Master")
    # The operator ends an elastic job at its first Worker's success: Running would delete the others, logs and all.
    elastic = pytorchjob("pretrain.kubernetes.replicas=2", "pretrain.kubernetes.elastic_policy.min_replicas=1")
    assert elastic["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    assert MASTER_LAST not in command_of(elastic, "Worker")


def test_torchrun_runs_a_stage_command_as_it_is_and_a_python_program_by_python() -> None:
    command = command_of(
        pytorchjob("pretrain.kubernetes.replicas=2", "pretrain.kubernetes.command=[sleep, '60']"), "Master"
    )
    torchrun = command.index("torch.distributed.run")
    assert "--no-python" in command[torchrun:]  # else torchrun would run `python -u sleep 60`
    assert "--no-python" not in command_of(pytorchjob("pretrain.kubernetes.replicas=2"), "Master")


def start(tmp_path: Path, node_rank: int, *command: str, pods: int = 2, grace: int = 1) -> subprocess.Popen:
    """MASTER_LAST as a pod runs it, in a session of its own (its TERM trap signals its whole process group)."""
    argv = master_last(list(command), str(tmp_path / "ends"), pods, wait_seconds=30, grace_seconds=grace)
    return subprocess.Popen(
        argv,
        env={**os.environ, "PET_NODE_RANK": str(node_rank)},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_master_ends_after_every_pod_has_marked_its_end_and_a_worker_at_once(tmp_path: Path) -> None:
    master = start(tmp_path, 0, "echo", "trained")
    time.sleep(2)
    assert master.poll() is None  # its training is done, the Worker's is not
    worker = start(tmp_path, 1, "true")
    assert worker.wait(timeout=5) == 0 and master.poll() is None  # the Worker ends at once; the Master after it
    began = time.monotonic()
    assert master.wait(timeout=10) == 0
    assert time.monotonic() - began >= 0.9  # the grace for the Worker's pod to be reported ended
    assert master.stdout.read() == "trained\n"
    assert sorted(p.name for p in (tmp_path / "ends").iterdir()) == ["pod-0", "pod-1"]


def test_a_failed_command_ends_its_pod_at_once_with_its_status_and_no_mark(tmp_path: Path) -> None:
    master = start(tmp_path, 0, "bash", "-c", "exit 7", grace=30)
    assert master.wait(timeout=5) == 7
    assert not (tmp_path / "ends").exists()


def test_a_deletions_sigterm_reaches_the_command(tmp_path: Path) -> None:
    master = start(tmp_path, 0, "bash", "-c", "trap 'echo stopped; exit 143' TERM; sleep 60 & wait")
    time.sleep(1)
    master.send_signal(signal.SIGTERM)
    assert master.wait(timeout=10) == 143
    assert "stopped" in master.stdout.read()
