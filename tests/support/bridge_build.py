"""What tests/bridge/test_bridge_build.py hands the build probe (tests/support/bridge_build_probe.py, run by the
Bridge test environment's Python): the entry program's arguments as `plan` renders them for a pipeline, the data
list and the tokenizer files a job would have, and one probe run for many cases."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

from support.bridge_venv import REPO, entry_arguments, pretrain_job

PROBE = REPO / "tests" / "support" / "bridge_build_probe.py"
DATA = [(0.6, "/data/preprocessed/train_chunk1_text_document"), (0.4, "/data/preprocessed/train_chunk2_text_document")]
HELD_OUT = [(1.0, "/data/validation/preprocessed/validation_chunk_0.jsonl_text_document")]


def planned_arguments(project: Path, pipeline: str, sets: list[str]) -> list[str]:
    """The entry program's arguments in the BCP job `plan` renders for `pipeline` with these `--set`s."""
    from bcp_pipeline.cli.main import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert (
            main(
                [
                    "--config",
                    str(project / "pipelines.yaml"),
                    "plan",
                    pipeline,
                    "--backend",
                    "bcp",
                    "--json",
                    *[word for s in sets for word in ("--set", s)],
                ]
            )
            == 0
        )
    return entry_arguments("bcp", pretrain_job(json.loads(printed.getvalue())))


def job_files(folder: Path) -> tuple[Path, Path]:
    """The data list the job's first step writes (data_list.py's format: the bundled pipelines validate on a
    held-out split, so megatron-core's per-split blends) and the workspace's BPE folder (the real GPT-2 vocab.json
    and merges.txt), as the job has them."""
    from data_list import render_hydra_per_split
    from support.stage_fixtures import gpt2_vocab_merges

    data_list = folder / "data_path.txt"
    train, held_out = [x for pair in DATA for x in pair], [x for pair in HELD_OUT for x in pair]
    data_list.write_text(render_hydra_per_split([train, held_out, None]) + "\n")
    bpe = folder / "bpe"
    bpe.mkdir(exist_ok=True)
    vocab, merges = gpt2_vocab_merges()
    shutil.copy(vocab, bpe / "vocab.json")
    shutil.copy(merges, bpe / "merges.txt")
    return data_list, bpe


def as_job_has_them(arguments: list[str], data_list: Path, bpe: Path) -> list[str]:
    """The rendered arguments with the job's own files in their place: the data list the job writes, and the BPE
    folder the job reads from its workspace."""
    args = list(arguments)
    args[args.index("--overrides-file") + 1] = str(data_list)
    for key, name in (("tokenizer.vocab_file", "vocab.json"), ("tokenizer.merge_file", "merges.txt")):
        [index] = [i for i, word in enumerate(args) if word.startswith(f"{key}=")]
        args[index] = f"{key}={bpe / name}"
    return args


def run_probe(python: Path, cases: list[dict], folder: Path) -> dict[str, dict]:
    """Every case in one process of the Bridge environment's Python: {case name: its result}."""
    spec = folder / "cases.json"
    spec.write_text(json.dumps(cases), encoding="utf-8")
    # A process of its own, not bridge_venv.run_bridge's fork server: the probe installs its TE stand-in before
    # megatron-core is imported, which a server that imported megatron-core already would defeat.
    result = subprocess.run(
        [str(python), str(PROBE), str(spec)],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=1500,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"},
    )
    marker = "# bridge_build_probe: "
    lines = [line for line in result.stdout.splitlines() if line.startswith(marker)]
    assert result.returncode == 0 and lines, (
        f"the build probe failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return json.loads(lines[-1][len(marker) :])
