"""`needs: [{stage: X, stream: true}]`: loaded as a need plus a streamed edge, and refused, at its line, where the
edge could not keep its promise (an upstream that does not publish its outputs as they complete, a downstream
that cannot start on a part of its inputs or has no verification to wait with)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.pipeline_fixtures import REPO

from bcp_pipeline.config.load import load_config
from bcp_pipeline.errors import ConfigError

STAGES = """\
      download:
        program: download.py
        args: [--out, "${workspace}/zst"]
        verify: [{glob: "${workspace}/zst/*.jsonl.zst", expect: 4}]
      bpe:
        program: gpt2_files.py
        args: [--out, "${workspace}/bpe"]
      tokens:
        program: preprocess.py
        args: [--in, "${workspace}/zst", --out, "${workspace}/out", --files-per-output, "2", --vocab, v, --merges, m]
        needs: NEEDS
        verify: [{glob: "${workspace}/out/*.bin", expect_from: download, group: 2}]
"""


def config_text(needs: str, stages: str = STAGES) -> str:
    return (
        f"version: 1\nstages_dir: {REPO / 'stages'}\npipelines:\n  p:\n    workspace: {{name: w}}\n"
        f"    stages:\n{stages.replace('NEEDS', needs)}"
    )


def load(tmp_path: Path, text: str):
    path = tmp_path / "pipelines.yaml"
    path.write_text(text)
    return load_config(path, pipeline="p").pipeline("p")


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return str(info.value)


def test_a_streamed_need_is_a_need_and_a_streamed_edge(tmp_path):
    pipeline = load(tmp_path, config_text("[{stage: download, stream: true}, bpe]"))
    tokens = pipeline.stages["tokens"]
    assert tokens.needs == ["download", "bpe"] and tokens.streamed == ["download"]
    assert pipeline.order() == ["download", "bpe", "tokens"]
    plain = load(tmp_path, config_text("[{stage: download}, bpe]")).stages["tokens"]
    assert plain.needs == ["download", "bpe"] and plain.streamed == []


def test_the_bundled_fast_pipelines_stream_their_download():
    from bcp_pipeline.config.preflight import load_and_check

    config = load_and_check(REPO / "pipelines.yaml")
    for name in ("slimpajama-8b-fast", "demo-fast"):
        assert config.pipeline(name).stages["tokenize-preprocess"].streamed == ["download"]


@pytest.mark.parametrize(
    "needs, message",
    [
        ("[{stage: download, stream: yes please}]", "stream is true or false, got text yes please"),
        ("[{stage: download, streamed: true}]", "unknown key 'streamed' in a need"),
        ("[{stream: true}]", "a need written as a mapping names its stage"),
        ("[{stage: nowhere, stream: true}]", "unknown stage 'nowhere' in needs"),
        ("[{stage: bpe, stream: true}]", "bpe's program gpt2_files.py does not publish its outputs as they complete"),
    ],
)
def test_a_malformed_streamed_need_is_refused_at_its_line(tmp_path, needs, message):
    text = error(tmp_path, config_text(needs))
    assert message in text
    line = next(i for i, row in enumerate(config_text(needs).splitlines(), 1) if "needs:" in row)
    assert f"pipelines.yaml:{line}" in text, text


def test_a_downstream_that_cannot_start_on_part_of_its_inputs_is_refused(tmp_path):
    without_groups = STAGES.replace('--files-per-output, "2", ', "")
    text = error(tmp_path, config_text("[{stage: download, stream: true}]", without_groups))
    assert "preprocess.py without --files-per-output cannot start on a part of its inputs" in text
    assert "drop `stream: true`" in text


def test_a_streamed_downstream_needs_a_verification_to_wait_with(tmp_path):
    check = '        verify: [{glob: "${workspace}/out/*.bin", expect_from: download, group: 2}]\n'
    unverified = STAGES.replace(check, "")
    text = error(tmp_path, config_text("[{stage: download, stream: true}]", unverified))
    assert "it needs a `verify:` check, which then waits for the upstream's verification" in text
