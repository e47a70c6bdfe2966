"""Apptainer on Grid Engine without a cell: the STAND-IN `apptainer` (tests/fakes/apptainer_bin, which parses
Apptainer's documented grammar strictly) loaded as a module, and a Grid Engine backend whose stage (the demo's
pretrain) runs in an Apptainer image over a parallel environment."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import yaml

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.gridengine.backend import GridEngineBackend
from bcp_pipeline.config.load import load_config
from support.golden_files import REPO

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
    raw.setdefault("backends", {})["gridengine"] = {"container": "apptainer", "python": "python3",
                                                    "parallel_environment": "pe_node"}
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    sets = ("pretrain.gridengine.container_image=/images/nemo framework 24.05.sif",
            "pretrain.gridengine.container_binds=[/data:/data:ro]", "pretrain.gridengine.distributed=true",
            "pretrain.gridengine.resources=[node_f=1]", "pretrain.gridengine.project=tga-lab",
            "pretrain.gridengine.nodes=2", *sets)
    config = load_config(config_file, list(sets), pipeline="demo")
    pipeline = config.pipelines["demo"]
    stage = pipeline.stages["pretrain"]
    backend = GridEngineBackend(config.options["gridengine"], config_dir=tmp_path, stages_dir=REPO / "stages",
                                run_dir=tmp_path / "runs/demo-RUN", workspace_name="demo")
    return backend, JobRequest(run_id="demo-RUN", pipeline=pipeline, stage=stage, kind="stage",
                               program=stage.program, args=tuple(stage.args))
