"""The ACE's limits against the bundled pipelines' rendered jobs (backends/bcp/admission.py's policy: pure; run and
plan call it with the ACE they read)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ngc_parser
from support.golden_files import REPO

from bcp_pipeline.backends.bcp.admission import PlannedJob, planned_jobs, rendered_jobs, violations
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.submitter import planned_requests

CONFIG = load_and_check(REPO / "pipelines.yaml")
INSTANCES = ("dgxa100.80g.1.norm", "dgxa100.80g.4.norm", "dgxa100.80g.8.norm", "dgxh100.80g.8.norm")


def jobs(pipeline: str) -> list[PlannedJob]:
    config = CONFIG.pipeline(pipeline)
    backend = make_backend("bcp", CONFIG, config, Path("/nonexistent/runs") / f"{pipeline}-RUN")
    return planned_jobs(rendered_jobs(backend.render(r) for r in planned_requests(config, f"{pipeline}-RUN")))


def ace(**limits) -> dict:
    """An ACE as `ngc base-command ace info --format_type json` prints it (ngcsdk's Ace / AceInstance fields)."""
    per_instance = {
        k: limits.pop(k)
        for k in ("allowMultinode", "allowMultinodePreemptable", "multiNodeSupportedArrayTypes")
        if k in limits
    }
    instances = limits.pop("instances", INSTANCES)
    return {
        "id": 357,
        "name": "my-ace",
        "maxRuntimeSeconds": 30 * 86400,
        **limits,
        "instances": [
            {
                "name": name,
                "type": "GPU",
                "allowMultinode": True,
                "multiNodeSupportedArrayTypes": ["MPI", "PYTORCH"],
                **per_instance,
            }
            for name in instances
        ],
    }


def test_a_roomy_ace_has_nothing_to_say():
    for pipeline in CONFIG.pipelines:
        assert violations(ace(), jobs(pipeline)) == [], pipeline


def test_runtime_and_replicas_over_the_ace_maximum_name_the_stage_and_the_set_that_fixes_it():
    found = violations(ace(maxRuntimeSeconds=4 * 86400, maxAllowedReplicas=4), jobs("slimpajama-8b"))
    assert [(v.stage, v.limit, v.fix) for v in found] == [
        (
            "pretrain",
            "maxRuntimeSeconds",
            "--set pretrain.bcp.total_runtime=4D (the stage then continues from its last checkpoint in a further job)",
        ),
        ("pretrain", "maxAllowedReplicas", "--set pretrain.bcp.replicas=4"),
    ]
    assert str(found[0]).startswith(
        "stage pretrain: total_runtime 5D (432000 s), but the ACE's maxRuntimeSeconds "
        "allows 4D (345600 s); --set pretrain.bcp.total_runtime=4D"
    )


def test_an_evaluation_over_the_ace_maximum_is_said_to_go_on_from_its_last_result():
    found = violations(ace(maxRuntimeSeconds=7 * 86400), jobs("slimpajama-8b-bridge"))
    assert [(v.stage, v.limit, v.fix) for v in found] == [
        (
            "evaluate",
            "maxRuntimeSeconds",
            "--set evaluate.bcp.total_runtime=7D (the stage then continues from its last result in a further job)",
        )
    ]


def test_an_instance_the_ace_lacks_is_named_with_one_it_has():
    planned = jobs("slimpajama-126m")
    found = violations(ace(instances=("dgxa100.80g.8.norm", "dgxa100.40g.1.norm")), planned)
    on_one_gpu = [(j.stage, j.kind) for j in planned if j.spec.instance == "dgxa100.80g.1.norm"]
    assert [(v.stage, v.kind, v.limit) for v in found] == [(s, k, "instances") for s, k in on_one_gpu]
    fixes = {v.kind: v.fix for v in found}
    assert fixes["verify"] == "set verification.bcp.instance: dgxa100.40g.1.norm in pipelines.yaml"
    stage = next(v for v in found if v.kind == "stage")
    assert stage.fix == f"--set {stage.stage}.bcp.instance=dgxa100.40g.1.norm"  # as many GPUs as it asked for


def test_multinode_rules_of_the_instance():
    no_multinode = violations(ace(allowMultinode=False), jobs("slimpajama-126m"))
    multi_stages = [j.stage for j in jobs("slimpajama-126m") if j.spec.replicas > 1]
    assert [v.stage for v in no_multinode] == multi_stages and multi_stages
    assert {v.fix for v in no_multinode} == {f"--set {s}.bcp.replicas=1" for s in multi_stages}
    mpi_only = violations(ace(multiNodeSupportedArrayTypes=["MPI"]), jobs("slimpajama-126m"))
    assert {v.limit for v in mpi_only} == {"multiNodeSupportedArrayTypes"}
    assert mpi_only[0].fix == f"--set {multi_stages[0]}.bcp.array_type=MPI"
    preemptable = [
        PlannedJob(stage=j.stage, kind=j.kind, spec=j.spec.__class__(**{**j.spec.__dict__, "preempt": "RESUMABLE"}))
        for j in jobs("slimpajama-126m")
    ]
    found = violations(ace(allowMultinodePreemptable=False), preemptable)
    assert {v.fix for v in found} == {f"--set {s}.bcp.preempt=RUNONCE" for s in multi_stages}


def test_detach_needs_two_active_jobs():
    assert violations(ace(maxActiveJobsPerUser=2), jobs("slimpajama-126m"), detach=True) == []
    (found,) = violations(ace(maxActiveJobsPerUser=1), jobs("slimpajama-126m"), detach=True)
    assert found.limit == "maxActiveJobsPerUser" and "run without --detach" in found.fix
    assert violations(ace(maxActiveJobsPerUser=1), jobs("slimpajama-126m")) == []


def test_a_streamed_edge_needs_its_two_jobs_active_at_once():
    planned = jobs("slimpajama-8b-fast")
    assert [j.streams_from for j in planned if j.stage == "tokenize-preprocess"] == [("download",), ()]  # + verify
    assert violations(ace(maxActiveJobsPerUser=2), planned) == []
    (found,) = violations(ace(maxActiveJobsPerUser=1), planned)
    assert (found.stage, found.limit) == ("tokenize-preprocess", "maxActiveJobsPerUser")
    assert "it streams from download (needs with stream: true), so 2 jobs are active at once" in found.value
    assert "drop `stream: true` from tokenize-preprocess's needs" in found.fix
    (with_driver,) = [
        v for v in violations(ace(maxActiveJobsPerUser=2), planned, detach=True) if v.stage == "tokenize-preprocess"
    ]
    assert "3 jobs are active at once with the --detach driver" in with_driver.value


@pytest.mark.skipif(not ngc_parser.available(), reason="ngcsdk==4.19.1 not installed")
def test_the_ace_as_nvidias_data_class_gives_it():
    ngc_parser.parse_args(["batch", "list"])  # ngcsdk loaded the offline way before its data classes are imported
    from basecommand.data.api.Ace import Ace  # pylint: disable=import-outside-toplevel

    as_sdk = Ace(ace(maxRuntimeSeconds=86400, allowMultinode=False)).toDict()
    assert {v.limit for v in violations(as_sdk, jobs("slimpajama-8b"))} == {"maxRuntimeSeconds", "allowMultinode"}
