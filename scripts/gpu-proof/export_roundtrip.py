"""The export's round trip: a tiny Llama-shaped model, HF -> Megatron checkpoint ->
HF, the export through the export stage's own code (stages/_bridge_export.py: AutoBridge.from_auto_config and
export_ckpt). Prints one JSON line: the steps it passed, the weights compared, or where it stopped and why.

The import side builds the Megatron model on the CPU, which Bridge's own `import_ckpt` cannot do here: the Llama
provider sets `apply_rope_fusion` (Transformer Engine only) and the TE layer spec. So it takes the same public steps
`import_ckpt` takes (`to_megatron_provider`, `provide_distributed_model`, `save_megatron_model`) with the fusion off
and megatron-core's local layer spec (no Transformer Engine on either machine), in a gloo process group of one;
on a CPU with stand-ins for the three CUDA calls its checkpoint save makes (the CUDA RNG state, a device
synchronize, the current device). The export side is the stage's, unchanged.

    python export_roundtrip.py WORKDIR BPE_DIR [--cpu]    # BPE_DIR: GPT-2's vocab.json + merges.txt

On a GPU (the GPU proof's machine) it runs as written; `--cpu` (tests/bridge/test_bridge_export.py, in the
Megatron-Bridge test environment) adds the three CUDA stand-ins of the import half, named where they are set.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

SHAPE = {
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 160,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "seq_length": 128,
    "vocab_size": 512,
    "rotary_base": 500000,
    "norm_epsilon": 1e-5,
}


STAGES = Path(__file__).resolve().parents[2] / "stages"


def main(work: Path, bpe_dir: Path, cpu: bool) -> dict:
    sys.path.insert(0, str(STAGES))
    passed: list[str] = []
    step = "import"
    try:
        import _bridge_export
        import torch
        from megatron.bridge import AutoBridge
        from megatron.bridge.models.gpt_provider import local_layer_spec
        from megatron.bridge.training.model_load_save import temporary_distributed_context
        from safetensors.torch import load_file
        from transformers import LlamaConfig, LlamaForCausalLM

        passed.append(step)

        step = "hf model"
        config = _bridge_export.llama_config(SHAPE)
        config["torch_dtype"] = "float32"
        torch.manual_seed(0)
        source = work / "hf_source"
        LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(source)
        passed.append(step)

        step = "hf -> megatron"
        bridge = AutoBridge.from_hf_pretrained(str(source))
        provider = bridge.to_megatron_provider(load_weights=True)
        provider.apply_rope_fusion = False  # TE only (the stand-in has none)
        provider.gradient_accumulation_fusion = False
        provider.persist_layer_norm = False  # Apex only; torch's norm under the local spec
        provider.bias_activation_fusion = False
        provider.bias_dropout_fusion = False
        provider.masked_softmax_fusion = False
        provider.transformer_layer_spec = local_layer_spec
        provider.params_dtype = torch.float32
        provider.bf16 = False
        megatron = work / "megatron"
        # Bridge's save_checkpoint stores the CUDA RNG state (checkpointing.py get_rng_state, 0.6.2), and there is no
        # CUDA here: a stand-in for that one call returns the CPU generator's state (no weight depends on it). Only
        # the import half, the test's set-up, goes through it; the export half runs as the stage runs it.
        if cpu:
            torch.cuda.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()  # stand-in: no CUDA here
            # and megatron-core's checkpoint writer waits for the device before it copies tensors out
            # (dist_checkpointing/strategies/filesystem_async.py preload_tensors): nothing to wait for on the CPU
            torch.cuda.synchronize = lambda *args, **kwargs: None  # stand-in: no CUDA here
            # and its finalize all-reduces a failure flag on the current CUDA device (state_dict_saver.py): the
            # CPU's, over the gloo group
            torch.cuda.current_device = lambda: "cpu"  # stand-in: no CUDA here
        with temporary_distributed_context(backend="gloo"):
            provider.finalize()
            model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
            bridge.save_megatron_model(model, str(megatron))
        passed.append(step)

        step = "find the checkpoint"
        found = sorted(p.relative_to(megatron).as_posix() for p in megatron.rglob("*") if p.is_file())[:40]
        iters = sorted(p for p in megatron.iterdir() if p.is_dir() and p.name.startswith("iter_"))
        iter_dir = iters[-1] if iters else megatron
        passed.append(step)

        step = "megatron -> hf (the export stage's AutoBridge code)"
        staging = work / "export" / ".hf.partial"
        staging.mkdir(parents=True)
        _bridge_export.export(iter_dir, SHAPE, staging, bpe_dir)
        passed.append(step)

        step = "compare"
        before = {}
        for path in source.glob("*.safetensors"):
            before.update(load_file(path))
        after = {}
        for path in staging.glob("*.safetensors"):
            after.update(load_file(path))
        different = sorted(
            n for n in before if n not in after or not torch.equal(before[n], after[n].to(before[n].dtype))
        )
        exported_config = json.loads((staging / "config.json").read_text())
        passed.append(step)
        return {
            "ok": not different and set(before) == set(after),
            "passed": passed,
            "tensors": len(before),
            "names_only_before": sorted(set(before) - set(after)),
            "names_only_after": sorted(set(after) - set(before)),
            "different": different,
            "dtypes_after": sorted({str(t.dtype) for t in after.values()}),
            "exported_architectures": exported_config.get("architectures"),
            "exported_vocab_size": exported_config.get("vocab_size"),
            "megatron_files": found,
        }
    except BaseException as exc:  # where it stopped is the result
        return {
            "ok": False,
            "passed": passed,
            "stopped_at": step,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }


if __name__ == "__main__":
    result = main(Path(sys.argv[1]), Path(sys.argv[2]), "--cpu" in sys.argv[3:])
    print("ROUNDTRIP " + json.dumps(result))
