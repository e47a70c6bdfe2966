"""A credential in a stage's `env:` is refused at load (issue 50, item 6): such a value was redacted in submitted/
and the report but kept in clear in state.json, jobs/*/spec.json, `status --json` and the BCP `plan`. The refusal
names the --set or line and the backend's way for a secret, and never shows the value."""

from __future__ import annotations

import pytest
from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, write_chain_project

CANARY = "hf_CANARYinline111"


def files_holding(root, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text in p.read_text(errors="replace")]


@pytest.mark.parametrize(
    ("backend", "way"),
    [
        ("local", "export MY_TOKEN in the shell that runs bcp-pipeline"),
        ("bcp", "`bcp: {secrets: [NAME:KEY:MY_TOKEN]}`"),
    ],
)
def test_a_credential_in_env_by_set_is_refused_and_shown_nowhere(tmp_path, capsys, backend, way):
    config = write_chain_project(tmp_path)
    setting = f"first.{backend}.env={{MY_TOKEN: {CANARY}, PLAIN_VAR: x}}"
    for verb in (["run", "chain"], ["plan", "chain"]):
        assert cli(config, *verb, "--backend", backend, "--set", setting) == 2
        captured = capsys.readouterr()
        assert CANARY not in captured.out + captured.err
        error = captured.err.strip()
        assert (
            error.startswith(f"bcp-pipeline: error: --set first.{backend}.env={{MY_TOKEN: <redacted>, PLAIN_VAR: x}}: ")
            and len(error.splitlines()) == 1
        ), error
        assert f"{backend}.env.MY_TOKEN looks like a credential (its value is not shown)" in error and way in error
    assert files_holding(tmp_path, CANARY) == []  # nothing recorded


def test_a_credential_in_env_in_the_file_is_refused_at_its_line(tmp_path, capsys):
    text = CHAIN_CONFIG.replace(
        "        local: {replicas: 2, processes: 1}\n",
        f"        local: {{replicas: 2, processes: 1, env: {{NGC_API_KEY: {CANARY}}}}}\n",
    )
    config = write_chain_project(tmp_path, text)
    assert cli(config, "plan", "chain") == 2
    error = capsys.readouterr().err
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "NGC_API_KEY" in row)
    assert f"pipelines.yaml:{line}: " in error and "local.env.NGC_API_KEY looks like a credential" in error, error
    assert CANARY not in error


def test_plain_values_short_flags_and_references_are_no_credentials(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    setting = "first.local.env={TOKENIZERS_PARALLELISM: 'false', HF_TOKEN: $HF_TOKEN, DATA_DIR: /mount/data-x-y-z}"
    assert cli(config, "plan", "chain", "--set", setting) == 0
    assert "TOKENIZERS_PARALLELISM=false" in capsys.readouterr().out


def test_the_way_the_refusal_names_keeps_the_credential_out_of_every_file_and_output(tmp_path, capsys, monkeypatch):
    """The local backend's way: the credential in the orchestrator's environment, which its jobs inherit."""
    monkeypatch.setenv("MY_TOKEN", CANARY)
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain", "--only", "first") == 0
    assert cli(config, "status", "--json") == 0
    assert cli(config, "plan", "chain") == 0
    captured = capsys.readouterr()
    assert CANARY not in captured.out + captured.err
    assert files_holding(tmp_path, CANARY) == []
