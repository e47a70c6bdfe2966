"""The GPU proof's jobs, from what `bcp-pipeline plan --json` renders (pure: text and lists in, lists out).

The rendered Slurm job of a Bridge pipeline's pretrain stage holds the two commands the proof runs as they are: the
data list (`data_list.py ... --out RUN/data_path.txt`) and the entry program (`bridge_pretrain.py --recipe ...
--overrides-file RUN/data_path.txt KEY=VALUE ...`). Slurm, because its workspace is a folder of this machine, so
every rendered path (tokenizer files, data, index cache, checkpoints) is one the proof can create.

The proof changes only what it must, each change with its reason (`Change`), and every one is listed in the summary:
a tiny shape, what megatron-core's local layer spec cannot build without Transformer Engine or apex, deterministic
settings for a bit-equal continuation, and per job the checkpoint folder and the time limit.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import datetime

ENTRY = "bridge_pretrain.py"


@dataclass(frozen=True)
class Rendered:
    data_list: list[str]  # data_list.py and its arguments (the interpreter left out)
    entry: list[str]  # the arguments after bridge_pretrain.py
    evaluate: list[str] | None = None  # the evaluate stage's arguments after evaluate.py (evaluate_of), if any


@dataclass(frozen=True)
class Change:
    key: str
    value: str
    reason: str


def pretrain_job(plan: dict) -> dict:
    jobs = [j for j in plan.get("jobs", []) if j.get("stage") == "pretrain" and j.get("kind") == "stage"]
    if len(jobs) != 1:
        raise ValueError(f"the plan has {len(jobs)} pretrain stage job(s), not 1")
    return jobs[0]


def rendered_commands(plan: dict) -> Rendered:
    """The data list and entry commands of the pretrain job of a Slurm plan (`plan --backend slurm --json`)."""
    script = pretrain_job(plan)["printable"]
    data_list = entry = None
    for line in script.splitlines():
        if "data_list.py" in line and "--out" in line:
            words = shlex.split(line.split(" || ", 1)[0])
            data_list = words[next(i for i, w in enumerate(words) if w.endswith("data_list.py")) :]
        elif f"{ENTRY} --recipe" in line:
            words = shlex.split(line.rstrip(" \\"))
            entry = words[next(i for i, w in enumerate(words) if w.endswith(ENTRY)) + 1 :]
    if data_list is None or entry is None:
        raise ValueError(
            "the pretrain job runs no data_list.py and bridge_pretrain.py: is it a megatron_bridge stage "
            "rendered for Slurm?"
        )
    return Rendered(data_list, entry, evaluate_arguments(plan))


def evaluate_arguments(plan: dict) -> list[str] | None:
    """The evaluate stage's evaluate.py arguments in a Slurm plan (its job script's command line)."""
    jobs = [j for j in plan.get("jobs", []) if j.get("stage") == "evaluate" and j.get("kind") == "stage"]
    for job in jobs:
        for line in job["printable"].splitlines():
            if "evaluate.py" in line and "--from bridge" in line:
                words = shlex.split(line.rstrip(" \\"))
                return words[next(i for i, w in enumerate(words) if w.endswith("evaluate.py")) + 1 :]
    return None


def evaluation_arguments(
    arguments: list[str], changes: list[Change], *, steps: int, out: str, layer_spec: str | None
) -> list[str]:
    """The rendered evaluate.py arguments for the proof's training: its steps (the schedule ends there; the rendered
    save_interval is past them, so only the last checkpoint is scored), one rank (the tiny shape has TP 1), its
    results folder, the layer spec, and the training's changes applied to the overrides after `--`."""
    split = arguments.index("--")
    options, overrides = list(arguments[:split]), arguments[split + 1 :]
    for option, value in (("--target-step", str(steps)), ("--world-size", "1"), ("--out", out)):
        options[options.index(option) + 1] = value
    if layer_spec:
        options += ["--layer-spec", layer_spec]
    changed, _ = apply(overrides, changes)
    return [*options, "--", *changed]


def key_of(word: str) -> str | None:
    """The override's key (`+`/`~` prefixes left out); None for an option or its value."""
    if word.startswith("-") or "=" not in word:
        return None
    return word.split("=", 1)[0].lstrip("+~")


def value_of(entry: list[str], key: str) -> str | None:
    found = [w.split("=", 1)[1] for w in entry if key_of(w) == key]
    return found[-1] if found else None


def option_of(words: list[str], option: str) -> str:
    return words[words.index(option) + 1]


def apply(entry: list[str], changes: list[Change]) -> tuple[list[str], list[dict]]:
    """The entry arguments with each change's key set (in place where rendered, else appended), and what changed."""
    result, record = list(entry), []
    for change in changes:
        word = f"{change.key}={change.value}"
        places = [i for i, w in enumerate(result) if key_of(w) == change.key]
        record.append(
            {"key": change.key, "rendered": value_of(entry, change.key), "value": change.value, "reason": change.reason}
        )
        if places:
            result[places[-1]] = word
            result = [w for i, w in enumerate(result) if i not in places[:-1]]
        else:
            result.append(word)
    return result, record


@dataclass(frozen=True)
class Shape:
    layers: int = 4
    hidden: int = 512
    ffn: int = 1536
    heads: int = 8
    seq: int = 512
    global_batch: int = 16
    micro_batch: int = 8


def tiny_changes(shape: Shape, steps: int, per_split: bool = False) -> list[Change]:
    """The tiny shape's changes; `per_split`: the data list holds per-split blends (a held-out split), whose
    `dataset.split=null` megatron-core requires, so the split is left as rendered."""
    why = "a tiny GPT that trains in seconds on one GPU"
    changes = [
        Change("model.num_layers", str(shape.layers), why),
        Change("model.hidden_size", str(shape.hidden), why),
        Change("model.ffn_hidden_size", str(shape.ffn), why),
        Change("model.num_attention_heads", str(shape.heads), why),
        Change("model.seq_length", str(shape.seq), why),
        Change("dataset.seq_length", str(shape.seq), why),
        Change("model.tensor_model_parallel_size", "1", "one GPU"),
        Change("train.global_batch_size", str(shape.global_batch), why),
        Change("train.micro_batch_size", str(shape.micro_batch), f"{why}; 2+ micro batches a step"),
        Change("train.train_iters", str(steps), "the proof's steps"),
        Change(
            "scheduler.lr_warmup_iters",
            str(max(1, steps // 10)),
            "megatron-core's scheduler needs warm-up below the decay steps",
        ),
        Change(
            "logger.log_interval",
            "1",
            "a step line every step, each with that step's own loss (Bridge averages the loss over the interval)",
        ),
        Change(
            "dataset.split",
            "'98,1,1'",
            "the tiny corpus (800 documents) would give the rendered split's 8 and 2 parts in 100,000 no document",
        ),
        Change("validation.eval_iters", "2", "a short validation"),
    ]
    return [c for c in changes if not (per_split and c.key == "dataset.split")]


# What megatron-core's local layer spec cannot build or run without Transformer Engine and apex (the GPU machine has
# neither): each refusal is NVIDIA's own code, and tests/scripts/test_gpu_proof_bridge.py shows it on CPU.
NO_TE = [
    Change(
        "model.layernorm_zero_centered_gamma",
        "false",
        "without apex the local spec normalizes with torch.nn.LayerNorm (megatron/core/transformer/torch_norm.py "
        "WrappedTorchNorm), which asserts no zero-centred gamma (gpt3/7b_improved's layernorm1p)",
    ),
    Change(
        "model.masked_softmax_fusion",
        "false",
        "FusedScaleMaskSoftmax imports the compiled kernel scaled_masked_softmax_cuda (apex's, Megatron's own "
        "build) for bf16 input (megatron/core/fusions/fused_softmax.py is_kernel_available)",
    ),
]
DETERMINISTIC = [
    Change(
        "model.deterministic_mode",
        "true",
        "the same floating-point sums in every run, so that the resumed "
        "steps' losses can be held equal to the uninterrupted run's (torch.use_deterministic_algorithms)",
    ),
    Change(
        "model.cross_entropy_loss_fusion",
        "false",
        "Bridge refuses deterministic mode with the fused cross entropy (config.py "
        "_validate_and_apply_deterministic_mode)",
    ),
]
# The environment deterministic mode needs (Bridge asserts NCCL_ALGO; cuBLAS needs a fixed workspace).
DETERMINISTIC_ENV = {"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def job_changes(entry: list[str], *, checkpoints: str | None = None, exit_minutes: float | None = None) -> list[Change]:
    """Per job: a checkpoint folder of its own (the uninterrupted run), or a time limit (the job that is stopped)."""
    changes = []
    if checkpoints is not None:
        changes += [
            Change(
                "checkpoint.save",
                checkpoints,
                "the uninterrupted run's own folder, so that the stopped job does not continue it",
            ),
            Change("checkpoint.load", checkpoints, "the same"),
        ]
    if exit_minutes is not None:
        changes.append(
            Change(
                "train.exit_duration_in_mins",
                f"{exit_minutes:.4f}",
                "stopped by Bridge's own time limit part-way (the rendered limit is the job's runtime less its margin)",
            )
        )
    return changes


STAMP = re.compile(r"^\s*\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]\s+iteration\s+(\d+)/")
INITIALIZED = re.compile(r"\[after megatron is initialized\] datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
INIT_SECONDS = re.compile(r"time to initialize megatron \(seconds\): ([\d.]+)")


def seconds_at_steps(log: str) -> dict[int, float]:
    """Seconds since Bridge's clock started (`pretrain()`'s state: what train.exit_duration_in_mins counts) at each
    logged step, to the second: the clock's start is the `after megatron is initialized` stamp less the initialize
    time Bridge prints just before it."""
    init = INITIALIZED.search(log)
    seconds = INIT_SECONDS.search(log)
    if init is None or seconds is None:
        return {}
    start = datetime.strptime(init.group(1), "%Y-%m-%d %H:%M:%S").timestamp() - float(seconds.group(1))
    found = {}
    for line in log.splitlines():
        if match := STAMP.match(line.split("]:", 1)[-1] if line.startswith("[rank") else line):
            found[int(match.group(2))] = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp() - start
    return found


def stop_minutes(log: str, steps: int, fraction: float = 0.4) -> float:
    """The time limit that stops a job like this log's part-way: when it had done `fraction` of its steps. The
    stopped job reads the data index the first one built, so it gets a little further in the same time."""
    at = seconds_at_steps(log)
    target = max(2, round(steps * fraction))
    if target not in at:
        raise ValueError(f"the uninterrupted run's log has no timed step {target} (it logged {len(at)} steps)")
    return at[target] / 60
