"""`bcp-pipeline check` on the local backend: real Python, disk and cores of this machine; the table, --json and
the saved profile; what is not recognised is `different`, never ok."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.check_fixtures import check, project, rows

from bcp_pipeline.backends.checks import different, ok, unchecked
from bcp_pipeline.backends.profile import load_profile, profile_key, save_profile
from bcp_pipeline.check.render import render_check
from bcp_pipeline.check.run import CheckResult
from bcp_pipeline.cli.main import main
from bcp_pipeline.errors import StateError


def test_local_check_reports_each_row_and_saves_the_profile(tmp_path):
    config = project(tmp_path)
    code, payload, _ = check(config, "demo")
    found = rows(payload)
    assert set(found) == {"orchestrator python", "stage python", "disk", "cpu"}
    assert found["orchestrator python"]["verdict"] == "ok"
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in found["orchestrator python"]["showed"]
    assert found["stage python"]["verdict"] == "ok"  # this venv has every stage package
    assert found["disk"]["verdict"] == "could not check"  # demo declares no sizes
    assert "declares no sizes" in found["disk"]["showed"]
    cores = len(os.sched_getaffinity(0))
    # The demo's widest stage that computes starts 2 processes; its download's 2 x 2 mostly wait on I/O.
    assert found["cpu"]["verdict"] == ("ok" if cores >= 2 else "different")
    assert code == (0 if cores >= 2 else 1)
    if cores < 4:
        assert "wider, and I/O-bound: download (4)" in found["cpu"]["showed"]
    saved = load_profile(tmp_path / ".bcp-pipeline", profile_key("local", socket.gethostname()))
    assert saved is not None and saved["rows"] == payload["rows"] and saved["facts"]["cpu_cores"] == cores
    assert Path(payload["profile"]).name == f"local-{profile_key(socket.gethostname())}.json"


def test_declared_sizes_beyond_the_free_disk_are_different(tmp_path):
    config = project(tmp_path)
    _, payload, _ = check(config, "slimpajama-8b", "--backend", "local")  # 895 GB compressed, 2.6 TB of text...
    disk = rows(payload)["disk"]
    assert disk["verdict"] == "different", disk
    assert "short" in disk["meaning"] and "download" in disk["showed"]


def test_a_stage_interpreter_that_lacks_packages_is_different(tmp_path):
    """A real other interpreter (the system's python3 without the stage packages, or a broken path)."""
    bare = tmp_path / "bare-python"
    bare.write_text('#!/bin/sh\nexec /usr/bin/env -i /usr/bin/python3 -S "$@"\n')
    bare.chmod(0o755)
    config = project(tmp_path, f"  local: {{python: {bare}}}\n")
    _, payload, _ = check(config, "demo")
    row = rows(payload)["stage python"]
    assert row["verdict"] == "different", row
    assert "missing" in row["showed"] and "pip install -r stages/requirements.txt" in row["meaning"]


def test_the_table_names_every_row_and_the_counts():
    result = CheckResult(
        backend="local",
        key="local-h",
        target={"host": "h"},
        pipeline="demo",
        checked_at=0.0,
        rows=[
            ok("a", "assumes A", "showed A"),
            different("b", "assumes B", "showed B", "do B"),
            unchecked("c", "assumes C", "no answer"),
        ],
    )
    text = render_check(result, "/state/checks/local-h.json")
    assert "assumes B" in text and "different" in text and "do B" in text and "could not check" in text
    assert text.splitlines()[-1] == "1 ok, 1 different, 1 could not check; profile saved: /state/checks/local-h.json"
    assert text.startswith("# check: local (host h), pipeline demo, 1970-01-01 00:00 UTC")


def test_a_corrupt_profile_is_an_error_not_ignored(tmp_path):
    path = save_profile(tmp_path, "org-ace", {"facts": {}})
    assert load_profile(tmp_path, "org-ace")["facts"] == {}
    path.write_text("{half")
    with pytest.raises(StateError, match="run `bcp-pipeline check` again"):
        load_profile(tmp_path, "org-ace")
    assert load_profile(tmp_path, "other") is None


def test_check_needs_a_pipeline_or_a_backend(tmp_path, capsys):
    config = project(tmp_path)
    assert main(["--config", str(config), "check"]) == 2
    assert "name a pipeline" in capsys.readouterr().err
    assert main(["--config", str(config), "check", "--backend", "local"]) == 0
    assert "orchestrator python" not in capsys.readouterr().out  # the table shows the assumption, not the topic


def one_core_check(config: Path, *sets: str) -> dict:
    one_core = min(os.sched_getaffinity(0))
    done = subprocess.run(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "check", "demo", "--json", *sets],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=config.parent,
        preexec_fn=lambda: os.sched_setaffinity(0, {one_core}),
    )
    return rows(json.loads(done.stdout))["cpu"]


def test_a_stage_wider_than_the_cores_gets_the_set_that_fits_it(tmp_path):
    """The demo's download (2 x 2 processes) on one usable core, taken as a stage that computes: the row names the
    numbers, not `N`."""
    cpu = one_core_check(project(tmp_path), "--set", "download.io_bound=false")
    assert cpu["verdict"] == "different" and "1 usable core(s)" in cpu["showed"], cpu
    assert cpu["meaning"].endswith("to fit: --set download.local.replicas=1 --set download.local.processes=1"), cpu
    assert "=N" not in cpu["meaning"]


def test_an_io_bound_stage_may_start_more_processes_than_cores(tmp_path):
    """As bundled, the download is I/O-bound: the row names it, and judges the widest stage that computes."""
    cpu = one_core_check(project(tmp_path))
    assert "wider, and I/O-bound: download (4)" in cpu["showed"], cpu
    assert "the widest stage, tokenize-preprocess, starts 2" in cpu["showed"], cpu
    assert cpu["meaning"].endswith("to fit: --set tokenize-preprocess.local.processes=1"), cpu
