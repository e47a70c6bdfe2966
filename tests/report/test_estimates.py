"""Estimates in `plan` and estimate against actual in `status`: the arithmetic checked against hand-worked numbers."""

from __future__ import annotations

import json
import math

import pytest
from support.pipeline_fixtures import CHAIN_CONFIG, REPO, write_chain_project

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.instances import KNOWN_INSTANCES, instances_table
from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.nemo import KNOWN_SHAPES
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.state import StageState, StageStatus
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.report.estimates import actual_rates, estimate_pipeline
from bcp_pipeline.report.mfu import flops_per_token, params_for_flops

BUNDLED = REPO / "pipelines.yaml"


def test_7b_improved_flops_per_token_by_hand():
    # 32 layers x (4 x 4096^2 attention + 3 x 4096 x 10880 swiglu FFN) + output layer 50688 x 4096, where 50688 is
    # 50257 padded to a multiple of 128 x TP 4.
    n = 32 * (4 * 4096**2 + 3 * 4096 * 10880) + 50688 * 4096
    assert params_for_flops(KNOWN_SHAPES["gpt3/7b_improved"], 4) == n == 6_633_291_776
    assert flops_per_token(KNOWN_SHAPES["gpt3/7b_improved"], 4) == 6 * n + 12 * 32 * 2048 * 4096


def test_126m_parameters_by_hand():
    # 12 layers x 12 x 768^2 (4 h^2 attention + 8 h^2 FFN of 4h) + 50304 x 768 (50257 padded to 128 x TP 1)
    assert params_for_flops(KNOWN_SHAPES["gpt3/126m"], 1) == 12 * 12 * 768**2 + 50304 * 768


def test_slimpajama_8b_training_time_and_attempts():
    pipeline = load_and_check(BUNDLED).pipeline("slimpajama-8b")
    estimate = estimate_pipeline(pipeline, KNOWN_INSTANCES)
    pretrain = {s.stage: s for s in estimate.stages}["pretrain"]
    tokens = 300_000 * 512 * 2048
    per_token = 6 * 6_633_291_776 + 12 * 32 * 2048 * 4096
    seconds = tokens * per_token / (64 * 312e12 * 0.40)  # 8 nodes x 8 A100 at the declared MFU
    assert pretrain.training["tokens"] == tokens == 314_572_800_000
    assert pretrain.seconds == pytest.approx(seconds)
    assert 19 < seconds / 86400 < 20  # about 19.6 days
    assert pretrain.gpu_hours == pytest.approx(seconds / 3600 * 64)
    # 5D attempts less the 45 min margin NeMo stops at: 4 attempts, within max_attempts 10.
    per_attempt = 5 * 86400 - 45 * 60
    assert pretrain.training["attempts"] == math.ceil(seconds / per_attempt) == 4
    assert estimate.warnings == []


def test_too_few_attempts_is_a_warning_that_names_the_fix(capsys):
    capsys.readouterr()
    assert main(["--config", str(BUNDLED), "plan", "slimpajama-8b", "--set", "pretrain.nemo.max_attempts=3"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: pretrain: training needs 4 attempts of 5D but max_attempts is 3" in out
    assert "--set pretrain.nemo.max_attempts=4" in out
    assert "max_attempts 3 does NOT cover it" in out


def test_plan_text_and_json_carry_the_same_estimates(capsys):
    capsys.readouterr()
    assert main(["--config", str(BUNDLED), "plan", "slimpajama-8b", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)["estimates"]
    stages = {s["stage"]: s for s in payload["stages"]}
    assert list(stages) == [
        "bpe",
        "download",
        "extract",
        "concat",
        "tokenize-preprocess",
        "download-validation",
        "tokenize-validation",
        "download-test",
        "tokenize-test",
        "pretrain",
    ]
    assert stages["download"]["items_out"] == 59166 and stages["download"]["bytes_in"] == 895e9
    assert stages["concat"]["items_out"] == 74  # 59,166 files in groups of 800
    assert stages["tokenize-preprocess"]["bytes_out"] == 627e9 * 2
    assert stages["pretrain"]["training"]["attempts"] == 4
    total = payload["total"]
    assert total["gpu_hours"] == pytest.approx(sum(s["gpu_hours"] or 0 for s in stages.values()))
    # The total runs along the longest path: bpe runs beside the data stages and adds nothing, nor does the test
    # split's download and tokenization, beside the validation split's of the same size.
    beside = {"bpe", "download-test", "tokenize-test"}
    assert stages["download-test"]["seconds"] == stages["download-validation"]["seconds"] > 0
    assert total["seconds"] == pytest.approx(sum(stages[n]["seconds"] for n in stages if n not in beside))
    assert main(["--config", str(BUNDLED), "plan", "slimpajama-8b"]) == 0
    text = capsys.readouterr().out
    assert "\npretrain             dgxa100.80g.8.norm  8 " in text
    assert "4 attempt(s) of 5D" in text and "max_attempts 10 covers it" in text


def test_data_stage_time_is_cpu_or_storage_bound():
    pipeline = load_and_check(BUNDLED).pipeline("slimpajama-8b")
    stages = {s.stage: s for s in estimate_pipeline(pipeline, KNOWN_INSTANCES).stages}
    # tokenize-preprocess: 627e9 tokens / (2 nodes x 37 processes x 3 workers x 27.1e6 tokens/s per core with
    # gigatoken) is 104 s, under the 2.6 TB it reads through the declared 1000 MB/s of storage on 2 nodes
    assert 627e9 / (2 * 111 * 27.1e6) < 2.6e12 / 2e9
    assert stages["tokenize-preprocess"].seconds == pytest.approx(2.6e12 / 2e9)
    assert stages["tokenize-preprocess"].basis == "2 node(s) x 1000 MB/s storage (declared)"
    # concat on one node: 2.6 TB through the declared 1000 MB/s of storage beats 48 cores x 976 MB/s
    assert stages["concat"].seconds == pytest.approx(2.6e12 / 1e9)
    assert stages["download"].seconds == pytest.approx(895e9 / (2 * 200e6))


def test_declared_instances_extend_the_known_ones(tmp_path):
    text = CHAIN_CONFIG.replace(
        "backends:\n", "backends:\n  bcp: {instances: {big.1.norm: {gpus: 1, cpu_cores: 4, gpu_peak_tflops: 100}}}\n"
    )
    config = load_config(write_chain_project(tmp_path, text))
    table = instances_table(config.options["bcp"].instances)
    assert table["big.1.norm"].cpu_cores == 4 and "dgxh100.80g.8.norm" in table
    assert table["dgxh100.80g.8.norm"].gpu_peak_tflops == 989.0


@pytest.mark.parametrize(
    "estimates, key, message",
    [
        ("{mfu: 1.5}", "estimates.mfu", "fraction of peak"),
        ("{tokens: lots}", "estimates.tokens", "'lots' is not a number"),
        ("{tokens: 1e9, mfu_typo: 0.4}", "estimates.mfu_typo", "unknown key 'mfu_typo'; valid keys: compressed_bytes"),
        ("{per_core: {extract.py: 100}}", "estimates.per_core.extract.py", "no stage of this pipeline runs"),
    ],
)
def test_bad_declaration_names_file_line_and_key(tmp_path, estimates, key, message):
    text = CHAIN_CONFIG.replace('    vars: {count: "6"}\n', f'    vars: {{count: "6"}}\n    estimates: {estimates}\n')
    config = write_chain_project(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(config)
    line = text.splitlines().index(f"    estimates: {estimates}") + 1
    assert f"pipelines.yaml:{line}: pipelines.chain.{key}: " in str(info.value) and message in str(info.value)


def test_tokens_per_core_from_the_bin_bytes_of_a_finished_stage():
    pipeline = load_and_check(BUNDLED).pipeline("slimpajama-8b")
    state = StageState(
        status=StageStatus.SUCCEEDED,
        sharding={"replicas": 2, "processes": 37},
        started_at=0.0,
        finished_at=100.0,
        verification={"ok": True, "checks": [{"glob": "x", "expected": 74, "found": 74, "bytes": 2 * 222_000_000}]},
    )
    rates = actual_rates(pipeline.stages["tokenize-preprocess"], state, now=1e9)
    # 222 M tokens (uint16 ids) in 100 s over 2 x 37 x 3 cores
    assert rates["tokens_per_s_per_core"] == pytest.approx(222e6 / 100 / 222)
    assert rates["items_per_s"] == pytest.approx(0.74)


def test_status_shows_estimate_against_elapsed_for_a_finished_run(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert main(["--config", str(config), "run", "chain"]) == 0
    capsys.readouterr()
    assert main(["--config", str(config), "status"]) == 0
    out = capsys.readouterr().out
    section = out.split("estimate against actual")[1].splitlines()
    assert section[1].split() == ["STAGE", "ESTIMATE", "ELAPSED", "ITEMS/S", "MB/S", "PER", "CORE", "STEPS/S"]
    assert [row.split()[0] for row in section[2:5]] == ["first", "second", "third"]
    assert main(["--config", str(config), "status", "--json"]) == 0
    estimates = json.loads(capsys.readouterr().out)["estimates"]
    assert estimates["first"]["estimate_s"] is None  # items.py has no throughput model
    assert estimates["first"]["elapsed_s"] > 0
    assert estimates["first"]["items_per_s"] == pytest.approx(6 / estimates["first"]["elapsed_s"])


def test_plan_speaks_of_epochs_and_warns_above_one(capsys):
    """fineweb-edu-126m trains one epoch of the 9.3 B tokens of its sample that are not held out (max_steps 17,700);
    gpt3/126m's own 600,000 steps would be 600,000 x 256 x 2,048 / 9.3e9 = 33.8 epochs, which `plan` warns about
    with the steps of one epoch."""
    capsys.readouterr()
    assert main(["--config", str(BUNDLED), "plan", "fineweb-edu-126m"]) == 0
    out = capsys.readouterr().out
    assert "1.00 epoch(s) of the data's 9.3 G tokens (declared: estimates.tokens)" in out and "WARNING" not in out
    assert main(["--config", str(BUNDLED), "plan", "fineweb-edu-126m", "--set", "pretrain.nemo.max_steps=600000"]) == 0
    out = capsys.readouterr().out
    assert "33.83 epoch(s)" in out
    assert (
        "WARNING: pretrain: 600,000 steps train 315 G tokens, 33.8 epochs of the data's 9.3 G (declared: "
        "estimates.tokens)"
    ) in out
    assert f"One epoch is {int(9.3e9) // (256 * 2048):,} steps (--set pretrain.nemo.max_steps=17738)" in out


def test_epochs_come_from_the_manifests_once_the_data_exists(tmp_path, capsys):
    from support.manifests import chunk_name, fabricate

    config = tmp_path / "pipelines.yaml"
    config.write_text(BUNDLED.read_text().replace("stages_dir: stages", f"stages_dir: {REPO / 'stages'}"))
    data = tmp_path / ".bcp-pipeline/workspaces/nemo-framework/data/fineweb-edu/preprocessed"
    for i in range(4):  # 4 x 1.3 G tokens = 5.2 G: 17,700 steps (9.28 G tokens) are 1.78 epochs of it
        fabricate(data, chunk_name(i), 1_300_000_000, with_files=False)
    capsys.readouterr()
    assert main(["--config", str(config), "plan", "fineweb-edu-126m", "--backend", "local"]) == 0
    out = capsys.readouterr().out
    assert "1.78 epoch(s) of the data's 5.2 G tokens (counted in the preprocess manifests)" in out
    assert "One epoch is 9,918 steps" in out  # 5.2e9 // 524,288


def plan_estimates(capsys, *args: str) -> dict[str, dict]:
    capsys.readouterr()
    assert main(["--config", str(BUNDLED), "plan", *args, "--json"]) == 0
    return {s["stage"]: s for s in json.loads(capsys.readouterr().out)["estimates"]["stages"]}


def test_estimates_use_the_rank_layout_of_the_backend_planned(capsys):
    tokens, per_token = 300_000 * 512 * 2048, 6 * 6_633_291_776 + 12 * 32 * 2048 * 4096
    # The EKS example (docs/backends/kubernetes.md): 4 p4de pods of 8 GPUs train, not the 8 DGX of the BCP section
    # (Megatron-Bridge: the NeMo launcher does not run on Kubernetes).
    p4de = "{node.kubernetes.io/instance-type: p4de.24xlarge}"
    eks = plan_estimates(
        capsys,
        "slimpajama-8b-bridge",
        "--backend",
        "kubernetes",
        "--set",
        "pretrain.kubernetes.replicas=4",
        "--set",
        "pretrain.kubernetes.gpus=8",
        "--set",
        f"pretrain.kubernetes.node_selector={p4de}",
    )
    on_bcp = plan_estimates(capsys, "slimpajama-8b-bridge", "--backend", "bcp")["pretrain"]
    pretrain = eks["pretrain"]
    assert (pretrain["nodes"], pretrain["gpus_per_node"], pretrain["instance"]) == (4, 8, "p4de.24xlarge")
    assert (on_bcp["nodes"], on_bcp["gpus_per_node"]) == (8, 8)
    assert pretrain["seconds"] == pytest.approx(pretrain["training"]["flops"] / (32 * 312e12 * 0.40))
    assert pretrain["seconds"] == pytest.approx(on_bcp["seconds"] * 64 / 32)
    assert pretrain["gpu_hours"] == pytest.approx(pretrain["seconds"] / 3600 * 32)
    assert eks["download"]["gpus_per_node"] == 0  # a data pod asks for no GPU
    # Grid Engine, TSUBAME-like: 4 hosts x 1 rank (one GPU each) of a distributed job.
    sge = plan_estimates(
        capsys,
        "slimpajama-8b",
        "--backend",
        "gridengine",
        "--set",
        "pretrain.gridengine.nodes=4",
        "--set",
        "pretrain.gridengine.processes_per_node=1",
        "--set",
        "pretrain.gridengine.distributed=true",
        "--set",
        "pretrain.gridengine.container_image=/images/nemo.sif",
    )
    assert (sge["pretrain"]["nodes"], sge["pretrain"]["gpus_per_node"]) == (4, 1)
    assert sge["pretrain"]["seconds"] == pytest.approx(tokens * per_token / (4 * 312e12 * 0.40))
    # One host of 4 ranks (no `distributed`: a one-host training needs none): 4 GPUs, as the job starts 4 ranks;
    # a data stage's ranks there are no GPUs.
    one_host = plan_estimates(
        capsys,
        "slimpajama-8b",
        "--backend",
        "gridengine",
        "--set",
        "pretrain.gridengine.nodes=1",
        "--set",
        "pretrain.gridengine.processes_per_node=4",
        "--set",
        "pretrain.gridengine.container_image=/images/nemo.sif",
        "--set",
        "download.gridengine.distributed=true",
    )
    assert (one_host["pretrain"]["nodes"], one_host["pretrain"]["gpus_per_node"]) == (1, 4)
    assert one_host["download"]["gpus_per_node"] == 0
    # Local: each stage's replicas on this machine, with no GPU and so no training time.
    local = plan_estimates(capsys, "demo", "--backend", "local")
    demo = load_and_check(BUNDLED).pipeline("demo")
    assert {s["instance"] for s in local.values()} == {"this machine"}
    assert {name: s["nodes"] for name, s in local.items()} == {
        name: stage.local.replicas for name, stage in demo.stages.items()
    }
    assert plan_estimates(capsys, "slimpajama-8b", "--backend", "local")["pretrain"]["nodes"] == 1  # BCP: 8
    assert local["pretrain"]["gpu_hours"] in (0, None) and local["pretrain"]["seconds"] is None
    # The same pipeline planned for BCP keeps its DGX shape.
    bcp = plan_estimates(capsys, "slimpajama-8b", "--backend", "bcp")
    assert (bcp["pretrain"]["nodes"], bcp["pretrain"]["gpus_per_node"]) == (8, 8)
