"""Which org, team and ACE jobs run in (pipelines.yaml, else NGC_CLI_*, else ngc's config), and so which saved
`check` profile describes them."""

from __future__ import annotations

from collections.abc import Mapping

from bcp_pipeline.backends.bcp.connect import read_ngc_config
from bcp_pipeline.backends.profile import profile_key
from bcp_pipeline.config.resources import BcpOptions


def account_of(options: BcpOptions, environ: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    """org, team, ACE as jobs get them: pipelines.yaml, else NGC_CLI_ORG/TEAM/ACE, else ngc's config file."""
    saved = read_ngc_config(dict(environ))
    return (
        options.org or environ.get("NGC_CLI_ORG") or saved.get("org") or None,
        options.team or environ.get("NGC_CLI_TEAM") or saved.get("team") or None,
        options.ace or environ.get("NGC_CLI_ACE") or saved.get("ace") or None,
    )


def profile_key_of(options: BcpOptions, environ: Mapping[str, str]) -> str | None:
    """The name of the `check` profile for this org/ACE; None where either is not configured."""
    org, _team, ace = account_of(options, environ)
    return profile_key(org, ace) if org and ace else None
