"""The export stage (`export_of:`, config/export.py) through `plan`: the demo's exports the smoke model it trained
(and scores it), the Llama-shaped Bridge pipeline's runs stages/export_hf.py through AutoBridge in the training's
image on every backend, on the training's own checkpoint folder, after it, verified by its record; a shape with no
Hugging Face architecture, a NeMo training and a stage declared wrong are refused at load, in one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.bridge_venv import entry_arguments, pretrain_job
from support.cli import cli
from support.index_jobs import after, program_words, stage_job

CONFIG = Path(__file__).resolve().parents[2] / "pipelines.yaml"
BACKENDS = ("bcp", "slurm", "gridengine", "kubernetes")
LLAMA = "slimpajama-8b-bridge-llama"
IMAGE = {
    "bcp": "--image nvcr.io/nvidia/nemo:26.08",
    "slurm": "--container-image='nvcr.io#nvidia/nemo:26.08'",
    "gridengine": "/images/nemo-26.08.sif",
    "kubernetes": "image: nvcr.io/nvidia/nemo:26.08",
}


def planned(capsys, backend: str, pipeline: str, *extra: str) -> dict:
    capsys.readouterr()
    assert cli(CONFIG, "plan", pipeline, "--backend", backend, "--json", *extra) == 0
    return json.loads(capsys.readouterr().out)


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_llama_export_runs_autobridge_in_the_training_s_image_on_its_checkpoints(capsys, backend):
    plan = planned(capsys, backend, LLAMA)
    job = stage_job(plan, "export")
    words = program_words(backend, job, "export_hf.py")
    args = after(words, "export_hf.py")
    training = entry_arguments(backend, pretrain_job(plan))
    saved = next(o.split("=", 1)[1] for o in training if o.startswith("checkpoint.save="))
    assert option(args, "--from") == "bridge" and option(args, "--checkpoints") == saved
    assert option(args, "--out") == saved.removesuffix("/checkpoints") + "/export"
    shape = dict(pair.split("=") for pair in option(args, "--shape").split(","))
    assert shape == {
        "num_layers": "32",
        "hidden_size": "4096",
        "ffn_hidden_size": "14336",
        "num_attention_heads": "32",
        "num_query_groups": "8",
        "seq_length": "2048",
        "vocab_size": "50688",
        "rotary_base": "500000",
        "norm_epsilon": "1e-05",
    }  # 50257 -> 128 x TP 4
    # the training renders the same shape: what the export assumes is what was trained
    for key in (
        "model.num_query_groups=8",
        "model.rotary_base=500000",
        "model.normalization=RMSNorm",
        "model.rotary_percent=1.0",
        "model.ffn_hidden_size=14336",
    ):
        assert key in training
    assert IMAGE[backend] in job["printable"] + "".join(job.get("files", {}).values())
    assert "bootstrap.sh" not in " ".join(words)
    order = [(j["stage"], j["kind"]) for j in plan["jobs"]]
    assert order.index(("pretrain", "stage")) < order.index(("export", "stage"))
    verify = after(program_words(backend, stage_job(plan, "export", "verify"), "verify.py"), "verify.py")
    # The same file: on Grid Engine the export runs in the training's image, which binds the workspace at its mount,
    # while the verification job reads the workspace's own folder on the host.
    results = option(args, "--out").split("/results/", 1)[1]
    assert verify[0] == "--check" and verify[1:] and verify[1].endswith(f"/results/{results}/export.json=1"), verify


def test_the_plan_prints_the_export_job_and_its_estimate(capsys):
    capsys.readouterr()
    assert cli(CONFIG, "plan", LLAMA, "--backend", "bcp") == 0
    text = capsys.readouterr().out
    assert "--name slimpajama-8b-bridge-llama.export " in text
    [row] = [line for line in text.splitlines() if line.startswith("export ")]
    assert "dgxa100.80g.1.norm" in row and "weights" in row


def test_the_launcher_shaped_plan_says_why_it_has_no_export_and_which_pipeline_exports(capsys):
    capsys.readouterr()
    assert cli(CONFIG, "plan", "slimpajama-8b-bridge", "--backend", "bcp") == 0
    text = capsys.readouterr().out
    assert "--name slimpajama-8b-bridge.export " not in text
    [note] = [line for line in text.splitlines() if line.startswith("# stage pretrain is not exported")]
    assert "gpt3/7b_improved has no Hugging Face architecture" in note and "LayerNorm1P" in note
    assert "train megatron_bridge.model llama3-8b-gpt2 to export (as slimpajama-8b-bridge-llama does)" in note
    plan = planned(capsys, "bcp", "slimpajama-8b-bridge")
    assert [n.startswith("stage pretrain is not exported") for n in plan["not_exported"]] == [True]
    assert "not_exported" not in planned(capsys, "bcp", LLAMA)  # it exports


def test_the_demo_exports_its_smoke_model_and_scores_it(capsys):
    plan = planned(capsys, "local", "demo")
    args = after(program_words("local", stage_job(plan, "export"), "export_hf.py"), "export_hf.py")
    training = after(program_words("local", stage_job(plan, "pretrain"), "pretrain_local.py"), "pretrain_local.py")
    run_dir = f"{option(training, '--results')}/{option(training, '--run-name')}"
    assert option(args, "--from") == "smoke" and option(args, "--checkpoints") == f"{run_dir}/checkpoints"
    assert option(args, "--out") == f"{run_dir}/export"
    assert option(args, "--scores-dir") == f"{run_dir}/evaluate/lm-eval"
    assert option(args, "--tasks") == "demo_cloze,demo_lastword"


def test_locally_the_bridge_pipeline_exports_the_smoke_stand_in(capsys):
    plan = planned(capsys, "local", LLAMA)
    args = after(program_words("local", stage_job(plan, "export"), "export_hf.py"), "export_hf.py")
    assert option(args, "--from") == "smoke" and "--shape" not in args
    assert option(args, "--checkpoints").endswith("/results/llama_8b-slimpajama-8b-bridge-llama-RUN/checkpoints")


def test_the_launcher_shape_is_refused_in_one_line_naming_the_shape_that_exports(capsys):
    capsys.readouterr()
    assert cli(CONFIG, "plan", LLAMA, "--set", "pretrain.megatron_bridge.model=gpt3/7b_improved") == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "stages.export.export_of" in line and "gpt3/7b_improved has no Hugging Face architecture" in line
    assert "LayerNorm1P" in line and "RoPE turns 0.5 of each head" in line
    assert "train megatron_bridge.model llama3-8b-gpt2 to export" in line


def small_project(tmp_path: Path, export: str) -> Path:
    config = tmp_path / "pipelines.yaml"
    config.write_text(f"""version: 1
stages_dir: {CONFIG.parent / "stages"}
pipelines:
  small:
    backend: local
    workspace: {{name: small}}
    stages:
      pretrain:
        program: pretrain_local.py
        args: [--data-dir, d, --results, r, --run-name, n]
      nemo-pretrain:
        program: pretrain_local.py
        args: [--data-dir, d, --results, r, --run-name, m]
        nemo: {{model: gpt3/126m, run_name: x, data_dir: d, bpe_dir: b, results_dir: r}}
        bcp: {{image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.8.norm,
               total_runtime: 1h, replicas: 1}}
      export:
        program: export_hf.py
{export}
""")
    return config


@pytest.mark.parametrize(
    "export, said",
    [
        ("        export_of: pretrain\n        needs: [pretrain]\n        args: [--bpe-dir, b]", None),
        ("        export_of: nowhere\n        needs: [pretrain]", "'nowhere' is no training stage of this pipeline"),
        ("        export_of: pretrain\n        args: [--bpe-dir, b]", "add pretrain to the needs of export"),
        ("        export_of: pretrain\n        needs: [pretrain]", "give --bpe-dir DIR"),
        ("        export_of: nemo-pretrain\n        needs: [nemo-pretrain]", "trains with the NeMo launcher"),
    ],
)
def test_an_export_declared_so_that_it_could_not_export_is_refused(tmp_path, capsys, export, said):
    config = small_project(tmp_path, export)
    capsys.readouterr()
    status = cli(config, "plan", "small")
    if said is None:
        assert status == 0
        return
    assert status == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert said in line and "pipelines.yaml:" in line
