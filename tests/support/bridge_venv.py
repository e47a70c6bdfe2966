"""The Megatron-Bridge test environment (scripts/bridge-venv: Python 3.12, megatron-bridge 0.6.2, megatron-core
0.19.2, a Transformer Engine stand-in), and what the rendered jobs give the entry program, read back from `plan`.

Where the environment is missing the tests that need it skip, unless BCP_BRIDGE_REQUIRED=1 (CI sets it): then they
fail, so that a broken build never passes as skipped tests."""

from __future__ import annotations

import ast
import atexit
import functools
import json
import os
import shlex
import socket
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from support.bridge_forkserver import IMPORT_TIME_PREFIXES  # its constants only: the server runs in the Bridge venv

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "stages" / "bridge_pretrain.py"


@functools.cache
def bundled_bridge_sections() -> dict[str, dict]:
    """Each bundled Megatron-Bridge pipeline's `megatron_bridge:` section, as pipelines.yaml writes it (read once)."""
    pipelines = yaml.safe_load((REPO / "pipelines.yaml").read_text())["pipelines"]
    sections = {
        name: stage["megatron_bridge"]
        for name, body in pipelines.items()
        for stage in body["stages"].values()
        if "megatron_bridge" in (stage or {})
    }
    assert sections, "pipelines.yaml bundles no Megatron-Bridge pipeline"
    return sections


def bridge_python() -> Path:
    venv = Path(
        subprocess.run(
            [str(REPO / "scripts/bridge-venv"), "--path"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    python = venv / "bin" / "python"
    if not python.exists():
        message = f"the Megatron-Bridge test environment is not built ({venv}): run scripts/bridge-venv"
        if os.environ.get("BCP_BRIDGE_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


FORKSERVER = REPO / "tests" / "support" / "bridge_forkserver.py"
_SERVERS: dict[tuple, tuple[subprocess.Popen, Path]] = {}  # this process's fork servers, by their import-time key


def import_time_key(python: Path, env: dict[str, str]) -> tuple:
    """What a fork server's warmed packages depend on (bridge_forkserver.IMPORT_TIME_PREFIXES): a request whose
    values differ is served by a server started with them."""
    return (str(python), *sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)))


def fork_server(python: Path, env: dict[str, str]) -> Path:
    """The socket of a running fork server for `python` and `env`'s import-time values, started on first use (one
    megatron.bridge import, then a fork per program); stopped when this process exits."""
    key = import_time_key(python, env)
    if key in _SERVERS and _SERVERS[key][0].poll() is None:
        _SERVERS[key] = _SERVERS.pop(key)  # the most recently used last
        return _SERVERS[key][1]
    while len(_SERVERS) >= 2:  # each holds ~1 GB of imported packages: keep the two most recent
        oldest, _ = _SERVERS.pop(next(iter(_SERVERS)))
        oldest.kill()
    folder = Path(tempfile.mkdtemp(prefix="bcpp-bridge-fork-"))
    sock = folder / "server.sock"
    with (folder / "server.log").open("wb") as log:
        server = subprocess.Popen(
            [str(python), str(FORKSERVER), str(sock)],
            env=env,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    atexit.register(server.kill)
    deadline = time.monotonic() + 900  # megatron.bridge's import: 20 CPU-seconds, far longer on a loaded machine
    while not sock.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            said = (folder / "server.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"the Bridge fork server did not start:\n{said}")
        time.sleep(0.2)
    _SERVERS[key] = (server, sock)
    return sock


def run_bridge(
    python: Path,
    argv: list[str],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """`python ARGV...` in the Bridge environment, as subprocess.run(..., capture_output=True, text=True) would
    give it, run as a child of a fork server (tests/support/bridge_forkserver.py says how that child is the same
    program run the same way, and where it is not)."""
    env = dict(os.environ if env is None else env)
    sock = fork_server(python, env)
    with tempfile.TemporaryDirectory(prefix="bcpp-bridge-run-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        request = {
            "argv": [str(a) for a in argv],
            "env": env,
            "cwd": str(cwd or os.getcwd()),
            "stdout": str(out),
            "stderr": str(err),
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(sock))
            client.sendall((json.dumps(request) + "\n").encode())
            replies = client.makefile("r")
            pid = json.loads(replies.readline())["pid"]
            client.settimeout(timeout)
            try:
                ended = json.loads(replies.readline())
            except TimeoutError:
                os.kill(pid, 9)
                raise subprocess.TimeoutExpired(
                    [str(python), *argv], timeout, out.read_text(errors="replace"), err.read_text(errors="replace")
                ) from None
        return subprocess.CompletedProcess(
            [str(python), *argv], ended["returncode"], out.read_text(errors="replace"), err.read_text(errors="replace")
        )


def site_packages(python: Path) -> Path:
    return Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )


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
            words = shlex.split(block.replace("$workspace", "/mount_workspace").replace("$results", "/results"))
            return after_entry(words)
        for line in text.splitlines():
            if "bridge_pretrain.py" in line and "--recipe" in line:
                return after_entry(shlex.split(line[line.index("python3 -u") :].rstrip(" \\")))
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
    return words[index + 1 :]


def dry_run_process(
    python: Path,
    arguments: list[str],
    world_size: int,
    data_list: Path,
    tmp: Path,
    *,
    restart: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """The entry program's --dry-run over `arguments`, its overrides file replaced by `data_list`. Without
    `restart` it is told it has started again already (its loop guard), so it sets the recipe's environment in
    place rather than importing Bridge a second time; the start-again itself is tested on its own."""
    args = list(arguments)
    args[args.index("--overrides-file") + 1] = str(data_list)
    marker = {} if restart else {"BCP_PIPELINE_RECIPE_ENV_APPLIED": "(the tests)"}
    argv = [str(ENTRY), *args, "--dry-run", "--world-size", str(world_size)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", **marker, **(env or {})}
    if restart:  # it starts itself again (os.execv) before importing Bridge: a fork server's imports would be waste
        result = subprocess.run([str(python), *argv], capture_output=True, text=True, cwd=tmp, timeout=600, env=env)
    else:
        result = run_bridge(python, argv, cwd=tmp, env=env)
    assert result.returncode == 0, f"--dry-run failed:\n{result.stderr[-4000:]}"
    return result


def resolved(result: subprocess.CompletedProcess) -> dict:
    """The config the dry run printed: Bridge's own logging shares stdout; the config follows the marker line."""
    printed = result.stdout.split("# bridge_pretrain --dry-run:", 1)[1].split("\n", 1)[1]
    return yaml.safe_load(printed)


def dry_run(python: Path, arguments: list[str], world_size: int, data_list: Path, tmp: Path) -> dict:
    """The resolved config of the entry program's --dry-run over `arguments` (dry_run_process), as YAML read back."""
    return resolved(dry_run_process(python, arguments, world_size, data_list, tmp))


def dumped(value) -> str:
    return json.dumps(value, sort_keys=True)


# -- Bridge's step line, from its own format strings ---------------------------------------------------------------
TRAIN_UTILS = "megatron/bridge/training/utils/train_utils.py"
OPTIONAL_FIELDS = {"energy", "power", "params_norm", "num_zeros_in_grad", "log_max_attention_logit"}


def step_line_parts(source: str) -> list[ast.expr]:
    """The expressions `training_log` builds its console line from (`log_string = ...`, `log_string += ...`), in
    source order, without the fields Bridge prints only when asked (energy, norms) or when samples were skipped."""
    function = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "training_log"
    )
    parts = []
    for node in ast.walk(function):
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign)
            else node.target
            if isinstance(node, ast.AugAssign)
            else None
        )
        if isinstance(target, ast.Name) and target.id == "log_string":
            names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            text = ast.unparse(node.value)
            if not names & OPTIONAL_FIELDS and "skipped_train_samples" not in text:
                parts.append(node.value)
    return sorted(parts, key=lambda expr: (expr.lineno, expr.col_offset))


def step_line(
    source: str, *, iteration: int, train_iters: int, ms: float, tflops: float, loss: float, batch: int = 512
) -> str:
    """The line Bridge's `training_log` prints for these figures (its format strings evaluated)."""
    namespace = {
        "datetime": datetime,
        "iteration": iteration,
        "train_config": SimpleNamespace(train_iters=train_iters),
        "global_state": SimpleNamespace(
            train_state=SimpleNamespace(consumed_train_samples=iteration * batch, skipped_train_samples=0)
        ),
        "elapsed_time_per_iteration": ms / 1000.0,
        "per_gpu_tf": tflops,
        "learning_rate": 1.5e-4,
        "batch_size": batch,
        "key": "lm loss",
        "avg": loss,
        "loss_scale": 1.0,
        "grad_norm": 1.234,
        "skipped_iters_key": "skipped iterations",
        "nan_iters_key": "nan iterations",
        "total_loss_dict": {"skipped iterations": 0, "nan iterations": 0},
    }
    return "".join(
        eval(compile(ast.Expression(expr), TRAIN_UTILS, "eval"), namespace)  # noqa: S307
        for expr in step_line_parts(source)
    )
