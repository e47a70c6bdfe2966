"""NVIDIA's own ngc parser (ngcsdk 4.19.1, via tests/support/ngc_parser.py): what it accepts, rejects and builds."""

from __future__ import annotations

import os
import time

import pytest
from support import ngc_parser

pytestmark = pytest.mark.skipif(not ngc_parser.available(), reason="needs ngcsdk==4.19.1 and argcomplete")

RUN = ["base-command", "job", "run"]
MINIMAL = RUN + ["--name", "stage", "--image", "nvidia/pytorch:23.03-py3", "--instance", "dgxa100.80g.1.norm",
                 "--result", "/results", "--commandline", "true"]  # fmt: skip
GUIDE_DOWNLOAD = [
    "ngc", "base-command", "job", "run", "--name", "download",
    "--image", "nvcr.io/nvaie/nemo-framework-training:23.11", "--instance", "dgxa100.80g.8.norm",
    "--replicas", "2", "--array-type", "PYTORCH", "--total-runtime", "10h", "--preempt", "RUNONCE",
    "--priority", "NORMAL", "--order", "50", "--result", "/results",
    "--workspace", "nemo-framework:/mount_workspace:RW", "--label", "bcpp_run_x",
    "--commandline", "bcprun --nnodes 2 --npernode 48 --no_redirect --cmd 'python3 /mount_workspace/x.py'",
]  # fmt: skip


def rejected(argv: list[str], **kwargs: str | None) -> ngc_parser.NgcRejected:
    with pytest.raises(ngc_parser.NgcRejected) as info:
        ngc_parser.job_create_request(argv, **kwargs)
    return info.value


def test_guide_multinode_command_builds_the_expected_request() -> None:
    started = time.monotonic()
    request = ngc_parser.job_create_request(GUIDE_DOWNLOAD)
    print(f"first parse incl. loading ngcsdk: {time.monotonic() - started:.2f} s")
    assert request == {
        "aceInstance": "dgxa100.80g.8.norm",
        "aceName": ngc_parser.DEFAULT_ACE,
        "arrayType": "PYTORCH",
        "command": GUIDE_DOWNLOAD[-1],
        "dockerImageName": "nvaie/nemo-framework-training:23.11",  # registry host dropped
        "jobOrder": 50,
        "jobPriority": "NORMAL",
        "minAvailability": 2,  # coscheduling (default) -> all replicas
        "name": "download",
        "replicaCount": 2,
        "resultContainerMountPoint": "/results",
        "runPolicy": {"preemptClass": "RUNONCE", "totalRuntimeSeconds": 36000},
        "userLabels": ["bcpp_run_x"],
        "workspaceMounts": [{"containerMountPoint": "/mount_workspace", "id": "nemo-framework", "mountMode": "RW"}],
    }
    started = time.monotonic()
    ngc_parser.job_create_request(GUIDE_DOWNLOAD)
    assert time.monotonic() - started < 1.0, "the parser is cached per process"


@pytest.mark.parametrize(
    ("spelling", "seconds"),
    [("10h", 36000), ("10H", 36000), ("5D", 432000), ("5d", 432000), ("1h30m", 5400), ("1H30M", 5400),
     ("36000s", 36000), ("36000S", 36000), ("1D12H", 129600), ("90m", 5400), ("2D3H4M5S", 183845), ("1.5h", 5400)],
)  # fmt: skip
def test_duration_spellings_accepted(spelling: str, seconds: int) -> None:
    request = ngc_parser.job_create_request(MINIMAL + ["--total-runtime", spelling, "--min-timeslice", spelling])
    assert request["runPolicy"] == {"preemptClass": "RUNONCE", "totalRuntimeSeconds": seconds,
                                    "minTimesliceSeconds": seconds}  # fmt: skip


@pytest.mark.parametrize("spelling", ["3600", "1w", "10 h", "h", "PT1H", "10hours"])
def test_duration_spellings_rejected(spelling: str) -> None:
    error = rejected(MINIMAL + ["--total-runtime", spelling])
    assert error.exit_code == 2 and "[nD][nH][nM][nS]" in error.message


@pytest.mark.parametrize("spelling", ["0s", ""])
def test_zero_or_empty_runtime_is_left_out_and_preempt_defaults_to_runonce(spelling: str) -> None:
    request = ngc_parser.job_create_request(MINIMAL + ["--total-runtime", spelling])
    assert request["runPolicy"] == {"preemptClass": "RUNONCE"}


@pytest.mark.parametrize(
    ("extra", "code", "fragment"),
    [
        (["--workspace", "ws:/mnt:rw"], 2, "<RW|RO>"),
        (["--workspace", "ws"], 2, "<RW|RO>"),
        (["--replicas", "2"], 1, "total_runtime is required"),
        (["--replicas", "2", "--total-runtime", "1h"], 1, "array_type is required"),
        (["--replicas", "2", "--array-type", "PYTORCH", "--total-runtime", "1h", "--preempt", "RESTARTABLE"], 1,
         "RUNONCE` or `RESUMABLE"),
        (["--array-type", "PYTORCH"], 1, "only valid for multi-node"),
        (["--label", "bad-label"], 2, "Base Command labels"),
        (["--label", "1abc"], 2, "Base Command labels"),
        (["--label", "x" * 257], 2, "256"),
        (["--label", ",".join(f"l{i}" for i in range(21))], 1, "maximum of 20"),
        (["--secret", "a:b:c:d"], 1, "A secret must match"),
        (["--secret", "bad/name"], 1, "A secret must match"),
        (["--env-var", "KEY=value"], 1, "Key-value must match"),
        (["--env-var", "bad key:value"], 1, "Key-value must match"),
        (["--order", "100"], 2, "valid range is 1-99"),
        (["--priority", "normal"], 2, "invalid choice"),
        (["--preempt", "runonce"], 2, "invalid choice"),
        (["--waitrun", "--waitend"], 1, "cannot be specified with"),
        (["--org", "a", "--org", "b"], 1, "Duplicate --org"),
        (["--no-such-flag"], 2, "unrecognized arguments"),
        (["--name", "again"], 2, "Duplicate options are not allowed"),
    ],
)  # fmt: skip
def test_rejections(extra: list[str], code: int, fragment: str) -> None:
    error = rejected(MINIMAL + extra)
    assert (error.exit_code, fragment in error.message) == (code, True), error.message


def test_required_fields_and_ace() -> None:
    assert "name is required" in rejected([a for a in MINIMAL if a not in ("--name", "stage")]).message
    assert "result is required" in rejected([a for a in MINIMAL if a not in ("--result", "/results")]).message
    assert "Provide ACE name" in rejected(MINIMAL, ace=None).message
    assert ngc_parser.job_create_request(MINIMAL + ["--ace", "my-ace"], ace=None)["aceName"] == "my-ace"


@pytest.mark.parametrize(
    ("name", "ok"),
    [("download", True), ("bcpp run-1.stage_2, x", True), ("9lives", True), ("x", False), ("a" * 129, False),
     ("run/stage", False), ("run:stage", False), ("_hidden", False), (".dot", False)],
)  # fmt: skip
def test_job_name_rules(name: str, ok: bool) -> None:
    """JobCreateRequest.isValid: 2-128 chars matching ^[a-zA-Z0-9][a-zA-Z0-9-. ,_]*$ (exit 1 otherwise)."""
    argv = [a if a != "stage" else name for a in MINIMAL]
    if ok:
        assert ngc_parser.job_create_request(argv)["name"] == name
    else:
        assert "JobCreateRequest.name" in rejected(argv).message


def test_instance_is_required() -> None:
    argv = [a for a in MINIMAL if a not in ("--instance", "dgxa100.80g.1.norm")]
    assert "aceInstance" in rejected(argv).message


def test_globals_after_job_run_set_org_ace_team() -> None:
    run = ngc_parser.run_request(MINIMAL + ["--org", "o2", "--ace", "a2", "--team", "T2", "--format_type", "json"])
    assert (run.org, run.ace, run.team, run.format_type) == ("o2", "a2", "t2", "json")  # team lower-cased
    assert run.request["aceName"] == "a2" and "org" not in str(run.request.keys())
    # the next call does not inherit the previous call's globals (the parser is cached)
    run = ngc_parser.run_request(MINIMAL)
    defaults = (ngc_parser.DEFAULT_ORG, ngc_parser.DEFAULT_ACE, None, "ascii")
    assert (run.org, run.ace, run.team, run.format_type) == defaults


def test_labels_secrets_env_vars_shapes() -> None:
    request = ngc_parser.job_create_request(MINIMAL + [
        "--label", "run_1,stage_x", "--label", "_reserved", "--label", "__system", "--lock-label",
        "--secret", "hf:token:HF_TOKEN", "--secret", "hf:other", "--secret", "aws",
        "--env-var", "DATA:/mnt/ws:ro=1", "--env-var", "EMPTY:",
        "--workspace", "ws:/mnt/ws",
    ])  # fmt: skip
    assert request["userLabels"] == ["run_1", "stage_x"]
    assert request["reservedLabels"] == ["_reserved"] and request["systemLabels"] == ["__system"]
    assert request["isLabelLocked"] is True
    assert request["userSecretsSpec"] == [
        {
            "name": "hf",
            "allKeys": False,
            "keysSpec": [{"keyName": "token", "envName": "HF_TOKEN"}, {"keyName": "other"}],
        },
        {"name": "aws", "allKeys": True},
    ]
    assert request["envs"] == [{"name": "DATA", "value": "/mnt/ws:ro=1"}, {"name": "EMPTY", "value": ""}]
    assert request["workspaceMounts"] == [{"id": "ws", "containerMountPoint": "/mnt/ws"}]  # no mode -> no key


def test_batch_alias_and_leading_ngc() -> None:
    alias = ["ngc", "batch", "run"] + MINIMAL[3:]
    assert ngc_parser.job_create_request(alias) == ngc_parser.job_create_request(MINIMAL)
    assert ngc_parser.is_job_run(alias) and not ngc_parser.is_job_run(["base-command", "job", "info", "1"])
    assert ngc_parser.is_job_run(["--format_type", "json", "--ace", "a", "bc", "job", "run", "--name", "x"])


def test_other_subcommands_parse() -> None:
    listing = ngc_parser.parse_args(["base-command", "job", "list", "--label", "bcpp_*", "--status", "RUNNING",
                                     "--duration", "30D", "--format_type", "json"]).namespace  # fmt: skip
    assert listing.label == ["bcpp_*"] and listing.status == ["RUNNING"] and listing.duration.days == 30
    log = ngc_parser.parse_args(["batch", "log", "12:1", "--tail", "--lines", "5"]).namespace
    assert (log.jobid, log.tail, log.lines) == ("12:1", True, 5)
    upload = ngc_parser.parse_args(["workspace", "upload", "ws", "--source", "s", "--destination", "d",
                                    "--exclude", "*.pyc"]).namespace  # fmt: skip
    assert (upload.workspace_id, upload.exclude) == ("ws", ["*.pyc"])
    assert list(ngc_parser.parse_args(["bc", "job", "kill", "1, 2,5-6"]).namespace.jobids) == [1, 2, 5, 6]
    with pytest.raises(ngc_parser.NgcRejected) as info:
        ngc_parser.parse_args(["base-command", "job", "list", "--status", "DONE"])
    assert info.value.exit_code == 2
    with pytest.raises(ngc_parser.NgcRejected):
        ngc_parser.parse_args(["base-command", "job", "log", "1", "--head", "--tail"])


def test_loading_leaves_the_callers_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGC_CLI_API_KEY", "callers-key")
    ngc_parser.job_create_request(MINIMAL)
    assert os.environ["NGC_CLI_API_KEY"] == "callers-key"
