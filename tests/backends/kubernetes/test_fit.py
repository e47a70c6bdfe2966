"""The pure half of `check`'s "fits a node" rows (bcp_pipeline/backends/kubernetes/fit.py): which pod specs a
rendered manifest creates, their summed requests, and quantities as people write them. The rows themselves are
tested against the real test cluster's nodes (tests/e2e/test_kubernetes_e2e.py)."""

from decimal import Decimal

from bcp_pipeline.backends.kubernetes.fit import pod_requests, pod_specs, show


def pod(*requests: dict) -> dict:
    return {
        "containers": [{"name": f"c{i}", "resources": {"requests": r, "limits": r}} for i, r in enumerate(requests)]
    }


def test_a_jobs_template_and_each_pytorchjob_replica_are_the_pods_it_creates() -> None:
    job = {"kind": "Job", "spec": {"template": {"spec": pod({"cpu": "2"})}}}
    master, worker = pod({"cpu": "4"}), pod({"cpu": "4", "nvidia.com/gpu": "8"})
    pytorchjob = {
        "kind": "PyTorchJob",
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {"spec": master}},
                "Worker": {"replicas": 3, "template": {"spec": worker}},
            }
        },
    }
    assert pod_specs(job) == [job["spec"]["template"]["spec"]]
    assert pod_specs(pytorchjob) == [master, worker]
    assert pod_specs({"kind": "Service", "spec": {"clusterIP": "None"}}) == []


def test_requests_add_up_over_containers_in_the_schedulers_units() -> None:
    assert pod_requests(pod({"cpu": "1500m", "memory": "1Gi"}, {"cpu": "1", "memory": "512Mi"})) == {
        "cpu": Decimal("2.5"),
        "memory": Decimal(3 * 2**29),
    }
    assert pod_requests({"containers": [{"name": "c"}]}) == {}


def test_quantities_are_shown_as_written() -> None:
    assert [show(Decimal(64 * 2**30)), show(Decimal(512 * 2**20)), show(Decimal("8")), show(Decimal("2.5"))] == [
        "64Gi",
        "512Mi",
        "8",
        "2.5",
    ]
