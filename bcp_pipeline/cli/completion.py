"""Shell completion (bash, zsh) of the `bcp-pipeline` command line, through argcomplete.

Verbs and options come from the argparse parser itself; the values below come from the files the commands would
read: pipeline names and their stages from the config file (`--config`, default ./pipelines.yaml), run ids and a
run's stages from the state folder (`--state-dir`, default next to the config file). Enable it in a shell with
`eval "$(register-python-argcomplete bcp-pipeline)"` (docs/commands.md, "Shell completion").

Completing runs on every <TAB>, so it reads as little as it can (the YAML without validation, run folder names
without their state) and never fails: an unreadable config or state offers nothing rather than a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from bcp_pipeline.config.load import DEFAULT_CONFIG_FILE
from bcp_pipeline.config.sections.bcp import DriverOptions
from bcp_pipeline.engine.state import store_for

# A completer gets the arguments parsed so far and returns candidates, each with a description (shown by zsh).
Candidates = dict[str, str]
Completer = Callable[[argparse.Namespace], Candidates]
DRIVER_KEYS = tuple(field.name for field in fields(DriverOptions))


def enable_completion(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit, when this process is one; otherwise return at once.

    argcomplete marks a completion request with the environment variable `_ARGCOMPLETE`. Without argcomplete
    installed such a request gets no candidates (an empty answer), never the command's own usage error.
    """
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        raise SystemExit(0) from None  # before parse_args, which would answer with a usage error
    attach_completers(parser)
    # Options only once "-" is typed: after a verb, the pipeline or run names are what one is looking for.
    argcomplete.autocomplete(parser, always_complete_options=False, default_completer=_nothing)


def attach_completers(parser: argparse.ArgumentParser) -> None:
    """Give every argument of `parser` and its sub-commands that names a pipeline, run, stage, config file or
    state folder its completer, matched by the argument's `dest` (so options added later get one too)."""
    from argcomplete.completers import DirectoriesCompleter, FilesCompleter

    by_dest: dict[str, Any] = {
        "pipeline": _safe(pipeline_names),
        "run": _safe(run_ids),
        "stage": _safe(stage_names),
        "from_stage": _safe(stage_names),
        "only": _safe(stage_names),
        "overrides": _safe(override_keys),
        "config": FilesCompleter(("yaml", "yml")),
        "state_dir": DirectoriesCompleter(),
    }
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in set(action.choices.values()):
                attach_completers(subparser)
        elif action.dest in by_dest:
            action.completer = by_dest[action.dest]  # type: ignore[attr-defined]


def _safe(completer: Completer) -> Callable[..., Candidates]:
    """`completer` in argcomplete's calling convention, answering nothing where it would raise."""

    def complete(*, parsed_args: argparse.Namespace, **_: Any) -> Candidates:
        try:
            return completer(parsed_args)
        except Exception:  # a half-typed command line or a broken file: no candidates, no traceback
            return {}

    return complete


def _nothing(**_: Any) -> Candidates:
    """Values with no candidates of their own (numbers, STAGE.KEY=VALUE) get none, not argcomplete's file names."""
    return {}


# -- the candidates --------------------------------------------------------------------------------------------
def pipeline_names(args: argparse.Namespace) -> Candidates:
    """The pipelines of the config file, with their descriptions."""
    return {name: _description(body) for name, body in _pipelines(args).items()}


def run_ids(args: argparse.Namespace) -> Candidates:
    """The runs in the state folder, oldest first (run ids sort by creation time); their state is not read."""
    runs = _state_root(args) / "runs"
    return {path.name: "" for path in sorted(runs.iterdir()) if (path / "state.json").is_file()}


def stage_names(args: argparse.Namespace) -> Candidates:
    """The stages of the pipeline named on the line, or of the run named on it (logs, verify); of every pipeline
    when neither is named yet. Stages already given to a repeated `--only` are not offered again."""
    run = getattr(args, "run", None)
    pipeline = getattr(args, "pipeline", None)
    if run:
        state = _run_state(args, run)
        stages = {str(name): "" for name in _mapping(state.get("stages"))}
        if state.get("detached") and getattr(args, "command", None) == "logs":
            stages.setdefault("driver", "the detached run's driver job")
    else:
        pipelines = _pipelines(args)
        chosen = [pipelines[pipeline]] if pipeline in pipelines else list(pipelines.values())
        stages = {str(name): _description(body) for p in chosen for name, body in _mapping(p.get("stages")).items()}
    return {name: about for name, about in stages.items() if name not in (getattr(args, "only", None) or ())}


def override_keys(args: argparse.Namespace) -> Candidates:
    """What `--set` reaches in the pipeline on the line: `STAGE.KEY=` for each key a stage (or a backend section
    of it, defaults merged) writes, `vars.NAME=` and the --detach driver's `backends.bcp.driver.KEY=`."""
    pipelines = _pipelines(args)
    body = pipelines.get(getattr(args, "pipeline", None) or "") or {}
    defaults = _mapping(body.get("defaults"))
    candidates: Candidates = {f"vars.{name}=": f"now {value}" for name, value in _mapping(body.get("vars")).items()}
    for stage, stage_body in _mapping(body.get("stages")).items():
        for key, value in _mapping(stage_body).items():
            if isinstance(value, dict) or key in defaults:
                merged = {**_mapping(defaults.get(key)), **_mapping(value)}
                candidates.update({f"{stage}.{key}.{inner}=": f"now {merged[inner]}" for inner in merged})
            else:
                candidates[f"{stage}.{key}="] = ""
    candidates.update({f"backends.bcp.driver.{name}=": "the --detach driver job" for name in DRIVER_KEYS})
    return candidates


# -- reading the files -------------------------------------------------------------------------------------------
def _config_file(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "config", None) or DEFAULT_CONFIG_FILE)


def _pipelines(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The config file's `pipelines` mapping as plain YAML: no validation, which costs more than a <TAB> may."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    raw = yaml.load(_config_file(args).read_text(encoding="utf-8"), Loader=loader)
    return {
        str(name): body for name, body in _mapping(_mapping(raw).get("pipelines")).items() if isinstance(body, dict)
    }


def _state_root(args: argparse.Namespace) -> Path:
    # The commands' own rule for where runs are kept, so completion offers exactly the runs they will find.
    return store_for(_config_file(args), getattr(args, "state_dir", None)).root


def _run_state(args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    return _mapping(json.loads((_state_root(args) / "runs" / run_id / "state.json").read_text(encoding="utf-8")))


def _mapping(value: Any) -> dict[Any, Any]:
    """`value` where it is a mapping, else an empty one: hand-edited files can hold anything."""
    return value if isinstance(value, dict) else {}


def _description(body: Any) -> str:
    """A pipeline's or stage's description on one line (a zsh completion menu shows one line per candidate)."""
    text = _mapping(body).get("description")
    return " ".join(str(text).split()) if text else ""
