"""The export stage on the smoke pretrain's model (stages/export_hf.py --from smoke): a real 16-step run's
checkpoint becomes a GPT-2 folder that transformers loads and generates from, with the same logits as the model it
came from, and that lm-evaluation-harness (the real one, on the CPU, offline) scores on the shipped tasks.

One training, one export and one scoring for the whole module (module fixtures): each costs seconds of CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _hf_folder
import export_hf
import pytest
import torch
from _pretrain_checkpoints import latest_checkpoint, load_checkpoint
from _smoke_gpt import SmokeGPT
from support.smoke_pretrain import command, data_dir, run_to_end, summary  # noqa: F401 (data_dir: a fixture)
from support.stage_fixtures import gpt2_vocab_merges

transformers = pytest.importorskip("transformers", reason="the export's tests need transformers (scripts/setup)")
RUN = "export-smoke"


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bpe")
    vocab, merges = gpt2_vocab_merges()
    shutil.copyfile(vocab, folder / "vocab.json")
    shutil.copyfile(merges, folder / "merges.txt")
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:  # noqa: F811
    results = tmp_path_factory.mktemp("results")
    run_to_end(command(data_dir, results, RUN))
    return results / RUN


@pytest.fixture(scope="module")
def exported(trained: Path, bpe_dir: Path) -> dict:
    out = trained / "export"
    argv = [
        "--from",
        "smoke",
        "--checkpoints",
        str(trained / "checkpoints"),
        "--bpe-dir",
        str(bpe_dir),
        "--out",
        str(out),
    ]
    assert export_hf.main(argv) == 0
    return {"argv": argv, "out": out, "record": json.loads((out / "export.json").read_text())}


def test_the_record_names_the_step_the_checkpoint_and_the_weights(exported: dict, trained: Path) -> None:
    record, model_dir = exported["record"], exported["out"] / "hf"
    assert record["step"] == summary(trained.parent, RUN)["steps"] == 16
    assert record["source"] == str(latest_checkpoint(trained / "checkpoints"))
    assert record["weights_sha256"] == _hf_folder.weights_digest(model_dir)
    # the smoke model's own digest of the same weights: the run's summary says which weights it ended with
    assert record["source_weights_sha256"] == summary(trained.parent, RUN)["weights_sha256"]
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json"} <= set(
        record["files"]
    )


def test_transformers_loads_it_as_gpt2_with_the_smoke_models_logits(exported: dict, trained: Path) -> None:
    model_dir = exported["out"] / "hf"
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    payload = load_checkpoint(latest_checkpoint(trained / "checkpoints"), torch.device("cpu"))
    cfg = payload["config"]
    smoke = SmokeGPT(cfg["vocab_size"], cfg["hidden"], cfg["layers"], cfg["heads"], cfg["seq_length"]).eval()
    smoke.load_state_dict(payload["model"])
    tokens = torch.randint(0, cfg["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, smoke(tokens), rtol=1e-4, atol=1e-4)


def test_it_generates_text_through_its_own_tokenizer(exported: dict) -> None:
    model_dir = exported["out"] / "hf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = tokenizer("The farmer walked to", return_tensors="pt")
    assert prompt["input_ids"].tolist() == [[464, 18739, 6807, 284]]  # GPT-2's own ids for the prompt
    with torch.no_grad():
        generated = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert generated.shape[1] == 12
    text = tokenizer.decode(generated[0])
    assert text.startswith("The farmer walked to") and len(text) > len("The farmer walked to")


def test_a_rerun_keeps_the_export_and_a_tampered_one_is_redone(exported: dict, capsys) -> None:
    out = exported["out"]
    before = (out / "export.json").read_bytes()
    assert export_hf.main(exported["argv"]) == 0
    assert "exported already" in capsys.readouterr().out
    assert (out / "export.json").read_bytes() == before
    weights = out / "hf" / "model.safetensors"
    saved = weights.read_bytes()
    weights.write_bytes(saved[:-4] + bytes(4))  # the digest no longer matches: the export is redone
    assert export_hf.main(exported["argv"]) == 0
    assert "exported already" not in capsys.readouterr().out
    assert weights.read_bytes() == saved and (out / "export.json").read_bytes() == before


def test_no_checkpoint_is_a_one_line_error(tmp_path: Path, bpe_dir: Path, capsys) -> None:
    argv = [
        "--from",
        "smoke",
        "--checkpoints",
        str(tmp_path / "none"),
        "--bpe-dir",
        str(bpe_dir),
        "--out",
        str(tmp_path / "export"),
    ]
    assert export_hf.main(argv) == 1
    assert "no smoke pretrain checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "export" / "export.json").exists()


@pytest.fixture(scope="module")
def scored(exported: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness (the eval extra: scripts/setup)")
    scores_dir = tmp_path_factory.mktemp("evaluate")
    argv = [*exported["argv"], "--tasks", "demo_cloze,demo_lastword", "--scores-dir", str(scores_dir)]
    assert export_hf.main(argv) == 0
    return {"dir": scores_dir, "result": json.loads((scores_dir / "step-00000016.json").read_text())}


def test_lm_eval_scores_the_export_in_the_evaluate_results_shape(scored: dict, exported: dict) -> None:
    result = scored["result"]
    assert {"step", "split", "loss", "perplexity", "tokens", "checkpoint", "tasks"} <= set(result)
    assert result["step"] == 16 and result["checkpoint"] == exported["record"]["source"]
    tasks = result["tasks"]
    assert set(tasks) == {"demo_cloze", "demo_lastword"}
    assert 0.0 <= tasks["demo_cloze"]["acc"] <= 1.0 and 0.0 <= tasks["demo_cloze"]["acc_norm"] <= 1.0
    # 20 items: every accuracy is a multiple of 1/20
    assert round(tasks["demo_cloze"]["acc"] * 20, 6).is_integer()
    # a 16-step model over 50,257 tokens is far from sure of the last word, and finite
    assert 1.0 < tasks["demo_lastword"]["perplexity"] < 1e7


def test_the_scores_are_those_of_the_model_a_direct_loglikelihood_gives(scored: dict, exported: dict) -> None:
    """demo_lastword's perplexity recomputed by hand from the exported model: exp(-mean log p(last word))."""
    model_dir = exported["out"] / "hf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    lines = [
        json.loads(line)
        for line in (Path(export_hf.__file__).parent / "lm_eval_tasks" / "demo_lastword.jsonl").read_text().splitlines()
    ]
    total = 0.0
    for line in lines:
        context, target = tokenizer(line["context"])["input_ids"], tokenizer(line["target"])["input_ids"]
        ids = torch.tensor([context + target])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
        total += sum(logprobs[len(context) - 1 + i, t].item() for i, t in enumerate(target))
    expected = float(torch.exp(torch.tensor(-total / len(lines))))
    assert scored["result"]["tasks"]["demo_lastword"]["perplexity"] == pytest.approx(expected, rel=1e-3)
