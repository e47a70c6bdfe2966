"""The data index built before the training, on the local backend's stand-in (stages/pretrain_local.py
--build-data-index, with megatron-core's real builder over data the real preprocess stage tokenized) and its checks:
the smoke training then reads that index without rebuilding it; verify.py --listed passes on it and fails on a
missing, a truncated or an extra file; a build killed half-way is rebuilt, not taken for complete; another config's
index is removed from the folder when this one is built."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.smoke_pretrain import REPO, command, data_dir, run_to_end, summary  # noqa: F401 (data_dir: a fixture)

VERIFY = REPO / "stages" / "verify.py"


def cache_state(cache: Path) -> dict[str, tuple[int, int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(cache.iterdir())}


def build_index(data: Path, results: Path, run: str, *extra: str) -> subprocess.CompletedProcess:
    return run_to_end([*command(data, results, run, *extra), "--build-data-index"])


def verify(manifest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(VERIFY), "--check", f"{manifest}=1", "--listed", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def indexed(data_dir, tmp_path_factory) -> dict:  # noqa: F811
    results = tmp_path_factory.mktemp("results")
    done = build_index(data_dir, results, "smoke")
    manifest = results / "smoke" / "data_index.json"
    return {
        "results": results,
        "data": data_dir,
        "stdout": done.stdout,
        "manifest": manifest,
        "record": json.loads(manifest.read_text()),
        "cache": results / "smoke" / "index_cache",
    }


def test_the_stand_in_builds_its_training_s_index_and_says_what_it_built(indexed):
    record = indexed["record"]
    # two outputs: a GPTDataset each (4 files) and their BlendedDataset (3), the training split only (100,0,0)
    assert sorted(d["kind"] for d in record["datasets"]) == ["BlendedDataset", "GPTDataset", "GPTDataset"]
    assert len(record["files"]) == 2 * 4 + 3 and record["built"] == 11 and record["samples"] == [16 * 4, 0, 0]
    assert "pretrain_local: data index of the smoke pretrain smoke: 11 file(s) for 2 prefix(es)" in indexed["stdout"]
    assert not (indexed["results"] / "smoke" / "checkpoints").exists()  # no training


def test_the_smoke_training_then_reads_the_index_without_building_it(indexed):
    before = cache_state(indexed["cache"])
    run_to_end(command(indexed["data"], indexed["results"], "smoke"))
    assert summary(indexed["results"], "smoke")["steps"] == 16
    after = cache_state(indexed["cache"])
    assert {k: v for k, v in after.items() if not k.startswith(".")} == {
        k: v for k, v in before.items() if not k.startswith(".")
    }  # same inodes, same mtimes: read, not rebuilt


def test_the_verification_passes_on_the_index_as_built(indexed):
    done = verify(indexed["manifest"])
    assert done.returncode == 0, done.stderr
    assert '"ok": true' in done.stdout and "11 file(s) as listed" in done.stderr


@pytest.mark.parametrize("harm", ["missing", "truncated", "extra"])
def test_the_verification_fails_on_a_missing_wrong_or_extra_file(indexed, tmp_path, harm):
    copy = tmp_path / "smoke"
    shutil.copytree(indexed["results"] / "smoke", copy)
    cache = copy / "index_cache"
    victim = next(p for p in sorted(cache.iterdir()) if p.name.endswith("shuffle_index.npy"))
    if harm == "missing":
        victim.unlink()
    elif harm == "truncated":
        victim.write_bytes(victim.read_bytes()[:-8])
    else:
        (cache / f"{'0' * 32}-GPTDataset-train-shuffle_index.npy").write_bytes(b"\x93NUMPY")
    done = verify(copy / "data_index.json")
    assert done.returncode == 1
    said = {
        "missing": f"{victim.name}: missing",
        "extra": "not listed (another build's?)",
        "truncated": f"{victim.name}: {victim.stat().st_size if victim.exists() else 0} bytes",
    }[harm]
    assert said in done.stderr and '"ok": false' in done.stdout


def test_a_build_killed_half_way_is_rebuilt_not_taken_for_complete(indexed, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(indexed["results"] / "smoke", results / "half")
    manifest = results / "half" / "data_index.json"
    manifest.unlink()  # killed before the manifest, its last write: its files may be half-written
    victim = next(p for p in sorted((results / "half" / "index_cache").iterdir()) if p.name.endswith("index.npy"))
    victim.write_bytes(victim.read_bytes()[:16])
    build_index(indexed["data"], results, "half")
    record = json.loads(manifest.read_text())
    assert record["built"] == 11 and record["read"] == 0
    assert verify(manifest).returncode == 0


def test_another_config_s_index_is_removed_when_this_one_is_built(indexed, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(indexed["results"] / "smoke", results / "longer")
    old = set(json.loads((results / "longer" / "data_index.json").read_text())["files"])
    done = build_index(indexed["data"], results, "longer", "--steps", "20")  # another sample count: other names
    record = json.loads((results / "longer" / "data_index.json").read_text())
    assert record["removed_stale"] == 11 and not old & set(record["files"]) and "removed 11 stale" in done.stdout
    assert verify(results / "longer" / "data_index.json").returncode == 0
