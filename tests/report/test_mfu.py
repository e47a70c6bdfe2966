"""MFU arithmetic against hand computations: 7b_improved on 8 x dgxa100.80g.8.norm, and `plan`'s assumption line."""

from __future__ import annotations

import json

import pytest
from support.pipeline_fixtures import REPO

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.instances import KNOWN_INSTANCES
from bcp_pipeline.config.nemo import KNOWN_SHAPES
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.report.gather import stage_facts
from bcp_pipeline.report.measured import Measurement, save_measurement
from bcp_pipeline.report.mfu import (
    cpu_peak,
    flops_per_token,
    gpu_peak,
    model_flops_utilization,
    step_seconds_at,
    tokens_per_second,
)


def test_7b_improved_on_eight_dgx_a100_nodes_by_hand():
    # N = 32 x (4 x 4096^2 + 3 x 4096 x 10880) + 50688 x 4096 = 6,633,291,776 (TP 4 pads 50257 to 50688).
    # FLOPs/token = 6 N + 12 L s h = 39,799,750,656 + 12 x 32 x 2048 x 4096 (3,221,225,472) = 43,020,976,128.
    per_token = flops_per_token(KNOWN_SHAPES["gpt3/7b_improved"], 4)
    assert per_token == 43_020_976_128
    # 8 nodes x 8 A100 = 64 GPUs x 312e12 = 1.9968e16 FLOP/s.
    peak = gpu_peak("dgxa100.80g.8.norm", 64)
    assert peak.flops_per_s == 19_968_000_000_000_000
    assert "A100" in peak.source
    # GBS 512 x seq 2048 = 1,048,576 tokens a step; at 11.2 s/step 93,622.857 tokens/s.
    tokens_per_s = tokens_per_second(11.2, 512 * 2048)
    assert tokens_per_s == pytest.approx(93_622.857, abs=1e-3)
    # 93,622.857 x 43,020,976,128 = 4.02774e15 FLOP/s; / 1.9968e16 = 0.20171.
    assert model_flops_utilization(tokens_per_s, per_token, peak) == pytest.approx(0.201710, abs=1e-6)
    # The inverse: MFU 0.40 on these GPUs means 1,048,576 x 43,020,976,128 / (0.4 x 1.9968e16) = 4.51104e16 / 7.9872e15
    # = 5.64788 s a step.
    assert step_seconds_at(0.40, 512 * 2048, per_token, peak) == pytest.approx(5.64788, abs=1e-5)


def test_an_unknown_gpu_has_only_a_declared_peak_and_a_cpu_none_unless_declared():
    assert gpu_peak("mycloud.gpu.8", 8) is None
    declared = gpu_peak("mycloud.gpu.8", 8, declared_tflops=500.0)
    assert declared.flops_per_s == 8 * 500e12 and "declared" in declared.source
    assert gpu_peak("dgxh100.80g.8.norm", 16).flops_per_s == 16 * 989e12
    assert cpu_peak(None, 2) is None
    assert cpu_peak(0.5, 2).flops_per_s == 1e12


def test_plan_names_its_mfu_assumption_and_the_step_time_it_means(capsys):
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", "slimpajama-8b", "--backend", "bcp"]) == 0
    out = capsys.readouterr().out
    assert (
        "pretrain: MFU 40% assumed (estimates.mfu, declared, not measured) = 5.65 s/step on 64 x A100 BF16 dense "
        "(312 TFLOP/s each, datasheet)"
    ) in out


def test_plan_uses_a_profile_runs_measured_step_time_on_the_same_instance_and_nodes(tmp_path, capsys):
    measured = Measurement(
        run_id="slimpajama-8b-20261125-120000-abcd",
        stage="pretrain",
        backend="bcp",
        instance="dgxa100.80g.8.norm",
        nodes=8,
        step_s=11.2,
        mfu=0.2017,
    )
    save_measurement(tmp_path, "slimpajama-8b", measured)
    argv = [
        "--config",
        str(REPO / "pipelines.yaml"),
        "--state-dir",
        str(tmp_path),
        "plan",
        "slimpajama-8b",
        "--backend",
        "bcp",
        "--json",
    ]
    assert main(argv) == 0
    pretrain = {s["stage"]: s for s in json.loads(capsys.readouterr().out)["estimates"]["stages"]}["pretrain"]
    assert pretrain["seconds"] == pytest.approx(300_000 * 11.2)  # 38.9 days instead of 19.6 at the declared 0.40
    assert pretrain["basis"] == "from profile run slimpajama-8b-20261125-120000-abcd: 11.2 s/step, MFU 20%"
    assert pretrain["training"]["attempts"] == 8  # ceil(3,360,000 s / (5 days - 45 min))
    assert main(argv[:-1]) == 0
    assert (
        "pretrain: time from profile run slimpajama-8b-20261125-120000-abcd: 11.2 s/step, MFU 20% (measured; "
        "the declared MFU 40% is not used)"
    ) in capsys.readouterr().out

    save_measurement(tmp_path, "slimpajama-8b", Measurement(**{**measured.__dict__, "nodes": 2}))
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "MFU 40% assumed" in out and "ran on bcp (2 x dgxa100.80g.8.norm), not 8 x dgxa100.80g.8.norm" in out


def test_the_report_holds_a_nemo_stage_against_its_instances_gpus():
    stage = (
        load_and_check(REPO / "pipelines.yaml", pipeline="slimpajama-8b").pipeline("slimpajama-8b").stages["pretrain"]
    )
    given = stage_facts(stage, "bcp", KNOWN_INSTANCES)
    assert (given.facts.flops_per_token, given.facts.tokens_per_step, given.facts.devices) == (
        43_020_976_128,
        1_048_576,
        64,
    )
    assert given.peak.flops_per_s == 64 * 312e12
    assert given.mfu_basis == "MFU against 64 x A100 BF16 dense (312 TFLOP/s each, datasheet)"
    assert stage_facts(stage, "slurm", KNOWN_INSTANCES).mfu_basis.endswith(
        "(the stage's BCP instance; the run is on slurm)"
    )
    assert (
        stage_facts(stage, "bcp", {}).mfu_basis
        == "no MFU: instance 'dgxa100.80g.8.norm' is not known (backends.bcp.instances)"
    )


def test_the_report_reads_a_nemo_stage_with_the_image_of_the_backend_it_ran_on():
    """The launcher's release, and so its parallel sizes, come from the image the run's backend used: 23.08's
    7b_improved is TP 2, the bundled bcp.image's TP 4 (a Grid Engine or Kubernetes stage was read with BCP's)."""
    older = "nvcr.io/nvidia/nemo:23.08"
    stage = (
        load_and_check(
            REPO / "pipelines.yaml",
            pipeline="slimpajama-8b",
            overrides=[
                f"pretrain.kubernetes.image={older}",
                f"pretrain.gridengine.container_image=docker://{older}",
                f"pretrain.slurm.container_image={older}",
            ],
        )
        .pipeline("slimpajama-8b")
        .stages["pretrain"]
    )
    shape = KNOWN_SHAPES["gpt3/7b_improved"]
    by_backend = {
        backend: stage_facts(stage, backend, KNOWN_INSTANCES).facts.flops_per_token
        for backend in ("bcp", "local", "slurm", "gridengine", "kubernetes")
    }
    assert by_backend == {
        "bcp": flops_per_token(shape, 4),
        "local": flops_per_token(shape, 4),
        "slurm": flops_per_token(shape, 2),
        "gridengine": flops_per_token(shape, 2),
        "kubernetes": flops_per_token(shape, 2),
    }
    assert flops_per_token(shape, 2) != flops_per_token(shape, 4)  # TP pads the vocabulary: the sizes tell apart
