"""NeMo pretraining: preflight (parallel sizes, time limits) and the rendered launcher job, run with a stand-in."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from bcp_pipeline.errors import ConfigError
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.config.nemo import (KNOWN_MODELS, KNOWN_SHAPES, launcher_overrides, launcher_version, model_config,
                                      time_limits, valid_node_counts)
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.report.estimates import KNOWN_INSTANCES, estimate_stage
from bcp_pipeline.report.mfu import flops_per_token
from bcp_pipeline.backends.bcp_render import commandline
from bcp_pipeline.config.resources import BcpOptions
from golden_files import REPO

CONFIG = REPO / "pipelines.yaml"


def test_valid_node_counts_of_the_known_models():
    assert valid_node_counts(KNOWN_MODELS[(23, 11)]["gpt3/7b_improved"], 8) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert valid_node_counts(KNOWN_MODELS[(23, 11)]["gpt3/126m"], 8) == [1, 2, 4, 8]
    # TP 2 at 23.08: a data-parallel size twice as large, so 256 nodes no longer divide the global batch of 512.
    assert valid_node_counts(KNOWN_MODELS[(23, 8)]["gpt3/7b_improved"], 8) == [1, 2, 4, 8, 16, 32, 64, 128]


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


IMAGE_2308 = "nvcr.io/ea-bignlp/nemofw-training:23.08.03"
SIZES = ["pretrain.nemo.tensor_parallel=8", "pretrain.nemo.pipeline_parallel=2", "pretrain.nemo.global_batch_size=1024",
         "pretrain.nemo.micro_batch_size=2", "pretrain.nemo.max_steps=1000"]


def test_launcher_version_is_the_image_tags_release():
    assert launcher_version("nvcr.io/nvidia/nemo:23.11") == (23, 11)
    assert launcher_version(IMAGE_2308) == (23, 8)
    assert launcher_version("nvcr.io/nvidia/nemo:24.05.01.framework") == (24, 5)
    assert launcher_version("nvcr.io#nvidia/nemo:24.05") == (24, 5)  # enroot's form on Slurm
    assert launcher_version("registry:5000/nemo:23.11@sha256:00ff") == (23, 11)
    for image in ("nvcr.io/nvidia/nemo:latest", "registry:5000/nemo", "nemo:23.13", "nemo@sha256:00ff",
                  "/lustre/containers/nemo-24.01.framework.sqsh"):
        assert launcher_version(image) is None, image


def _pretrain(image: str, *more: str, pipeline: str = "slimpajama-8b"):
    config = load_and_check(CONFIG, pipeline=pipeline, overrides=[f"pretrain.bcp.image={image}", *more])
    return config.pipeline(pipeline), config.pipeline(pipeline).stages["pretrain"]


def test_7b_improved_tensor_parallel_follows_the_launcher_release():
    _, stage = _pretrain(IMAGE_2308)
    assert model_config(stage).tensor_parallel == 2
    _, stage = _pretrain("nvcr.io/nvaie/nemo-framework-training:23.11")
    assert model_config(stage).tensor_parallel == 4
    # Between two keyed releases the older one's facts hold; after the last, the last's.
    assert model_config(_pretrain("nvcr.io/nvidia/nemo:23.10")[1]).tensor_parallel == 2
    assert model_config(_pretrain("nvcr.io/nvidia/nemo:24.05.01.framework")[1]).tensor_parallel == 4


def test_the_preflight_checks_the_sizes_of_the_images_release():
    _pretrain("nvcr.io/nvidia/nemo:23.11", "pretrain.bcp.replicas=256")
    with pytest.raises(ConfigError) as info:
        _pretrain(IMAGE_2308, "pretrain.bcp.replicas=256")
    message = str(info.value)
    assert "stages.pretrain.nemo" in message and "TP 2" in message
    assert message.endswith("valid node counts with 8 GPUs per node: 1, 2, 4, 8, 16, 32, 64, 128")
    # On Slurm the training container's release counts: 23.08 there, 23.11 on BCP.
    with pytest.raises(ConfigError, match="TP 2 / PP 1"):
        _pretrain("nvcr.io/nvidia/nemo:23.11", "pretrain.slurm.nodes=256",
                  "pretrain.slurm.container_image=nvcr.io#ea-bignlp/nemofw-training:23.08.03")


def test_the_estimate_pads_the_vocabulary_for_the_images_tensor_parallel():
    per_token = {}
    for image in (IMAGE_2308, "nvcr.io/nvidia/nemo:23.11"):
        pipeline, stage = _pretrain(image)
        per_token[image] = estimate_stage(pipeline, stage, KNOWN_INSTANCES).training["flops_per_token"]
    shape = KNOWN_SHAPES["gpt3/7b_improved"]
    assert per_token[IMAGE_2308] == flops_per_token(shape, 2)  # 50257 padded to 50432, a multiple of 256
    assert per_token["nvcr.io/nvidia/nemo:23.11"] == flops_per_token(shape, 4)  # to 50688, of 512
    assert per_token[IMAGE_2308] < per_token["nvcr.io/nvidia/nemo:23.11"]


@pytest.mark.parametrize("image, why", [
    ("nvcr.io/nvidia/nemo:latest", "whose tag is no YY.MM release"),
    ("nvcr.io/nvidia/nemo:23.05", "NeMo launcher 23.05, older than every release with known facts"),
])
def test_an_image_of_unknown_release_is_refused_naming_it(image, why):
    with pytest.raises(ConfigError) as info:
        _pretrain(image)
    message = str(info.value)
    assert f"stage pretrain runs image {image!r} (bcp.image), {why}" in message
    assert "stages.pretrain.nemo" in message
    assert "known for launcher releases 23.08, 23.11" in message
    assert "Set bcp.image to a NeMo image tagged with its release" in message
    assert "or give tensor_parallel, pipeline_parallel, global_batch_size, micro_batch_size and max_steps" in message


def test_an_image_of_unknown_release_with_declared_sizes_is_accepted_and_they_reach_the_launcher():
    pipeline, stage = _pretrain("nvcr.io/nvidia/nemo:latest", *SIZES, "pretrain.bcp.replicas=4")
    assert model_config(stage) == model_config(stage, "slurm")
    assert (model_config(stage).tensor_parallel, model_config(stage).pipeline_parallel) == (8, 2)
    assert stage.continuation.target_steps == 1000
    overrides = launcher_overrides(stage, cluster_type="bcp", nodes="4", total_runtime="5D",
                                   values={"workspace": "/mount_workspace"})
    for size in ("training.model.tensor_model_parallel_size=8", "training.model.pipeline_model_parallel_size=2",
                 "training.model.global_batch_size=1024", "training.model.micro_batch_size=2",
                 "training.trainer.max_steps=1000"):
        assert size in overrides
    # Declared sizes are still checked: 4 nodes x 8 GPUs / (TP 8 x PP 2) = DP 2; 1024 % (2 x 2) == 0. Three are not.
    with pytest.raises(ConfigError, match="3 node"):
        _pretrain("nvcr.io/nvidia/nemo:latest", *SIZES, "pretrain.bcp.replicas=3")
    # Sizes some are missing from are not enough.
    with pytest.raises(ConfigError, match="whose tag is no YY.MM release"):
        _pretrain("nvcr.io/nvidia/nemo:latest", *SIZES[:4])
    # A model no release knows is named as such, whatever the image.
    with pytest.raises(ConfigError, match=r"model 'gpt3/40b' is not one of the known configs \(gpt3/126m, gpt3/7b"):
        _pretrain("nvcr.io/nvidia/nemo:latest", "pretrain.nemo.model=gpt3/40b")


def test_a_size_the_verbatim_overrides_set_is_not_rendered_twice():
    _, stage = _pretrain("nvcr.io/nvidia/nemo:23.11", "pretrain.nemo.tensor_parallel=2",
                         "pretrain.nemo.overrides=[training.model.tensor_model_parallel_size=2]")
    overrides = launcher_overrides(stage, cluster_type="bcp", nodes="8", total_runtime="5D",
                                   values={"workspace": "/mount_workspace"})
    assert overrides.count("training.model.tensor_model_parallel_size=2") == 1


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
