"""Apptainer on Grid Engine without a cell: the STAND-IN `apptainer` (tests/fakes/apptainer_bin) loaded as a module,
a Grid Engine backend whose stage (the demo's pretrain) runs in an Apptainer image over a parallel environment, and
`documented_exec`: the rendered lines checked against the grammar Apptainer's manual documents (quoted below), not
against the stand-in's own parser."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from support.golden_files import REPO

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.gridengine.backend import GridEngineBackend
from bcp_pipeline.config.load import load_config

STAND_IN = REPO / "tests" / "fakes" / "apptainer_bin" / "apptainer"


def load_stand_in():
    loader = importlib.machinery.SourceFileLoader("apptainer_stand_in", str(STAND_IN))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module
    loader.exec_module(module)
    return module


def container_backend(tmp_path: Path, *sets: str) -> tuple[GridEngineBackend, JobRequest]:
    """The demo's pretrain stage in an Apptainer image, distributed over a parallel environment."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    raw["stages_dir"] = str(REPO / "stages")
    raw.setdefault("backends", {})["gridengine"] = {
        "container": "apptainer",
        "python": "python3",
        "parallel_environment": "pe_node",
    }
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    sets = (
        "pretrain.gridengine.container_image=/images/nemo framework 24.05.sif",
        "pretrain.gridengine.container_binds=[/data:/data:ro]",
        "pretrain.gridengine.distributed=true",
        "pretrain.gridengine.resources=[node_f=1]",
        "pretrain.gridengine.project=tga-lab",
        "pretrain.gridengine.nodes=2",
        *sets,
    )
    config = load_config(config_file, list(sets), pipeline="demo")
    pipeline = config.pipelines["demo"]
    stage = pipeline.stages["pretrain"]
    backend = GridEngineBackend(
        config.options["gridengine"],
        config_dir=tmp_path,
        stages_dir=REPO / "stages",
        run_dir=tmp_path / "runs/demo-RUN",
        workspace_name="demo",
    )
    return backend, JobRequest(
        run_id="demo-RUN", pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
    )


# Apptainer's own documentation of `apptainer exec` (https://apptainer.org/docs/user/latest/cli/apptainer_exec.html),
# the grammar the rendered lines are checked against (not the stand-in's parser):
#   Usage:  apptainer exec [exec options...] <container> <command>
#   -B, --bind strings   a user-bind path specification. spec has the format src[:dest[:opts]], where src and dest
#                        are outside and inside paths. If dest is not given, it is set equal to src. Mount options
#                        ('opts') may be specified as 'ro' (read-only) or 'rw' (read/write, which is the default).
#                        Multiple bind paths can be given by a comma separated list.
#   -e, --cleanenv       clean environment before running container
#       --env strings    pass environment variable to contained process
#       --nv             enable Nvidia support
# and "Environment and Metadata" (environment_and_metadata.html): "The --env option ... allows you to specify
# environment variables as NAME=VALUE pairs ... Separate multiple variables with commas".
DOCUMENTED_FLAGS = frozenset({"--nv", "-e", "--cleanenv"})
DOCUMENTED_VALUE_OPTIONS = frozenset({"-B", "--bind", "--env"})


@dataclass
class DocumentedExec:
    options: list[tuple[str, str | None]]
    container: str
    command: list[str]

    def binds(self) -> list[tuple[str, str, str]]:
        """(src, dest, opts) of every bind, as the manual defines them (dest = src, opts = rw where not given)."""
        found = []
        for name, value in self.options:
            if name in ("-B", "--bind"):
                for spec in value.split(","):
                    src, dest, opts = (spec.split(":") + [None, None])[:3]
                    found.append((src, dest or src, opts or "rw"))
        return found

    def flags(self) -> set[str]:
        return {name for name, value in self.options if value is None}


def documented_exec(argv: list[str]) -> DocumentedExec:
    """`apptainer exec [exec options...] <container> <command>`, each option one the manual documents, each bind
    spec `src[:dest[:opts]]` with absolute paths and opts ro|rw, each --env value NAME=VALUE; AssertionError else."""
    assert argv[:2] == ["apptainer", "exec"], argv
    options, rest = [], list(argv[2:])
    while rest and rest[0].startswith("-"):
        name, equals, value = rest.pop(0).partition("=")
        if name in DOCUMENTED_FLAGS:
            assert not equals, f"{name} takes no value"
            options.append((name, None))
            continue
        assert name in DOCUMENTED_VALUE_OPTIONS, f"{name} is not an option the manual documents for exec"
        value = value if equals else rest.pop(0)
        for part in value.split(","):
            if name == "--env":
                key, eq, _ = part.partition("=")
                assert eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"--env {part!r} is not NAME=VALUE"
            else:
                pieces = part.split(":")
                assert 1 <= len(pieces) <= 3 and all(p.startswith("/") for p in pieces[:2]), (
                    f"bind {part!r} is not src[:dest[:opts]] of absolute paths"
                )
                assert len(pieces) < 3 or pieces[2] in ("ro", "rw"), f"bind {part!r}: opts must be ro or rw"
        options.append((name, value))
    assert len(rest) >= 2, f"apptainer exec needs <container> <command>: {argv}"
    return DocumentedExec(options=options, container=rest[0], command=rest[1:])
