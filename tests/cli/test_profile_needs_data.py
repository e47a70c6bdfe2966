"""`profile` before any run made the training's data is refused up front, naming the run to make first; nothing is
submitted (it used to submit a job that failed minutes later on a missing folder)."""

from __future__ import annotations

import shutil

from support.cli import cli
from support.golden_files import REPO


def test_profile_before_the_data_exists_is_refused_naming_the_run_to_make(tmp_path, capsys):
    shutil.copytree(REPO / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pipelines.yaml", tmp_path / "pipelines.yaml")
    config = tmp_path / "pipelines.yaml"
    assert cli(config, "run", "demo", "--only", "sample") == 0  # a run, but not of the data the training reads
    capsys.readouterr()
    assert cli(config, "profile", "demo") == 2
    err = capsys.readouterr().err
    assert "profile demo trains stage pretrain on what tokenize-preprocess, tokenize-validation wrote" in err, err
    assert "`bcp-pipeline run demo`" in err and "--data-ready" in err
    assert not list((tmp_path / ".bcp-pipeline" / "profiles").rglob("state.json"))  # no profile run, no job
