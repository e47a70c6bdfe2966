"""The Megatron-Bridge test environment (scripts/bridge-venv: Python 3.12, megatron-bridge 0.6.2, megatron-core
0.19.2, a Transformer Engine stand-in), and what the rendered jobs give the entry program, read back from `plan`.

Where the environment is missing the tests that need it skip, unless BCP_BRIDGE_REQUIRED=1 (CI sets it): then they
fail, so that a broken build never passes as skipped tests."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "stages" / "bridge_pretrain.py"


def bridge_python() -> Path:
    venv = Path(subprocess.run([str(REPO / "scripts/bridge-venv"), "--path"], check=True, capture_output=True,
                               text=True).stdout.strip())
    python = venv / "bin" / "python"
    if not python.exists():
        message = f"the Megatron-Bridge test environment is not built ({venv}): run scripts/bridge-venv"
        if os.environ.get("BCP_BRIDGE_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


def site_packages(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())


def pretrain_job(plan_json: dict) -> dict:
    [job] = [j for j in plan_json["jobs"] if j["stage"] == "pretrain" and j["kind"] == "stage"]
    return job


def entry_arguments(backend: str, job: dict) -> list[str]:
    """The entry program's arguments (after `bridge_pretrain.py`) as the rendered job gives them: from the BCP job
    script's `rank=( ... )` array, the Kubernetes pod's args, or the Slurm/Grid Engine script's command line."""
    texts = [job["printable"], *job.get("files", {}).values()]
    if backend == "kubernetes":
        for document in yaml.safe_load_all(job["printable"]):
            for container in containers(document):
                words = [*container.get("command", []), *container.get("args", [])]
                if any(w.endswith("bridge_pretrain.py") for w in words):
                    return after_entry(words)
        raise AssertionError("no pod runs bridge_pretrain.py")
    for text in texts:
        if backend == "bcp" and "rank=(" in text:
            block = text.split("rank=(\n", 1)[1].split("\n)", 1)[0]
            words = shlex.split(block.replace('$workspace', '/mount_workspace').replace('$results', '/results'))
            return after_entry(words)
        for line in text.splitlines():
            if "bridge_pretrain.py" in line and "--recipe" in line:
                return after_entry(shlex.split(line[line.index("python3 -u"):].rstrip(" \\")))
    raise AssertionError(f"the {backend} job does not run bridge_pretrain.py")


def containers(node) -> list[dict]:
    """Every container spec anywhere in a manifest (a Job's, or each replica type's of a PyTorchJob)."""
    if isinstance(node, dict):
        found = [c for c in node.get("containers", []) if isinstance(c, dict)]
        return found + [c for key, value in node.items() if key != "containers" for c in containers(value)]
    if isinstance(node, list):
        return [c for item in node for c in containers(item)]
    return []


def after_entry(words: list[str]) -> list[str]:
    index = next(i for i, w in enumerate(words) if w.endswith("bridge_pretrain.py"))
    return words[index + 1:]


def dry_run(python: Path, arguments: list[str], world_size: int, data_list: Path, tmp: Path) -> dict:
    """The entry program's --dry-run over `arguments`, its overrides file replaced by `data_list`: the resolved
    config, as YAML read back."""
    args = list(arguments)
    args[args.index("--overrides-file") + 1] = str(data_list)
    result = subprocess.run([str(python), str(ENTRY), *args, "--dry-run", "--world-size", str(world_size)],
                            capture_output=True, text=True, cwd=tmp, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, f"--dry-run failed:\n{result.stderr[-4000:]}"
    # Bridge's own logging shares stdout; the config follows the program's marker line
    printed = result.stdout.split("# bridge_pretrain --dry-run:", 1)[1].split("\n", 1)[1]
    return yaml.safe_load(printed)


def dumped(value) -> str:
    return json.dumps(value, sort_keys=True)


# -- Bridge's step line, from its own format strings ---------------------------------------------------------------
TRAIN_UTILS = "megatron/bridge/training/utils/train_utils.py"
OPTIONAL_FIELDS = {"energy", "power", "params_norm", "num_zeros_in_grad", "log_max_attention_logit"}


def step_line_parts(source: str) -> list[ast.expr]:
    """The expressions `training_log` builds its console line from (`log_string = ...`, `log_string += ...`), in
    source order, without the fields Bridge prints only when asked (energy, norms) or when samples were skipped."""
    function = next(node for node in ast.walk(ast.parse(source))
                    if isinstance(node, ast.FunctionDef) and node.name == "training_log")
    parts = []
    for node in ast.walk(function):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(
            node, ast.AugAssign) else None
        if isinstance(target, ast.Name) and target.id == "log_string":
            names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            text = ast.unparse(node.value)
            if not names & OPTIONAL_FIELDS and "skipped_train_samples" not in text:
                parts.append(node.value)
    return sorted(parts, key=lambda expr: (expr.lineno, expr.col_offset))


def step_line(source: str, *, iteration: int, train_iters: int, ms: float, tflops: float, loss: float,
              batch: int = 512) -> str:
    """The line Bridge's `training_log` prints for these figures (its format strings evaluated)."""
    namespace = {
        "datetime": datetime, "iteration": iteration, "train_config": SimpleNamespace(train_iters=train_iters),
        "global_state": SimpleNamespace(train_state=SimpleNamespace(consumed_train_samples=iteration * batch,
                                                                    skipped_train_samples=0)),
        "elapsed_time_per_iteration": ms / 1000.0, "per_gpu_tf": tflops, "learning_rate": 1.5e-4,
        "batch_size": batch, "key": "lm loss", "avg": loss, "loss_scale": 1.0, "grad_norm": 1.234,
        "skipped_iters_key": "skipped iterations", "nan_iters_key": "nan iterations",
        "total_loss_dict": {"skipped iterations": 0, "nan iterations": 0},
    }
    return "".join(eval(compile(ast.Expression(expr), TRAIN_UTILS, "eval"), namespace)  # noqa: S307
                   for expr in step_line_parts(source))
