"""A Megatron-Bridge training's data index built beforehand, against NVIDIA's REAL code (megatron-bridge 0.6.2,
megatron-core 0.19.2, in the environment scripts/bridge-venv builds): the index stage's job, as `plan` renders it,
builds megatron-core's indices of a small blend on one CPU process (no GPU, no torch.distributed); then the
training's own dataset build, from the training job's rendered data list command and override list, as Bridge's
`pretrain()` and `setup()` run it (runtime_config_update, the tokenizer into the dataset config, the dataset provider,
build_train_valid_test_datasets), for the training's world size, reads every index and builds none: megatron-core's
index-building functions and numpy.save raise inside it, and every cache file keeps its inode and mtime. A changed
seed or sequence length is another description, another hash: the same build then does try to build.

The data: English-like JSONL tokenized by the project's own preprocess stage with the GPT-2 files it ships.
Megatron-core's GPT2BPETokenizer builds Hugging Face's AutoTokenizer("gpt2", vocab_file=..., merges_file=...), which
reads the model's tokenizer config from the Hub: a Hugging Face cache of it, made here from the same two files, is
read offline (HF_HUB_OFFLINE=1), as a job's megatron_bridge.hf_home would be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.bridge_venv import REPO, bridge_python, run_bridge
from support.index_jobs import after, program_words, stage_job
from support.smoke_pretrain import make_dataset
from support.stage_fixtures import gpt2_vocab_merges

from bcp_pipeline.cli.main import main

CONFIG = """\
version: 1
stages_dir: stages
pipelines:
  small:
    backend: slurm
    workspace: {name: ws}
    defaults:
      slurm: {time: 1h}
    stages:
      pretrain-index:
        program: bridge_index.py
        data_index_of: pretrain
      pretrain:
        program: pretrain_local.py
        needs: [pretrain-index]
        megatron_bridge:
          model: gpt3/126m
          run_name: gpt
          data_dir: ${workspace}/data/out
          bpe_dir: ${workspace}/data/bpe
          results_dir: ${workspace}/results
          num_layers: 2
          hidden_size: 64
          ffn_hidden_size: 128
          num_attention_heads: 4
          seq_length: 64
          global_batch_size: 4
          micro_batch_size: 1
          train_iters: 10
          # a validation every 5 steps of 2 batches, and a split that leaves documents to each part of this blend
          overrides: [validation.eval_interval=5, validation.eval_iters=2, "dataset.split='90,5,5'"]
        slurm: {nodes: 1, gpus_per_node: 2}
"""
TRAINING_WORLD = 2  # the training's ranks (1 node x 2 GPUs); the index job resolves the config for 1
HUB_REVISION = "0" * 40

# The training's dataset build as Bridge runs it on rank 0, megatron-core's index builders made to raise.
PROBE = r"""
import json, os, sys
sys.path.insert(0, os.environ["STAGES"])
import numpy
import megatron.core.datasets.gpt_dataset as gpt_dataset
from megatron.core.datasets import helpers

def refuse(name):
    def built(*args, **kwargs):
        raise RuntimeError(f"index build attempted: {name}")
    return built

for module, name in ((gpt_dataset, "_build_document_index"), (gpt_dataset, "_build_shuffle_index"),
                     (helpers, "build_sample_idx"), (helpers, "build_blending_indices"),
                     (helpers, "build_exhaustive_blending_indices"), (numpy, "save")):
    if hasattr(module, name):
        setattr(module, name, refuse(name))

import bridge_pretrain
from megatron.bridge.data.loaders import build_train_valid_test_datasets
from megatron.bridge.data.utils import get_dataset_provider
from megatron.bridge.training.config import runtime_config_update
from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

args = bridge_pretrain.parse_args(sys.argv[1:])
config = bridge_pretrain.build_config(args.recipe, bridge_pretrain.overrides_of(args))
runtime_config_update(config)                      # pretrain(), first
tokenizer = build_tokenizer(config.tokenizer)      # setup(): the tokenizer, into the dataset config
config.dataset.tokenizer = tokenizer
if config.dataset.token_dtype_code is None:
    config.dataset.token_dtype_code = 4 if tokenizer.vocab_size > numpy.iinfo(numpy.uint16).max + 1 else 8
train, valid, test = build_train_valid_test_datasets(config, get_dataset_provider(config.dataset))
print("PROBE " + json.dumps({"lengths": [len(d) for d in (train, valid, test)],
                             "first_tokens": train[0]["tokens"][:4].tolist()}))
"""


def hub_cache(folder: Path, vocab: Path, merges: Path) -> Path:
    """A Hugging Face cache holding the `gpt2` tokenizer (its config, the shipped vocab and merges)."""
    snapshot = folder / "hub" / "models--gpt2" / "snapshots" / HUB_REVISION
    snapshot.mkdir(parents=True)
    (folder / "hub" / "models--gpt2" / "refs").mkdir()
    (folder / "hub" / "models--gpt2" / "refs" / "main").write_text(HUB_REVISION)
    shutil.copy(vocab, snapshot / "vocab.json")
    shutil.copy(merges, snapshot / "merges.txt")
    (snapshot / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024})
    )
    (snapshot / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 50257}))
    return folder


@pytest.fixture(scope="module")
def python() -> Path:
    return bridge_python()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, python) -> dict:
    """The project (its workspace holding the preprocessed blend and the GPT-2 files), and the commands `plan`
    renders for the index stage, its verification and the training."""
    root = tmp_path_factory.mktemp("project")
    (root / "pipelines.yaml").write_text(CONFIG)
    (root / "stages").symlink_to(REPO / "stages")
    workspace = root / ".bcp-pipeline" / "workspaces" / "ws"
    make_dataset(workspace / "data", chunks=(120, 60, 40))
    vocab, merges = gpt2_vocab_merges()
    (workspace / "data" / "bpe").mkdir(parents=True)
    shutil.copy(vocab, workspace / "data" / "bpe" / "vocab.json")
    shutil.copy(merges, workspace / "data" / "bpe" / "merges.txt")
    plan = run_plan(root)
    index, training = stage_job(plan, "pretrain-index"), stage_job(plan, "pretrain")
    return {
        "root": root,
        "workspace": workspace,
        "hub": hub_cache(root / "hf", vocab, merges),
        "index": program_words("slurm", index, "bridge_index.py"),
        "verify": program_words("slurm", stage_job(plan, "pretrain-index", "verify"), "verify.py"),
        "data_list": program_words("slurm", training, "data_list.py"),
        "training": after(program_words("slurm", training, "bridge_pretrain.py"), "bridge_pretrain.py"),
    }


def run_plan(root: Path) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--config", str(root / "pipelines.yaml"), "plan", "small", "--json"]) == 0
    return json.loads(out.getvalue())


def bridge_env(jobs: dict, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    return {
        **keep,
        "HF_HOME": str(jobs["hub"]),
        "HF_HUB_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore",
        "STAGES": str(REPO / "stages"),
        **extra,
    }


def run_in_bridge(python: Path, words: list[str], jobs: dict, **env: str) -> subprocess.CompletedProcess:
    """A rendered command with the Bridge environment's interpreter in place of the job's `python3`."""
    assert Path(words[0]).name.startswith("python"), words
    return run_bridge(python, words[1:], cwd=jobs["root"], env=bridge_env(jobs, **env))


def cache_state(cache: Path) -> dict[str, tuple[int, int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(cache.iterdir())}


def probe(python: Path, jobs: dict, *extra: str) -> subprocess.CompletedProcess:
    """The training job's first step (its data list), then its rank 0's dataset build, with `extra` overrides."""
    listed = run_in_bridge(python, jobs["data_list"], jobs)
    assert listed.returncode == 0, listed.stderr
    script = jobs["root"] / "probe.py"
    script.write_text(PROBE)
    return run_in_bridge(
        python, ["python3", str(script), *jobs["training"], *extra], jobs, WORLD_SIZE=str(TRAINING_WORLD), RANK="0"
    )


@pytest.fixture(scope="module")
def built(python, jobs) -> dict:
    """The index stage's job run as rendered, and what it left."""
    done = run_in_bridge(python, jobs["index"], jobs)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest_path = Path(jobs["index"][jobs["index"].index("--manifest") + 1])
    manifest = json.loads(manifest_path.read_text())
    cache = manifest_path.parent / manifest["cache"]
    return {"stdout": done.stdout, "manifest": manifest, "cache": cache, "state": cache_state(cache)}


def test_the_index_job_builds_every_index_of_the_blend_on_one_cpu_process(built, jobs):
    manifest = built["manifest"]
    # 3 prefixes x 3 splits of GPTDataset (4 files each), and a BlendedDataset a split (3 files each)
    kinds = sorted((d["kind"], d["split"]) for d in manifest["datasets"])
    assert kinds.count(("BlendedDataset", "train")) == 1 and len(kinds) == 12
    assert len(manifest["files"]) == 9 * 4 + 3 * 3 == len(built["state"])
    assert manifest["built"] == 45 and manifest["read"] == 0
    # Bridge's own sample counts: 10 steps x 4; (10 // 5 + 1) x 2 validations x 4; 2 test batches x 4
    assert manifest["samples"] == [40, 24, 8]
    assert "bridge_index: data index of recipe vanilla_gpt_pretrain_config" in built["stdout"]
    assert "built 45, read 0" in built["stdout"]
    assert Path(jobs["workspace"] / "results" / "gpt-small-RUN" / "data_cache") == built["cache"]


def test_the_training_s_dataset_build_reads_the_cache_and_builds_nothing(built, python, jobs):
    done = probe(python, jobs)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "index build attempted" not in done.stdout + done.stderr
    logged = done.stdout + done.stderr
    assert "Build and save" not in logged
    assert logged.count("Load the GPTDataset") >= 9 and "Load the BlendedDataset" in logged
    result = json.loads(logged.split("PROBE ", 1)[1].splitlines()[0])
    assert result["lengths"][0] >= 40 and result["lengths"][1] >= 24 and result["lengths"][2] >= 8
    assert cache_state(built["cache"]) == built["state"]  # every file as the index job left it


def test_the_verification_job_passes_on_the_built_index(built, python, jobs):
    done = run_in_bridge(python, jobs["verify"], jobs)
    assert done.returncode == 0, done.stderr
    assert '"ok": true' in done.stdout


@pytest.mark.parametrize(
    "changed",
    [["dataset.random_seed=4321"], ["model.seq_length=32", "dataset.seq_length=32"]],
    ids=["seed", "seq_length"],
)
def test_another_seed_or_sequence_length_is_not_a_cache_hit(built, python, jobs, changed):
    done = probe(python, jobs, *changed)
    assert done.returncode != 0
    assert "index build attempted" in done.stderr, done.stderr[-3000:]
    assert cache_state(built["cache"]) == built["state"]


def test_a_second_index_job_reads_what_the_first_built(built, python, jobs):
    done = run_in_bridge(python, jobs["index"], jobs)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "built 0, read 45" in done.stdout
    assert cache_state(built["cache"]) == built["state"]
