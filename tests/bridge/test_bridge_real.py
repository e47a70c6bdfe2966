"""The Megatron-Bridge engine against NVIDIA's REAL code (megatron-bridge 0.6.2, megatron-core 0.19.2, in the
Python 3.12 environment scripts/bridge-venv builds; bridge_venv.py):

- the entry program's `--dry-run` takes the override list `plan` renders, on every backend, for every bundled
  Bridge pipeline and shape, and the config Bridge resolves holds the intended values (written out below, not
  read back from the renderer): a dropped override fails the check;
- status's step-line parser reads the line Bridge's own format strings make;
- a checkpoint folder laid out by Bridge's own naming code (its tracker file) is what the verification reads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support.bridge_venv import (REPO, bridge_python, dry_run, dumped, entry_arguments, pretrain_job,
                                 site_packages, step_line)

from bcp_pipeline.cli.main import main
from bcp_pipeline.training_log import last_progress, parse_training_log
from bcp_pipeline.report.throughput import step_tflops

WORKSPACE = "/mount_workspace"  # the workspace as the BCP, Grid Engine (Apptainer) and Kubernetes jobs see it
DATA = [(0.6, "/data/preprocessed/train_chunk1_text_document"), (0.4, "/data/preprocessed/train_chunk2_text_document")]


@dataclass(frozen=True)
class Shape:
    """What a launcher config means on Bridge (its YAML in the NeMo launcher, 23.11): the values the resolved
    config must hold."""

    model: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    seq: int
    tp: int
    gbs: int
    mbs: int
    iters: int


GPT_8B = Shape("gpt3/7b_improved", layers=32, hidden=4096, ffn=10880, heads=32, seq=2048, tp=4, gbs=512, mbs=1,
               iters=300000)
GPT_126M = Shape("gpt3/126m", layers=12, hidden=768, ffn=3072, heads=12, seq=2048, tp=1, gbs=256, mbs=4,
                 iters=600000)


def bundled_bridge_pipelines() -> list[str]:
    pipelines = yaml.safe_load((REPO / "pipelines.yaml").read_text())["pipelines"]
    names = [name for name, body in pipelines.items()
             if any("megatron_bridge" in (stage or {}) for stage in body["stages"].values())]
    assert names, "pipelines.yaml bundles no Megatron-Bridge pipeline"
    return names


CASES = [(p, backend, GPT_8B) for p in bundled_bridge_pipelines()
         for backend in ("bcp", "slurm", "gridengine", "kubernetes")] + \
        [(p, "bcp", GPT_126M) for p in bundled_bridge_pipelines()]


def planned(project: Path, pipeline: str, backend: str, shape: Shape, capsys) -> dict:
    capsys.readouterr()
    sets = ["--set", f"pretrain.megatron_bridge.model={shape.model}"] if shape is not GPT_8B else []
    assert main(["--config", str(project / "pipelines.yaml"), "plan", pipeline, "--backend", backend, "--json",
                 *sets]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(REPO / "pipelines.yaml", tmp_path / "pipelines.yaml")
    (tmp_path / "stages").symlink_to(REPO / "stages")  # a config names its stage programs beside it
    return tmp_path


@pytest.fixture(scope="module")
def python() -> Path:
    return bridge_python()


def data_list_file(tmp_path: Path) -> Path:
    """The file the job's first step writes (data_list.py's hydra format, under the key the job gives it)."""
    from data_list import render_hydra

    path = tmp_path / "data_path.txt"
    path.write_text(render_hydra([x for pair in DATA for x in pair], key="dataset.data_path") + "\n")
    return path


def intended(shape: Shape, run_folder: str, bpe: str) -> dict[str, object]:
    """Each setting the issue names, as Bridge's resolved config must hold it."""
    return {
        "model.num_layers": shape.layers, "model.hidden_size": shape.hidden, "model.ffn_hidden_size": shape.ffn,
        "model.num_attention_heads": shape.heads, "model.seq_length": shape.seq, "dataset.seq_length": shape.seq,
        "model.tensor_model_parallel_size": shape.tp, "model.pipeline_model_parallel_size": 1,
        "model.context_parallel_size": 1, "train.global_batch_size": shape.gbs,
        "train.micro_batch_size": shape.mbs, "train.train_iters": shape.iters,
        "dataset.blend": [[prefix for _, prefix in DATA], [weight for weight, _ in DATA]],
        "dataset.path_to_cache": f"{run_folder}/data_cache",
        "tokenizer.tokenizer_type": "GPT2BPETokenizer", "tokenizer.vocab_file": f"{bpe}/vocab.json",
        "tokenizer.merge_file": f"{bpe}/merges.txt",
        "checkpoint.save": f"{run_folder}/checkpoints", "checkpoint.load": f"{run_folder}/checkpoints",
        "checkpoint.most_recent_k": 2,
        "train.exit_duration_in_mins": 5 * 24 * 60 - 20,  # the 5D job less the 20-minute margin
        "train.exit_signal_handler": True, "logger.log_throughput": True,
    }


def lookup(config: dict, dotted: str):
    value = config
    for part in dotted.split("."):
        value = value[part]
    return value


def mismatches(config: dict, expected: dict[str, object]) -> dict[str, tuple]:
    found = {}
    for key, value in expected.items():
        try:
            got = lookup(config, key)
        except (KeyError, TypeError):
            got = "(missing)"
        if dumped(got) != dumped(value):
            found[key] = (got, value)
    return found


def rendered_overrides_hold(config: dict, arguments: list[str]) -> dict[str, tuple]:
    """Every KEY=VALUE the job renders, as Bridge resolved it (a function such as the activation by its name)."""
    found = {}
    for word in arguments:
        if "=" not in word or word.startswith("-"):
            continue
        key, value = word.split("=", 1)
        got, want = lookup(config, key), yaml.safe_load(value)
        if isinstance(want, str) and isinstance(got, float):
            want = float(want)  # PyYAML reads 1e-05 (no dot) as a string; OmegaConf, as Bridge, as a number
        if isinstance(got, dict) and "_target_" in got:
            got = str(got["_target_"]).rsplit(".", 1)[-1]
        if dumped(got) != dumped(want) and not (isinstance(got, float) and got == want):
            found[key] = (got, want)
    return found


@pytest.mark.parametrize("pipeline, backend, shape", CASES,
                         ids=[f"{p}-{b}-{s.model.split('/')[1]}" for p, b, s in CASES])
def test_the_entry_program_dry_runs_what_plan_renders_with_the_intended_values(
        pipeline, backend, shape, project, python, tmp_path, capsys):
    job = pretrain_job(planned(project, pipeline, backend, shape, capsys))
    arguments = entry_arguments(backend, job)
    workspace = str(project / ".bcp-pipeline/workspaces/nemo-framework") if backend == "slurm" else WORKSPACE
    run_folder = f"{workspace}/results/gpt_8b-{pipeline}-RUN"
    assert arguments[arguments.index("--overrides-file") + 1] == f"{run_folder}/data_path.txt"

    config = dry_run(python, arguments, 8 * 8, data_list_file(tmp_path), tmp_path)

    assert mismatches(config, intended(shape, run_folder, f"{workspace}/data/bpe")) == {}
    assert rendered_overrides_hold(config, arguments) == {}


def test_a_dropped_override_fails_the_check(project, python, tmp_path, capsys):
    """The check above would catch a renderer that loses any of the settings: without them Bridge resolves the
    recipe's own values (the shared default checkpoint folder, no time limit, its own shape) and each one shows."""
    pipeline = bundled_bridge_pipelines()[0]
    arguments = entry_arguments("bcp", pretrain_job(planned(project, pipeline, "bcp", GPT_8B, capsys)))
    run_folder = f"{WORKSPACE}/results/gpt_8b-{pipeline}-RUN"
    expected = intended(GPT_8B, run_folder, f"{WORKSPACE}/data/bpe")
    dropped = ["model.tensor_model_parallel_size", "model.seq_length", "dataset.seq_length", "checkpoint.save",
               "checkpoint.load", "train.exit_duration_in_mins", "tokenizer.vocab_file", "dataset.path_to_cache"]
    kept = [a for a in arguments if a.split("=", 1)[0] not in dropped]
    assert len(kept) == len(arguments) - len(dropped)

    config = dry_run(python, kept, 8 * 8, data_list_file(tmp_path), tmp_path)

    assert set(dropped) <= set(mismatches(config, expected))


def test_the_step_line_parser_reads_bridge_s_own_format(python):
    source = (site_packages(python) / "megatron/bridge/training/utils/train_utils.py").read_text()
    lines = [step_line(source, iteration=step, train_iters=300000, ms=5650.4 + step, tflops=140.5,
                       loss=9.0 - step / 100) for step in (10, 20, 30)]
    log = "\n".join(["bridge_pretrain: recipe vanilla_gpt_pretrain_config, 64 rank(s)", *lines])

    progress = last_progress(log)
    assert (progress.steps_done, progress.total, progress.loss) == (30, 300000, pytest.approx(8.7))
    assert progress.step_seconds == pytest.approx(5.6804)
    assert [(p.step, p.loss) for p in parse_training_log(log)] == [(10, pytest.approx(8.9)),
                                                                   (20, pytest.approx(8.8)),
                                                                   (30, pytest.approx(8.7))]
    assert step_tflops(log) == {10: 140.5, 20: 140.5, 30: 140.5}


CHECKPOINTS = """
import sys
from megatron.bridge.training.checkpointing import read_metadata
from megatron.bridge.training.utils.checkpoint_utils import (
    get_checkpoint_name, get_checkpoint_run_config_filename, get_checkpoint_tracker_filename)
import os
save, complete, cut_short, tracker = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "tracker"
for step in filter(None, complete.split(",")):  # what save_checkpoint leaves once a save has completed
    os.makedirs(get_checkpoint_name(save, int(step)), exist_ok=True)
    open(get_checkpoint_run_config_filename(get_checkpoint_name(save, int(step))), "w").write("model: {}\\n")
    if tracker:
        open(get_checkpoint_tracker_filename(save), "w").write(step)
if cut_short:  # a save under way when the job ended: its folder, not yet its config or the tracker
    os.makedirs(get_checkpoint_name(save, int(cut_short)), exist_ok=True)
print(read_metadata(get_checkpoint_tracker_filename(save))[0] if tracker else "no tracker")
"""


@pytest.mark.parametrize("complete, cut_short, tracker, step", [
    ("1000,2000", "3000", "tracker", 2000),
    ("1000", "2000", "none", 1000),
    ("", "1000", "none", 0),
])
def test_bridge_s_checkpoint_folder_drives_the_continuation(python, tmp_path, complete, cut_short, tracker, step):
    save = tmp_path / "checkpoints"
    made = subprocess.run([str(python), "-c", CHECKPOINTS, str(save), complete, cut_short, tracker],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    if tracker == "tracker":
        assert made.stdout.split()[-1] == str(step)  # Bridge itself resumes from this step

    def verify(target: int) -> dict:
        result = subprocess.run([sys.executable, str(REPO / "stages/verify.py"), "--progress", f"{save}={target}"],
                                capture_output=True, text=True)
        line = next(x for x in result.stdout.splitlines() if x.startswith("##bcp-pipeline verify "))
        return {"exit": result.returncode, **json.loads(line.split(" ", 2)[2])}

    below = verify(300000)  # a job that stopped short: the stage is submitted again
    assert (below["exit"], below["ok"], below["steps"]) == (1, False, step)
    if step:
        reached = verify(step)  # training done: the stage ends
        assert (reached["exit"], reached["ok"], reached["steps"]) == (0, True, step)
