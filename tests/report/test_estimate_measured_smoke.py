"""The step time `profile` measured is used for the smoke pretrain's estimate (issue 50, item 12f: `profile demo`
said it was "kept for `plan`", and `plan demo` still showed the pretrain as not modelled)."""

from __future__ import annotations

import functools

from support.golden_files import REPO

from bcp_pipeline.config.instances import instances_table, this_machine
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.report.estimates import estimate_pipeline
from bcp_pipeline.report.measured import Measurement


@functools.cache
def demo():
    config = load_and_check(REPO / "pipelines.yaml", pipeline="demo")  # once: loading it is most of the cost
    return config.pipeline("demo"), instances_table(config.options["bcp"].instances), this_machine()


def demo_estimate(measured: Measurement | None, backend: str = "local"):
    pipeline, instances, here = demo()
    estimate = estimate_pipeline(pipeline, instances, measured, backend=backend, here=here)
    return next(s for s in estimate.stages if s.stage == "pretrain")


def test_the_smoke_pretrain_is_estimated_from_the_measured_step_time_where_it_was_measured():
    measured = Measurement(
        run_id="demo-20261202-000000-0000",
        stage="pretrain",
        backend="local",
        instance=None,
        nodes=1,
        step_s=0.5,
        mfu=None,
    )
    pretrain = demo_estimate(measured)
    assert pretrain.modelled and pretrain.seconds == 60 * 0.5
    assert pretrain.basis == "from profile run demo-20261202-000000-0000: 0.5 s/step x 60 steps"
    assert demo_estimate(None).basis == "not modelled (counted as 0)"
    elsewhere = demo_estimate(measured, backend="slurm")  # measured on local: not for a Slurm node
    assert not elsewhere.modelled and elsewhere.seconds is None
    assert any("its step time is not used" in note for note in elsewhere.notes)
