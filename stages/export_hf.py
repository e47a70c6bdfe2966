"""Export a training's latest checkpoint as a Hugging Face model folder that `AutoModelForCausalLM.from_pretrained`
loads: config.json, safetensors, and the GPT-2 tokenizer files the data was tokenized with.

    export_hf.py --from smoke  --checkpoints RESULTS/RUN/checkpoints --bpe-dir BPE --out RESULTS/RUN/export
    export_hf.py --from bridge --checkpoints RESULTS/RUN/checkpoints --bpe-dir BPE --out RESULTS/RUN/export \
                 --shape num_layers=32,hidden_size=4096,...

* `smoke`: the local smoke pretrain's `step=N[-last].pt` (stages/_smoke_gpt.py) as GPT-2 (GPT2LMHeadModel), its
  architecture: stages/_smoke_to_gpt2.py. Needs torch only.
* `bridge`: a Megatron-Bridge checkpoint (the tracker's step, as Bridge resumes) as Llama (LlamaForCausalLM) through
  Megatron-Bridge's own AutoBridge (stages/_bridge_export.py), in the training's image.

Output: `OUT/hf/` (the model folder, built aside and moved into place) and `OUT/export.json`, written last, naming
the checkpoint and its step, the architecture and the sha256 of the exported weights (stages/_hf_folder.py). A rerun
that finds an export of the same checkpoint, its weights unchanged, does nothing. With `--tasks`, the exported model
is then scored with lm-evaluation-harness on tasks shipped in stages/lm_eval_tasks/ (stages/_lm_eval_scores.py),
into `--scores-dir`/step-NNNNNNNN.json. Prints a `##bcp-pipeline summary` line: the step, the digest, the scores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _common
import _hf_folder

STAGE = "export"
SHAPE_KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "seq_length",
    "vocab_size",
    "rotary_base",
    "norm_epsilon",
)


def parse_shape(text: str) -> dict:
    """`key=value,...` of every SHAPE_KEYS key (what bcp_pipeline/config/export.py renders)."""
    pairs = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    missing = [key for key in SHAPE_KEYS if key not in pairs]
    if missing:
        raise argparse.ArgumentTypeError(f"--shape lacks {', '.join(missing)}")
    return {key: (float(pairs[key]) if key == "norm_epsilon" else int(pairs[key])) for key in SHAPE_KEYS}


def export_smoke(checkpoints: Path, bpe_dir: Path, out: Path) -> dict:
    import torch
    from _pretrain_checkpoints import latest_checkpoint, load_checkpoint
    from _smoke_gpt import SmokeGPT, weights_digest
    from _smoke_to_gpt2 import gpt2_config, gpt2_tensors

    path = latest_checkpoint(checkpoints)
    if path is None:
        raise _common.StageError(f"{checkpoints}: no smoke pretrain checkpoint (step=N.pt) to export")
    payload = load_checkpoint(path, torch.device("cpu"))
    step, cfg = int(payload["step"]), payload["config"]
    if (done := _hf_folder.finished(out, step, str(path))) is not None:
        print(f"{STAGE}: step {step} of {path} is exported already ({out / _hf_folder.MODEL_DIR})", flush=True)
        return done
    model = SmokeGPT(cfg["vocab_size"], cfg["hidden"], cfg["layers"], cfg["heads"], cfg["seq_length"])
    model.load_state_dict(payload["model"])  # refuses a checkpoint that is not this model, by name and shape
    staging = _hf_folder.staging_dir(out)
    _hf_folder.write_safetensors(staging / "model.safetensors", gpt2_tensors(payload["model"]))
    _common.atomic_write_json(staging / "config.json", gpt2_config(cfg))
    _hf_folder.write_gpt2_tokenizer(staging, bpe_dir, cfg["seq_length"])
    return _hf_folder.publish(
        out,
        staging,
        {
            "step": step,
            "source": str(path),
            "from": "smoke",
            "architecture": "GPT2LMHeadModel",
            "source_weights_sha256": weights_digest(model),
        },
    )


def export_bridge(checkpoints: Path, bpe_dir: Path, out: Path, shape: dict) -> dict:
    import _bridge_export

    step, iter_dir = _bridge_export.checkpoint_to_export(checkpoints)
    if (done := _hf_folder.finished(out, step, str(iter_dir))) is not None:
        print(f"{STAGE}: step {step} of {iter_dir} is exported already ({out / _hf_folder.MODEL_DIR})", flush=True)
        return done
    staging = _hf_folder.staging_dir(out)
    _bridge_export.export(iter_dir, shape, staging, bpe_dir)
    _hf_folder.write_gpt2_tokenizer(staging, bpe_dir, shape["seq_length"])
    return _hf_folder.publish(
        out, staging, {"step": step, "source": str(iter_dir), "from": "bridge", "architecture": "LlamaForCausalLM"}
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", choices=("smoke", "bridge"), required=True)
    parser.add_argument("--checkpoints", required=True, type=Path, help="the training's checkpoint folder")
    parser.add_argument("--bpe-dir", required=True, type=Path, help="vocab.json + merges.txt (GPT-2 BPE)")
    parser.add_argument("--out", required=True, type=Path, help="the export folder: OUT/hf and OUT/export.json")
    parser.add_argument("--shape", type=parse_shape, default=None, help="bridge: the Llama shape, key=value,...")
    parser.add_argument("--tasks", default="", help="comma-separated lm-evaluation-harness tasks of --tasks-dir")
    parser.add_argument("--tasks-dir", type=Path, default=Path(__file__).resolve().parent / "lm_eval_tasks")
    parser.add_argument("--scores-dir", type=Path, default=None, help="where the scores go (step-N.json)")
    parser.add_argument("--batch-size", type=_common.positive_int, default=8)
    args = parser.parse_args(argv)
    if args.source == "bridge" and args.shape is None:
        parser.error("--from bridge needs --shape")
    if args.tasks and args.scores_dir is None:
        parser.error("--tasks needs --scores-dir")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.source == "smoke":
            record = export_smoke(args.checkpoints, args.bpe_dir, args.out)
        else:
            record = export_bridge(args.checkpoints, args.bpe_dir, args.out, args.shape)
        print(
            f"{STAGE}: step {record['step']} of {record['source']} -> {record['model_dir']} "
            f"({record['architecture']}, weights sha256 {record['weights_sha256']})",
            flush=True,
        )
        summary = f"step {record['step']} exported as {record['architecture']} (sha256 {record['weights_sha256'][:12]})"
        if args.tasks:
            import _lm_eval_scores

            names = [name for name in args.tasks.split(",") if name]
            scores = _lm_eval_scores.score_and_record(
                Path(record["model_dir"]), names, args.tasks_dir, args.scores_dir, record, args.batch_size
            )
            print(
                f"{STAGE}: lm-evaluation-harness on step {record['step']}: {_lm_eval_scores.describe(scores)}",
                flush=True,
            )
            summary += f"; {_lm_eval_scores.describe(scores)}"
    except _common.StageError as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr, flush=True)
        return 1
    _common.emit("summary", {"text": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
