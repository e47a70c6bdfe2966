"""The kubernetes backend's job policies without a cluster (issue 36's smaller items): a PyTorchJob's elastic
rendezvous (`elastic_policy`), an Indexed Job's per-index retries (`retries_per_index`, `max_failed_indexes`), the
service-account token, and the ranks' line prefixes that `logs --rank` reads, each refused at its line when the
keys do not fit together. The apiserver and the training operator's CRD accept what is rendered here:
tests/e2e/test_kubernetes_e2e.py (server-side dry runs)."""

from __future__ import annotations

import subprocess

import pytest
from support.k8s_requests import request_for

from bcp_pipeline.backends.kubernetes.render import POD_LAUNCHER, job_name, manifests
from bcp_pipeline.backends.kubernetes.states import status_of
from bcp_pipeline.backends.shared.logs import rank_lines
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.training_log import last_progress, parse_training_log

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402

ELASTIC = ("pretrain.kubernetes.launcher=pytorchjob", "pretrain.kubernetes.replicas=3")


def test_an_elastic_pytorchjob_is_workers_in_the_operators_elastic_rendezvous() -> None:
    backend, request = request_for(
        "pretrain", *ELASTIC, "pretrain.kubernetes.elastic_policy={min_replicas: 2, max_restarts: 5}"
    )
    (job,) = manifests(request, backend.options)
    spec = job["spec"]
    # Workers only: the operator points PET_RDZV_ENDPOINT at worker-0, and no Master pod stands apart from them.
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"] and spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert spec["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 3, "rdzvBackend": "c10d", "maxRestarts": 5}
    assert "nProcPerNode" not in spec["elasticPolicy"] and spec["nprocPerNode"] == "1"  # the webhook refuses both
    container = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]  # the rendezvous port
    meet = backend.render(request).rendezvous
    assert meet["MASTER_ADDR"].startswith(
        f"{job_name(request)}-worker-0 (the first Worker pod: c10d elastic rendezvous of 2 to 3 pods"
    )
    # Without a policy: a Master and replicas-1 Workers, no elasticPolicy.
    backend, request = request_for("pretrain", *ELASTIC)
    (job,) = manifests(request, backend.options)
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master", "Worker"] and "elasticPolicy" not in job["spec"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("pretrain.kubernetes.elastic_policy={min_replicas: 1}",),
            "elastic_policy is a PyTorchJob's: it needs launcher",
        ),
        (
            (*ELASTIC, "pretrain.kubernetes.elastic_policy={min_replicas: 4}"),
            "1 <= min_replicas <= replicas <= max_replicas, got min_replicas 4, replicas 3",
        ),
        ((*ELASTIC, "pretrain.kubernetes.elastic_policy={max_replicas: 2}"), "replicas 3 .*max_replicas 2"),
        ((*ELASTIC, "pretrain.kubernetes.elastic_policy={min_replicas: 0}"), "got min_replicas 0"),
        ((*ELASTIC, "pretrain.kubernetes.elastic_policy={max_restarts: -1}"), "max_restarts must be >= 0"),
        (("download.kubernetes.max_failed_indexes=1",), "max_failed_indexes needs retries_per_index"),
        (
            ("download.kubernetes.retries_per_index=1", "download.kubernetes.max_failed_indexes=3"),
            "max_failed_indexes 3 is more than the stage's 2 pods",
        ),
        (("download.kubernetes.retries_per_index=-1",), "retries_per_index must be >= 0"),
        (
            ("download.kubernetes.launcher=pytorchjob", "download.kubernetes.retries_per_index=1"),
            "a PyTorchJob .* has none",
        ),
        (
            ("pretrain.kubernetes.replicas=2", "pretrain.kubernetes.retries_per_index=1"),
            "a training of 2 pods: they meet at a rendezvous",
        ),
    ],
)
def test_keys_that_do_not_fit_together_are_refused_at_their_line(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        request_for("download", *overrides)
    assert f"--set {overrides[-1]}" in str(caught.value)  # blamed on the key that was set


def test_retries_per_index_render_backoff_limit_per_index_and_no_global_limit_unless_set() -> None:
    def limits(*overrides: str, stage: str = "download") -> dict:
        backend, request = request_for(stage, *overrides)
        _, job = manifests(request, backend.options)
        return {key: value for key, value in job["spec"].items() if "Limit" in key or "Indexes" in key}

    assert limits() == {"backoffLimit": 0}  # unchanged: the first failed program fails the stage
    assert limits("download.kubernetes.backoff_limit=2") == {"backoffLimit": 2}
    # Per index: no backoffLimit (the apiserver's default is then no limit), or a limit of 0 would fail the Job at
    # the first failed pod and the retries would never run.
    assert limits("download.kubernetes.retries_per_index=2") == {"backoffLimitPerIndex": 2}
    assert limits(
        "download.kubernetes.retries_per_index=2",
        "download.kubernetes.max_failed_indexes=1",
        "download.kubernetes.backoff_limit=5",
    ) == {"backoffLimit": 5, "backoffLimitPerIndex": 2, "maxFailedIndexes": 1}
    # The pod failure policy stays: disruptions ignored (replaced), the time limit's exit failing the Job, failed
    # programs counted (now per index).
    backend, request = request_for("download", "download.kubernetes.retries_per_index=2")
    _, job = manifests(request, backend.options)
    assert [rule["action"] for rule in job["spec"]["podFailurePolicy"]["rules"]] == ["Ignore", "FailJob", "Count"]
    # A training of one pod (nothing to rejoin) may retry it.
    assert limits("pretrain.kubernetes.retries_per_index=1", stage="pretrain") == {"backoffLimitPerIndex": 1}


def test_failed_indexes_fail_the_stage_and_name_the_indexes() -> None:
    def job(kind: str, reason: str, failed: str | None) -> client.V1Job:
        return client.V1Job(
            metadata=client.V1ObjectMeta(name="j"),
            status=client.V1JobStatus(
                failed_indexes=failed,
                conditions=[
                    client.V1JobCondition(type=kind, status="True", reason=reason, message="Job has failed indexes")
                ],
            ),
        )

    status = status_of(job("Failed", "FailedIndexes", "1,3"))
    assert (status.state.value, status.native) == ("failed", "FAILED/FAILEDINDEXES")
    assert status.detail == "Job has failed indexes (failed indexes: 1,3)"
    assert status_of(job("Failed", "MaxFailedIndexesExceeded", "0-1")).state.value == "failed"
    # Decided, its other indexes' pods still stopping: not finished, so no next attempt overlaps them.
    assert status_of(job("FailureTarget", "FailedIndexes", "1")).state.value == "running"
    assert status_of(job("FailureTarget", "MaxFailedIndexesExceeded", "1")).state.value == "running"


def test_the_service_account_token_is_mounted_only_when_a_stage_asks() -> None:
    def pod(*overrides: str) -> dict:
        backend, request = request_for("sample", *overrides)
        _, job = manifests(request, backend.options)
        return job["spec"]["template"]["spec"]

    default = pod()
    assert default["automountServiceAccountToken"] is False and "serviceAccountName" not in default
    asked = pod("sample.kubernetes.service_account=reader", "sample.kubernetes.mount_service_account_token=true")
    assert asked["automountServiceAccountToken"] is True and asked["serviceAccountName"] == "reader"
    backend, request = request_for(
        "pretrain", "pretrain.kubernetes.launcher=pytorchjob", "pretrain.kubernetes.mount_service_account_token=true"
    )
    (job,) = manifests(request, backend.options)
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_the_pod_launcher_heads_each_ranks_lines_and_exits_with_the_programs_status() -> None:
    """The launcher as the pod runs it (bash): 2 ranks in pod index 1, stdout and stderr alike, a last line without
    its newline, and the failed rank's own exit status (pipefail: not the line prefixer's 0)."""
    program = [
        "python3",
        "-c",
        "import os, sys; r = os.environ['RANK']; "
        "print('out', r, os.environ['LOCAL_RANK'], flush=True); print('err', r, file=sys.stderr); "
        "sys.stdout.write('last'); sys.exit(7 if r == '3' else 0)",
    ]
    done = subprocess.run(
        ["bash", "-c", POD_LAUNCHER, "bcp-pipeline-pod", *program],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "BCP_PIPELINE_PROCESSES": "2", "JOB_COMPLETION_INDEX": "1"},
        timeout=60,
    )
    assert done.returncode == 7, done
    assert sorted(done.stdout.splitlines()) == [
        "[rank2]:err 2",
        "[rank2]:last",
        "[rank2]:out 2 0",
        "[rank3]:err 3",
        "[rank3]:last",
        "[rank3]:out 3 1",
    ]
    assert rank_lines(done.stdout, 3).splitlines() == ["out 3 1", "err 3", "last"]  # one rank's, in its order
    assert rank_lines(done.stdout, 5) == "" and rank_lines("no prefixes\n", 0) is None


def test_torchrun_pods_prefix_their_ranks_lines_too() -> None:
    backend, request = request_for("pretrain", "pretrain.kubernetes.launcher=pytorchjob")
    (job,) = manifests(request, backend.options)
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    torchrun = container["command"][5:]  # inside the time limit's timer (render.time_limited)
    assert container["command"][3] == "bcp-pipeline-time-limit"
    assert torchrun[:5] == ["python3", "-m", "torch.distributed.run", "--nproc_per_node=1", "--tee=3"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"


def test_a_training_log_with_rank_prefixes_reads_as_one_without() -> None:
    plain = "step 1/60 loss 10.5 lr 1.000e-03 2.00 steps/s\nstep 2/60 loss 9.5 lr 1.000e-03 2.00 steps/s\n"
    prefixed = "".join(f"[rank0]:{line}\n" for line in plain.splitlines())
    assert parse_training_log(prefixed) == parse_training_log(plain) and len(parse_training_log(plain)) == 2
    assert last_progress(prefixed) == last_progress(plain)
