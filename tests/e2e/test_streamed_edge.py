"""A streamed edge on the local backend (pipeline demo-fast: download -> tokenize-preprocess with `stream: true`),
the download served by a slow loopback HTTP server so the two stages overlap:

- the tokenize job starts while the download runs, makes an output before the last shard lands, and its outputs
  are the bytes of the same pipeline run one stage after the other;
- a download that fails stops the tokenize job (cancelled, naming why); a resume finishes both;
- the orchestrator killed while both stages run: a resume ends with the same bytes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.chaos_run import make_project
from support.http_faults import Fault, FaultServer
from support.pipeline_fixtures import REPO, wait_for
from support.stage_fixtures import snapshot

from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import RunStore

PIPELINE = "demo-fast"
BODY_DELAY = 1.5  # seconds per shard: 8 shards over 2 ranks of one connection take ~6 s to land


def project(folder: Path, streamed: bool = True) -> Path:
    """A copy of the repo's config; `streamed=False` makes the edge a plain one (the serial reference)."""
    config = make_project(folder, REPO / "pipelines.yaml", {"local": {"poll_seconds": 0.1}}) / "pipelines.yaml"
    raw = yaml.safe_load(config.read_text())
    needs = raw["pipelines"][PIPELINE]["stages"]["tokenize-preprocess"]["needs"]
    assert {"stage": "download", "stream": True} in needs
    if not streamed:
        raw["pipelines"][PIPELINE]["stages"]["tokenize-preprocess"]["needs"] = ["download", "bpe"]
    config.write_text(yaml.safe_dump(raw, sort_keys=False, width=120))
    return config


def workspace(config: Path) -> Path:
    loaded = load_config(config, pipeline=PIPELINE)
    return config.parent / loaded.options["local"].workspace_dir / loaded.pipeline(PIPELINE).workspace.name


def cli(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bcp_pipeline", "--config", str(config), *args]


def run_args(config: Path, url: str) -> list[str]:
    download = load_config(config, pipeline=PIPELINE).pipeline(PIPELINE).stages["download"].args
    args = [url if arg.startswith("file://") else arg for arg in download]
    return cli(config, "run", PIPELINE, "--set", f"download.args={json.dumps(args)}")


def run(argv: list[str], config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=config.parent, capture_output=True, text=True, timeout=300)


def latest(config: Path):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def serve(config: Path) -> FaultServer:
    mirror = workspace(config) / "mirror"
    mirror.mkdir(parents=True, exist_ok=True)  # the sample stage fills it in the run
    return FaultServer(mirror, body_delay=BODY_DELAY)


def outputs(config: Path) -> dict[str, bytes]:
    return snapshot(workspace(config) / "data" / "slimpajama" / "preprocessed")


@pytest.fixture(scope="module")
def serial_outputs(tmp_path_factory) -> dict[str, bytes]:
    """The pipeline's outputs with the edge a plain one: the download finished before the tokenize job starts."""
    config = project(tmp_path_factory.mktemp("serial"), streamed=False)
    with serve(config) as server:
        done = run(run_args(config, server.url), config)
    assert done.returncode == 0, done.stdout + done.stderr
    return outputs(config)


def test_tokenize_starts_on_the_landed_shards_and_writes_the_serial_bytes(tmp_path, serial_outputs):
    config = project(tmp_path / "streamed")
    with serve(config) as server:
        done = run(run_args(config, server.url), config)
    assert done.returncode == 0, done.stdout + done.stderr
    state = latest(config)
    download = state.stages["download"].jobs[0]
    tokenize = state.stages["tokenize-preprocess"].jobs[0]
    assert tokenize.submitted_at < download.ended_at, "the tokenize job was submitted while the download ran"
    shards = sorted((workspace(config) / "data" / "slimpajama" / "zst").glob("*.jsonl.zst"))
    first_output = (
        workspace(config) / "data" / "slimpajama" / "preprocessed" / "train_chunk_0.jsonl_text_document.manifest.json"
    )
    assert first_output.stat().st_mtime < max(p.stat().st_mtime for p in shards), (
        "chunk 0 was tokenized before the last shard landed"
    )
    verification = state.stages["tokenize-preprocess"].jobs[-1]
    # Its verification waited for the download's: the shards were counted complete before its outputs were.
    assert verification.kind == "verify" and verification.submitted_at >= state.stages["download"].finished_at
    assert outputs(config) == serial_outputs


def test_a_failed_download_stops_the_tokenize_job_and_a_resume_finishes_both(tmp_path, serial_outputs):
    config = project(tmp_path / "streamed")
    broken = "/train/chunk2/example_train_3.jsonl.zst"
    with serve(config) as server:
        server.always(broken, Fault.error(404))
        done = run(run_args(config, server.url), config)
        assert done.returncode != 0
        state = latest(config)
        assert state.stages["download"].status.value == "failed"
        tokenize = state.stages["tokenize-preprocess"]
        assert tokenize.status.value == "cancelled", done.stdout
        assert "stopped because download failed" in tokenize.error
        assert "it streams from download failed" in tokenize.jobs[-1].detail
        status = run(cli(config, "status", state.run_id), config).stdout
        assert "stopped because download failed" in status
        server.heal(broken)
        resumed = run(cli(config, "resume", state.run_id), config)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert latest(config).status == "succeeded"
    assert outputs(config) == serial_outputs


def test_the_orchestrator_killed_while_both_stages_run_resumes_to_the_same_bytes(tmp_path, serial_outputs):
    config = project(tmp_path / "streamed")
    with serve(config) as server:
        orchestrator = subprocess.Popen(
            run_args(config, server.url), cwd=config.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:

            def both_running() -> bool:
                state = latest(config)
                return state is not None and all(
                    state.stages[name].status.value == "running" for name in ("download", "tokenize-preprocess")
                )

            wait_for(both_running, timeout=120, what="download and tokenize-preprocess running at once")
            orchestrator.send_signal(signal.SIGKILL)
            orchestrator.wait()
        finally:
            if orchestrator.poll() is None:
                orchestrator.kill()
        resumed = run(cli(config, "resume", latest(config).run_id), config)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "re-attached" in resumed.stdout or latest(config).stages["download"].attempts == 1
    assert latest(config).status == "succeeded"
    assert outputs(config) == serial_outputs
