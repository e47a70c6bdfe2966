"""The export of a Megatron-Bridge checkpoint through Megatron-Bridge's own AutoBridge, on the CPU, in the Bridge test
environment (megatron-bridge 0.6.2, megatron-core 0.19.2, transformers): a tiny Llama-shaped model goes HF ->
Megatron checkpoint -> HF, the second half through the export stage's own code (stages/_bridge_export.py:
`AutoBridge.from_auto_config` + `export_ckpt`), and comes back with every weight equal, as LlamaForCausalLM.

One subprocess (scripts/gpu-proof/export_roundtrip.py --cpu: Bridge's import alone takes minutes of wall time on 2
busy cores). The import half needs three CUDA stand-ins on a CPU (named in the script); the GPU proof's machine runs
the same script without them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.bridge_venv import bridge_python
from support.stage_fixtures import gpt2_vocab_merges

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-proof" / "export_roundtrip.py"


@pytest.mark.timeout(1500)  # one process: Bridge's import, a model's import and export; 7-8 min on a loaded machine
def test_a_llama_goes_hf_to_megatron_to_hf_through_autobridge_with_equal_weights(tmp_path: Path) -> None:
    python = bridge_python()
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    vocab, merges = gpt2_vocab_merges()
    shutil.copyfile(vocab, bpe / "vocab.json")
    shutil.copyfile(merges, bpe / "merges.txt")
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(python), str(SCRIPT), str(tmp_path / "work"), str(bpe), "--cpu"],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROUNDTRIP ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("ROUNDTRIP "))
    assert result["ok"], json.dumps(result, indent=1)[-4000:]
    assert result["exported_architectures"] == ["LlamaForCausalLM"]
    assert result["tensors"] == 2 * 9 + 3 and not result["different"]  # 9 a layer, embedding, final norm, lm_head
