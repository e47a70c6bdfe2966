"""A project folder with the repository's pipelines.yaml and stages/, for `bcp-pipeline check` tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bcp_pipeline.check.run import CheckRequest, run_check

REPO = Path(__file__).resolve().parents[2]


def project(root: Path, extra_backends: str = "") -> Path:
    """pipelines.yaml (with `backends:` lines added to its own) and stages/ copied into `root`; the config path."""
    shutil.copytree(REPO / "stages", root / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    text = (REPO / "pipelines.yaml").read_text()
    if extra_backends:
        assert text.count("\nbackends:\n") == 1 and extra_backends.startswith("  ")
        text = text.replace("\nbackends:\n", "\nbackends:\n" + extra_backends.rstrip("\n") + "\n", 1)
    config = root / "pipelines.yaml"
    config.write_text(text)
    return config


def check(config: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, dict, str]:
    """`bcp-pipeline check ARGS --json` as a real subprocess: exit code, the JSON, stderr."""
    res = subprocess.run(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "check", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or dict(os.environ),
        cwd=config.parent,
    )
    try:
        payload = json.loads(res.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (exit {res.returncode}): {res.stdout[-2000:]}\n{res.stderr[-3000:]}") from None
    return res.returncode, payload, res.stderr


def rows(payload: dict) -> dict[str, dict]:
    return {row["topic"]: row for row in payload["rows"]}


def checked(tmp_path: Path, fake, *args: str, jobs: bool = True, detach: bool = False, overrides=()):
    """`check` of the demo on the emulated BCP, in this process: (config, its rows by topic, the result)."""
    fake.create_workspace("demo")
    config = project(tmp_path / "project", f"  bcp: {{transport: {fake.transport}}}\n")
    result, _ = run_check(
        CheckRequest(
            config_file=config,
            state_root=tmp_path / "project" / ".bcp-pipeline",
            pipeline="demo",
            backend="bcp",
            jobs=jobs,
            detach=detach,
            overrides=list(overrides),
        ),
        dict(os.environ),
    )
    return config, {row.topic: row for row in result.rows}, result
