"""`bcp-pipeline check --no-jobs` against the NGC API EMULATOR (tests/fakes/ngc_api.py), once per transport (NVIDIA's
ngc CLI code, ngcsdk in-process): what the emulated service shows, and what it lacks, reported row by row."""

from __future__ import annotations

import json

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import project

from bcp_pipeline.cli.main import main

pytestmark = [needs_ngcsdk, pytest.mark.both_transports]  # what this checks differs by transport


def bcp_project(tmp_path, fake, extra: str = ""):
    return project(tmp_path / "project", f"  bcp: {{transport: {fake.transport}{extra}}}\n")


def check_json(config, capsys, *args: str) -> tuple[int, dict[str, dict], dict]:
    capsys.readouterr()
    code = main(["--config", str(config), "check", *args, "--json"])
    payload = json.loads(capsys.readouterr().out)
    return code, {row["topic"]: row for row in payload["rows"]}, payload


def test_no_jobs_check_of_the_emulated_ace(tmp_path, fake, capsys):
    fake.create_workspace("demo")
    config = bcp_project(tmp_path, fake)
    code, rows, payload = check_json(config, capsys, "demo", "--backend", "bcp", "--no-jobs")
    verdicts = {topic: row["verdict"] for topic, row in rows.items()}
    assert verdicts == {
        "credentials": "ok",
        "team": "ok",
        "ace": "ok",
        "instances": "ok",
        "ace limits": "ok",
        "image": "ok",
        "workspace": "ok",
        # the test ngc is ngcsdk's CLI code, which has no `version` command (the standalone CLI's)
        "client version": "ok" if fake.transport == "sdk" else "could not check",
    }, payload["rows"]
    assert code == 0
    org, ace = fake.env()["NGC_CLI_ORG"], fake.env()["NGC_CLI_ACE"]
    assert payload["target"] == {"org": org, "ace": ace}
    assert payload["key"] == f"{org}-{ace}"
    assert "dgxa100.80g.1.norm" in rows["instances"]["showed"]
    assert "nvcr.io/nvaie/nemo-framework-training:23.11" in rows["image"]["showed"]
    assert payload["facts"]["ace"]["maxRuntimeSeconds"] == 30 * 86400
    saved = json.loads((tmp_path / "project" / ".bcp-pipeline" / "checks" / f"{org}-{ace}.json").read_text())
    assert saved["rows"] == payload["rows"]
    assert not fake.requests("POST", "/v2/org/*/jobs") and not fake.jobs()  # --no-jobs: nothing was submitted
    # each row says what was learned in one readable line: no raw client error, URL or argparse usage
    for row in rows.values():
        assert not any(noise in row["showed"] for noise in ("usage:", "for url", "Invalid SAK", "exited")), row
    assert rows["workspace"]["showed"].startswith("demo: 0.0 GB used; ")
    if fake.transport == "cli":
        assert rows["client version"]["showed"].startswith("this `ngc` has no `version` command"), rows


def test_what_the_ace_lacks_is_different(tmp_path, fake, capsys):
    """No workspace `demo`, a missing image, an instance the ACE does not offer, and the driver's secret absent."""
    fake.set_missing_images(["nvaie/nemo-framework-training:23.11"])
    config = bcp_project(tmp_path, fake)
    code, rows, payload = check_json(
        config,
        capsys,
        "demo",
        "--backend",
        "bcp",
        "--no-jobs",
        "--detach",
        "--set",
        "sample.bcp.instance=dgxa100.80g.16.norm",
    )
    assert code == 1
    for topic in ("workspace", "image", "instances", "secrets"):
        assert rows[topic]["verdict"] == "different", (topic, payload["rows"])
    assert "instances allows dgxa100" in rows["instances"]["showed"]
    assert "but sample: instance dgxa100.80g.16.norm" in rows["instances"]["showed"]
    assert "--set sample.bcp.instance=" in rows["instances"]["meaning"]  # admission.py's fix
    assert "secret bcp-pipeline-ngc does not exist" in rows["secrets"]["showed"]
    assert "ngc workspace create" in rows["workspace"]["meaning"]

    fake.set_secret("bcp-pipeline-ngc", {"other": "x"})  # the secret, without the key the driver takes
    _, rows, _ = check_json(config, capsys, "demo", "--backend", "bcp", "--no-jobs", "--detach")
    assert rows["secrets"]["verdict"] == "different"
    assert "has no key api_key (it has: other)" in rows["secrets"]["showed"]
    assert "x" not in rows["secrets"]["showed"].split("(it has: other)")[1]  # never a value
    fake.set_secret("bcp-pipeline-ngc", {"api_key": "the-value"})
    _, rows, payload = check_json(config, capsys, "demo", "--backend", "bcp", "--no-jobs", "--detach")
    assert rows["secrets"]["verdict"] == "ok"
    assert "the-value" not in json.dumps(payload)


def test_an_org_the_key_does_not_belong_to_is_different(tmp_path, fake, capsys):
    config = bcp_project(tmp_path, fake, ", org: someone-elses-org")
    code, rows, payload = check_json(config, capsys, "--backend", "bcp", "--no-jobs")
    assert code == 1, payload["rows"]
    assert rows["credentials"]["verdict"] == "different"
    assert fake.env()["NGC_CLI_ORG"] in rows["credentials"]["showed"]  # the org the key does belong to
    assert "backends.bcp.org" in rows["credentials"]["meaning"]
    text = json.dumps(payload)
    assert "Using API key" not in text and "****" not in text  # not even the key's end, which ngcsdk shows
