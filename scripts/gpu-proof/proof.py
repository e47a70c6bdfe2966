"""The GPU proof itself (scripts/gpu-proof/run starts it in the environment it builds): a tiny GPT trained through
stages/bridge_pretrain.py with the override list `plan` renders, stopped by Bridge's time limit, continued from
Bridge's own checkpoint, and checked (proof_report.py). Writes summary.json, summary.md and the jobs' logs to --out.

    python proof.py --out DIR [--steps 300] [--pipeline slimpajama-8b-bridge] [--set STAGE.KEY=VALUE]...
    python proof.py --out DIR --rehearse    # on a CPU: everything up to training (plan, data, the jobs' dry runs)

Exit 0 when every required check holds, 1 when one fails (summary.md says which), 2 on bad input.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]

import proof_jobs as jobs  # noqa: E402
import proof_report as report  # noqa: E402

STAGES = REPO / "stages"


class ProofError(Exception):
    """A step before the checks failed (plan, the data): the summary says which, with its output."""


WORDS = (
    "the model reads tokens from a tiny corpus written for this proof; each document is a few sentences of "
    "plain words so that the tokenizer, the index and the loader see real text"
).split()


def tiny_corpus(folder: Path, chunks: int = 2, docs: int = 400, seed: int = 0) -> None:
    """concat's outputs (train_chunk_{i}.jsonl) of deterministic documents: two chunks, so that the data list is a
    blend, as the real pipeline's is; another `seed`, other documents (a held-out split's)."""
    folder.mkdir(parents=True, exist_ok=True)
    for chunk in range(chunks):
        lines = []
        for doc in range(docs):
            n = 40 + (doc * 7 + chunk + seed) % 80
            lines.append(
                json.dumps(
                    {"text": " ".join(WORDS[(doc * 13 + seed + i * (chunk + 3)) % len(WORDS)] for i in range(n))}
                )
            )
        (folder / f"train_chunk_{chunk}.jsonl").write_text("\n".join(lines) + "\n")


def run(argv: list[str], log: Path, env: dict | None = None, cwd: Path | None = None, timeout: int = 240) -> int:
    """A command with its output to `log` (and to ours, live); its exit code, 124 when it ran past `timeout` (then
    its whole process group is killed: torchrun and its workers)."""
    print(f"$ {' '.join(argv[:6])} ... > {log.name}", flush=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd, start_new_session=True
        )
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            os.killpg(process.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            for line in process.stdout:
                out.write(line)
                if "iteration" not in line or " 1/" in line:  # every line but the step lines, to keep ours short
                    sys.stdout.write(line)
            code = process.wait()
        finally:
            timer.cancel()
        if expired.is_set():
            out.write(f"\nproof: killed after {timeout} s\n")
            return 124
        return code


def environment() -> dict:
    import torch

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    try:  # absent on the GPU machine: the import-only STAND-IN serves megatron/bridge/peft/lora_layers.py alone
        import transformer_engine  # noqa: F401

        te = f"installed ({version('transformer-engine')})"
    except ModuleNotFoundError:
        te = (
            "absent (an import-only STAND-IN, tests/fakes/transformer_engine_standin.py, serves the one import of "
            "megatron/bridge/peft/lora_layers.py)"
        )
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "megatron_core": version("megatron-core"),
        "megatron_bridge": version("megatron-bridge"),
        "transformers": version("transformers"),
        "transformer_engine": te,
        "host": platform.node(),
    }


def plan(project: Path, pipeline: str, sets: list[str]) -> dict:
    project.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "pipelines.yaml", project / "pipelines.yaml")
    if not (project / "stages").exists():
        (project / "stages").symlink_to(STAGES)  # a config names its stage programs beside it
    words = [w for s in sets for w in ("--set", s)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bcp_pipeline",
            "--config",
            str(project / "pipelines.yaml"),
            "plan",
            pipeline,
            "--backend",
            "slurm",
            "--json",
            *words,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
    )
    if done.returncode != 0:
        raise ProofError(f"bcp-pipeline plan {pipeline} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def prepare_data(rendered: jobs.Rendered, work: Path, logs: Path) -> None:
    """The bpe, tokenize-preprocess and data-list steps, into the folders the rendered job reads."""
    vocab = Path(jobs.value_of(rendered.entry, "tokenizer.vocab_file"))
    merges = Path(jobs.value_of(rendered.entry, "tokenizer.merge_file"))
    data_dir = Path(jobs.option_of(rendered.data_list, "--data-dir"))
    tiny_corpus(work / "train")
    steps = [
        [str(STAGES / "gpt2_files.py"), "--out", str(vocab.parent)],
        [
            str(STAGES / "preprocess.py"),
            "--in",
            str(work / "train"),
            "--out",
            str(data_dir),
            "--vocab",
            str(vocab),
            "--merges",
            str(merges),
            "--workers",
            "2",
        ],
        rendered.data_list,
    ]
    if "--valid-data-dir" in rendered.data_list:  # the held-out split, tokenized apart as tokenize-validation does
        tiny_corpus(work / "validation", chunks=1, docs=120, seed=5)
        steps.insert(
            2,
            [
                str(STAGES / "preprocess.py"),
                "--in",
                str(work / "validation"),
                "--out",
                jobs.option_of(rendered.data_list, "--valid-data-dir"),
                "--files-per-output",
                "1",
                "--output-stem",
                "validation_chunk",
                "--vocab",
                str(vocab),
                "--merges",
                str(merges),
                "--workers",
                "1",
            ],
        )
    Path(jobs.option_of(rendered.data_list, "--out")).parent.mkdir(parents=True, exist_ok=True)
    for number, argv in enumerate(steps):
        if run([sys.executable, *argv], logs / f"data-{number}.log") != 0:
            raise ProofError(f"{Path(argv[0]).name} failed: {(logs / f'data-{number}.log').read_text()[-2000:]}")


def entry_command(args: argparse.Namespace, entry: list[str], dry_run: bool) -> list[str]:
    spec = [] if args.layer_spec is None else ["--layer-spec", args.layer_spec]
    if dry_run:
        return [sys.executable, str(STAGES / jobs.ENTRY), *spec, *entry, "--dry-run", "--world-size", "1"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        str(STAGES / jobs.ENTRY),
        *spec,
        *entry,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-proof-work"))
    parser.add_argument("--pipeline", default="slimpajama-8b-bridge")
    parser.add_argument("--set", action="append", default=[], metavar="STAGE.KEY=VALUE", help="passed to plan")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layer-spec", default="local", help="bridge_pretrain.py's --layer-spec ('' to pass none)")
    parser.add_argument("--no-deterministic", action="store_true")
    parser.add_argument("--no-smoke", action="store_true", help="skip the smoke trainer's comparison run")
    parser.add_argument("--rehearse", action="store_true", help="CPU: plan, data and dry runs; no training")
    parser.add_argument(
        "--budget",
        type=int,
        default=480,
        help="seconds for all jobs together (default: %(default)s;"
        " the device tool kills a command at 600 s, and the summary must be written before)",
    )
    args = parser.parse_args(argv)
    args.layer_spec = args.layer_spec or None
    if args.steps < 20:
        parser.error("--steps must be at least 20 (the job stopped part-way needs steps on both sides)")
    seconds: dict[str, float] = {}
    clock = time.monotonic()
    deadline = clock + args.budget

    def left() -> int:  # a job's time limit: what is left of the budget (a job past it is killed, and checked failed)
        return max(10, int(deadline - time.monotonic()))

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name] = time.monotonic() - clock
        clock = time.monotonic()

    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    logs = args.work / "logs"
    logs.mkdir(parents=True)
    env = environment()
    print(f"proof: {json.dumps(env)}", flush=True)
    if not env["cuda"] and not args.rehearse:
        raise SystemExit("proof: torch sees no CUDA GPU here; --rehearse runs what a CPU can")
    summary = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "environment": env,
        "pipeline": args.pipeline,
        "sets": args.set,
        "layer_spec": args.layer_spec or "(none given)",
        "rendered_overrides": 0,
        "steps": args.steps,
        "changes": [],
        "checks": [],
        "throughput": {},
        "seconds": seconds,
    }
    try:
        if (
            args.layer_spec
            and "--layer-spec"
            not in subprocess.run(
                [sys.executable, str(STAGES / jobs.ENTRY), "--help"], capture_output=True, text=True
            ).stdout
        ):
            raise ProofError(
                f"stages/{jobs.ENTRY} has no --layer-spec option: without Transformer Engine the jobs "
                "need megatron-core's local spec (--layer-spec local)"
            )
        rendered = jobs.rendered_commands(plan(args.work / "project", args.pipeline, args.set))
        lap("plan")
        prepare_data(rendered, args.work, logs)
        lap("data")
    except (ProofError, ValueError) as exc:
        summary["checks"].append(report.check("plan and the data stages run", False, str(exc)))
        return finish(summary, args.out, logs)
    per_split = jobs.value_of(rendered.entry, "dataset.split") == "null"
    changes = jobs.tiny_changes(jobs.Shape(), args.steps, per_split) + jobs.NO_TE
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    if not args.no_deterministic:
        changes += jobs.DETERMINISTIC
        run_env.update(jobs.DETERMINISTIC_ENV)
    base, record = jobs.apply(rendered.entry, changes)
    checkpoints = Path(jobs.value_of(base, "checkpoint.save"))
    own = f"{checkpoints.parent}-uninterrupted/checkpoints"
    summary.update(rendered_overrides=sum(1 for w in rendered.entry if jobs.key_of(w)), changes=record)
    a_entry, a_record = jobs.apply(base, jobs.job_changes(base, checkpoints=own))
    if args.rehearse:  # the three jobs' configs, resolved by Bridge itself
        for name, entry in (
            ("A", a_entry),
            ("B", jobs.apply(base, jobs.job_changes(base, exit_minutes=0.5))[0]),
            ("C", base),
        ):
            code = run(entry_command(args, entry, dry_run=True), logs / f"dry-{name}.log", env=run_env, timeout=left())
            summary["checks"].append(report.check(f"{name}'s config resolves (--dry-run)", code == 0, f"exit {code}"))
        if rendered.evaluate:  # the evaluate stage's command for the last checkpoint, resolved by Bridge too
            entry = evaluation_entry(args, rendered, changes, checkpoints)
            code = run(entry_command(args, entry, dry_run=True), logs / "dry-evaluate.log", env=run_env, timeout=left())
            summary["checks"].append(
                report.check("the evaluation's config resolves (--dry-run)", code == 0, f"exit {code}")
            )
        lap("dry runs")
        if not args.no_smoke:  # three steps on the CPU: the smoke trainer with the carried megatron-core
            smoke(
                args,
                jobs.Shape(),
                Path(jobs.option_of(rendered.data_list, "--data-dir")),
                logs,
                summary,
                device="cpu",
                steps=3,
            )
            lap("smoke trainer (CPU)")
        return finish(summary, args.out, logs)
    a_code = run(entry_command(args, a_entry, False), logs / "job-A.log", env=run_env, cwd=args.work, timeout=left())
    lap("job A")
    a_log = (logs / "job-A.log").read_text(errors="replace")
    summary["checks"].append(report.check("A exits 0", a_code == 0, f"exit code {a_code}"))
    try:
        minutes = jobs.stop_minutes(a_log, args.steps)
    except ValueError as exc:
        summary["checks"].append(report.check("A's log times its steps", False, str(exc)))
        return finish(summary, args.out, logs)
    b_entry, b_record = jobs.apply(base, jobs.job_changes(base, exit_minutes=minutes))
    summary["changes"] += a_record + b_record
    b_code = run(entry_command(args, b_entry, False), logs / "job-B.log", env=run_env, cwd=args.work, timeout=left())
    lap("job B")
    tracker_file = checkpoints / "latest_checkpointed_iteration.txt"
    tracker = tracker_file.read_text() if tracker_file.is_file() else None
    c_code = run(entry_command(args, base, False), logs / "job-C.log", env=run_env, cwd=args.work, timeout=left())
    lap("job C")
    texts = {name: (logs / f"job-{name}.log").read_text(errors="replace") for name in "BC"}
    found, figures = report.continuation_checks(
        a_log, texts["B"], texts["C"], steps=args.steps, b_exit=b_code, c_exit=c_code, tracker=tracker
    )
    summary["checks"] += found
    summary["figures"] = figures
    if rendered.evaluate:
        evaluate_checkpoints(args, rendered, changes, texts["C"], logs, summary, run_env, left())
        lap("evaluate")
    shape = jobs.Shape()
    summary["throughput"]["Bridge (A), local spec"] = report.bridge_throughput(
        a_log, tokens_per_step=shape.global_batch * shape.seq
    )
    summary["checks"].append(
        report.check(
            "Bridge reports its TFLOP/s",
            bool(summary["throughput"]["Bridge (A), local spec"]["tflops_per_gpu"]),
            "logger.log_throughput=true's figure",
        )
    )
    if not args.no_smoke and left() > 60:
        smoke(args, shape, Path(jobs.option_of(rendered.data_list, "--data-dir")), logs, summary)
        lap("smoke trainer")
    return finish(summary, args.out, logs)


def evaluation_entry(
    args: argparse.Namespace, rendered: jobs.Rendered, changes: list[jobs.Change], checkpoints: Path
) -> list[str]:
    """The entry program's arguments as evaluate.py --from bridge gives them for the last checkpoint."""
    words = jobs.evaluation_arguments(
        rendered.evaluate or [], changes, steps=args.steps, out=str(args.work / "evaluate"), layer_spec=None
    )
    overrides = words[words.index("--") + 1 :]
    recipe, data_list = jobs.option_of(words, "--recipe"), jobs.option_of(words, "--data-list")
    load = [f"checkpoint.load={checkpoints}", f"checkpoint.ckpt_step={args.steps}"]
    return ["--recipe", recipe, "--overrides-file", data_list, *overrides, *load]


def evaluate_checkpoints(
    args: argparse.Namespace,
    rendered: jobs.Rendered,
    changes: list[jobs.Change],
    c_log: str,
    logs: Path,
    summary: dict,
    env: dict,
    timeout: int,
) -> None:
    """The evaluate stage's program, as the plan renders it, on the training's last checkpoint: its loss is
    Bridge's own held-out loss of those weights, so it equals the training's final validation line (job C's, at
    the last step, from the validation set's first sample: no validation ran before it)."""
    sys.path.insert(0, str(STAGES))
    import _bridge_evaluate  # noqa: PLC0415  (stages/ is not on the proof's path before this)

    out = args.work / "evaluate"
    words = jobs.evaluation_arguments(
        rendered.evaluate or [], changes, steps=args.steps, out=str(out), layer_spec=args.layer_spec
    )
    code = run([sys.executable, str(STAGES / "evaluate.py"), *words], logs / "evaluate.log", env=env, timeout=timeout)
    result = out / f"step-{args.steps:08d}.json"
    summary["checks"].append(report.check("the evaluate stage exits 0", code == 0 and result.is_file(), f"exit {code}"))
    if code != 0 or not result.is_file():
        return
    scored = json.loads(result.read_text())["loss"]
    trained = _bridge_evaluate.validation_loss(c_log.splitlines(), args.steps)
    summary["checks"].append(
        report.check(
            "the evaluation's held-out loss is the training's final validation line",
            trained is not None and f"{scored:.6E}" == f"{trained:.6E}",
            f"evaluate {scored:.6E}, job C {trained if trained is None else f'{trained:.6E}'}",
        )
    )


def smoke(
    args: argparse.Namespace,
    shape: jobs.Shape,
    data_dir: Path,
    logs: Path,
    summary: dict,
    device: str = "cuda",
    steps: int = 100,
) -> None:
    """The same shape in the project's own smoke trainer on the same GPU (bf16-mixed), for comparison only."""
    code = run(
        [
            sys.executable,
            str(STAGES / "pretrain_local.py"),
            "--device",
            device,
            "--precision",
            "bf16-mixed" if device == "cuda" else "fp32",
            "--data-dir",
            str(data_dir),
            "--results",
            str(args.work / "smoke"),
            "--run-name",
            "smoke",
            "--steps",
            str(steps),
            "--layers",
            str(shape.layers),
            "--hidden",
            str(shape.hidden),
            "--heads",
            str(shape.heads),
            "--seq-length",
            str(shape.seq),
            "--global-batch-size",
            str(shape.global_batch),
            "--no-checkpoints",
        ],
        logs / "smoke.log",
        timeout=120,
    )
    figures = report.smoke_throughput((logs / "smoke.log").read_text(errors="replace"))
    summary["throughput"][f"smoke trainer (stages/pretrain_local.py), {device}"] = figures
    ran = code == 0 and (bool(figures["step_s"]) or steps <= report.WARM_UP_STEPS)
    summary["checks"].append(
        report.check("the smoke trainer runs the same shape", ran, f"exit code {code}", required=False)
    )


def finish(summary: dict, out: Path, logs: Path) -> int:
    failed = [c["name"] for c in summary["checks"] if c["required"] and not c["ok"]]
    summary["result"] = "failed: " + "; ".join(failed) if failed else "every required check holds"
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(report.markdown(summary) + f"\nResult: {summary['result']}\n")
    for name in ("job-A.log", "job-B.log", "job-C.log", "smoke.log"):
        if (logs / name).is_file():
            shutil.copy(logs / name, out / name)
    print((out / "summary.md").read_text(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
