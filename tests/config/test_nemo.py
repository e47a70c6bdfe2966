"""NeMo pretraining: preflight (parallel sizes, time limits, where the launcher is) and the rendered BCP job script,
run with the launcher STAND-IN (tests/fakes/nemo_launcher/, not NVIDIA's code: its facts' sources are in
tests/fakes/README.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.golden_files import REPO

from bcp_pipeline.backends.bcp.render import commandline, job_files
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.config.instances import KNOWN_INSTANCES
from bcp_pipeline.config.nemo import (
    KNOWN_MODELS,
    KNOWN_SHAPES,
    launcher_dir,
    launcher_overrides,
    launcher_version,
    model_config,
    time_limits,
    valid_node_counts,
)
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.report.estimates import estimate_stage
from bcp_pipeline.report.mfu import flops_per_token

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
    config = load_and_check(
        CONFIG,
        pipeline="slimpajama-8b",
        overrides=[
            "pretrain.nemo.model=gpt3/40b",
            "pretrain.nemo.tensor_parallel=8",
            "pretrain.nemo.pipeline_parallel=4",
            "pretrain.nemo.global_batch_size=1024",
            "pretrain.nemo.micro_batch_size=1",
            "pretrain.nemo.max_steps=1000",
        ],
    )
    assert config.pipeline("slimpajama-8b").stages["pretrain"].continuation.target_steps == 1000


IMAGE_2308 = "nvcr.io/ea-bignlp/nemofw-training:23.08.03"
SIZES = [
    "pretrain.nemo.tensor_parallel=8",
    "pretrain.nemo.pipeline_parallel=2",
    "pretrain.nemo.global_batch_size=1024",
    "pretrain.nemo.micro_batch_size=2",
    "pretrain.nemo.max_steps=1000",
    "pretrain.nemo.launcher_dir=/opt/NeMo-Framework-Launcher/launcher_scripts",
]  # no release: no known path


def test_launcher_version_is_the_image_tags_release():
    assert launcher_version("nvcr.io/nvidia/nemo:23.11") == (23, 11)
    assert launcher_version(IMAGE_2308) == (23, 8)
    assert launcher_version("nvcr.io/nvidia/nemo:24.05.01.framework") == (24, 5)
    assert launcher_version("nvcr.io#nvidia/nemo:24.05") == (24, 5)  # enroot's form on Slurm
    assert launcher_version("registry:5000/nemo:23.11@sha256:00ff") == (23, 11)
    for image in (
        "nvcr.io/nvidia/nemo:latest",
        "registry:5000/nemo",
        "nemo:23.13",
        "nemo@sha256:00ff",
        "/lustre/containers/nemo-24.01.framework.sqsh",
    ):
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
        _pretrain(
            "nvcr.io/nvidia/nemo:23.11",
            "pretrain.slurm.nodes=256",
            "pretrain.slurm.container_image=nvcr.io#ea-bignlp/nemofw-training:23.08.03",
        )


def test_the_estimate_pads_the_vocabulary_for_the_images_tensor_parallel():
    per_token = {}
    for image in (IMAGE_2308, "nvcr.io/nvidia/nemo:23.11"):
        pipeline, stage = _pretrain(image)
        per_token[image] = estimate_stage(pipeline, stage, KNOWN_INSTANCES).training["flops_per_token"]
    shape = KNOWN_SHAPES["gpt3/7b_improved"]
    assert per_token[IMAGE_2308] == flops_per_token(shape, 2)  # 50257 padded to 50432, a multiple of 256
    assert per_token["nvcr.io/nvidia/nemo:23.11"] == flops_per_token(shape, 4)  # to 50688, of 512
    assert per_token[IMAGE_2308] < per_token["nvcr.io/nvidia/nemo:23.11"]


@pytest.mark.parametrize(
    "image, why",
    [
        ("nvcr.io/nvidia/nemo:latest", "whose tag is no YY.MM release"),
        ("nvcr.io/nvidia/nemo:23.05", "NeMo launcher 23.05, older than every release with known facts"),
    ],
)
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
    overrides = launcher_overrides(
        stage,
        cluster_type="bcp",
        backend="bcp",
        nodes="4",
        runtime="5D",
        values={"workspace": "/mount_workspace", "run_id": "r"},
    )
    for size in (
        "training.model.tensor_model_parallel_size=8",
        "training.model.pipeline_model_parallel_size=2",
        "training.model.global_batch_size=1024",
        "training.model.micro_batch_size=2",
        "training.trainer.max_steps=1000",
    ):
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
    _, stage = _pretrain(
        "nvcr.io/nvidia/nemo:23.11",
        "pretrain.nemo.tensor_parallel=2",
        "pretrain.nemo.overrides=[training.model.tensor_model_parallel_size=2]",
    )
    overrides = launcher_overrides(
        stage,
        cluster_type="bcp",
        backend="bcp",
        nodes="8",
        runtime="5D",
        values={"workspace": "/mount_workspace", "run_id": "r"},
    )
    assert overrides.count("training.model.tensor_model_parallel_size=2") == 1


def test_each_job_trains_its_runtime_minus_the_margin():
    stage = load_and_check(CONFIG).pipeline("slimpajama-8b").stages["pretrain"]
    limits = time_limits(stage, "5D")
    assert limits.per_run == "4:23:15:00"  # 5 days - 45 min, in every job of the run
    assert limits.hard_limit == "5-00:00:00"  # Slurm's --time for the launcher's job
    stage.nemo.time_margin = "30m"
    assert time_limits(stage, "10h").per_run == "0:09:30:00"
    with pytest.raises(ConfigError, match="time_margin 6h leaves no training time in the runtime 5h"):
        load_and_check(
            CONFIG,
            pipeline="slimpajama-8b",
            overrides=["pretrain.nemo.time_margin=6h", "pretrain.bcp.total_runtime=5h"],
        )


def test_bcp_renders_the_per_run_limit_and_no_inert_setting():
    stage = load_and_check(CONFIG).pipeline("slimpajama-8b").stages["pretrain"]
    bcp = launcher_overrides(stage, cluster_type="bcp", backend="bcp", nodes="8", runtime="5D", values={"run_id": "r"})
    assert "+training.exp_manager.max_time_per_run=4:23:15:00" in bcp
    # BCP's launcher never reads run.time_limit; trainer.max_time would be a budget over every job of the run.
    assert not [o for o in bcp if o.startswith(("training.run.time_limit", "training.trainer.max_time"))]
    slurm = launcher_overrides(
        stage, cluster_type="bcm", backend="slurm", nodes="8", runtime="2D", values={"run_id": "r"}
    )
    assert "training.run.time_limit=2-00:00:00" in slurm
    assert "+training.exp_manager.max_time_per_run=1:23:15:00" in slurm


def test_the_launcher_path_follows_the_images_release():
    def path(image: str, *sets: str) -> str:
        return launcher_dir(_pretrain(image, *sets)[1], "bcp")

    assert path("nvcr.io/nvaie/nemo-framework-training:23.11") == "/opt/NeMo-Megatron-Launcher/launcher_scripts"
    assert path("nvcr.io/nvidia/nemo:24.05.01.framework") == "/opt/NeMo-Megatron-Launcher/launcher_scripts"
    assert path("nvcr.io/nvidia/nemo:24.07") == "/opt/NeMo-Framework-Launcher/launcher_scripts"
    assert path("nvcr.io/nvidia/nemo:24.12") == "/opt/NeMo-Framework-Launcher/launcher_scripts"
    assert path("nvcr.io/nvidia/nemo:latest", *SIZES, "pretrain.nemo.launcher_dir=/opt/mine/") == "/opt/mine"
    # An image of no release, sizes declared, but no launcher_dir: said at load time, naming the setting.
    with pytest.raises(ConfigError, match="set nemo.launcher_dir to the image's launcher_scripts folder"):
        _pretrain("nvcr.io/nvidia/nemo:latest", *SIZES[:4], "pretrain.nemo.max_steps=1000")


def rendered_script(pipeline, run_id: str = "r") -> str:
    stage = pipeline.stages["pretrain"]
    request = JobRequest(
        run_id=run_id, pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
    )
    [text] = job_files(request, BcpOptions(), REPO / "stages").values()
    return text


def test_a_24_07_image_renders_the_new_launcher_path():
    config = load_and_check(
        CONFIG, pipeline="slimpajama-8b", overrides=["pretrain.bcp.image=nvcr.io/nvidia/nemo:24.07"]
    )
    script = rendered_script(config.pipeline("slimpajama-8b"))
    assert "python3 /opt/NeMo-Framework-Launcher/launcher_scripts/main.py" in script
    assert "launcher_scripts_path=/opt/NeMo-Framework-Launcher/launcher_scripts" in script
    assert "NeMo-Megatron-Launcher" not in script


def test_the_commandline_is_one_short_line_with_no_quotes():
    config = load_and_check(CONFIG, pipeline="slimpajama-8b")
    pipeline = config.pipeline("slimpajama-8b")
    stage = pipeline.stages["pretrain"]
    request = JobRequest(
        run_id="slimpajama-8b-20261125-220000-ab12",
        pipeline=pipeline,
        stage=stage,
        kind="stage",
        program=stage.program,
        args=tuple(stage.args),
    )
    text = commandline(request, BcpOptions(), REPO / "stages")
    assert len(text) < 200 and "'" not in text and '"' not in text, text
    assert re.fullmatch(
        r"bash /mount_workspace/\.bcp-pipeline/jobs/slimpajama-8b-20261125-220000-ab12/"
        r"pretrain-[0-9a-f]{12}\.sh /mount_workspace /results",
        text,
    )


def test_the_job_script_runs_the_launcher_in_debug_mode_then_its_training_under_pipefail(tmp_path):
    """The rendered script run by bash, its two mount points mapped to folders, with the launcher and trainer
    stand-ins and the bcprun stand-in on PATH: the data list from the manifests reaches the launcher's composed
    config, the training's output reaches the job's output and the result folder, a crash fails the job, and another
    replica starts nothing."""
    from support.manifests import chunk_name, fabricate

    launcher = REPO / "tests/fakes/nemo_launcher/launcher_scripts"
    config = load_and_check(
        CONFIG,
        pipeline="slimpajama-126m",
        overrides=[
            f"pretrain.nemo.launcher_dir={launcher}",
            "pretrain.bcp.instance=dgxa100.80g.1.norm",
            "pretrain.nemo.max_steps=12",
            "pretrain.nemo.overrides=[+training.standin.step_seconds=0]",
        ],
    )
    pipeline = config.pipeline("slimpajama-126m")
    workspace, results = tmp_path / "ws", tmp_path / "results"
    tokens = [300, 100, 600]
    for i, count in enumerate(tokens):
        fabricate(workspace / "data/slimpajama/preprocessed", chunk_name(i), count)
    held_out = workspace / "data/slimpajama/validation/preprocessed"
    fabricate(held_out, "validation_chunk_0.jsonl_text_document", 50)
    test_split = workspace / "data/slimpajama/test/preprocessed"
    fabricate(test_split, "test_chunk_0.jsonl_text_document", 40)
    script_text = rendered_script(pipeline)
    code_dir = re.search(r"\$workspace/(\.bcp-pipeline/code/[0-9a-f]+)/data_list\.py", script_text).group(1)
    (workspace / code_dir).parent.mkdir(parents=True)
    (workspace / code_dir).symlink_to(REPO / "stages")
    script = tmp_path / "job.sh"
    script.write_text(script_text)
    results.mkdir()
    env = {
        **os.environ,
        "NGC_ARRAY_SIZE": "4",
        "NGC_ARRAY_INDEX": "0",
        "NGC_GPUS_PER_NODE": "1",
        "PATH": os.pathsep.join([str(REPO / "tests/fakes"), str(Path(sys.executable).parent), os.environ["PATH"]]),
    }

    def job(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(script), str(workspace), str(results)],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = job(BCPP_EMU_COMMANDLINE="launcher")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = workspace / "results/gpt_126m-r"
    composed = (run / "gpt_126m-r_hydra.yaml").read_text()
    prefixes = re.findall(r"- (\S+train_chunk_\d\.jsonl_text_document)", composed)
    assert prefixes == [
        str(workspace / f"data/slimpajama/preprocessed/train_chunk_{i}.jsonl_text_document") for i in range(3)
    ]
    # Per split (nemo.valid_data_dir, test_data_dir): it trains on the train list, validates on the held-out
    # split and tests on the test split.
    data = yaml.safe_load(composed)["model"]["data"]
    assert set(data["data_prefix"]) == {"train", "validation", "test"} and data["splits_string"] is None
    assert data["data_prefix"]["validation"] == [1.0, str(held_out / "validation_chunk_0.jsonl_text_document")]
    assert data["data_prefix"]["test"] == [1.0, str(test_split / "test_chunk_0.jsonl_text_document")]
    assert "max_time_per_run: 0:23:15:00" in composed and "num_nodes: 4" in composed and "devices: 1" in composed
    # The training's progress bar in the job's own output (the job log) and in the result folder's log.
    assert "reduced_train_loss=" in done.stdout and "global_step=11.000" in done.stdout
    assert "reduced_train_loss=" in (results / "gpt_126m-r.log").read_text()
    # The run's configs are copied beside the results, its checkpoints are not.
    assert (results / "gpt_126m-r/gpt_126m-r_hydra.yaml").is_file()
    assert not (results / "gpt_126m-r/results/checkpoints").exists()
    assert list((run / "results/checkpoints").glob("*-step=12-*-last.ckpt"))

    # A training that crashes fails the job, with its own error lines in the job's output.
    shutil.rmtree(run)  # (a new training, not a resumed one at its max_steps)
    script.write_text(
        script_text.replace(
            "+training.standin.step_seconds=0", "+training.standin.step_seconds=0\n  +training.standin.crash_at_step=3"
        )
    )
    crashed = job(BCPP_EMU_COMMANDLINE="launcher")
    assert crashed.returncode == 1 and "RuntimeError: CUDA error" in crashed.stdout, crashed.stdout[-2000:]

    # Another replica starts nothing: the launcher's bcprun on replica 0 starts every node's ranks.
    other = job(NGC_ARRAY_INDEX="3")
    assert other.returncode == 0 and "the launcher runs on replica 0" in other.stdout
    assert "submission file created" not in other.stdout


def test_no_two_bundled_pipelines_share_a_nemo_run_and_a_config_that_would_is_refused(tmp_path):
    from bcp_pipeline.config.nemo import nemo_run_name

    config = load_and_check(CONFIG)
    trainings = {}
    for pipeline in config.pipelines.values():
        for stage in pipeline.stages.values():
            if stage.nemo:  # what each renders for the plan's run id of its own pipeline
                run = nemo_run_name(stage, f"{pipeline.name}-RUN")
                trainings[pipeline.name] = (pipeline.workspace.name, stage.nemo.results_dir, run)
    assert {"slimpajama-8b", "slimpajama-8b-fast", "slimpajama-126m", "fineweb-edu-126m"} <= set(trainings)
    assert len(set(trainings.values())) == len(trainings), trainings
    # Taking over a run is explicit, and two pipelines taking over the same one are refused at load time.
    one = load_and_check(CONFIG, pipeline="slimpajama-8b", overrides=["pretrain.nemo.continue_run=gpt_8b"])
    assert nemo_run_name(one.pipeline("slimpajama-8b").stages["pretrain"], "any") == "gpt_8b"
    nemo_8b = "  nemo:\n    model: gpt3/7b_improved\n    run_name: gpt_8b\n"  # not the megatron_bridge: section's
    assert CONFIG.read_text().count(nemo_8b) == 1
    text = CONFIG.read_text().replace(nemo_8b, nemo_8b + "    continue_run: gpt_8b\n")
    shared = tmp_path / "pipelines.yaml"
    shared.write_text(text.replace("stages_dir: stages", f"stages_dir: {REPO / 'stages'}"))
    with pytest.raises(
        ConfigError,
        match="pipeline slimpajama-8b-fast continues NeMo run 'gpt_8b' in "
        r"\$\{workspace\}/results of workspace nemo-framework, and so does "
        "pipeline slimpajama-8b",
    ):
        load_and_check(shared)
