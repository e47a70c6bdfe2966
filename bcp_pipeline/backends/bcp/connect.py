"""How the BCP backend reaches Base Command: which transport (`backends.bcp.transport: auto` takes the CLI when
`ngc` is on PATH, else ngcsdk when it imports), and what `run` checks before a run is recorded: an API key, an org
and an ACE configured (an nvapi- key's org too), and every workspace the jobs mount there. The key itself is read
only to tell its kind: never shown, logged or passed on."""

from __future__ import annotations

import configparser
import contextlib
import importlib.util
import io
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from bcp_pipeline.backends.bcp.transport import SDK_VERSION, Transport
from bcp_pipeline.backends.bcp.transport_cli import CliTransport
from bcp_pipeline.backends.bcp.transport_sdk import SdkTransport
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError, ConfigError, is_not_found

INSTALL_HINT = (
    "install one of: NVIDIA's ngc CLI (https://org.ngc.nvidia.com/setup/installers/cli, then put `ngc` "
    f'on PATH or set backends.bcp.ngc), or ngcsdk {SDK_VERSION}: pip install "bcp-pipeline[bcp]"'
)


# -- choosing one ----------------------------------------------------------------------------------------------
def sdk_available() -> bool:
    return importlib.util.find_spec("ngcsdk") is not None and importlib.util.find_spec("basecommand") is not None


def cli_available(options: BcpOptions) -> bool:
    return shutil.which(options.ngc) is not None


def choose_transport(options: BcpOptions) -> str:
    """`cli` or `sdk` for `options.transport`; a ConfigError that says how to get one when neither is there."""
    wanted = options.transport
    if wanted in ("cli", "auto") and cli_available(options):
        return "cli"
    if wanted in ("sdk", "auto") and sdk_available():
        return "sdk"
    if wanted == "cli":
        raise ConfigError(
            f"backends.bcp.transport is cli, but the ngc CLI {options.ngc!r} is not on PATH; "
            f"{INSTALL_HINT} (and set transport: sdk or auto)"
        )
    if wanted == "sdk":
        raise ConfigError(
            f"backends.bcp.transport is sdk, but ngcsdk {SDK_VERSION} cannot be imported: "
            f'pip install "bcp-pipeline[bcp]"'
        )
    raise ConfigError(
        f"the BCP backend needs NVIDIA's ngc CLI or ngcsdk {SDK_VERSION}, and neither is here: {INSTALL_HINT}"
    )


def make_transport(options: BcpOptions) -> Transport:
    return CliTransport(options) if choose_transport(options) == "cli" else SdkTransport(options)


NOTHING_DONE = "Nothing was submitted or recorded"  # how `run` ends a refusal made before a run is recorded
SCOPED_KEY_PREFIX = "nvapi-"  # personal and service keys (ngcbase.constants): the bearer itself, one org each


def check_credentials(
    options: BcpOptions, environ: dict[str, str] | None = None, transport: Transport | None = None
) -> None:
    """Before a run is recorded: an API key and an ACE must be configured (names what is missing, and where).

    A personal or service key (`nvapi-...`) works in the one org it was made for, so with one the org is checked
    too, by one call through `transport` (default: the configured one): NVIDIA's error, then which org the key
    belongs to and where this run's org came from."""
    env = os.environ if environ is None else environ
    config = read_ngc_config(env)
    missing = []
    key = configured_api_key(env)
    if not key:
        missing.append("an API key (NGC_CLI_API_KEY, or `ngc config set`)")
    org = _setting(options.org, "backends.bcp.org", env, "NGC_CLI_ORG", config, "org")
    ace = _setting(options.ace, "backends.bcp.ace", env, "NGC_CLI_ACE", config, "ace")
    if not org:
        missing.append("an org (backends.bcp.org, NGC_CLI_ORG, or `ngc config set`)")
    if not ace:
        missing.append("an ACE (backends.bcp.ace, NGC_CLI_ACE, or `ngc config set`)")
    if missing:
        raise ConfigError("the BCP backend is missing " + "; ".join(missing) + f". {NOTHING_DONE}")
    if key.startswith(SCOPED_KEY_PREFIX):
        _check_key_org(transport or make_transport(options), key, org, ace[0])


def configured_api_key(environ: Mapping[str, str]) -> str:
    """The API key NVIDIA's client will use (NGC_CLI_API_KEY, else ngc's config file); "" when none. For deciding
    what kind of key it is: never to be shown, logged or passed on."""
    return environ.get("NGC_CLI_API_KEY") or read_ngc_config(dict(environ)).get("apikey") or ""


def _setting(
    value: str | None, name: str, env: dict[str, str], env_name: str, config: dict[str, str], config_key: str
) -> tuple[str, str] | None:
    """(value, where it was set) in NGC's order of precedence for our calls: pipelines.yaml, env, `ngc config`."""
    for found, where in ((value, name), (env.get(env_name), env_name), (config.get(config_key), "ngc config")):
        if found:
            return found, where
    return None


def _check_key_org(transport: Transport, key: str, org: tuple[str, str], ace: str) -> None:
    try:
        transport.ace(ace)
    except BackendCallError as exc:
        key_org = scoped_key_org(key)
        if key_org is None or key_org == org[0]:
            raise
        raise ConfigError(
            f"{exc}\n  The NGC API key (an nvapi- key) belongs to org {key_org!r}, but this run uses "
            f"org {org[0]!r} (set in {org[1]}). Set backends.bcp.org: {key_org} in pipelines.yaml "
            f"(or NGC_CLI_ORG={key_org}), or use a key made in org {org[0]!r}. {NOTHING_DONE}"
        ) from None


def scoped_key_org(key: str) -> str | None:
    """The org an nvapi- key belongs to, as NVIDIA's client asks it (`/v3/keys/get-caller-info`, through ngcsdk);
    None when ngcsdk is not here or cannot tell."""
    if not sdk_available():
        return None
    try:
        import ngcsdk  # pylint: disable=import-outside-toplevel

        with contextlib.redirect_stdout(io.StringIO()):
            return str(ngcsdk.Client().authentication.get_sak_key_details(key).orgName or "") or None
    except Exception:  # pylint: disable=broad-except  # only a better message is at stake
        return None


def read_ngc_config(environ: dict[str, str]) -> dict[str, str]:
    """The `[CURRENT]` section of NGC's config file (`$NGC_CLI_HOME/.ngc/config`, else `~/.ngc/config`)."""
    home = Path(environ.get("NGC_CLI_HOME") or Path.home())
    parser = configparser.ConfigParser()
    try:
        parser.read(home / ".ngc" / "config")
    except configparser.Error:
        return {}
    return dict(parser["CURRENT"]) if parser.has_section("CURRENT") else {}


def check_workspaces_exist(options: BcpOptions, pipeline: PipelineConfig, transport: Transport | None = None) -> None:
    """Every workspace the pipeline's jobs mount exists, or a ConfigError naming it and `ngc workspace create`:
    found before a run is recorded, not as a failed first submission. Only "not found" refuses: another failure of
    the look-up is left to the submission, which reports it with its own hint."""
    names = [pipeline.workspace.name]
    for section in [pipeline.verification.bcp, *(stage.bcp for stage in pipeline.stages.values())]:
        names += [mount.name for mount in section.workspaces if mount.name not in names]
    transport = transport or make_transport(options)
    for name in names:
        try:
            transport.workspace(name)
        except BackendCallError as exc:
            if is_not_found(exc):
                ace = f" --ace {options.ace}" if options.ace else ""
                raise ConfigError(
                    f"BCP workspace {name!r} (pipeline {pipeline.name}) does not exist in this org: "
                    f"create it with `ngc workspace create --name {name}{ace}`, or name an existing "
                    "one (`ngc workspace list`). Nothing was submitted or recorded"
                ) from None
