"""`slimpajama-8b-sim`: SlimPajama's real cardinality on the local backend. The whole run (about 1.5 minutes on
2 cores) is benchmarks/bench_scale.py's job; here, that the pipeline asks for exactly that cardinality."""

from __future__ import annotations

import json
import subprocess
import sys

import _slimpajama_files  # stages/ is on sys.path (conftest)
import sample
from support.golden_files import REPO

from bcp_pipeline.cli.main import main


def plan_checks(capsys) -> dict[tuple[str, str], list[str]]:
    capsys.readouterr()
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", "slimpajama-8b-sim", "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs"]
    return {(job["stage"], job["kind"]): job["argv"] for job in jobs}


def test_the_sim_verifies_the_real_counts(capsys):
    argv = plan_checks(capsys)
    checks = {
        stage: [arg.rsplit("=", 1)[1] for arg in args if "*" in arg and "=" in arg]
        for (stage, kind), args in argv.items()
        if kind == "verify"
    }
    assert set(checks) == {"bpe", "sample", "download", "extract", "concat", "tokenize-preprocess"}
    assert checks["sample"] == ["59166"] and checks["download"] == ["59166"] and checks["extract"] == ["59166"]
    assert checks["concat"] == ["74"] and checks["tokenize-preprocess"] == ["74", "74"]
    assert "pretrain" not in {stage for stage, _ in argv}  # no training
    assert argv[("download", "stage")][argv[("download", "stage")].index("--base-url") + 1].startswith("file://")


def test_the_sim_mirror_has_slimpajamas_per_chunk_counts(tmp_path):
    paths = sample.sample_paths(tmp_path, 10, "real")
    per_chunk = [sum(1 for _, chunk, _, _ in paths if chunk == c) for c in range(1, 11)]
    assert per_chunk == list(_slimpajama_files.TRAIN_FILES_PER_CHUNK) and len(paths) == 59166
    assert paths[0][0] == tmp_path / "train/chunk1/example_train_0.jsonl.zst"


def test_real_counts_stop_at_slimpajamas_ten_chunks(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages/sample.py"),
            "--out",
            str(tmp_path),
            "--chunks",
            "11",
            "--files-per-chunk",
            "real",
            "--docs-per-file",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "knows 10 train chunks, not 11" in result.stderr
