"""The BCP backend's two transports (the ngc CLI, ngcsdk in-process) and what is checked before a run is recorded.

Both transports submit every bundled job to the NGC API EMULATOR (tests/fakes/ngc_api.py), which records each
JobCreateRequest it got; NVIDIA's own request builder fed with our argv (tests/support/ngc_parser.py) is the reference.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from support import ngc_parser
from support.bcp_emulation import needs_ngcsdk
from support.golden_files import REPO

from bcp_pipeline.backends.bcp import connect
from bcp_pipeline.backends.bcp.render import JobSpec, job_run_argv, job_spec
from bcp_pipeline.backends.bcp.transport_cli import CliTransport
from bcp_pipeline.backends.bcp.transport_sdk import SdkTransport
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.cli.main import main
from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.errors import BackendCallError, is_transient

pytestmark = [needs_ngcsdk, pytest.mark.both_transports]  # the transport is what this tests
BUNDLED = load_and_check(REPO / "pipelines.yaml")  # as `plan` and `run` load it


def bundled_requests() -> list[JobRequest]:
    """Every job of every bundled pipeline: each stage and its verification."""
    return [
        request
        for pipeline in BUNDLED.pipelines.values()
        for request in planned_requests(pipeline, f"{pipeline.name}-RUN")
    ]


def through_the_cli(specs: list[tuple[JobRequest, JobSpec]]) -> set[str]:
    """The jobs the CLI transport also submits: one of each set of `job run` options, and the longest command line.
    The CLI passes the same argv to NVIDIA's own parser, in a process of its own (about 2 s a job): what can differ
    from the SDK is how the argv is built and handed over, which these cover; the SDK submits every job."""
    chosen: dict[tuple[str, ...], str] = {}
    for request, spec in specs:
        chosen.setdefault(tuple(sorted(w for w in job_run_argv(spec) if w.startswith("--"))), request.job_name)
    longest = max(specs, key=lambda pair: len(pair[1].commandline))[0].job_name
    return {*chosen.values(), longest}


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)  # one emulator; both transports talk to it
def test_both_transports_submit_the_same_job_create_request_for_every_bundled_job(fake):
    options = BUNDLED.options["bcp"]
    for workspace in {p.workspace.name for p in BUNDLED.pipelines.values()}:
        fake.create_workspace(workspace)
    fake.set_secret("hf-token", {"token": "not-a-real-token"})
    # Nothing needs to run (the request is the point): every job ends at once, so no supervisor lingers.
    fake.inject("FAILED", after_seconds=0, times=None, details="not run: this test compares requests")
    transports = {"cli": CliTransport(options), "sdk": SdkTransport(options)}
    requests = bundled_requests()
    assert len(requests) > 30
    specs = [(request, job_spec(request, options, BUNDLED.stages_dir)) for request in requests]
    both = through_the_cli(specs)
    assert len(both) >= 5
    for request, spec in specs:
        reference = ngc_parser.job_create_request(job_run_argv(spec), org=fake.org, ace=fake.ace)
        for name, transport in transports.items():
            if name == "cli" and request.job_name not in both:
                continue
            job_id = int(transport.submit(spec))  # every job of every golden plan gets an id
            received = fake.jobs()[job_id]["emu"]["request"]
            assert received == reference, f"{request.job_name}: the {name} transport sent another request"
    assert len(fake.calls("job run")) == len(both)  # the CLI's calls


def test_every_bundled_commandline_is_one_program_and_its_arguments():
    """`job run` sends --commandline as is and does not say which shell runs it: anything more than one program
    and its arguments must say `bash -c '...'` itself."""
    options = BUNDLED.options["bcp"]
    for request in bundled_requests():
        lexer = shlex.shlex(
            job_spec(request, options, BUNDLED.stages_dir).commandline, posix=True, punctuation_chars=True
        )
        lexer.whitespace_split = True
        words = list(lexer)
        operators = [w for w in words if w and set(w) <= set("();<>|&")]
        assert operators == [], f"{request.job_name}: shell syntax {operators} outside bash -c"
        assert not any(w.startswith("$") for w in words[1:2]), request.job_name


def without_any_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "sdk_available", lambda: False)
    monkeypatch.setattr(connect, "cli_available", lambda options: False)


def demo_project(tmp_path: Path, transport: str = "auto") -> Path:
    config = tmp_path / "pipelines.yaml"
    text = (REPO / "pipelines.yaml").read_text().replace("stages_dir: stages\n", f"stages_dir: {REPO / 'stages'}\n", 1)
    text = text.replace("\nbackends:\n", f"\nbackends:\n  bcp: {{transport: {transport}}}\n", 1)
    config.write_text(text)
    return config


def test_without_cli_and_sdk_run_fails_before_recording_and_plan_still_works(tmp_path, monkeypatch, capsys):
    without_any_transport(monkeypatch)
    config = demo_project(tmp_path)
    assert main(["run", "demo", "--backend", "bcp", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert "needs NVIDIA's ngc CLI or ngcsdk 4.19.1, and neither is here" in error
    assert 'pip install "bcp-pipeline[bcp]"' in error and "ngc" in error
    assert not (tmp_path / ".bcp-pipeline").exists(), "no run record is left behind"
    assert main(["plan", "demo", "--backend", "bcp", "--config", str(config)]) == 0
    assert "ngc base-command job run" in capsys.readouterr().out


@pytest.mark.parametrize(
    "transport, message",
    [
        ("cli", "backends.bcp.transport is cli, but the ngc CLI 'ngc' is not on PATH"),
        ("sdk", "backends.bcp.transport is sdk, but ngcsdk 4.19.1 cannot be imported"),
    ],
)
def test_a_named_transport_that_is_missing_is_named(tmp_path, monkeypatch, capsys, transport, message):
    without_any_transport(monkeypatch)
    assert main(["run", "demo", "--backend", "bcp", "--config", str(demo_project(tmp_path, transport))]) == 2
    assert message in capsys.readouterr().err


def test_without_api_key_or_ace_run_fails_before_recording(tmp_path, monkeypatch, capsys):
    for key in ("NGC_CLI_API_KEY", "NGC_CLI_ORG", "NGC_CLI_ACE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NGC_CLI_HOME", str(tmp_path / "empty-ngc-home"))  # no ~/.ngc/config either
    monkeypatch.setenv("NGC_CLI_ORG", "my-org")
    config = demo_project(tmp_path, "sdk")
    assert main(["run", "demo", "--backend", "bcp", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert (
        "the BCP backend is missing an API key (NGC_CLI_API_KEY, or `ngc config set`); an ACE "
        "(backends.bcp.ace, NGC_CLI_ACE, or `ngc config set`). Nothing was submitted or recorded"
    ) in error
    assert not (tmp_path / ".bcp-pipeline").exists()
    # The settings file `ngc config set` writes is enough.
    (tmp_path / "empty-ngc-home/.ngc").mkdir(parents=True)
    (tmp_path / "empty-ngc-home/.ngc/config").write_text("[CURRENT]\napikey = k\nace = my-ace\norg = my-org\n")
    connect.check_credentials(load_config(config).options["bcp"])


def test_global_options_are_taken_after_the_verb(tmp_path, capsys):
    config = demo_project(tmp_path)
    assert main(["--config", str(config), "plan", "demo"]) == 0
    before = capsys.readouterr().out
    assert main(["plan", "demo", "--config", str(config)]) == 0
    assert capsys.readouterr().out == before
    assert main(["list", "--config", str(config), "--state-dir", str(tmp_path / "state")]) == 0
    assert "no runs yet" in capsys.readouterr().out


def test_the_backend_picks_the_transport_only_when_it_needs_one(tmp_path, monkeypatch):
    without_any_transport(monkeypatch)
    config = load_config(demo_project(tmp_path))
    backend = make_backend("bcp", config, config.pipeline("demo"), tmp_path / "runs/demo-RUN")
    backend.prepare(config.pipeline("demo"), execute=False)  # rendering needs no transport
    with pytest.raises(Exception, match="neither is here"):
        _ = backend.transport


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "download.bcp.preempt=RESTARTABLE",
            "stage download: preempt RESTARTABLE is refused for a job with replicas > 1 "
            "(ngc allows only RUNONCE or RESUMABLE for multi-node jobs); set `--set download.bcp.preempt=RESUMABLE`",
        ),
        (
            "download.bcp.array_type=MPI",
            "stage download: array_type MPI is not supported: bcprun in an MPIJob gives its "
            "processes Open MPI's rank variables",
        ),
    ],
)
def test_what_bcp_would_refuse_or_get_wrong_is_a_config_error_before_anything_is_recorded(
    tmp_path, capsys, override, message
):
    """Not six "transient" submit failures (RESTARTABLE with replicas > 1), nor ranks that all read rank 0 of 1."""
    config = tmp_path / "pipelines.yaml"
    config.write_text(
        (REPO / "pipelines.yaml").read_text().replace("stages_dir: stages\n", f"stages_dir: {REPO / 'stages'}\n", 1)
    )
    for command in ("run", "plan"):
        assert main([command, "slimpajama-126m", "--backend", "bcp", "--config", str(config), "--set", override]) == 2
        error = capsys.readouterr().err
        assert message in error and "download.bcp" in error, error
    assert not (tmp_path / ".bcp-pipeline").exists()


@pytest.mark.emulator(variants={"runonce_preemption": "refused"})
def test_preempt_through_either_transport_and_a_refusal_keeps_its_http_status(fake):
    """`job preempt` as `check`'s preemption probe makes it; a refused one is a BackendCallError that says the
    service's 400 (a refusal, never taken for a busy API)."""
    transport = (CliTransport if fake.transport == "cli" else SdkTransport)(BUNDLED.options["bcp"])
    runonce, resumable = (
        transport.submit(
            JobSpec(
                name=f"preempt-{kind}",
                image="nvcr.io/nvaie/x:1",
                preempt=kind,
                instance="dgxa100.80g.1.norm",
                result="/results",
                commandline="exec sleep 60",
            )
        )
        for kind in ("RUNONCE", "RESUMABLE")
    )
    for job_id in (runonce, resumable):
        fake.wait_for(int(job_id), {"RUNNING"})
    with pytest.raises(BackendCallError) as refused:
        transport.preempt(runonce)
    assert refused.value.http_status == 400 and not is_transient(refused.value)
    assert "cannot be preempted" in str(refused.value) and fake.status(int(runonce)) == "RUNNING"
    transport.preempt(resumable)
    assert fake.wait_for(int(resumable), {"PREEMPTED"}) == "PREEMPTED"
    transport.resume(resumable)
    assert fake.wait_for(int(resumable), {"RUNNING"}) == "RUNNING"
