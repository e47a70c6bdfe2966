"""The kubernetes backend without a cluster: golden manifests (`plan` prints them as `run` creates them), the
rank layout and rendezvous, secrets only by reference, the PyTorchJob, and the Job-condition -> JobState map."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from support.golden_files import REPO, assert_golden, normalize
from support.k8s_requests import request_for

from bcp_pipeline.backends.contract import JobRequest, JobState
from bcp_pipeline.backends.kubernetes.render import (
    POD_LAUNCHER,
    TIME_LIMIT_EXIT,
    TIME_LIMITER,
    job_name,
    manifests,
    printable,
    time_limited,
)
from bcp_pipeline.backends.kubernetes.states import pytorchjob_status, status_of
from bcp_pipeline.cli.main import main
from bcp_pipeline.errors import SubmissionError

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402


def plan(capsys: pytest.CaptureFixture, pipeline: str, *overrides: str) -> str:
    capsys.readouterr()
    sets = [arg for override in overrides for arg in ("--set", override)]
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", pipeline, "--backend", "kubernetes", *sets]) == 0
    return capsys.readouterr().out.replace(sys.executable, "<PYTHON>")


def test_plan_demo_golden(capsys: pytest.CaptureFixture) -> None:
    assert_golden("kubernetes/plan-demo.txt", normalize(plan(capsys, "demo")))


def test_indexed_job_shape_rendezvous_and_secrets_by_reference() -> None:
    backend, request = request_for(
        "download",
        "download.kubernetes.secrets=[hf-token:token:HF_TOKEN]",
        "download.kubernetes.gpus=8",
        "download.kubernetes.efa=4",
    )
    submission = backend.render(request)
    service, job = yaml.safe_load_all(submission.printable)
    assert [service, job] == submission.payload["manifests"]  # printed exactly as created
    name = job["metadata"]["name"]
    assert name == job_name(request) == "demo-run-download-a1"
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == name
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)  # demo: 2 x 2
    # The time limit (bcp.total_runtime 1h) is kept by the container from its start, not by activeDeadlineSeconds
    # (which would count the time spent queued); its exit code fails the Job at once (read as timed out).
    assert "activeDeadlineSeconds" not in spec
    assert spec["podFailurePolicy"]["rules"][:2] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "stage", "operator": "In", "values": [TIME_LIMIT_EXIT]}},
    ]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == name and pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["command"][:5] == ["bash", "-c", TIME_LIMITER, "bcp-pipeline-time-limit", "3600"]
    assert container["command"][5:8] == ["bash", "-c", POD_LAUNCHER]  # the pod's processes, under the timer
    env = {e["name"]: e for e in container["env"]}
    assert env["WORLD_SIZE"]["value"] == "4" and env["BCP_PIPELINE_PROCESSES"]["value"] == "2"
    assert env["MASTER_ADDR"]["value"] == f"{name}-0.{name}"
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "4"}
    assert container["volumeMounts"] == [
        {"name": "workspace", "mountPath": "/mount_workspace", "readOnly": False},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]  # GPUs: more than 64 MiB
    assert pod["volumes"][1] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert (env["FI_PROVIDER"]["value"], env["FI_EFA_USE_DEVICE_RDMA"]["value"]) == ("efa", "1")  # efa: 4
    assert submission.rendezvous["WORLD_SIZE"] == 4
    assert backend.sharding(request) == {"replicas": 2, "processes": 2}


def test_verification_mounts_read_only_and_names_apart() -> None:
    backend, request = request_for("download", kind="verify")
    _, job = manifests(request, backend.options)
    assert job["metadata"]["name"] == "demo-run-download-verify-a1"
    assert job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] is True


def test_long_names_stay_dns_labels() -> None:
    backend, request = request_for("tokenize-preprocess")
    long = JobRequest(
        run_id="a-very-long-pipeline-name-20261125-221500-abcd",
        pipeline=request.pipeline,
        stage=request.stage,
        kind="verify",
        program="verify.py",
        args=(),
        attempt=12,
    )
    name = job_name(long)
    assert len(name) <= 52 and name.endswith("-verify-a12") and name == name.lower()
    # A Service's and a PyTorchJob's name is a DNS-1035 label: it starts with a letter, whatever the pipeline's name.
    digits = JobRequest(
        run_id="8b-20261125-221500-abcd",
        pipeline=request.pipeline,
        stage=request.stage,
        kind="stage",
        program="x.py",
        args=(),
    )
    assert job_name(digits) == "p8b-20261125-221500-abcd-tokenize-preprocess-a1"
    assert all(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job_name(r)) for r in (long, digits))


def test_pytorchjob_golden() -> None:
    backend, request = request_for(
        "pretrain",
        "pretrain.kubernetes.launcher=pytorchjob",
        "pretrain.kubernetes.replicas=2",
        "pretrain.kubernetes.gpus=8",
    )
    assert_golden("kubernetes/pretrain-pytorchjob.yaml", normalize(backend.render(request).printable))
    (obj,) = manifests(request, backend.options)
    assert obj["kind"] == "PyTorchJob" and obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


def test_bad_secret_and_missing_image_are_refused() -> None:
    backend, request = request_for("bpe", "bpe.kubernetes.secrets=[just-a-name]")
    with pytest.raises(SubmissionError, match="SECRET:KEY:ENV"):
        backend.render(request)


def job_with(conditions: list[tuple[str, str]], ready: int = 0) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name="j"),
        status=client.V1JobStatus(
            ready=ready,
            conditions=[client.V1JobCondition(type=kind, status="True", reason=reason) for kind, reason in conditions],
        ),
    )


@pytest.mark.parametrize(
    ("conditions", "ready", "state"),
    [
        ([], 0, JobState.QUEUED),
        ([], 1, JobState.RUNNING),
        ([("Complete", "")], 0, JobState.SUCCEEDED),
        ([("SuccessCriteriaMet", ""), ("Complete", "")], 0, JobState.SUCCEEDED),
        ([("Failed", "BackoffLimitExceeded")], 0, JobState.FAILED),
        ([("Failed", "PodFailurePolicy")], 0, JobState.FAILED),
        ([("Failed", "DeadlineExceeded")], 0, JobState.TIMED_OUT),
        ([("Suspended", "JobSuspended")], 0, JobState.QUEUED),
        ([("Failed", "SomethingNew")], 0, JobState.UNKNOWN),  # unknown: not finished, never "failed"
    ],
)
def test_job_conditions_map_to_states(conditions: list, ready: int, state: JobState) -> None:
    assert status_of(job_with(conditions, ready)).state is state


def test_pytorchjob_conditions_map_to_states() -> None:
    def obj(*kinds: str) -> dict:
        return {"metadata": {"name": "p"}, "status": {"conditions": [{"type": k, "status": "True"} for k in kinds]}}

    assert pytorchjob_status(obj()).state is JobState.QUEUED
    assert pytorchjob_status(obj("Created", "Running")).state is JobState.RUNNING
    assert pytorchjob_status(obj("Created", "Running", "Succeeded")).state is JobState.SUCCEEDED
    assert pytorchjob_status(obj("Created", "Failed")).state is JobState.FAILED
    deadline = obj("Created", "Running", "Failed")  # as the training operator words it past activeDeadlineSeconds
    deadline["status"]["conditions"][-1].update(
        reason="PyTorchJobFailed",
        message="PyTorchJob p has failed because it was active longer than specified deadline",
    )
    assert pytorchjob_status(deadline).state is JobState.TIMED_OUT
    # The operator's condition for a replica that exited names no exit code: a pod's time limit (its exit code)
    # makes the failure a time-out; any other exit code leaves it failed.
    failed = obj("Created", "Running", "Failed")
    failed["status"]["conditions"][-1].update(message="PyTorchJob p is failed because 1 Master replica(s) failed.")

    def ended_pod(code: int) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"p-worker-{code}"),
            status=client.V1PodStatus(
                container_statuses=[
                    client.V1ContainerStatus(
                        name="pytorch",
                        image="i",
                        image_id="",
                        ready=False,
                        restart_count=0,
                        state=client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=code)),
                    )
                ]
            ),
        )

    timed_out = pytorchjob_status(failed, [ended_pod(0), ended_pod(TIME_LIMIT_EXIT)])
    assert (timed_out.state, timed_out.native) == (JobState.TIMED_OUT, "FAILED/TIMELIMIT")
    assert timed_out.detail == (
        "PyTorchJob p is failed because 1 Master replica(s) failed. The stage's time limit "
        "ran out: pod p-worker-124 exited 124."
    )
    assert pytorchjob_status(failed, [ended_pod(1)]).state is JobState.FAILED
    assert pytorchjob_status(failed).state is JobState.FAILED


def test_a_pytorchjob_keeps_its_time_limit_in_its_pods() -> None:
    """No runPolicy.activeDeadlineSeconds (it counts from the job's start, queue included): torchrun runs under
    the container's timer, whose exit states.py reads as timed out."""
    backend, request = request_for(
        "pretrain", "pretrain.kubernetes.launcher=pytorchjob", "pretrain.kubernetes.active_deadline=2h"
    )
    (job,) = backend.render(request).payload["manifests"]
    assert "activeDeadlineSeconds" not in job["spec"]["runPolicy"]
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"][:5] == ["bash", "-c", TIME_LIMITER, "bcp-pipeline-time-limit", "7200"]
    assert container["command"][6:8] == ["-m", "torch.distributed.run"]


def test_the_time_limiter_ends_a_stage_at_its_limit_and_passes_exit_codes_on(tmp_path) -> None:
    """TIME_LIMITER itself, run by bash: the limit counts from its start and ends every process of the container
    (the pod's ranks too) with TIME_LIMIT_EXIT; an earlier exit passes its status on, a program's own
    TIME_LIMIT_EXIT becoming 1 so it cannot pass for a time-out."""
    import os
    import subprocess
    import time

    def run(command: list[str], limit: int, **env: str) -> tuple[int, float, str]:
        started = time.monotonic()
        done = subprocess.run(
            time_limited(command, limit),
            capture_output=True,
            text=True,
            timeout=60,
            start_new_session=True,
            env={**os.environ, **env},
        )
        return done.returncode, time.monotonic() - started, done.stderr

    pids = tmp_path / "pids"
    ranks = ["bash", "-c", POD_LAUNCHER, "pod", "bash", "-c", f"echo $$ >> {pids}; exec sleep 60"]
    code, took, said = run(ranks, 2, BCP_PIPELINE_PROCESSES="2", JOB_COMPLETION_INDEX="0")
    assert code == TIME_LIMIT_EXIT and 2 <= took < 10 and "time limit of 2 s" in said, (code, took, said)
    time.sleep(0.5)
    for pid in pids.read_text().split():  # both ranks ended (at most a zombie awaiting its new parent)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split()[2] in "ZX", stat.read_text()
    assert run(["bash", "-c", "exit 3"], 30)[0] == 3
    assert run(["true"], 30)[0] == 0
    code, _, said = run(["bash", "-c", f"exit {TIME_LIMIT_EXIT}"], 30)
    assert code == 1 and "reported as 1" in said
    assert time_limited(["true"], None) == ["true"]  # no limit, no timer


def test_plan_prints_manifests_without_yaml_anchors():
    """One dict shared by the Master and Worker templates (or by requests and limits) is written out in full: no
    `&id001` / `*id001`, which kubectl users never write and `plan` readers cannot follow."""
    shared = {"nvidia.com/gpu": "8"}
    text = printable([{"kind": "PyTorchJob", "spec": {"requests": shared, "limits": shared}}])
    assert "&id" not in text and "*id" not in text and text.count("nvidia.com/gpu: '8'") == 2


def test_a_nemo_stage_runs_nvidia_s_launcher_in_gpu_pods_never_the_smoke_trainer(capsys: pytest.CaptureFixture) -> None:
    """`plan slimpajama-8b --backend kubernetes` renders the NeMo launcher's pods (the rest: test_nemo.py):
    no pretrain_local.py anywhere, a GPU request, and what each job runs said above its manifests."""
    out = plan(capsys, "slimpajama-8b")
    assert "pretrain_local.py" not in out and "CANNOT BE PLANNED" not in out
    pretrain = out.split("\n# stage pretrain", 1)[1].split("\n# estimates", 1)[0]
    assert (
        "# runs: NVIDIA's NeMo launcher: its debug mode composes the training config on the first pod, then "
        "torchrun in each of 8 pod(s) runs NeMo's megatron_gpt_pretraining.py, a rank on each of 8 GPU(s) a pod"
        in pretrain
    )
    assert pretrain.count("nvidia.com/gpu: '8'") == 2  # requests = limits
    assert out.count("# runs: ") == out.count("\n# stage ") + out.count("\n# verification of ")  # every job
    # A stage with a command of its own runs that command instead, and says so.
    backend, request = request_for("pretrain", "pretrain.kubernetes.command=[sleep, '1']")
    assert backend.render(request).printable.startswith("# runs: the stage's kubernetes.command in each of 1 pod(s)")


def test_pod_settings_a_real_site_needs_shared_memory_pull_secrets_priority_efa() -> None:
    backend, request = request_for(
        "sample",
        "sample.kubernetes.shm_size=16Gi",
        "sample.kubernetes.image_pull_secrets=[ngc-registry]",
        "sample.kubernetes.priority_class=training-high",
        "sample.kubernetes.efa=1",
        "sample.kubernetes.env={FI_EFA_USE_DEVICE_RDMA: '0'}",
    )
    _, job = manifests(request, backend.options)
    pod = job["spec"]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert pod["imagePullSecrets"] == [{"name": "ngc-registry"}] and pod["priorityClassName"] == "training-high"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "0"  # the stage's own env wins
    # A one-process CPU pod that asks for nothing keeps the runtime's /dev/shm, and no EFA settings.
    backend, request = request_for("sample")
    _, job = manifests(request, backend.options)
    pod = job["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["workspace"] and "imagePullSecrets" not in pod
    assert not any(e["name"].startswith("FI_") for e in pod["containers"][0]["env"])


def test_a_disrupted_pod_fails_a_training_gang_but_is_replaced_in_a_data_stage() -> None:
    def disruption_rule(stage: str, *overrides: str) -> str:
        backend, request = request_for(stage, *overrides)
        _, job = manifests(request, backend.options)
        rules = job["spec"]["podFailurePolicy"]["rules"]
        return next(r["action"] for r in rules if r.get("onPodConditions") == [{"type": "DisruptionTarget"}])

    assert disruption_rule("download") == "Ignore"  # 2 pods of independent shards: the Job replaces one
    assert disruption_rule("pretrain", "pretrain.kubernetes.replicas=2") == "FailJob"  # 2 pods that meet
    assert disruption_rule("pretrain") == "Ignore"  # one pod: nothing to rejoin


def test_processes_default_to_the_pods_whole_cpus() -> None:
    # download: bcp.processes 2 in the demo; a 1-CPU pod runs 1, a pod of 8 CPUs keeps 2, `processes` decides.
    for overrides, processes in (
        (("download.kubernetes.processes=null", "download.kubernetes.cpu='1'"), 1),
        (("download.kubernetes.processes=null", "download.kubernetes.cpu='8'"), 2),
        (("download.kubernetes.processes=null", "download.kubernetes.cpu=500m"), 2),
        (("download.kubernetes.processes=3", "download.kubernetes.cpu='1'"), 3),
    ):
        backend, request = request_for("download", *overrides)
        assert backend.sharding(request)["processes"] == processes, overrides


def test_plan_names_the_pytorchjobs_master_as_its_rendezvous() -> None:
    backend, request = request_for(
        "pretrain", "pretrain.kubernetes.launcher=pytorchjob", "pretrain.kubernetes.replicas=2"
    )
    meet = backend.render(request).rendezvous
    name = job_name(request)
    assert meet["MASTER_ADDR"].startswith(f"{name}-master-0 ") and meet["WORLD_SIZE"] == 2
    backend, request = request_for("pretrain", "pretrain.kubernetes.replicas=2")
    assert backend.render(request).rendezvous["MASTER_ADDR"].startswith(f"{job_name(request)}-0.{job_name(request)} ")


def test_labels_annotations_and_a_ttl_pass_through_but_never_replace_the_backends_labels() -> None:
    backend, request = request_for(
        "sample",
        "sample.kubernetes.labels={team: llm, example.org/cost-centre: c42, bcp-pipeline/run: x}",
        "sample.kubernetes.annotations={owner: me@example.org}",
        "sample.kubernetes.ttl_after_finished=1D",
    )
    _, job = manifests(request, backend.options)
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        assert meta["labels"]["team"] == "llm" and meta["labels"]["example.org/cost-centre"] == "c42"
        assert meta["labels"]["bcp-pipeline/run"] == "demo-RUN"  # the backend's own: what it lists and selects by
        assert meta["annotations"] == {"owner": "me@example.org"}
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    backend, request = request_for(
        "sample",
        "sample.kubernetes.launcher=pytorchjob",
        "sample.kubernetes.ttl_after_finished=2H",
        "sample.kubernetes.labels={team: llm}",
    )
    (pytorchjob,) = manifests(request, backend.options)
    assert pytorchjob["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 7200
    assert pytorchjob["metadata"]["labels"]["team"] == "llm"
    assert pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"]["team"] == "llm"
