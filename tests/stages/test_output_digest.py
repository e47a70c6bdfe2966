"""Outputs another config made are redone, refused or reused, never taken as this config's.

First `_completion.claim_outputs` on its own (rank 0 decides, the other ranks wait for its record), then the demo's
real `sample` stage through the orchestrator on the local backend: its mirror made with another `--seed` is
redone (the old files kept aside), refused with the setting that reuses it, or reused; `status` says which.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import _completion
import pytest
from _stage_error import StageError
from support.golden_files import REPO

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.output_digest import output_digest
from bcp_pipeline.engine.state import RunStore


def env(digest: str, policy: str = "redo") -> dict[str, str]:
    return {_completion.OUTPUT_DIGEST_ENV: digest, _completion.OTHER_OUTPUTS_ENV: policy, "BCP_PIPELINE_STAGE": "make"}


def outputs(folder: Path) -> list[Path]:
    return sorted(folder.glob("out-*.txt"))


def made(folder: Path, digest: str, count: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    assert _completion.claim_outputs(folder, "make", outputs(folder), 0, env(digest))["outputs"] in ("new", "same")
    for index in range(count):
        (folder / f"out-{index}.txt").write_text(f"{digest} {index}")


def test_outputs_of_the_same_digest_are_kept_and_another_digests_are_set_aside_then_redone(tmp_path, capsys):
    made(tmp_path, "aaaa")
    assert _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 0, env("aaaa")) == {
        "outputs": "same",
        "digest": "aaaa",
    }
    found = _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 0, env("bbbb"))
    assert found["outputs"] == "redone" and found["count"] == 2 and found["previous_digest"] == "aaaa"
    aside = Path(found["set_aside"])
    assert aside.parent == tmp_path and aside.name.startswith(".superseded-aaaa-")
    assert outputs(tmp_path) == [] and (aside / "out-1.txt").read_text() == "aaaa 1"  # moved, never deleted
    printed = capsys.readouterr().out.splitlines()
    line = [json.loads(text.split(" ", 2)[2]) for text in printed if " outputs " in text][-1]
    assert line["outputs"] == "redone" and line["set_aside"] == str(aside)
    assert _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 0, env("bbbb"))["outputs"] == "same"


def test_refuse_names_the_setting_that_reuses_them_and_reuse_keeps_them(tmp_path):
    made(tmp_path, "aaaa")
    with pytest.raises(StageError, match=r"--set make\.other_outputs=reuse"):
        _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 1, env("bbbb", "refuse"))  # every rank refuses
    assert len(outputs(tmp_path)) == 2
    found = _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 0, env("bbbb", "reuse"))
    assert found["outputs"] == "reused" and [p.read_text() for p in outputs(tmp_path)] == ["aaaa 0", "aaaa 1"]


def test_outputs_without_a_recorded_digest_count_as_another_configs(tmp_path):
    (tmp_path / "out-0.txt").write_text("made before digests")
    found = _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 0, env("bbbb"))
    assert found["outputs"] == "redone" and found["previous_digest"] is None
    assert (Path(found["set_aside"]) / "out-0.txt").read_text() == "made before digests"


def test_other_ranks_wait_for_rank_0_before_they_skip_anything(tmp_path):
    made(tmp_path, "aaaa")
    waited: list[dict] = []
    other = threading.Thread(
        target=lambda: waited.append(_completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 1, env("bbbb")))
    )
    other.start()
    other.join(0.5)
    assert other.is_alive()  # rank 1 must not go on while the old outputs are still there
    _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 0, env("bbbb"))
    other.join(10)
    assert waited == [{"outputs": "same", "digest": "bbbb"}]


def test_without_a_digest_nothing_is_checked(tmp_path):
    made(tmp_path, "aaaa")
    assert _completion.claim_outputs(tmp_path, "make", outputs(tmp_path), 0, {}) == {"outputs": "unchecked"}
    assert len(outputs(tmp_path)) == 2


def test_the_digest_follows_args_program_image_and_upstream_stages(tmp_path):
    project = demo_project(tmp_path)

    def digests(*overrides: str) -> dict[str, str]:
        pipeline = load_config(project, overrides=list(overrides), pipeline="demo").pipeline("demo")
        return {name: output_digest(pipeline, name) for name in pipeline.stages}

    base = digests()
    seeded = digests(
        "sample.args=[--out, '${mirror}', --chunks, '2', --files-per-chunk, '4', --docs-per-file, '400', --seed, '7', "
        "--validation-files, '${validation_files}']"
    )
    assert seeded["sample"] != base["sample"] and seeded["download"] != base["download"]  # and below it
    assert seeded["bpe"] == base["bpe"]  # not below sample
    assert digests("extract.bcp.image=nvcr.io/nvidia/other:1")["extract"] != base["extract"]
    assert digests("vars.per_chunk=2")["concat"] != base["concat"]
    concat = project.parent / "stages/concat.py"
    concat.write_text(concat.read_text() + "\n# changed\n")
    assert digests()["concat"] != base["concat"] and digests()["extract"] == base["extract"]


# -- through the orchestrator: the demo's sample stage -----------------------------------------------------------
SEED = (
    "sample.args=[--out, '${{mirror}}', --chunks, '2', --files-per-chunk, '4', --docs-per-file, '40', --seed, '{}', "
    "--validation-files, '${{validation_files}}']"
)


def demo_project(root: Path) -> Path:
    shutil.copytree(REPO / "stages", root / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    config = root / "pipelines.yaml"
    shutil.copy(REPO / "pipelines.yaml", config)
    return config


def mirror_bytes(root: Path) -> dict[str, bytes]:
    mirror = root / ".bcp-pipeline/workspaces/demo/mirror/train"
    return {str(p.relative_to(mirror)): p.read_bytes() for p in sorted(mirror.rglob("*.zst"))}


def run_sample(config: Path, seed: int, *extra: str) -> int:
    return main(
        ["--config", str(config), "run", "demo", "--only", "sample", "--restart", "--set", SEED.format(seed), *extra]
    )


def test_a_sample_made_with_another_seed_is_redone_refused_or_reused_and_status_says_which(tmp_path, capsys):
    config = demo_project(tmp_path)
    assert run_sample(config, 0) == 0
    first = mirror_bytes(tmp_path)
    assert len(first) == 8

    assert run_sample(config, 7) == 0
    second = mirror_bytes(tmp_path)
    assert second.keys() == first.keys() and all(second[k] != first[k] for k in first)  # not the old mirror
    aside = next((tmp_path / ".bcp-pipeline/workspaces/demo/mirror").glob(".superseded-*"))
    assert {
        str(p.relative_to(aside / "train")): p.read_bytes() for p in sorted((aside / "train").rglob("*.zst"))
    } == first
    capsys.readouterr()
    assert main(["--config", str(config), "status"]) == 0
    out = capsys.readouterr().out
    assert "sample: 10 output(s) made by another config" in out and f"redone; the old ones are kept in {aside}" in out

    assert run_sample(config, 8, "--set", "sample.other_outputs=refuse") == 1
    assert mirror_bytes(tmp_path) == second
    capsys.readouterr()
    assert main(["--config", str(config), "status"]) == 0
    out = capsys.readouterr().out
    assert "--set sample.other_outputs=reuse" in out

    assert run_sample(config, 8, "--set", "sample.other_outputs=reuse") == 0
    assert mirror_bytes(tmp_path) == second
    state = RunStore(tmp_path / ".bcp-pipeline").latest()
    assert state.stages["sample"].extra["outputs"]["outputs"] == "reused"
    record = json.loads(
        next((tmp_path / ".bcp-pipeline/workspaces/demo/mirror/.completions").glob("sample-*.json")).read_text()
    )
    assert record["output_digest"] == state.stages["sample"].extra["outputs"]["digest"]  # the completion record's
