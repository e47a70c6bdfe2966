"""Offline contract check: NVIDIA's own ``ngc`` argument parser and request builder (ngcsdk 4.19.1).

ngcsdk 4.19.1 is the last PyPI release with Base Command code. Its CLI runner needs three modules that only
the standalone ``ngc`` CLI ships; import-only stand-ins live in ``tests/fakes/ngc_stubs`` (put on ``sys.path``
here). Nothing below touches the network: only the parser, NVIDIA's local argument checks and the
``JobCreateRequest`` builder run. ACE-side checks (instance exists, runtime caps, image architecture) need
the server and are NOT done.

API (everything raises :class:`NgcRejected` when the real CLI would refuse the argv):

- ``job_create_request(argv, org=..., ace=..., team=None) -> dict`` -- the JSON body ``ngc base-command job
  run ARGV`` would POST (``JobCreateRequest.toJSON()``), after ``Batch._apply_shell_defaults``,
  ``check_batch_run_args`` and ``check_multinode_job_args``, exactly as ``ngc`` 4.19.1 does.
- ``run_request(argv, ...) -> RunRequest`` -- the same plus the resolved org/ace/team/format and the flags
  that change what ``job run`` prints (``--waitrun``/``--waitend``); used by the emulator ``tests/fakes/ngc``.
- ``parse_args(argv, ...) -> ParsedArgs`` -- any ``ngc`` subcommand through the same parser.
- ``available() -> bool`` -- ngcsdk 4.19.1 (and argcomplete) importable; tests skip otherwise.

``argv`` is the command line without the program name; a leading ``"ngc"`` is stripped. ``org``/``ace``/
``team`` play the role of ``NGC_CLI_ORG``/``NGC_CLI_ACE``/``NGC_CLI_TEAM`` (pass ``None`` for "not set");
``--org``/``--ace``/``--team`` in argv override them, as in the real CLI. The user's ``~/.ngc/config`` is
never read (``NGC_CLI_HOME`` points at an empty private folder), so results do not depend on the machine.

Findings (ngcsdk 4.19.1, checked by tests/fakes/test_ngc_parser.py; details in tests/fakes/README.md):

- ``--total-runtime``/``--min-timeslice``: ``[nD][nH][nM][nS]``, case-insensitive (upper-cased, then read as
  ISO-8601 ``P{n}DT{rest}``). Accepted: ``10h``, ``10H``, ``5D``, ``5d``, ``1h30m``, ``90m``, ``36000s``, ``1D12H``,
  ``2D3H4M5S``, also fractions (``1.5h``). Refused (argparse, exit 2): a bare number (``3600``), ``1w``, ``10 h``,
  ``h``, ``PT1H``. ``runPolicy.totalRuntimeSeconds``/``minTimesliceSeconds`` are integers (``10h`` -> 36000,
  ``5D`` -> 432000, ``1h30m`` -> 5400). ``0s`` and ``""`` are accepted and leave the field out. Without
  ``--preempt``, ``preemptClass`` is ``RUNONCE``.
- Request-level checks (``JobCreateRequest.isValid``, exit 1): ``--name`` 2-128 chars matching
  ``^[a-zA-Z0-9][a-zA-Z0-9-. ,_]*$`` (no ``/`` or ``:``); ``--instance``, ``--image``, ``--result`` required.
  Single-use flags given twice (``--name``, ``--image``, ``--commandline``...) -> exit 2.
- ``--label``: each value is split on ``,``; each part must match ``^[a-zA-Z_][a-zA-Z0-9_]*$`` and be <= 256
  chars (exit 2). ``_x`` -> ``reservedLabels``, ``__x`` -> ``systemLabels``, the rest -> ``userLabels`` (lists of
  strings); more than 20 of one kind -> exit 1. Duplicates are kept. ``--lock-label`` -> ``isLabelLocked``.
- ``--secret NAME`` -> ``userSecretsSpec: [{"name": NAME, "allKeys": true}]``; ``NAME:KEY[:ENV]`` ->
  ``{"name", "allKeys": false, "keysSpec": [{"keyName": KEY, "envName": ENV}]}`` (flags for one NAME are
  merged). Parts must match ``^[a-zA-Z0-9_.-]{1,63}$``; a bad one raises NgcException out of the parser (CLI:
  ``{"error": ...}`` on stderr, exit 1, not argparse's 2).
- ``--env-var KEY:VALUE`` -> ``envs: [{"name": KEY, "value": VALUE}]``, split at the first ``:`` (the value may
  hold ``=`` and ``:``, may be empty, <= 2048 chars); ``KEY=VALUE`` -> exit 1.
- ``--org/--ace/--team`` (and ``--format_type``, ``--debug``) are global options accepted anywhere, also after
  ``job run``; each at most once (exit 1). They are hidden and refused when no API key is configured. They
  are not in the Namespace: they set the client configuration. ``aceName`` comes from ``--ace`` or
  ``NGC_CLI_ACE``; org and team are not in the body (they go in the URL). ``--team`` is lower-cased.
- ``--workspace NAME:MOUNT[:RW|RO]`` (mode upper-case only, exit 2 otherwise) -> ``workspaceMounts: [{"id":
  NAME, "containerMountPoint": MOUNT, "mountMode": "RW"}]`` (no ``mountMode`` key when the mode is omitted).
- ``--image nvcr.io/org/team/img:tag`` -> ``dockerImageName: "org/team/img:tag"`` (registry host dropped).
- ``--replicas N`` -> ``replicaCount: N`` and ``minAvailability: N`` (coscheduling is always on, so
  ``--min-availability`` is always refused); N > 1 needs ``--array-type`` and a non-zero ``--total-runtime``,
  and ``--preempt`` RUNONCE or RESUMABLE; ``--array-type`` with one replica is refused.
- ``--waitrun`` with ``--waitend``, ``--shell`` with ``--preempt``/``--min-timeslice`` -> exit 1 (mutex checks
  that the CLI runs before the command body; applied here too).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STUBS = Path(__file__).resolve().parents[1] / "fakes" / "ngc_stubs"
DEFAULT_ORG = "bcpp-test-org"
DEFAULT_ACE = "bcpp-test-ace"
# Not a real key. It must not start with "nvapi-" (that form triggers key-service checks) and it must be set:
# without any key the CLI hides --org/--ace/--team and refuses them as unrecognized arguments.
_DUMMY_API_KEY = "bcpp-offline-contract-check"
_JOB_RUN_PREFIXES = (("base-command", "job", "run"), ("batch", "run"))


class NgcRejected(Exception):
    """The real ``ngc`` CLI would refuse this command line.

    ``exit_code`` is what the CLI would exit with: 2 for argparse errors (usage printed on stderr), 1 for
    NVIDIA's own validators (printed as ``{"error": message}`` with ``--format_type json``).
    """

    def __init__(self, message: str, exit_code: int, argv: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.argv = argv


@dataclass(frozen=True)
class ParsedArgs:
    """One parsed ``ngc`` command line and the configuration the global options resolved to."""

    namespace: argparse.Namespace
    org: str | None
    ace: str | None
    team: str | None
    format_type: str


@dataclass(frozen=True)
class RunRequest:
    """What ``ngc base-command job run`` would submit: the JobCreateRequest body and its context."""

    request: dict[str, Any]
    org: str | None
    ace: str | None
    team: str | None
    format_type: str
    waitrun: bool = False
    waitend: bool = False
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Loaded:
    parser: Any  # ngcbase.command.parser.NgcParser
    client: Any  # ngcsdk.Client


def available() -> bool:
    """True when ngcsdk 4.19.1's Base Command code and argcomplete can be imported (nothing is imported)."""
    from importlib import metadata, util  # local: keep module import cheap

    try:
        version = metadata.version("ngcsdk")
    except metadata.PackageNotFoundError:
        return False
    return version == "4.19.1" and util.find_spec("argcomplete") is not None


@contextlib.contextmanager
def _temporary_environ(values: dict[str, str]) -> Iterator[None]:
    """Set env vars while ngcsdk imports and reads them (at import time), then restore the caller's."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@functools.lru_cache(maxsize=1)
def _load() -> _Loaded:
    """Import ngcsdk and build the real ``ngc`` parser once per process (about 1-2 s)."""
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))
    home = tempfile.mkdtemp(prefix="bcpp-ngc-home-")  # empty: the user's ~/.ngc/config must not leak in
    atexit.register(shutil.rmtree, home, True)
    env = {
        "NGC_CLI_API_KEY": _DUMMY_API_KEY,
        "NGC_CLI_HOME": home,
        "NGC_CLI_TRACE_DISABLE": "1",
        # Placeholders so the configuration objects exist; every call sets its own values (see _configure).
        "NGC_CLI_ORG": DEFAULT_ORG,
        "NGC_CLI_ACE": DEFAULT_ACE,
    }
    with _temporary_environ(env):
        import ngcsdk
        from ngcbase.command.basecli import BaseCLIRunner

        class _Runner(BaseCLIRunner):
            @staticmethod
            def import_modules() -> None:
                # pylint: disable=import-outside-toplevel,unused-import
                import basecommand.command.all_commands  # noqa: F401
                import ngcbase.command.config  # noqa: F401

        client = ngcsdk.Client()
        parser = _Runner(client).get_parser()
    return _Loaded(parser=parser, client=client)


def _configure(client: Any, org: str | None, ace: str | None, team: str | None) -> None:
    """Reset what a previous call's global options left in the (cached) client configuration.

    The parser's ``--org/--ace/--team/--format_type`` actions write into ``client.config``; the given
    values stand where the CLI would read ``NGC_CLI_ORG``/``NGC_CLI_ACE``/``NGC_CLI_TEAM``.
    """
    config = client.config
    for attr, env_value in (("_org_name", org), ("_ace_name", ace), ("_team_name", team), ("_format_type", None)):
        setting = getattr(config, attr)
        setting.global_arg = None
        setting.global_arg_remove = False
        setting.env_var_remove = False
        if attr != "_format_type":
            setting.env_var = env_value


def _strip_program(argv: list[str]) -> list[str]:
    argv = list(argv)
    if argv and Path(argv[0]).name == "ngc":
        argv = argv[1:]
    return argv


def parse_args(
    argv: list[str], *, org: str | None = DEFAULT_ORG, ace: str | None = DEFAULT_ACE, team: str | None = None
) -> ParsedArgs:
    """Parse any ``ngc`` command line with NVIDIA's parser; raise :class:`NgcRejected` as the CLI would fail."""
    loaded = _load()  # first: imports need the stand-ins on sys.path and the env set
    from ngcbase.errors import NgcException  # pylint: disable=import-outside-toplevel

    argv = _strip_program(argv)
    _configure(loaded.client, org, ace, team)
    stderr, stdout = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            namespace = loaded.parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse prints "usage: ...\nngc ...: error: MESSAGE" and exits 2; -h exits 0 after printing help.
        code = exit_.code if isinstance(exit_.code, int) else 2
        message = (stderr.getvalue() or stdout.getvalue()).strip() or f"ngc exited with {code}"
        raise NgcRejected(message, code, argv) from None
    except (NgcException, argparse.ArgumentError, ValueError, TypeError) as error:
        # Validators used as argparse ``type=`` that raise NgcException escape argparse (CLI: exit 1).
        raise NgcRejected(str(error), 1, argv) from None
    try:
        _run_command_decorator_checks(namespace)
    except (NgcException, argparse.ArgumentError, ValueError) as error:
        raise NgcRejected(_error_text(error), 1, argv) from None
    config = loaded.client.config
    return ParsedArgs(
        namespace=namespace,
        org=config.org_name,
        ace=config.ace_name,
        team=config.team_name,
        format_type=config.format_type or "ascii",
    )


def _run_command_decorator_checks(namespace: argparse.Namespace) -> None:
    """Run the checks NVIDIA attaches to command functions (``CLICommand.mutex/max_mutex/any_of``).

    They are wrappers around ``args.func`` that validate before the command body runs (for example
    ``--waitrun`` with ``--waitend``); we walk the wrapper chain and apply the same validators without
    running the command itself.
    """
    # pylint: disable=import-outside-toplevel
    from ngcbase.command.clicommand import validate_anyof, validate_mutex

    func = getattr(namespace, "func", None)
    while func is not None:
        code = getattr(func, "__code__", None)
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in func.__closure__ or ()))) if code else {}
        name = code.co_name if code else ""
        if name == "f_mutex":
            validate_mutex(namespace, *cells["groups"])
        elif name == "f_max_mutex":
            validate_mutex(namespace, *cells["groups"], count=cells["count"])
        elif name == "f_anyof" and cells.get("cond", True):
            validate_anyof(namespace, *cells["groups"])
        func = getattr(func, "__wrapped__", None)


_GLOBALS_WITH_VALUE = ("--format_type", "--org", "--ace", "--team", "--config-profile")


def command_words(argv: list[str], count: int = 3) -> list[str]:
    """The first ``count`` command words of an ``ngc`` argv (program name optional), global options and their values
    left out wherever they stand; ``bc`` is spelled ``base-command``."""
    words: list[str] = []
    skip = False
    for arg in _strip_program(argv):
        if skip:
            skip = False
        elif arg in _GLOBALS_WITH_VALUE:
            skip = True  # its value is not a command word
        elif not arg.startswith("-"):
            words.append(arg)
        if len(words) == count:
            break
    if words[:1] == ["bc"]:
        words[0] = "base-command"
    return words


def is_job_run(argv: list[str]) -> bool:
    """True when argv (program name optional) is ``[bc|base-command] job run`` or the alias ``batch run``."""
    words = command_words(argv)
    return any(tuple(words[: len(prefix)]) == prefix for prefix in _JOB_RUN_PREFIXES)


def run_request(
    argv: list[str], *, org: str | None = DEFAULT_ORG, ace: str | None = DEFAULT_ACE, team: str | None = None
) -> RunRequest:
    """Parse a ``job run`` argv and build its JobCreateRequest exactly as ``ngc`` 4.19.1 does before POSTing."""
    loaded = _load()  # first: imports need the stand-ins on sys.path and the env set
    # pylint: disable=import-outside-toplevel
    from basecommand.api.utils import check_batch_run_args, check_multinode_job_args
    from basecommand.command.args_validation import check_shell_support
    from basecommand.command.batch import Batch
    from ngcbase.errors import NgcException

    argv = _strip_program(argv)
    if not is_job_run(argv):
        raise ValueError(f"not an 'ngc base-command job run' command line: {argv!r}")
    parsed = parse_args(argv, org=org, ace=ace, team=team)
    args = parsed.namespace
    if args.clone:
        # JobsAPI would fetch the cloned job's definition from the server.
        raise NgcRejected("--clone needs the NGC server; the offline check cannot resolve it", 1, argv)
    try:
        # Same sequence as Batch.run -> JobsAPI.run, minus the server calls (_check_job_args, submit_job).
        Batch._apply_shell_defaults(args)  # pylint: disable=protected-access
        if args.start_deadline and not args.shell:
            raise NgcException("argument: --start-deadline can only be set with --shell")
        if args.shell:
            check_shell_support(args)
        builder_args = argparse.Namespace(**vars(args))
        builder_args.dataset = args.datasetid  # JobsAPI.run renames datasetid -> dataset
        check_batch_run_args(builder_args, parsed.ace)
        check_multinode_job_args(builder_args)
        request = loaded.client.basecommand.jobs._get_job_create_request(builder_args)  # pylint: disable=W0212
    except (NgcException, argparse.ArgumentError, argparse.ArgumentTypeError, ValueError) as error:
        raise NgcRejected(_error_text(error), 1, argv) from None
    return RunRequest(
        request=json.loads(request.toJSON()),
        org=parsed.org,
        ace=parsed.ace,
        team=parsed.team,
        format_type=parsed.format_type,
        waitrun=bool(args.waitrun),
        waitend=bool(args.waitend),
    )


def job_create_request(
    argv: list[str], *, org: str | None = DEFAULT_ORG, ace: str | None = DEFAULT_ACE, team: str | None = None
) -> dict[str, Any]:
    """The JobCreateRequest body (a dict) for an ``ngc base-command job run ...`` argv; see module docstring."""
    return run_request(argv, org=org, ace=ace, team=team).request


def _error_text(error: BaseException) -> str:
    """argparse.ArgumentError's str() prefixes 'argument None:' when it has no action; keep the message."""
    message = getattr(error, "message", None)
    return str(message) if message else str(error)


def main(argv: list[str]) -> int:
    """``python tests/support/ngc_parser.py ngc base-command job run ...``: print the request or the refusal."""
    try:
        print(json.dumps(job_create_request(argv), indent=2, sort_keys=True))
    except NgcRejected as rejected:
        print(rejected.message, file=sys.stderr)
        return rejected.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
