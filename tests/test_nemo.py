"""NeMo pretraining: preflight (parallel sizes, time limits) and the rendered launcher job, run with a stand-in."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from bcp_pipeline.errors import ConfigError
from bcp_pipeline.jobs import JobRequest
from bcp_pipeline.nemo import time_limits, valid_node_counts, KNOWN_MODELS
from bcp_pipeline.preflight import load_and_check
from bcp_pipeline.backends.bcp_render import commandline
from bcp_pipeline.resources import BcpOptions
from golden_files import REPO

CONFIG = REPO / "pipelines.yaml"


def test_valid_node_counts_of_the_known_models():
    assert valid_node_counts(KNOWN_MODELS["gpt3/7b_improved"], 8) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert valid_node_counts(KNOWN_MODELS["gpt3/126m"], 8) == [1, 2, 4, 8]


def test_invalid_node_count_is_refused_with_the_valid_list():
    with pytest.raises(ConfigError) as info:
        load_and_check(CONFIG, overrides=["pretrain.bcp.replicas=3"], pipeline="slimpajama-8b")
    message = str(info.value)
    assert "gpt3/7b_improved on 3 node(s)" in message
    assert "stages.pretrain.nemo" in message
    assert "global batch 512 is not divisible by micro batch 1 x data-parallel size 6" in message
    assert "valid node counts with 8 GPUs per node: 1, 2, 4, 8, 16, 32, 64, 128, 256" in message
    with pytest.raises(ConfigError, match="valid node counts with 8 GPUs per node: 1, 2, 4, 8$"):
        load_and_check(CONFIG, overrides=["pretrain.bcp.replicas=16"], pipeline="slimpajama-126m")


def test_unknown_model_needs_its_parallel_sizes():
    with pytest.raises(ConfigError, match="give tensor_parallel, pipeline_parallel"):
        load_and_check(CONFIG, overrides=["pretrain.nemo.model=gpt3/40b"], pipeline="slimpajama-8b")
    config = load_and_check(CONFIG, pipeline="slimpajama-8b", overrides=[
        "pretrain.nemo.model=gpt3/40b", "pretrain.nemo.tensor_parallel=8", "pretrain.nemo.pipeline_parallel=4",
        "pretrain.nemo.global_batch_size=1024", "pretrain.nemo.micro_batch_size=1", "pretrain.nemo.max_steps=1000"])
    assert config.pipeline("slimpajama-8b").stages["pretrain"].continuation.target_steps == 1000


def test_max_time_is_runtime_minus_margin():
    stage = load_and_check(CONFIG).pipeline("slimpajama-8b").stages["pretrain"]
    limits = time_limits(stage, "5D")
    assert limits.max_time == "4:23:15:00"  # 5 days - 45 min
    assert limits.time_limit == "4-23:37:30"  # between max_time and the hard runtime kill
    stage.nemo.time_margin = "30m"
    assert time_limits(stage, "10h").max_time == "0:09:30:00"
    with pytest.raises(ConfigError, match="time_margin 6h leaves no training time in total_runtime 5h"):
        load_and_check(CONFIG, pipeline="slimpajama-8b",
                    overrides=["pretrain.nemo.time_margin=6h", "pretrain.bcp.total_runtime=5h"])


LAUNCHER = """
import json, sys
from pathlib import Path
Path(sys.argv[0]).with_name("argv.json").write_text(json.dumps(sys.argv[1:]))
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
run = Path(args["base_results_dir"]) / args["training.run.name"]
(run / "results/checkpoints").mkdir(parents=True, exist_ok=True)
(run / "results/checkpoints/megatron_gpt--step=10-last.ckpt").write_text("big")
(run / "results/hparams.yaml").write_text("cfg")
print("stand-in launcher ran")
sys.exit(int(Path(sys.argv[0]).with_name("exit_code").read_text()))
"""


def test_rendered_training_job_builds_the_data_list_from_manifests(tmp_path):
    """Run the job's real commandline with /mount_workspace mapped to a folder and a stand-in launcher."""
    from test_data_list import chunk_name, fabricate

    config = load_and_check(CONFIG, pipeline="slimpajama-8b",
                            overrides=[f"pretrain.nemo.launcher_dir={tmp_path}/launcher"])
    pipeline = config.pipeline("slimpajama-8b")
    stage = pipeline.stages["pretrain"]
    request = JobRequest(run_id="r", pipeline=pipeline, stage=stage, kind="stage", program=stage.program,
                         args=tuple(stage.args))
    text = commandline(request, BcpOptions(), REPO / "stages")
    workspace, results = tmp_path / "ws", tmp_path / "results"
    tokens = [300, 100, 600]
    for i, count in enumerate(tokens):
        fabricate(workspace / "data/slimpajama/preprocessed", chunk_name(i), count)
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher/main.py").write_text(LAUNCHER)
    code_dir = text.split("python3 ")[1].split("/data_list.py")[0]
    local = text.replace(code_dir, str(REPO / "stages")).replace("python3 ", f"{sys.executable} ")
    local = re.sub(r"(?<![\w/])/results", str(results), local.replace("/mount_workspace", str(workspace)))
    results.mkdir()
    (tmp_path / "launcher/exit_code").write_text("0")
    done = subprocess.run(["bash", "-c", local],
                          env={**os.environ, "NGC_ARRAY_SIZE": "8"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # The run folder's small files are copied to the job's results, the checkpoints are not.
    assert (results / "gpt_8b/results/hparams.yaml").read_text() == "cfg"
    assert not (results / "gpt_8b/results/checkpoints").exists()
    argv = json.loads((tmp_path / "launcher/argv.json").read_text())
    assert argv[:3] == ["cluster_type=bcp", "stages=[training]", "training=gpt3/7b_improved"]
    assert "training.trainer.num_nodes=8" in argv and "training.trainer.max_time=4:23:15:00" in argv
    data_prefix = argv[-1]
    assert data_prefix.startswith("training.model.data.data_prefix=[")
    items = data_prefix.split("=", 1)[1].strip("[]").split(",")
    weights, prefixes = [float(w) for w in items[0::2]], items[1::2]
    assert prefixes == [str(workspace / f"data/slimpajama/preprocessed/train_chunk_{i}.jsonl_text_document")
                        for i in range(3)]
    assert abs(sum(weights) - 1) < 1e-9
    assert weights == pytest.approx([t / sum(tokens) for t in tokens], abs=1e-6)
    assert "stand-in launcher ran" in (results / "gpt_8b-pretrain.log").read_text()
    # The job ends with the launcher's exit status (a failed training is a failed job).
    (tmp_path / "launcher/exit_code").write_text("3")
    failed = subprocess.run(["bash", "-c", local], env={**os.environ, "NGC_ARRAY_SIZE": "8"}, capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode == 3
    # Should BCP run the commandline on every replica, only replica 0 starts the launcher (and its data list).
    (tmp_path / "launcher/argv.json").unlink()
    other = subprocess.run(["bash", "-c", local], env={**os.environ, "NGC_ARRAY_SIZE": "8", "NGC_ARRAY_INDEX": "3"},
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0 and not (tmp_path / "launcher/argv.json").exists(), other.stderr
