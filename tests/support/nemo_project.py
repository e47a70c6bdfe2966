"""The NeMo launcher test project, one for every backend: the pipelines.yaml of a one-stage pipeline whose
`pretrain` stage is a `nemo:` pretrain of gpt3/126m through the NeMo launcher stand-in (tests/fakes/nemo_launcher,
tests/fakes/README.md), and the data list it trains on. What is the backend's own (its `backends:` options and the
stage's section, where the workspace is, the job's image) each caller passes in: tests/support/ge_nemo.py (Grid
Engine), tests/backends/kubernetes/test_nemo.py, tests/e2e/test_kubernetes_nemo_pretrain.py and
tests/e2e/test_bcp_nemo_pretrain.py."""

from __future__ import annotations

from pathlib import Path

from support.manifests import chunk_name, fabricate
from support.pipeline_fixtures import REPO

NEMO_STAND_IN = REPO / "tests" / "fakes" / "nemo_launcher"
# The stand-in trains fast (0.02 s a step) and validates, so checkpoints, every 10 steps.
STAND_IN_OVERRIDES = "training.trainer.val_check_interval=10, +training.standin.step_seconds=0.02"
BCP_DEFAULTS = 'image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.1.norm, total_runtime: 1h'


def flow(indent: int, key: str, value: str) -> str:
    """`key: value` at `indent`, a flow mapping `value` written over several lines ("\\n" in it) with each further
    line under its first key, as a person writes it."""
    lead = " " * indent + f"{key}: "
    return lead + value.replace("\n", "\n" + " " * (len(lead) + 1))


def nemo_pipelines_yaml(
    backend: str,
    backend_options: str,
    stage_options: str,
    *,
    pipeline: str = "nemo",
    workspace: str = "{name: main}",
    variables: str | None = None,
    bcp_workspaces: str | None = None,
    bcp_verification: str | None = None,
    data: str = "${workspace}/data",
    results: str = "${workspace}/results",
    nemo_dir: bool = True,
    steps: int = 30,
    margin: str | None = None,
    extra_overrides: str | None = None,
) -> str:
    """The text of a pipelines.yaml: `backends: {backend: backend_options}` and the pipeline `pipeline`, whose one
    stage `pretrain` trains gpt3/126m for `steps` steps with the NeMo launcher stand-in, its data list and BPE files
    in `data` (preprocessed/, bpe/), its NeMo runs in `results` (paths in the workspace), and has the section
    `backend: stage_options`. The options are flow mappings ("{...}"); a "\\n" in one continues it on a line of
    its own.

    Left out where None (so the launcher's or the backend's defaults hold): `vars:` (`variables`), the BCP defaults'
    `workspaces:` (`bcp_workspaces`), the `verification:` job's BCP section (`bcp_verification`), `time_margin:`
    (`margin`) and `overrides:` (`extra_overrides`: what follows the stand-in's own, STAND_IN_OVERRIDES, "" for
    none more). `nemo_dir=False` leaves `nemo_dir:` out (its default, the image's /opt/NeMo), as a backend whose
    launcher runs the training itself (BCP) does not read it."""
    bcp_defaults = BCP_DEFAULTS + (f",\nworkspaces: {bcp_workspaces}" if bcp_workspaces is not None else "")
    lines = [
        "version: 1",
        f"stages_dir: {REPO / 'stages'}",
        "backends:",
        flow(2, backend, backend_options),
        "pipelines:",
        f"  {pipeline}:",
        f"    workspace: {workspace}",
    ]
    if variables is not None:
        lines.append(f"    vars: {variables}")
    lines += ["    defaults:", flow(6, "bcp", "{" + bcp_defaults + "}")]
    if bcp_verification is not None:
        lines += ["    verification:", f"      bcp: {bcp_verification}"]
    lines += [
        "    stages:",
        "      pretrain:",
        "        program: pretrain_local.py",
        "        nemo:",
        "          model: gpt3/126m",
        "          run_name: gpt",
        f"          data_dir: {data}/preprocessed",
        f"          bpe_dir: {data}/bpe",
        f"          results_dir: {results}",
        f"          launcher_dir: {NEMO_STAND_IN}/launcher_scripts",
    ]
    if nemo_dir:
        lines.append(f"          nemo_dir: {NEMO_STAND_IN}/NeMo")
    lines.append(f"          max_steps: {steps}")
    if margin is not None:
        lines.append(f"          time_margin: {margin}")
    if extra_overrides is not None:
        lines.append(f"          overrides: [{STAND_IN_OVERRIDES}{extra_overrides}]")
    lines.append(flow(8, backend, stage_options))
    return "\n".join(lines) + "\n"


def fabricate_nemo_data(preprocessed: Path) -> None:
    """The data list the pretrain reads from `preprocessed` (its `data_dir`): two made-up chunks of 3,000 and 1,000
    tokens (support/manifests.py)."""
    for i, tokens in enumerate((3000, 1000)):
        fabricate(preprocessed, chunk_name(i), tokens)
