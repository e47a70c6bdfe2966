"""`bcp-pipeline check` with the NGC API EMULATOR's kinds of API key (tests/fakes/README.md "Variants"), once per
transport: an nvapi- personal or service key of the configured org is named as such and everything is checked; one
made for another org stops the check at the credentials row, with the org to set, and `run` refuses it too."""

from __future__ import annotations

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import checked

from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import RunStore
from bcp_pipeline.errors import ConfigError

pytestmark = [needs_ngcsdk, pytest.mark.both_transports]  # what this checks differs by transport

NVAPI_KEY = "nvapi-emulated-personal-key-not-a-secret"


@pytest.mark.emulator(api_key=NVAPI_KEY)
def test_a_personal_and_a_service_key_of_the_org_are_named_and_accepted(tmp_path, fake):
    org = fake.env()["NGC_CLI_ORG"]
    _, rows, result = checked(tmp_path / "personal", fake, jobs=False)
    credentials = rows["credentials"]
    assert credentials.verdict.value == "ok", credentials
    assert credentials.showed == f"a personal key (nvapi-) of user Emulated User, made for org {org}"
    assert rows["ace"].verdict.value == "ok" and rows["workspace"].verdict.value == "ok"  # the look-ups went on
    assert NVAPI_KEY not in repr(result)

    fake.set_variants(key_type="SERVICE_KEY")  # the same key, now one of no user
    _, rows, result = checked(tmp_path / "service", fake, jobs=False)
    credentials = rows["credentials"]
    assert credentials.verdict.value == "ok", credentials
    assert credentials.showed == f"a service key (nvapi-), of no user, made for org {org}"
    assert "no user" in credentials.meaning
    assert rows["ace"].verdict.value == "ok" and rows["image"].verdict.value == "ok"
    assert NVAPI_KEY not in repr(result)


@pytest.mark.emulator(api_key=NVAPI_KEY, variants={"key_org": "the-keys-own-org"})
def test_a_key_of_another_org_stops_the_check_and_run_refuses_it(tmp_path, fake):
    """The org comes from NGC_CLI_ORG, not pipelines.yaml: given no org, ngcsdk would take the key's own org
    silently, and every call (the probe jobs too) would go there."""
    org = fake.env()["NGC_CLI_ORG"]
    config, rows, result = checked(tmp_path, fake)  # with jobs: none may be submitted
    credentials = rows["credentials"]
    assert credentials.verdict.value == "different", credentials
    assert "the key works in org the-keys-own-org only: set backends.bcp.org: the-keys-own-org" in credentials.meaning
    assert f"or use a key made in org {org}; nothing else was checked" in credentials.meaning
    nvidia = "doesn't match organization" if fake.transport == "sdk" else "made for org the-keys-own-org"
    assert nvidia in credentials.showed
    assert list(rows) == ["credentials"] and result.facts == {}
    assert fake.jobs() == {} and not fake.requests("POST", "/v2/org/*/jobs")
    assert not fake.requests("GET", "/v2/org/*/aces/*")  # nothing else was asked either
    run = RunRequest(
        pipeline="demo",
        config_file=config,
        backend="bcp",
        overrides=[],
        from_stage=None,
        only=None,
        restart=False,
        detach=False,
    )
    with pytest.raises(ConfigError, match="belongs to org 'the-keys-own-org'.*set in NGC_CLI_ORG"):
        choose_run(run, RunStore(config.parent / ".bcp-pipeline"))
    assert fake.jobs() == {} and RunStore(config.parent / ".bcp-pipeline").runs() == []
