"""Gang admission through the real Kueue (tests/support/kueue.py: built from its module source, no webhook) on the
real control plane with the node agents (the kubelet STAND-IN of tests/fakes/k8s_node_agent.py): two distributed
stages of 2 pods each, in a queue whose ClusterQueue holds the CPUs of one. Kueue admits one whole (both its pods
are created at once) and holds the other with no pod at all, which `status` shows queued with Kueue's reason, until
the first ends; then it is admitted and the run succeeds. `check` reads the queue; a PyTorchJob in the queue is
admitted through Kueue's kubeflow.org/pytorchjob integration and run by the real training operator."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.cli import cli
from support.k8s_cluster import (  # noqa: F401
    K8sCluster,
    cluster_port,
    k8s_cluster,
    shared_claim,
    skip_unless_required,
    training_operator,
    training_operator_binary,
)
from support.kueue import binary, kueue, make_queue
from support.pipeline_fixtures import make_stages_dir, start_orchestrator, wait_for

from bcp_pipeline.engine.state import RunStore

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402

NAMESPACE = "bcp-kueue"
QUEUE = "team-a"
# Two stages that need nothing of each other, so the run submits both at once; each 2 pods of 1 CPU, held before
# their first item while their STALL marker exists (items.py).
GANG_CONFIG = """\
version: 1
stages_dir: stages
backends:
  local: {workspace_dir: ws}
pipelines:
  gang:
    description: two 2-pod stages in one queue
    workspace: {name: main, mount: /mount_workspace}
    stages:
"""
STAGE = """\
      {name}:
        program: items.py
        args: [--out, "${{workspace}}/{name}", --count, "4", --name, {name}]
        kubernetes: {{replicas: 2, processes: 1, cpu: "1", queue: {queue}}}
        verify:
          - {{glob: "${{workspace}}/{name}/item-*.txt", expect: "4"}}
"""


@pytest.fixture(scope="module")
def project(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:  # noqa: F811
    """(the config, the workspace folder) of the `gang` pipeline on the cluster, with the namespace, the workspace
    claim, Kueue running and the LocalQueue `team-a` whose ClusterQueue holds 2 CPUs: one stage's pods."""
    if not binary().is_file():
        skip_unless_required(f"Kueue is not built ({binary()}): run `scripts/k8s-cluster install`")
    api = k8s_cluster.api()
    core = client.CoreV1Api(api)
    tmp_path = tmp_path_factory.mktemp("kueue")
    folder = tmp_path / "workspace"
    folder.mkdir()
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    shared_claim(k8s_cluster, NAMESPACE, "ws", "bcp-kueue-workspace", folder)
    make_stages_dir(tmp_path)
    config = tmp_path / "pipelines.yaml"
    raw = yaml.safe_load(GANG_CONFIG + "".join(STAGE.format(name=name, queue=QUEUE) for name in ("a", "b")))
    raw["backends"]["kubernetes"] = {
        "kubeconfig": str(k8s_cluster.kubeconfig),
        "namespace": NAMESPACE,
        "image": "python:3.11",
        "workspace_claim": "ws",
        "code_dir": str(tmp_path / "stages"),
        "python": sys.executable,
        "poll_seconds": 0.3,
        "poll_max_seconds": 1.0,
    }
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    with contextlib.ExitStack() as running:
        frameworks = ("batch/job",)
        if training_operator_binary().is_file():  # its CRD installed before Kueue starts, as Kueue wants it
            running.enter_context(training_operator(k8s_cluster, cluster_port() + 10))
            frameworks += ("kubeflow.org/pytorchjob",)
        running.enter_context(kueue(k8s_cluster, cluster_port() + 20, frameworks))
        make_queue(api, NAMESPACE, QUEUE, cpu="2")
        yield config, folder


def stage_pods(api: object, job: str) -> list[client.V1Pod]:
    return (
        client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job}").items
    )


def test_check_says_whether_each_stages_queue_exists(project, capsys) -> None:
    config, _ = project

    def queue_rows(config_file: Path) -> list[dict]:
        capsys.readouterr()
        cli(config_file, "check", "gang", "--backend", "kubernetes", "--no-jobs", "--json")
        return [row for row in json.loads(capsys.readouterr().out)["rows"] if row["topic"] == "kueue queue"]

    (row,) = queue_rows(config)
    assert row["verdict"] == "ok" and row["showed"] == "exists and is active (ClusterQueue team-a-cq)", row
    assert "stage a" in row["assumes"] and "stage b" in row["assumes"]
    missing = config.with_name("missing-queue.yaml")
    missing.write_text(config.read_text().replace(f"queue: {QUEUE}", "queue: nowhere"))
    (row,) = queue_rows(missing)
    assert row["verdict"] == "different" and row["showed"] == "not found", row
    assert "create the LocalQueue nowhere in bcp-kueue" in row["meaning"], row


def test_a_gang_is_admitted_whole_and_the_next_waits_for_its_quota(k8s_cluster: K8sCluster, project, capsys) -> None:  # noqa: F811
    config, folder = project
    api = k8s_cluster.api()
    batch = client.BatchV1Api(api)
    for stage in ("a", "b"):
        (folder / stage).mkdir()
        (folder / stage / "STALL").write_text("")
    started = time.monotonic()
    orchestrator = start_orchestrator(config, "run", "gang", "--backend", "kubernetes")
    try:
        store = RunStore(config.parent / ".bcp-pipeline")

        def both_jobs() -> dict[str, str] | None:
            state = store.latest()
            if state is None or not all(state.stages[s].jobs for s in ("a", "b")):
                return None
            return {s: state.stages[s].jobs[-1].job_id for s in ("a", "b")}

        jobs = wait_for(both_jobs, timeout=60, what="both stages' jobs submitted")

        def admitted() -> str | None:  # the stage whose Job Kueue unsuspended
            found = [s for s, job in jobs.items() if batch.read_namespaced_job(job, NAMESPACE).spec.suspend is False]
            return found[0] if len(found) == 1 else None

        first = wait_for(admitted, timeout=60, what="Kueue admitting one of the two")
        second = "b" if first == "a" else "a"
        # The first gang whole: both its pods, running; the second none, still suspended in the queue.
        wait_for(
            lambda: sum(p.status.phase == "Running" for p in stage_pods(api, jobs[first])) == 2,
            timeout=60,
            what=f"stage {first}'s 2 pods running",
        )
        assert batch.read_namespaced_job(jobs[second], NAMESPACE).spec.suspend is True
        assert stage_pods(api, jobs[second]) == []
        workloads = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", NAMESPACE, "workloads"
        )["items"]
        by_owner = {w["metadata"]["ownerReferences"][0]["name"]: w for w in workloads}
        assert by_owner[jobs[first]]["status"]["admission"]["podSetAssignments"][0]["count"] == 2  # all of its pods

        def says_why() -> str | None:  # the run's status, as a user reads it
            capsys.readouterr()
            cli(config, "status")
            text = capsys.readouterr().out
            return text if "insufficient unused quota" in text else None

        text = wait_for(says_why, timeout=30, what="status showing Kueue's reason")
        assert "(PENDING/KUEUE)" in text  # its JOBS cell
        assert f"{second}: job {jobs[second]} PENDING/KUEUE: waiting for Kueue admission in queue {QUEUE}: " in text
        time.sleep(3)  # held: nothing of the second starts while the first holds the quota
        assert batch.read_namespaced_job(jobs[second], NAMESPACE).spec.suspend is True
        assert stage_pods(api, jobs[second]) == []

        (folder / first / "STALL").unlink()  # the first ends; its quota goes back; the second is admitted
        wait_for(
            lambda: batch.read_namespaced_job(jobs[second], NAMESPACE).spec.suspend is False,
            timeout=60,
            what=f"Kueue admitting stage {second} once {first} ended",
        )
        wait_for(
            lambda: sum(p.status.phase == "Running" for p in stage_pods(api, jobs[second])) == 2,
            timeout=60,
            what=f"stage {second}'s 2 pods running",
        )
        (folder / second / "STALL").unlink()
        output, _ = orchestrator.communicate(timeout=120)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
            orchestrator.communicate(timeout=30)
    assert orchestrator.returncode == 0, output
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert {s: state.stages[s].status.value for s in ("a", "b")} == {"a": "succeeded", "b": "succeeded"}
    assert sorted(p.name for p in (folder / "b").glob("item-*.txt")) == [f"item-{i:04d}.txt" for i in range(4)]
    print(f"gang admission through Kueue: {time.monotonic() - started:.0f} s", file=sys.stderr)


def test_a_pytorchjob_is_admitted_through_kueues_pytorchjob_integration(k8s_cluster: K8sCluster, project) -> None:  # noqa: F811
    """`launcher: pytorchjob` in the queue: created with runPolicy.suspend, admitted by Kueue's
    kubeflow.org/pytorchjob integration (Master + Worker, 1 CPU each: the queue's 2), then run by the real training
    operator to the end."""
    if not training_operator_binary().is_file():
        skip_unless_required(f"no training operator at {training_operator_binary()}: run `scripts/k8s-cluster install`")
    config, folder = project
    torch_config = config.with_name("torch.yaml")
    raw = yaml.safe_load(config.read_text())
    stages = raw["pipelines"]["gang"]["stages"]
    stages["t"] = stages.pop("a")
    stages.pop("b")
    stages["t"]["args"] = [arg.replace("/a", "/t") if isinstance(arg, str) else arg for arg in stages["t"]["args"]]
    stages["t"]["verify"] = [{"glob": "${workspace}/t/item-*.txt", "expect": "4"}]
    stages["t"]["kubernetes"]["launcher"] = "pytorchjob"
    torch_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert cli(torch_config, "run", "gang", "--backend", "kubernetes") == 0
    stage = RunStore(torch_config.parent / ".bcp-pipeline").latest().stages["t"]
    job = next(j for j in stage.jobs if j.kind == "stage")
    assert job.native == "SUCCEEDED"
    api = k8s_cluster.api()
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "kubeflow.org", "v1", NAMESPACE, "pytorchjobs", job.job_id
    )
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    assert obj["spec"]["runPolicy"]["suspend"] is False  # Kueue unsuspended it: admitted
    workloads = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", NAMESPACE, "workloads"
    )["items"]
    (workload,) = [w for w in workloads if w["metadata"]["ownerReferences"][0]["name"] == job.job_id]
    assert sum(p["count"] for p in workload["status"]["admission"]["podSetAssignments"]) == 2
    assert sorted(p.name for p in (folder / "t").glob("item-*.txt")) == [f"item-{i:04d}.txt" for i in range(4)]
