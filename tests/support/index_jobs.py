"""What `plan` renders for a Megatron-Bridge training's derived stages (`data_index_of:`, `evaluate_of:`), read back
per backend: the arguments their jobs give their programs, and the training's data list command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml
from support.bridge_venv import containers
from support.cli import cli

CONFIG = Path(__file__).resolve().parents[2] / "pipelines.yaml"
BACKENDS = ("bcp", "slurm", "gridengine", "kubernetes")
# How each backend's job names the training's image (the NeMo 26.08 image the bundled Bridge pipelines train in)
IMAGE = {
    "bcp": "--image nvcr.io/nvidia/nemo:26.08",
    "slurm": "--container-image='nvcr.io#nvidia/nemo:26.08'",
    "gridengine": "/images/nemo-26.08.sif",
    "kubernetes": "image: nvcr.io/nvidia/nemo:26.08",
}


def planned(capsys, backend: str, config: Path = CONFIG, pipeline: str = "slimpajama-8b-bridge") -> dict:
    """`plan PIPELINE --backend BACKEND --json`, read back."""
    capsys.readouterr()
    assert cli(config, "plan", pipeline, "--backend", backend, "--json") == 0
    return json.loads(capsys.readouterr().out)


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def stage_job(plan_json: dict, stage: str, kind: str = "stage") -> dict:
    [job] = [j for j in plan_json["jobs"] if j["stage"] == stage and j["kind"] == kind]
    return job


def program_words(backend: str, job: dict, program: str) -> list[str]:
    """The command line (the interpreter first) that runs `program` in the rendered job."""
    texts = [job["printable"], *job.get("files", {}).values()]
    if backend == "kubernetes":
        for document in yaml.safe_load_all(job["printable"]):
            for container in containers(document):
                words = [*container.get("command", []), *container.get("args", [])]
                if any(w.endswith(program) for w in words):
                    return _from_interpreter(words, program)
                for word in words:  # inside a shell command line: `python3 .../data_list.py ... && exec ...`
                    inner = shlex.split(word) if program in word else []
                    if any(w.endswith(program) for w in inner):
                        return _from_interpreter(inner, program)
        raise AssertionError(f"no pod runs {program}")
    for text in texts:
        for line in text.splitlines():
            if program not in line:
                continue
            if backend == "bcp" and line.startswith("ngc base-command job run"):
                words = shlex.split(line)
                return _from_interpreter(shlex.split(words[words.index("--commandline") + 1]), program)
            # a script's line (BCP's: its mount points as the job is given them), from its interpreter on
            line = line.replace("$workspace", "/mount_workspace").replace("$results", "/results").lstrip("# ")
            line = line[line.index("python3") :] if "python3" in line else line
            try:
                words = shlex.split(line.rstrip(" \\"))
            except ValueError:  # prose that names the program (a comment)
                continue
            if any(w.endswith(program) for w in words):
                return _from_interpreter(words, program)
    raise AssertionError(f"the {backend} job does not run {program}")


SHELL_OPERATORS = {"||", "&&", "|", ";", ">", "2>&1", "&"}


def _from_interpreter(words: list[str], program: str) -> list[str]:
    """From the interpreter before `program` to the end of that command (a shell operator ends it)."""
    index = next(i for i, w in enumerate(words) if w.endswith(program))
    first = max(index - 1 if index and words[index - 1] != "-u" else index - 2, 0)
    command = []
    for word in words[first:]:
        if word in SHELL_OPERATORS:
            break
        if word.endswith(";"):  # `... ARG; }`: the shell's separator ends the command
            command.append(word[:-1])
            break
        command.append(word)
    return command


def after(words: list[str], program: str) -> list[str]:
    """The program's own arguments."""
    return words[next(i for i, w in enumerate(words) if w.endswith(program)) + 1 :]


def overrides_of(arguments: list[str]) -> list[str]:
    """The KEY=VALUE words of an argument list."""
    return [w for w in arguments if "=" in w and not w.startswith("-")]
