"""The Megatron-Bridge engine against NVIDIA's REAL code (megatron-bridge 0.6.2, megatron-core 0.19.2, in the
Python 3.12 environment scripts/bridge-venv builds; bridge_venv.py):

- the entry program's `--dry-run` takes the override list `plan` renders, on every backend, for every bundled
  Bridge pipeline and shape, and the config Bridge resolves holds the intended values (written out below, not
  read back from the renderer): a dropped override fails the check;
- status's step-line parser reads the line Bridge's own format strings make;
- the typed knobs (precision, async_save, fsdp, activation_offload), `--layer-spec local` and the recipe's
  environment resolve as intended in Bridge's own config code;
- a checkpoint folder laid out by Bridge's own naming code and TrainState (its two trackers, a torn one too) is what
  the verification reads, in the order Bridge's own loader reads it.
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
from support.bridge_venv import (
    REPO,
    bridge_python,
    bundled_bridge_sections,
    dry_run,
    dry_run_process,
    dumped,
    entry_arguments,
    pretrain_job,
    resolved,
    run_bridge,
    site_packages,
    step_line,
)

from bcp_pipeline.cli.main import main
from bcp_pipeline.report.throughput import step_tflops
from bcp_pipeline.training_log import last_progress, parse_training_log

WORKSPACE = "/mount_workspace"  # the workspace as the BCP, Grid Engine (Apptainer) and Kubernetes jobs see it
DATA = [(0.6, "/data/preprocessed/train_chunk1_text_document"), (0.4, "/data/preprocessed/train_chunk2_text_document")]
HELD_OUT = [(1.0, "/data/validation/preprocessed/validation_chunk_0.jsonl_text_document")]
TEST = [(1.0, "/data/test/preprocessed/test_chunk_0.jsonl_text_document")]


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


GPT_8B = Shape(
    "gpt3/7b_improved", layers=32, hidden=4096, ffn=10880, heads=32, seq=2048, tp=4, gbs=512, mbs=1, iters=300000
)
GPT_126M = Shape("gpt3/126m", layers=12, hidden=768, ffn=3072, heads=12, seq=2048, tp=1, gbs=256, mbs=4, iters=600000)
# Not a launcher config: Llama 3 8B's shape with GPT-2's vocabulary (config/bridge.py), 7b_improved's sizes
LLAMA_8B = Shape(
    "llama3-8b-gpt2", layers=32, hidden=4096, ffn=14336, heads=32, seq=2048, tp=4, gbs=512, mbs=1, iters=300000
)
SHAPES = {shape.model: shape for shape in (GPT_8B, GPT_126M, LLAMA_8B)}


def bundled_bridge_pipelines() -> list[str]:
    return list(bundled_bridge_sections())


def bundled_shape(pipeline: str) -> Shape:
    return SHAPES[bundled_bridge_sections()[pipeline].get("model", GPT_8B.model)]


def run_folder_of(pipeline: str, workspace: str = WORKSPACE) -> str:
    return f"{workspace}/results/{bundled_bridge_sections()[pipeline]['run_name']}-{pipeline}-RUN"


# Each pipeline in its own model on every backend, and the GPT ones also at 126m (a pipeline that exports its model
# is held to the one model it exports: config/export.py refuses another)
CASES = [
    (p, backend, bundled_shape(p))
    for p in bundled_bridge_pipelines()
    for backend in ("bcp", "slurm", "gridengine", "kubernetes")
] + [(p, "bcp", GPT_126M) for p in bundled_bridge_pipelines() if bundled_shape(p) is GPT_8B]


def planned(project: Path, pipeline: str, backend: str, shape: Shape, capsys, *more: str) -> dict:
    capsys.readouterr()
    sets = ["--set", f"pretrain.megatron_bridge.model={shape.model}"] if shape is not bundled_shape(pipeline) else []
    sets += [word for setting in more for word in ("--set", setting)]
    assert (
        main(["--config", str(project / "pipelines.yaml"), "plan", pipeline, "--backend", backend, "--json", *sets])
        == 0
    )
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(REPO / "pipelines.yaml", tmp_path / "pipelines.yaml")
    (tmp_path / "stages").symlink_to(REPO / "stages")  # a config names its stage programs beside it
    return tmp_path


@pytest.fixture(scope="module")
def python() -> Path:
    return bridge_python()


def data_list_file(tmp_path: Path, held_out: bool = True) -> Path:
    """The file the job's first step writes (data_list.py's hydra format, under the key the job gives it): the
    bundled pipelines validate on a held-out split and test on another, so megatron-core's per-split blends
    (train, validation, test); without them, the training's blend alone."""
    from data_list import render_hydra, render_hydra_per_split

    path = tmp_path / "data_path.txt"
    train = [x for pair in DATA for x in pair]
    text = (
        render_hydra_per_split([train, [x for pair in HELD_OUT for x in pair], [x for pair in TEST for x in pair]])
        if held_out
        else render_hydra(train, key="dataset.data_path")
    )
    path.write_text(text + "\n")
    return path


def intended(shape: Shape, run_folder: str, bpe: str, job_minutes: int = 5 * 24 * 60) -> dict[str, object]:
    """Each setting the issue names, as Bridge's resolved config must hold it."""
    return {
        "model.num_layers": shape.layers,
        "model.hidden_size": shape.hidden,
        "model.ffn_hidden_size": shape.ffn,
        "model.num_attention_heads": shape.heads,
        "model.seq_length": shape.seq,
        "dataset.seq_length": shape.seq,
        "model.tensor_model_parallel_size": shape.tp,
        "model.pipeline_model_parallel_size": 1,
        "model.context_parallel_size": 1,
        "train.global_batch_size": shape.gbs,
        "train.micro_batch_size": shape.mbs,
        "train.train_iters": shape.iters,
        # each held-out split's own blend for validation and test, no split of the training's data
        "dataset.blend": None,
        "dataset.split": None,
        "dataset.blend_per_split": [
            [[prefix for _, prefix in DATA], [weight for weight, _ in DATA]],
            [[prefix for _, prefix in HELD_OUT], [weight for weight, _ in HELD_OUT]],
            [[prefix for _, prefix in TEST], [weight for weight, _ in TEST]],
        ],
        "dataset.path_to_cache": f"{run_folder}/data_cache",
        "tokenizer.tokenizer_type": "GPT2BPETokenizer",
        "tokenizer.vocab_file": f"{bpe}/vocab.json",
        "tokenizer.merge_file": f"{bpe}/merges.txt",
        "checkpoint.save": f"{run_folder}/checkpoints",
        "checkpoint.load": f"{run_folder}/checkpoints",
        "checkpoint.most_recent_k": 2,
        "train.exit_duration_in_mins": job_minutes - 20,  # the job's runtime less the 20-minute margin
        "train.exit_signal_handler": True,
        "logger.log_throughput": True,
        # the launcher's weight decay is the scheduler's too (it overwrites optimizer.weight_decay from step 0)
        "optimizer.weight_decay": 0.1,
        "scheduler.start_weight_decay": 0.1,
        "scheduler.end_weight_decay": 0.1,
        "scheduler.weight_decay_incr_style": "constant",
        "ddp.overlap_grad_reduce": True,
        "ddp.overlap_param_gather": True,
        "ddp.average_in_collective": True,
        "dist.distributed_timeout_minutes": 30,
        "model.apply_query_key_layer_scaling": False,
        # precision bf16 (the default): Bridge's bf16_mixed recipe, applied to the model; no FP8
        "mixed_precision.bf16": True,
        "mixed_precision.fp8": None,
        "model.bf16": True,
        "model.fp8": None,
        "checkpoint.async_save": False,
        "checkpoint.ckpt_format": "torch_dist",
        "ddp.use_megatron_fsdp": False,
        "model.cpu_offloading": False,
        "model.transformer_impl": "transformer_engine",
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
        if key == "mixed_precision":  # a recipe's name, resolved into its settings: checked by their values
            continue
        got, want = lookup(config, key), yaml.safe_load(value)
        if isinstance(want, str) and isinstance(got, float):
            want = float(want)  # PyYAML reads 1e-05 (no dot) as a string; OmegaConf, as Bridge, as a number
        if isinstance(got, dict) and "_target_" in got:
            got = str(got["_target_"]).rsplit(".", 1)[-1]
        if dumped(got) != dumped(want) and not (isinstance(got, float) and got == want):
            found[key] = (got, want)
    return found


@pytest.mark.parametrize(
    "pipeline, backend, shape", CASES, ids=[f"{p}-{b}-{s.model.split('/')[-1]}" for p, b, s in CASES]
)
def test_the_entry_program_dry_runs_what_plan_renders_with_the_intended_values(
    pipeline, backend, shape, project, python, tmp_path, capsys
):
    job = pretrain_job(planned(project, pipeline, backend, shape, capsys))
    arguments = entry_arguments(backend, job)
    workspace = str(project / ".bcp-pipeline/workspaces/nemo-framework") if backend == "slurm" else WORKSPACE
    run_folder = run_folder_of(pipeline, workspace)
    assert arguments[arguments.index("--overrides-file") + 1] == f"{run_folder}/data_path.txt"

    config = dry_run(python, arguments, 8 * 8, data_list_file(tmp_path), tmp_path)

    # The job's runtime: 5D (bcp.total_runtime), on Grid Engine the bundled TSUBAME-shaped section's h_rt of 24h.
    minutes = 24 * 60 if backend == "gridengine" else 5 * 24 * 60
    assert mismatches(config, intended(shape, run_folder, f"{workspace}/data/bpe", minutes)) == {}
    assert rendered_overrides_hold(config, arguments) == {}


def test_a_dropped_override_fails_the_check(project, python, tmp_path, capsys):
    """The check above would catch a renderer that loses any of the settings: without them Bridge resolves the
    recipe's own values (the shared default checkpoint folder, no time limit, its own shape) and each one shows."""
    pipeline = bundled_bridge_pipelines()[0]
    arguments = entry_arguments("bcp", pretrain_job(planned(project, pipeline, "bcp", GPT_8B, capsys)))
    run_folder = run_folder_of(pipeline)
    expected = intended(GPT_8B, run_folder, f"{WORKSPACE}/data/bpe")
    dropped = [
        "model.tensor_model_parallel_size",
        "model.seq_length",
        "dataset.seq_length",
        "checkpoint.save",
        "checkpoint.load",
        "train.exit_duration_in_mins",
        "tokenizer.vocab_file",
        "dataset.path_to_cache",
        # the recipe's own: weight decay 0.033 from the scheduler, no overlap, the 10-minute timeout
        "scheduler.start_weight_decay",
        "scheduler.end_weight_decay",
        "ddp.overlap_grad_reduce",
        "ddp.overlap_param_gather",
        "ddp.average_in_collective",
        "dist.distributed_timeout_minutes",
    ]
    kept = [a for a in arguments if a.split("=", 1)[0] not in dropped]
    assert len(kept) == len(arguments) - len(dropped)

    config = dry_run(python, kept, 8 * 8, data_list_file(tmp_path), tmp_path)

    assert set(dropped) <= set(mismatches(config, expected))


H100 = "pretrain.bcp.instance=dgxh100.80g.8.norm"  # FP8 is refused on the bundled dgxa100 instance
KNOBS = {
    "fp8": (
        [H100, "pretrain.megatron_bridge.precision=fp8"],  # fp8 is fp8-current
        {
            "model.fp8": "hybrid",
            "model.fp8_recipe": "tensorwise",
            "mixed_precision.fp8_recipe": "tensorwise",
            "model.first_last_layers_bf16": True,
            "model.bf16": True,
        },
    ),
    "fp8-delayed": (
        [H100, "pretrain.megatron_bridge.precision=fp8-delayed"],
        {"model.fp8": "hybrid", "model.fp8_recipe": "delayed", "model.fp8_amax_history_len": 1024},
    ),
    "async_save": (
        ["pretrain.megatron_bridge.async_save=true"],
        {
            "checkpoint.async_save": True,
            "checkpoint.ckpt_format": "torch_dist",
            "checkpoint.use_persistent_ckpt_worker": True,
        },
    ),
    # Megatron-FSDP: Bridge turns the distributed optimizer on and average_in_collective off itself
    "fsdp": (
        ["pretrain.megatron_bridge.fsdp=true"],
        {
            "ddp.use_megatron_fsdp": True,
            "dist.use_megatron_fsdp": True,
            "ddp.data_parallel_sharding_strategy": "optim_grads_params",
            "checkpoint.ckpt_format": "fsdp_dtensor",
            "ddp.use_distributed_optimizer": True,
            "optimizer.use_distributed_optimizer": True,
            "ddp.average_in_collective": False,
        },
    ),
    "activation_offload": (
        ["pretrain.megatron_bridge.activation_offload=4"],
        {
            "model.cpu_offloading": True,
            "model.cpu_offloading_num_layers": 4,
            "model.cpu_offloading_activations": True,
            "model.cpu_offloading_weights": False,
        },
    ),
}


@pytest.mark.parametrize("knob", list(KNOBS))
def test_each_knob_resolves_to_bridge_s_own_settings(knob, project, python, tmp_path, capsys):
    sets, expected = KNOBS[knob]
    pipeline = bundled_bridge_pipelines()[0]
    arguments = entry_arguments("bcp", pretrain_job(planned(project, pipeline, "bcp", GPT_8B, capsys, *sets)))

    config = dry_run(python, arguments, 8 * 8, data_list_file(tmp_path), tmp_path)

    assert mismatches(config, expected) == {}
    assert rendered_overrides_hold(config, arguments) == {}


def test_the_local_layer_spec_resolves_without_transformer_engine(project, python, tmp_path, capsys):
    """--layer-spec local: megatron-core's own layers (Bridge's local_layer_spec), for a machine without TE."""
    arguments = entry_arguments(
        "bcp", pretrain_job(planned(project, bundled_bridge_pipelines()[0], "bcp", GPT_126M, capsys))
    )
    config = dry_run(python, [*arguments, "--layer-spec", "local"], 8, data_list_file(tmp_path), tmp_path)

    assert config["model"]["transformer_impl"] == "local"
    assert (
        config["model"]["transformer_layer_spec"]["_target_"] == "megatron.bridge.models.gpt_provider.local_layer_spec"
    )
    default = dry_run(python, arguments, 8, data_list_file(tmp_path), tmp_path)
    assert default["model"]["transformer_layer_spec"]["_target_"].endswith(".default_layer_spec")


RECIPE_ENV = {
    "NCCL_GRAPH_REGISTER": "0",
    "NCCL_NVLS_ENABLE": "0",  # vanilla_gpt's env_vars
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "TORCH_NCCL_HIGH_PRIORITY": "1",
}


def test_the_recipe_s_environment_is_in_place_before_bridge_is_imported(project, python, tmp_path, capsys, monkeypatch):
    """The recipe's env_vars (Bridge 0.6.2: COMMON_RECIPE_ENV_VARS) are set and the program started again, so
    that the process that trains had them from its start; a value the launcher gives wins (setdefault)."""
    for name in RECIPE_ENV:
        monkeypatch.delenv(name, raising=False)
    arguments = entry_arguments(
        "bcp", pretrain_job(planned(project, bundled_bridge_pipelines()[0], "bcp", GPT_126M, capsys))
    )
    given = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}

    result = dry_run_process(python, arguments, 8, data_list_file(tmp_path), tmp_path, restart=True, env=given)

    config = resolved(result)
    assert {k: str(v) for k, v in config["env_vars"].items()} == RECIPE_ENV  # what Bridge's recipe asks for
    assert "starting again so that torch and Transformer Engine see them at import" in result.stderr
    lines = result.stdout.split("# bridge_pretrain: the recipe's environment\n", 1)[1].split("# bridge_pretrain")[0]
    assert lines.splitlines() == [f"#   {k}={given.get(k, v)} (at start)" for k, v in sorted(RECIPE_ENV.items())]


def test_the_step_line_parser_reads_bridge_s_own_format(python):
    source = (site_packages(python) / "megatron/bridge/training/utils/train_utils.py").read_text()
    lines = [
        step_line(source, iteration=step, train_iters=300000, ms=5650.4 + step, tflops=140.5, loss=9.0 - step / 100)
        for step in (10, 20, 30)
    ]
    log = "\n".join(["bridge_pretrain: recipe vanilla_gpt_pretrain_config, 64 rank(s)", *lines])

    progress = last_progress(log)
    assert (progress.steps_done, progress.total, progress.loss) == (30, 300000, pytest.approx(8.7))
    assert progress.step_seconds == pytest.approx(5.6804)
    assert [(p.step, p.loss) for p in parse_training_log(log)] == [
        (10, pytest.approx(8.9)),
        (20, pytest.approx(8.8)),
        (30, pytest.approx(8.7)),
    ]
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


@pytest.mark.parametrize(
    "complete, cut_short, tracker, step",
    [
        ("1000,2000", "3000", "tracker", 2000),
        ("1000", "2000", "none", 1000),
        ("", "1000", "none", 0),
    ],
)
def test_bridge_s_checkpoint_folder_drives_the_continuation(python, tmp_path, complete, cut_short, tracker, step):
    save = tmp_path / "checkpoints"
    made = run_bridge(python, ["-c", CHECKPOINTS, str(save), complete, cut_short, tracker], timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    if tracker == "tracker":
        assert made.stdout.split()[-1] == str(step)  # Bridge itself resumes from this step

    def verify(target: int) -> dict:
        result = subprocess.run(
            [sys.executable, str(REPO / "stages/verify.py"), "--progress", f"{save}={target}"],
            capture_output=True,
            text=True,
        )
        line = next(x for x in result.stdout.splitlines() if x.startswith("##bcp-pipeline verify "))
        return {"exit": result.returncode, **json.loads(line.split(" ", 2)[2])}

    below = verify(300000)  # a job that stopped short: the stage is submitted again
    assert (below["exit"], below["ok"], below["steps"]) == (1, False, step)
    if step:
        reached = verify(step)  # training done: the stage ends
        assert (reached["exit"], reached["ok"], reached["steps"]) == (0, True, step)


TRAIN_STATE = """
import os, shutil, sys, torch
from megatron.bridge.training.checkpointing import TRACKER_PREFIX, _resolve_checkpoint_iteration
from megatron.bridge.training.state import TrainState
from megatron.bridge.training.utils.checkpoint_utils import (
    get_checkpoint_name, get_checkpoint_run_config_filename, get_checkpoint_tracker_filename,
    get_checkpoint_train_state_filename)
save, saves, txt, torn, repair = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "torn", sys.argv[5] == "repair"
for step in map(int, filter(None, saves.split(","))):  # what a save's finalize step writes, in its order
    folder = get_checkpoint_name(save, step)
    os.makedirs(folder, exist_ok=True)
    state = TrainState()
    state.step, state.consumed_train_samples = step, step * 512
    local = get_checkpoint_train_state_filename(folder)
    torch.save(state.state_dict(), local)
    shutil.copy(local, get_checkpoint_train_state_filename(save, prefix=TRACKER_PREFIX))
    open(get_checkpoint_run_config_filename(folder), "w").write("model: {}\\n")
if txt:  # the Megatron-LM tracker, written last (a kill before it leaves the previous save's)
    open(get_checkpoint_tracker_filename(save), "w").write(txt)
tracker = get_checkpoint_train_state_filename(save, prefix=TRACKER_PREFIX)
if torn:  # a kill inside shutil.copy: a part of the file
    data = open(tracker, "rb").read()
    open(tracker, "wb").write(data[: len(data) // 3])
if repair:  # what the entry program does on rank 0 before pretrain()
    sys.path.insert(0, sys.argv[6])
    from _bridge_tracker import repair_torn_tracker
    print("repaired:", repair_torn_tracker(save), file=sys.stderr)
try:
    print(_resolve_checkpoint_iteration(save, None)[0])  # the step Bridge's own loader resumes from
except RuntimeError as exc:
    print("refused", file=sys.stderr)
    print(f"bridge-refuses: {exc}", file=sys.stderr)
    print("refused")
"""


def verify_progress(save: Path, target: int) -> tuple[dict, str]:
    result = subprocess.run(
        [sys.executable, str(REPO / "stages/verify.py"), "--progress", f"{save}={target}"],
        capture_output=True,
        text=True,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("##bcp-pipeline verify "))
    return {"exit": result.returncode, **json.loads(line.split(" ", 2)[2])}, result.stderr


@pytest.mark.parametrize(
    "saves, txt, torn, bridge_step, step",
    [
        ("1000,2000", "2000", "whole", "2000", 2000),  # a completed save: both trackers agree
        ("1000,2000", "1000", "whole", "2000", 2000),  # killed after the .pt's copy, before the .txt: the .pt wins
        ("1000,2000", "1000", "torn", "refused", 1000),  # killed inside the copy: Bridge cannot resume from it
    ],
)
def test_the_verification_reads_bridge_s_trackers_in_its_loader_s_order(
    python, tmp_path, saves, txt, torn, bridge_step, step
):
    save = tmp_path / "checkpoints"
    made = run_bridge(python, ["-c", TRAIN_STATE, str(save), saves, txt, torn, "no", str(REPO / "stages")], timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    assert made.stdout.split()[-1] == bridge_step

    progress, said = verify_progress(save, 300000)
    assert (progress["exit"], progress["ok"], progress["steps"]) == (1, False, step)
    if torn == "torn":
        assert "latest_train_state.pt is unreadable" in said and "latest_checkpointed_iteration.txt" in said, said


def test_a_torn_tracker_is_repaired_before_the_resume_so_that_bridge_resumes(python, tmp_path):
    """The entry program's repair (rank 0, before pretrain()): the .txt's iteration's own train_state.pt copied
    over the torn one; Bridge's loader then resumes from that step, the one the verification counted."""
    save = tmp_path / "checkpoints"
    made = run_bridge(
        python, ["-c", TRAIN_STATE, str(save), "1000,2000", "1000", "torn", "repair", str(REPO / "stages")], timeout=300
    )
    assert made.returncode == 0, made.stderr[-3000:]
    assert made.stdout.split()[-1] == "1000"  # Bridge resumes, from the step of the last complete tracker
    assert "replaced it with" in made.stderr and "iter_0001000/train_state.pt" in made.stderr
    progress, said = verify_progress(save, 1000)
    assert (progress["ok"], progress["steps"]) == (True, 1000) and "unreadable" not in said
