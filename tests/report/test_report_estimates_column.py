"""The report's "Estimates against actuals" says one thing of every stage without an estimate, and its footnote
names no BCP instance on a run elsewhere (issue 50, item 12i: `-` beside `not modelled (counted as 0)`, and "the
stage's BCP instance" under a local run)."""

from __future__ import annotations

from bcp_pipeline.report.html import NO_ESTIMATE, estimates_table


def row(stage: str, *, estimate_s=None, basis=None, modelled=True) -> dict:
    return {
        "stage": stage,
        "instance": "this machine",
        "nodes": 1,
        "estimate_s": estimate_s,
        "actual_s": 3.0,
        "actual_over_estimate": None if estimate_s is None else 3.0 / estimate_s,
        "node_hours": None,
        "gpu_hours": None,
        "basis": basis,
        "modelled": modelled,
    }


def test_every_stage_without_an_estimate_reads_the_same_and_a_local_run_names_no_bcp_instance():
    rows = [
        row("sample", basis="not modelled (counted as 0)", modelled=False),
        row("download"),
        row("extract", estimate_s=2.0, basis="2 x 1.8 MB/s per core (benchmark)"),
    ]
    html = estimates_table(rows, "local")
    cells = [line for line in html.split("<td>") if line]
    assert html.count(NO_ESTIMATE) == 3  # sample's and download's cells, and the footnote saying what it means
    assert "2 x 1.8 MB/s per core (benchmark)" in html and "not modelled" not in html
    assert "BCP instance" not in html and "(local)" in html, cells
    assert "the nodes of the instance column" in html
