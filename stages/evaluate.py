#!/usr/bin/env python3
"""evaluate stage: the held-out loss of every checkpoint a training saves, while it trains, each exactly once.

    python3 evaluate.py --checkpoints RESULTS/RUN/checkpoints --valid-data-dir DIR --out RESULTS/RUN/evaluate
                        --every 20 --target-step 60 [--eval-iters N] [--split validation]
    python3 evaluate.py --from bridge ... --recipe R --world-size 4 --data-list RUN/data_path.txt -- KEY=VALUE ...

On a streamed edge from the pretrain (`needs: [{stage: pretrain, stream: true}]`) it starts beside the training and
watches its checkpoint folder. The checkpoints of the schedule, every `--every` steps and the last
(`--target-step`), are evaluated in step order as each lands: `OUT/step-<step:08d>.json`, written atomically, holds
"step", "split", "loss", "perplexity", "tokens", "checkpoint", the weights' sha256 and "tasks" ({}: where the
export stage adds lm-evaluation-harness scores). A checkpoint a stop signal saved between two of the schedule's is a
resume point, not a result: the results are a function of the schedule alone, the same bytes however often the
training was stopped and resumed. Run again (a killed or cancelled job), it redoes only the steps without a result
(a result under its final name is complete; a killed one's temporary is removed) and ends once the last step's
result exists.

With `--from bridge` (a stage with `evaluate_of:`, bcp_pipeline/config/evaluate.py derives its arguments) the
checkpoints are Megatron-Bridge's `iter_NNNNNNN/` folders, and each is scored by Bridge's own evaluation: the
training's entry program under torchrun on `--world-size` GPUs with the training's recipe, `--data-list` and the
overrides after `--` (_bridge_evaluate.py). Bridge reads the held-out split from its first sample when it skips
training, so every checkpoint is scored on the same samples, those of the training's first validation line.

Checkpoints: the smoke pretrain's `step=NNNNNN[-last].pt` (pretrain_local.py), evaluated through the training's own
evaluation (_pretrain_eval.heldout_loss, on the samples its `validation loss at iteration N` lines use; the
checkpoint's own settings: sequence length, seed, micro batch, precision, threads), so the numbers are the
training's. A scheduled checkpoint pruned (`--keep-checkpoints`) before it was evaluated fails the stage, naming
it. No checkpoint landing for `--stall-seconds` fails it too (the orchestrator cancels it sooner when the training
fails).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import _common
import data_list
from _pretrain_checkpoints import checkpoint_name, list_checkpoints

STAGE = "evaluate"
RESULT_NAME = "step-{step:08d}.json"
INDEX_CACHE = ".index_cache"  # hidden: no result glob matches it
TASKS_SCRATCH = ".tasks"  # hidden too: a checkpoint as a Hugging Face folder while the harness scores it
STALL_SECONDS_ENV = "BCP_PIPELINE_EVALUATE_STALL_SECONDS"
DEFAULT_STALL_SECONDS = 24 * 3600.0  # a large training saves every few hours; a day without one: it is gone
POLL_SECONDS = 1.0


def result_path(out: Path, step: int) -> Path:
    return out / RESULT_NAME.format(step=step)


def scheduled_steps(every: int, target: int) -> list[int]:
    """The steps whose checkpoints are evaluated: every `every` steps, and the last."""
    return sorted({*range(every, target + 1, every), target})


def finished_steps(out: Path) -> set[int]:
    """Steps with a result under its final name (written atomically: complete)."""
    found = set()
    for path in out.glob("step-*.json"):
        stem = path.name[len("step-") : -len(".json")]
        if stem.isdigit():
            found.add(int(stem))
    return found


def landed(checkpoints: Path) -> dict[int, Path]:
    """Complete checkpoints by step (the highest-ranked name of a step: `-last` first, as list_checkpoints sorts)."""
    found: dict[int, Path] = {}
    for step, path in list_checkpoints(checkpoints):
        found.setdefault(step, path)
    return found


class Evaluator:
    """The smoke pretrain's checkpoints: loads one and runs the training's evaluation on it; the held-out dataset
    is built once, on the first checkpoint's settings (every checkpoint of a run has them)."""

    pruned_by = "--keep-checkpoints"  # what removes a checkpoint before its turn, for the error

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dataset = None
        self.cfg: dict | None = None

    def landed(self) -> dict[int, Path]:
        return landed(self.args.checkpoints)

    def evaluate(self, step: int, path: Path) -> dict:
        import torch  # pylint: disable=import-outside-toplevel  (slow: only once there is a checkpoint)
        from _pretrain_checkpoints import load_checkpoint  # pylint: disable=import-outside-toplevel
        from _pretrain_eval import build_heldout_dataset, eval_samples, heldout_loss, perplexity
        from _smoke_gpt import SmokeGPT, weights_digest

        device = torch.device("cuda" if self.args.device == "cuda" else "cpu")
        payload = load_checkpoint(path, device)
        cfg = payload["config"]
        if self.cfg is None:
            self.cfg = cfg
            # The training's thread count and deterministic kernels: its numbers, bit for bit where it ran here.
            torch.set_num_threads(self.args.threads or int(cfg.get("threads") or 1))
            torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        iters = self.args.eval_iters or int(cfg.get("eval_iters") or 4)
        samples = eval_samples(iters, int(cfg["global_batch_size"]))
        if self.dataset is None:
            self.dataset = build_heldout_dataset(self.args.valid_data_dir, cfg, samples, self.args.out / INDEX_CACHE)
        model = SmokeGPT(cfg["vocab_size"], cfg["hidden"], cfg["layers"], cfg["heads"], cfg["seq_length"]).to(device)
        model.load_state_dict(payload["model"])
        loss, tokens = heldout_loss(
            model, self.dataset, samples, int(cfg["micro_batch_size"]), device, cfg.get("precision", "fp32")
        )
        entries = data_list.build_data_list(self.args.valid_data_dir)
        tasks = self.task_scores(step, payload) if self.args.tasks else {}
        return {
            "step": step,
            "split": self.args.split,
            "loss": loss,
            "perplexity": perplexity(loss),
            "tokens": tokens,
            "samples": samples,
            "eval_iters": iters,
            # The name the checkpoint keeps once a newer one is saved (`-last` moves on): stable in the result.
            "checkpoint": str(self.args.checkpoints / checkpoint_name(step, last=False)),
            "weights_sha256": weights_digest(model),
            "data": [[e.weight, e.name] for e in entries],
            "tasks": tasks,
        }

    def task_scores(self, step: int, payload: dict) -> dict[str, dict[str, float]]:
        """lm-evaluation-harness's scores of `--tasks` on this checkpoint, loaded as the export writes it (a GPT-2
        folder, in a hidden scratch folder of the results, removed after)."""
        import shutil  # pylint: disable=import-outside-toplevel

        import _hf_folder  # pylint: disable=import-outside-toplevel
        import _lm_eval_scores  # pylint: disable=import-outside-toplevel
        from _smoke_to_gpt2 import gpt2_config, gpt2_tensors  # pylint: disable=import-outside-toplevel

        folder = self.args.out / TASKS_SCRATCH / f"step-{step:08d}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            _hf_folder.write_safetensors(folder / "model.safetensors", gpt2_tensors(payload["model"]))
            _common.atomic_write_json(folder / "config.json", gpt2_config(payload["config"]))
            _hf_folder.write_gpt2_tokenizer(folder, self.args.bpe_dir, payload["config"]["seq_length"])
            names = [name for name in self.args.tasks.split(",") if name]
            return _lm_eval_scores.score(folder, names, self.args.tasks_dir)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class BridgeEvaluator:
    """Megatron-Bridge's checkpoints, each scored by Bridge's own evaluation in a torchrun of its own."""

    pruned_by = "megatron_bridge.most_recent_k"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def landed(self) -> dict[int, Path]:
        import _bridge_evaluate  # pylint: disable=import-outside-toplevel

        return _bridge_evaluate.complete_checkpoints(self.args.checkpoints)

    def evaluate(self, step: int, path: Path) -> dict:
        import _bridge_evaluate  # pylint: disable=import-outside-toplevel

        if not path.is_dir():
            raise FileNotFoundError(path)
        losses = _bridge_evaluate.run_evaluation(self.args, step)
        loss = losses["validation"]
        tokens, samples, iters = _bridge_evaluate.evaluated_tokens(self.args.overrides)
        entries = data_list.build_data_list(self.args.valid_data_dir)
        test = {"test_loss": losses["test"]} if "test" in losses else {}  # a test split in the data list
        return {
            "step": step,
            "split": self.args.split,
            "loss": loss,
            "perplexity": math.exp(min(loss, 700.0)),  # as _pretrain_eval.perplexity, without importing torch
            **test,
            "tokens": tokens,
            "samples": samples,
            "eval_iters": iters,
            "checkpoint": str(path),
            "engine": "megatron-bridge",
            "data": [[e.weight, e.name] for e in entries],
            "tasks": {},
        }


def announce(result: dict) -> None:
    """The orchestrator's line for `status` and the report (every result, again at each start of the job)."""
    keys = ("step", "split", "loss", "perplexity", "tokens", "test_loss", "tasks")
    _common.emit("evaluation", {key: result[key] for key in keys if key in result})


def evaluate_all(
    args: argparse.Namespace, evaluator: Evaluator | BridgeEvaluator, sleep=time.sleep, clock=time.monotonic
) -> list[int]:
    """Evaluate the schedule's checkpoints as they land until the last step has a result; the steps evaluated."""
    schedule = scheduled_steps(args.every, args.target_step)
    done = finished_steps(args.out)
    progress = _common.Progress(len(schedule), 0, unit="checkpoints", interval=0.0)
    for step in sorted(done & set(schedule)):
        announce(_read_result(result_path(args.out, step)))
        progress.advance()
    evaluated: list[int] = []
    last_landing = clock()
    seen: set[int] = set()
    while args.target_step not in done:
        present = evaluator.landed()
        if set(present) - seen:
            seen |= set(present)
            last_landing = clock()
        pending = [step for step in schedule if step not in done]
        newest = max(present, default=0)
        pruned = [step for step in pending if step < newest and step not in present]
        if pruned:
            raise _common.StageError(
                f"{args.checkpoints}: the checkpoint of step {pruned[0]} is gone (pruned by "
                f"{evaluator.pruned_by}?) before it was evaluated; keep more checkpoints"
            )
        ready = [step for step in pending if step in present]
        if not ready:
            waited = clock() - last_landing
            if waited >= args.stall_seconds:
                raise _common.StageError(
                    f"{args.checkpoints}: no checkpoint landed for {waited:.0f} s, waiting for "
                    f"step {pending[0]}: is the training running? (--stall-seconds)"
                )
            sleep(args.poll)
            continue
        step = ready[0]
        try:
            result = evaluator.evaluate(step, present[step])
        except (FileNotFoundError, _common.StageError):
            if present[step].exists():
                raise
            continue  # renamed (`-last` moved on) between the listing and the load: list again
        _common.atomic_write_json(result_path(args.out, step), result)
        last_landing = clock()  # the wait for the next checkpoint starts now, not while this one was evaluated
        done.add(step)
        evaluated.append(step)
        announce(result)
        progress.advance()
        scored = f"; {describe_tasks(result['tasks'])}" if result.get("tasks") else ""
        print(
            f"{STAGE}: step {step}: held-out loss {result['loss']:.4f} (perplexity {result['perplexity']:.1f}) "
            f"over {result['tokens']} tokens{scored}",
            flush=True,
        )
    return evaluated


def describe_tasks(tasks: dict[str, dict[str, float]]) -> str:
    return ", ".join(
        f"{name} {metric} {value:.4g}" for name, scores in tasks.items() for metric, value in scores.items()
    )


def _read_result(path: Path) -> dict:
    import json  # pylint: disable=import-outside-toplevel

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _common.StageError(f"{path}: unreadable result ({exc}); delete it to evaluate that step again") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="evaluate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--from",
        dest="source",
        choices=("smoke", "bridge"),
        default="smoke",
        help="whose checkpoints: the smoke pretrain's (step=N.pt) or Megatron-Bridge's (iter_NNNNNNN/)",
    )
    parser.add_argument("--checkpoints", type=Path, required=True, help="the training's checkpoint folder")
    parser.add_argument("--valid-data-dir", type=Path, required=True, help="the held-out split's .bin/.idx")
    parser.add_argument("--out", type=Path, required=True, help="folder of the step-<step>.json results")
    parser.add_argument(
        "--every", type=_common.positive_int, required=True, help="the training's checkpoint interval in steps"
    )
    parser.add_argument("--target-step", type=_common.positive_int, required=True, help="the training's last step")
    parser.add_argument("--split", default="validation", help="the held-out split's name, for the results")
    parser.add_argument(
        "--eval-iters",
        type=_common.positive_int,
        default=None,
        help="global batches evaluated (default: the training's own --eval-iters)",
    )
    parser.add_argument(
        "--tasks", default="", help="smoke: comma-separated lm-evaluation-harness tasks scored on each checkpoint"
    )
    parser.add_argument("--tasks-dir", type=Path, default=Path(__file__).resolve().parent / "lm_eval_tasks")
    parser.add_argument("--bpe-dir", type=Path, help="with --tasks: vocab.json + merges.txt, the model's tokenizer")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--threads",
        type=_common.positive_int,
        default=None,
        help="torch threads (default: the training's, for its numbers bit for bit)",
    )
    parser.add_argument("--poll", type=float, default=POLL_SECONDS, help="seconds between looks at the folder")
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=None,
        help=f"fail after this long without a new checkpoint (default: ${STALL_SECONDS_ENV} or "
        f"{DEFAULT_STALL_SECONDS:.0f})",
    )
    bridge = parser.add_argument_group("--from bridge", "the training's own settings (derived by evaluate_of)")
    bridge.add_argument("--recipe", help="its recipe of megatron.bridge.recipes")
    bridge.add_argument("--world-size", type=_common.positive_int, default=1, help="ranks: TP x PP x CP")
    bridge.add_argument("--data-list", type=Path, help="its data list overrides file (data_path.txt)")
    bridge.add_argument("--hf-home", type=Path, help="its Hugging Face cache, read offline")
    bridge.add_argument("--layer-spec", choices=("te", "local"), help="bridge_pretrain.py's (default: its own, te)")
    bridge.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="after --: its overrides, then the evaluation's"
    )
    args = parser.parse_args(argv)
    if args.source == "bridge":
        missing = [flag for flag, value in (("--recipe", args.recipe), ("--data-list", args.data_list)) if not value]
        if missing:
            parser.error(f"--from bridge needs {' and '.join(missing)}")
        if args.tasks:
            parser.error("--tasks scores the smoke pretrain's checkpoints; a Bridge model is scored by its export")
    elif args.overrides:
        parser.error(f"overrides are for --from bridge: {' '.join(args.overrides)}")
    if args.tasks and args.bpe_dir is None:
        parser.error("--tasks needs --bpe-dir (the tokenizer the model was trained with)")
    if args.tasks:
        from _lm_eval_scores import TASKS  # pylint: disable=import-outside-toplevel  (no harness imported)

        unknown = [name for name in args.tasks.split(",") if name and name not in TASKS]
        if unknown:
            parser.error(f"--tasks: unknown task(s) {', '.join(unknown)}; the shipped ones: {', '.join(TASKS)}")
    if args.stall_seconds is None:
        try:
            args.stall_seconds = float(os.environ.get(STALL_SECONDS_ENV) or DEFAULT_STALL_SECONDS)
        except ValueError:
            parser.error(f"{STALL_SECONDS_ENV}={os.environ[STALL_SECONDS_ENV]!r} is not a number of seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rank, world = _common.rank_and_world_size()
        if rank != 0:  # one evaluator per training: more ranks would write the same results
            print(f"{STAGE}: rank {rank} of {world} has nothing to do (rank 0 evaluates)", file=sys.stderr)
            return 0
        args.out.mkdir(parents=True, exist_ok=True)
        removed = _common.remove_stale_temporaries(args.out)
        if removed:
            print(f"{STAGE}: removed {removed} partial result(s) left by a killed evaluation", flush=True)
        evaluator = BridgeEvaluator(args) if args.source == "bridge" else Evaluator(args)
        evaluated = evaluate_all(args, evaluator)
        final = _read_result(result_path(args.out, args.target_step))
    except (_common.StageError, data_list.DataListError) as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr)
        return 1
    count = len(finished_steps(args.out) & set(scheduled_steps(args.every, args.target_step)))
    print(f"{STAGE}: {count} checkpoint(s) evaluated ({len(evaluated)} by this job)", flush=True)
    _common.emit(
        "summary", {"text": f"held-out loss {final['loss']:.2f} at step {final['step']} ({count} checkpoints)"}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
