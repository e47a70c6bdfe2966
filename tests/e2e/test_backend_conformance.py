"""One scenario, every backend: what each backend must do the same way, written once and run on the local backend,
the emulated BCP (NVIDIA's client against the NGC API EMULATOR, tests/fakes/), the real Slurm cluster, the real
Grid Engine cell and the Kubernetes test cluster (the clusters of scripts/, through their fixtures):

1. the bundled demo's data stages (sample, bpe, download, extract, concat, tokenize-preprocess) give the bytes a
   local run gives (on Slurm, the whole demo runs: its pretrain too); `status` and `logs` show the run;
2. an orchestrator SIGKILLed while a stage's job is alive leaves that job alive; `resume` re-attaches to it
   (no second job, for that stage or any other) and the run ends with the local run's outputs;
3. a poll cycle asks the scheduler for the state of every job of the run in one status call, whatever the number
   of jobs (the local backend, which has no scheduler, asks nothing: it reads its jobs' status files).

The scenario is the base class `Conformance`; each backend is a subclass (`TestLocal`, `TestBcp`, `TestSlurm`,
`TestGridEngine`, `TestKubernetes`) whose `driver` fixture requests that backend's cluster or emulator fixture and
says, in the backend's own records (its job folders, the emulator's jobs, squeue, qstat and qacct, the apiserver's
Jobs), which jobs exist and what state they are in, how to count its status calls, and what else a backend
must show (where the demo's ranks ran, the demo's pretrain on Slurm). A class per backend, not a
`@pytest.mark.parametrize` parameter, because pytest makes one fixture closure per test function: a parameter
cannot add a fixture (pytest.param refuses `usefixtures`), and the `cluster` marker and the parallel groups come
from that closure (tests/support/markers.py, tests/support/parallel.py): each class's tests carry its own.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.bcp_emulation import jobs_by_stage, needs_ngcsdk, status_calls
from support.cli import cli, latest
from support.k8s_cluster import k8s_cluster  # noqa: F401 (the fixtures of the clusters)
from support.pipeline_fixtures import (
    CHAIN_CONFIG,
    DEMO_SPREAD,
    GE_CHAIN,
    GE_OPTIONS,
    K8S_CHAIN,
    REPO,
    SLURM_CHAIN,
    SLURM_WORKSPACE_DIR,
    bcp_chain_config,
    stall_stage,
    start_orchestrator,
    wait_for,
    without_training,
    write_chain_project,
)
from support.sge_cluster import sge_cell  # noqa: F401
from support.slurm_cluster import slurm_cluster  # noqa: F401

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import RunState, StageStatus

CHAIN_JOBS = [f"{stage}{kind}" for stage in ("first", "second", "third") for kind in ("", ".verify")]
DATA_STAGES = ("sample", "bpe", "download", "extract", "concat", "tokenize-preprocess")
# Where each data stage of the demo writes, and the name its completion records carry.
DEMO_OUTPUTS = {
    "download": ("data/slimpajama/zst", "download"),
    "extract": ("data/slimpajama/jsonl", "extract"),
    "concat": ("data/slimpajama/train", "concat"),
    "tokenize-preprocess": ("data/slimpajama/preprocessed", "preprocess"),
}


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` by relative path, but the completion records (they hold times and hosts), the
    workspace's own `.bcp-pipeline` folder (the BCP code upload) and `results/` (the pretrain's, where it ran)."""
    files = {p.relative_to(root): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {
        str(rel): p.read_bytes()
        for rel, p in files.items()
        if ".completions" not in rel.parts and ".bcp-pipeline" not in rel.parts and rel.parts[0] != "results"
    }


def demo_config(
    root: Path, backends: dict, stage_sections: dict[str, dict] | None = None, *, pretrain: bool = False
) -> Path:
    """The bundled demo (its data stages; with `pretrain`, its pretrain stage too) in a project of its own, with
    these backend options and these extra sections per stage ({stage: {backend: {...}}})."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    # The evaluate stage runs beside the training with a torch process of its own: its streamed edge is
    # tests/engine/test_evaluate_stream.py's (local backend); here it would only add that cost on every backend.
    del demo["stages"]["evaluate"]
    if not pretrain:
        without_training(demo["stages"])
    for stage, sections in (stage_sections or {}).items():
        for backend, section in sections.items():
            demo["stages"][stage][backend] = {**(demo["stages"][stage].get(backend) or {}), **section}
    raw = {
        "version": raw.get("version", 1),
        "stages_dir": str(REPO / "stages"),
        "backends": {**(raw.get("backends") or {}), **backends},
        "pipelines": {"demo": demo},
    }
    root.mkdir(parents=True, exist_ok=True)
    config = root / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def streamed(config: Path) -> Path:
    """The demo project's data stages as demo-fast has them: no extract or concat; tokenize-preprocess reads the
    shards in groups of 4 (concat's groups, so its .bin/.idx are the demo's), streamed from the download."""
    raw = yaml.safe_load(config.read_text())
    stages = raw["pipelines"]["demo"]["stages"]
    del stages["extract"], stages["concat"]
    tokenize = stages["tokenize-preprocess"]
    tokenize["args"] = [
        "--in",
        "${data}/zst",
        "--files-per-output",
        "4",
        *[a for a in tokenize["args"] if a != "${data}/train" and a != "--in"],
    ]
    tokenize["needs"] = [{"stage": "download", "stream": True}, "bpe"]
    tokenize["verify"] = [
        {"glob": check["glob"], "expect_from": "download", "group": 4} for check in tokenize["verify"]
    ]
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def ranks_of(folder: Path, program_stage: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((folder / ".completions").glob(f"{program_stage}-*.json"))]


def with_copies_of_the_first_stage(config: Path, count: int) -> list[str]:
    """Add stages `first2`... to the project's chain: copies of `first` (its sections for every backend), each
    writing to a folder of its own and needing nothing. Returns `first` and the copies. (A stage's new job ends an
    earlier unfinished one on Kubernetes, so a poll of many jobs at once takes one job of each of many stages.)"""
    raw = yaml.safe_load(config.read_text())
    stages = raw["pipelines"]["chain"]["stages"]
    names = ["first", *(f"first{k}" for k in range(2, count + 1))]
    for name in names[1:]:
        args = [arg.replace("/first", f"/{name}") for arg in stages["first"]["args"]]
        stages[name] = {
            **stages["first"],
            "args": args,
            "verify": [{"glob": f"${{workspace}}/{name}/item-*.txt", "expect": "${count}"}],
        }
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return names


def stage_job_of(config: Path, stage: str) -> str | None:
    """The id of the stage's latest stage job as the run's state file records it (None before it does)."""
    states = sorted((config.parent / ".bcp-pipeline/runs").glob("*/state.json"))
    try:
        jobs = json.loads(states[-1].read_text())["stages"][stage]["jobs"] if states else []
    except (ValueError, KeyError):
        return None
    jobs = [job for job in jobs if job["kind"] == "stage"]
    return jobs[-1]["job_id"] if jobs else None


def processes_started_by(call: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """`call()`'s result and the names of the programs it started (every subprocess this process started)."""
    started: list[str] = []
    real_init = subprocess.Popen.__init__

    def counting_init(self, args, *rest, **kwargs):
        started.append(Path(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0])).name)
        real_init(self, args, *rest, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", counting_init)
        result = call()
    return result, started


class Driver:
    """What the scenario needs of one backend. The job records and states come from the backend's own view (not
    the run's state file, which is what is being tested)."""

    name: str
    # States of a job that is alive mid-stage, as `native_state` reads them.
    live: frozenset[str]
    # Calls of a poll cycle that ask for jobs' states, whatever their number (0: no scheduler to ask).
    status_calls_per_poll = 1
    # `run demo` options of this backend's demo run.
    demo_run_args: tuple[str, ...] = ()

    def chain_project(self, root: Path) -> Path:
        raise NotImplementedError

    def chain_workspace(self, config: Path) -> Path:
        return config.parent / "ws" / "main"

    def stall(self, config: Path, stage: str) -> Callable[[], None]:
        """Keep the stage's job alive and unfinished until the returned function is called."""
        return stall_stage(self.chain_workspace(config), stage).unlink

    def native_state(self, config: Path, job_id: str) -> str | None:
        raise NotImplementedError

    def jobs(self, config: Path, run_id: str) -> dict[str, list[str]]:
        """The run's jobs the backend knows, by `STAGE` or `STAGE.verify`: their ids, oldest first."""
        raise NotImplementedError

    def demo_project(self, root: Path) -> Path:
        raise NotImplementedError

    def demo_workspace(self, config: Path) -> Path:
        return config.parent / ".bcp-pipeline" / "workspaces" / "demo"

    def check_demo(self, config: Path, state: RunState, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
        """What else this backend must show of the demo's run (where its ranks ran, ...)."""

    def count_status_calls(self, poll: Callable[[], dict], monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict]:
        """`poll()`'s statuses and the calls it made: {"status": calls asking for jobs' states, "all": every call}."""
        raise NotImplementedError

    def submit_stalled(self, config: Path, run_id: str, stages: list[str]) -> tuple[Any, list[str]]:
        """A job of each of these stages of one run, submitted by the backend itself (kept unfinished: `stall`)."""
        loaded = load_config(config)
        pipeline = loaded.pipeline("chain")
        backend = make_backend(self.name, loaded, pipeline, config.parent / ".bcp-pipeline" / "runs" / run_id)
        ids = [
            backend.submit(
                backend.render(
                    JobRequest(
                        run_id=run_id,
                        pipeline=pipeline,
                        stage=stage,
                        kind="stage",
                        program=stage.program,
                        args=tuple(stage.args),
                    )
                )
            )
            for stage in (pipeline.stages[name] for name in stages)
        ]
        return backend, ids

    def check_poll(self, calls: dict[int, dict], statuses: dict[int, dict]) -> None:
        """What else this backend must show of its polls."""


class CommandDriver(Driver):
    """A backend whose scheduler is asked through commands (squeue, qstat, ...): a status call is one of them."""

    status_commands: frozenset[str]

    def count_status_calls(self, poll, monkeypatch):
        statuses, started = processes_started_by(poll, monkeypatch)
        return statuses, {
            "status": sum(name in self.status_commands for name in started),
            "all": len(started),
            "programs": started,
        }


class LocalDriver(Driver):
    name = "local"
    live = frozenset({"running"})
    status_calls_per_poll = 0

    def chain_project(self, root):
        return write_chain_project(root)

    def _job_dirs(self, config: Path) -> list[Path]:
        return sorted(p for run in (config.parent / ".bcp-pipeline/runs").glob("*/jobs") for p in run.iterdir())

    def native_state(self, config, job_id):
        for job in self._job_dirs(config):
            if job.name == job_id and (job / "status.json").is_file():
                try:
                    return json.loads((job / "status.json").read_text())["state"]
                except ValueError:
                    return None
        return None

    def jobs(self, config, run_id):
        found: dict[str, list[str]] = {}
        for job in (config.parent / ".bcp-pipeline/runs" / run_id / "jobs").iterdir():
            found.setdefault(job.name.rsplit(".", 1)[0], []).append(job.name)  # second.verify.1 -> second.verify
        return {name: sorted(ids) for name, ids in found.items()}

    def demo_project(self, root):
        return demo_config(root, {})

    def count_status_calls(self, poll, monkeypatch):
        statuses, started = processes_started_by(poll, monkeypatch)
        return statuses, {"status": 0, "all": len(started), "programs": started}  # it reads status files


class BcpDriver(Driver):
    name = "bcp"
    live = frozenset({"QUEUED"})  # held queued by the emulator (`stall`)

    def __init__(self, fake) -> None:
        self.fake = fake

    def chain_project(self, root):
        return write_chain_project(root, bcp_chain_config(self.fake.transport))

    def chain_workspace(self, config):
        return self.fake.workspace_path("main")

    def stall(self, config, stage):
        self.fake.hold_queued(name=f"chain.{stage}", times=1)
        return self.fake.release

    def native_state(self, config, job_id):
        return self.fake.status(int(job_id)) if int(job_id) in self.fake.jobs() else None

    def jobs(self, config, run_id):
        found: dict[str, list[str]] = {}
        for name, jobs in jobs_by_stage(self.fake).items():  # chain.second, chain.second-verify
            key = name.split(".", 1)[1].replace("-verify", ".verify")
            found[key] = sorted((str(job["id"]) for job in jobs), key=int)
        return found

    def demo_project(self, root):
        self.fake.create_workspace("demo")
        return demo_config(
            root, {"bcp": {"transport": self.fake.transport, "poll_min_seconds": 0.1, "poll_max_seconds": 0.3}}
        )

    def demo_workspace(self, config):
        return self.fake.workspace_path("demo")

    def submit_stalled(self, config, run_id, stages):
        self.fake.hold_queued(times=None)  # keep every job queued: only status calls happen
        self.fake.set_page_size(2)  # and the list comes in pages, which NVIDIA's client follows
        backend, ids = super().submit_stalled(config, run_id, stages)
        for job_id in ids:
            self.fake.wait_for(int(job_id), {"QUEUED"})
        return backend, ids

    def count_status_calls(self, poll, monkeypatch):
        self.fake.clear_calls()
        statuses = poll()
        # Every call but the list's further pages (NVIDIA's client follows them: they grow with the jobs).
        if self.fake.transport == "cli":
            made = len(self.fake.calls())
        else:
            made = len(
                [
                    r
                    for r in self.fake.requests(path="/v2/*")
                    if not (r["path"].endswith("/jobs") and "page-number=" in r["query"])
                ]
            )
        return statuses, {
            "status": status_calls(self.fake),
            "all": made,
            "job info": len(self.fake.requests("GET", "/v2/org/*/jobs/*")),
            "list pages": len(self.fake.requests("GET", "/v2/org/*/jobs")),
        }

    def check_poll(self, calls, statuses):
        assert all(s.native == "QUEUED" for polled in statuses.values() for s in polled.values()), statuses
        assert calls[1]["job info"] == calls[6]["job info"] == 0  # no `job info`: the list had every job
        # 6 jobs in pages of 2, which NVIDIA's client fetches as pages 0-3 (its own page arithmetic).
        assert calls[6]["list pages"] == 4, calls


class SlurmDriver(CommandDriver):
    name = "slurm"
    live = frozenset({"RUNNING"})
    status_commands = frozenset({"squeue"})

    def chain_project(self, root):
        return write_chain_project(root, SLURM_CHAIN)

    def chain_workspace(self, config):
        return config.parent / SLURM_WORKSPACE_DIR / "main"

    @staticmethod
    def listed(run_id: str | None = None) -> list[tuple[str, str, str]]:
        """(id, name, state) of every job squeue lists (all states), those of the run when given."""
        out = subprocess.run(
            ["squeue", "--noheader", "--states=all", "--Format=JobID:|,Name:|,State:|"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = [tuple(line.split("|")[:3]) for line in out.splitlines()]
        return sorted((r for r in rows if run_id is None or r[1].startswith(run_id + ".")), key=lambda r: int(r[0]))

    def native_state(self, config, job_id):
        return next((state for listed_id, _, state in self.listed() if listed_id == job_id), None)

    def jobs(self, config, run_id):
        found: dict[str, list[str]] = {}
        for job_id, name, _ in self.listed(run_id):
            found.setdefault(name[len(run_id) + 1 :], []).append(job_id)
        return found

    demo_run_args = ("--set", "vars.steps=10")

    def demo_project(self, root):
        pytest.importorskip("torch", reason="the demo's pretrain needs torch (scripts/setup installs it)")
        return demo_config(root, {"slurm": {"poll_seconds": 0.2, "poll_max_seconds": 1.0}}, pretrain=True)

    def check_demo(self, config, state, capsys, tmp_path):
        # The whole demo ran on Slurm, its pretrain (10 steps) too: every job Slurm ran for it COMPLETED.
        assert state.stages["pretrain"].status is StageStatus.SUCCEEDED
        assert state.stages["download"].sharding == {"replicas": 1, "processes": 4}
        completed = {job_id for job_id, _, slurm_state in self.listed(state.run_id) if slurm_state == "COMPLETED"}
        assert {j.job_id for s in state.stages.values() for j in s.jobs} <= completed
        capsys.readouterr()
        assert cli(config, "status") == 0
        assert f"{state.stages['pretrain'].jobs[0].job_id}(COMPLETED)" in capsys.readouterr().out


class GridEngineDriver(CommandDriver):
    name = "gridengine"
    live = frozenset({"r"})
    status_commands = frozenset({"qstat"})
    OPTIONS = GE_OPTIONS
    SPREAD = DEMO_SPREAD  # the demo's data stages over both hosts as array jobs: (array tasks, ranks per task)

    def __init__(self, cell) -> None:
        self.cell = cell

    def chain_project(self, root):
        return write_chain_project(root, GE_CHAIN)

    @staticmethod
    def queued() -> list[tuple[str, str, str]]:
        """(job id, name, state) of every task qstat lists."""
        root = ElementTree.fromstring(
            subprocess.run(["qstat", "-u", "*", "-xml"], capture_output=True, text=True, check=True).stdout
        )
        return [
            (
                e.findtext("JB_job_number", "").strip(),
                e.findtext("JB_name", "").strip(),
                e.findtext("state", "").strip(),
            )
            for e in root.iter("job_list")
        ]

    @staticmethod
    def accounted(run_id: str) -> list[tuple[str, str]]:
        """(job id, name) of every finished task of the run, from Grid Engine's accounting (qacct)."""
        done = subprocess.run(["qacct", "-j"], capture_output=True, text=True)  # every job (an empty file: none)
        records = []
        for block in re.split(r"^=+$", done.stdout, flags=re.M):
            fields = dict(re.findall(r"^(\w+)\s+(.*?)\s*$", block, re.M))
            if fields.get("jobname", "").startswith(run_id + "."):
                records.append((fields["jobnumber"], fields["jobname"]))
        return records

    def native_state(self, config, job_id):
        return next((state for listed_id, _, state in self.queued() if listed_id == job_id), None)

    def jobs(self, config, run_id):
        seen = {(job_id, name) for job_id, name, _ in self.queued() if name.startswith(run_id + ".")}
        seen |= set(self.accounted(run_id))
        found: dict[str, list[str]] = {}
        for job_id, name in sorted(seen, key=lambda r: int(r[0])):
            found.setdefault(name[len(run_id) + 1 :], []).append(job_id)
        return found

    def demo_project(self, root):
        return demo_config(
            root,
            {"gridengine": self.OPTIONS},
            {
                stage: {"gridengine": {"nodes": nodes, "processes_per_node": per_node}}
                for stage, (nodes, per_node) in self.SPREAD.items()
            },
        )

    def check_demo(self, config, state, capsys, tmp_path):
        workspace = self.demo_workspace(config)
        for stage, (folder, program_stage) in DEMO_OUTPUTS.items():
            nodes, per_node = self.SPREAD[stage]
            assert state.stages[stage].sharding == {"replicas": nodes, "processes": per_node}
            ranks = ranks_of(workspace / folder, program_stage)
            assert [(r["rank"], r["world_size"]) for r in ranks] == [
                (rank, nodes * per_node) for rank in range(nodes * per_node)
            ]
            # Each array task is one node: its ranks share a host, and the tasks ran on both hosts.
            hosts = [r["ran_on"]["hostname"] for r in ranks]
            assert set(hosts) == set(self.cell.hosts), hosts
            assert all(len(set(hosts[t * per_node : (t + 1) * per_node])) == 1 for t in range(nodes))
        capsys.readouterr()
        assert cli(config, "status") == 0
        assert "tokenize-preprocess  succeeded" in capsys.readouterr().out
        download_job = [job for job in state.stages["download"].jobs if job.kind == "stage"][-1].job_id
        assert cli(config, "logs", state.run_id, "download") == 0
        logs = capsys.readouterr().out
        assert "rank-00003.log" in logs, logs
        report = tmp_path / "report.html"
        assert cli(config, "report", "--out", str(report)) == 0 and report.stat().st_size > 0
        assert (config.parent / ".bcp-pipeline/runs" / state.run_id / "logs" / download_job).is_dir()


K8S_NAMESPACE = "bcp-conformance"
K8S_SECRET = b"hf_secret_VALUE"
K8S_CLAIMS = itertools.count(1)  # a workspace claim (and its volume) per project, named by this session's count


class KubernetesDriver(Driver):
    name = "kubernetes"
    live = frozenset({"running"})
    SPREAD = DEMO_SPREAD  # the demo's data stages over both nodes: (pods, processes per pod)

    def __init__(self, cluster) -> None:
        from kubernetes import client

        self.cluster, self.client = cluster, client
        self.api = cluster.api()

    def claim(self, folder: Path) -> tuple[str, list[str]]:
        """A workspace claim of its own on `folder`, made as the docs' recipe makes it (`scripts/k8s-cluster
        workspace`: a hostPath PV both nodes see, as FSx would be); its name and the `--set` options printed."""
        name = f"{K8S_NAMESPACE}-{os.getpid()}-{next(K8S_CLAIMS)}"
        made = self.cluster.script("workspace", str(folder), "--name", name, "--namespace", K8S_NAMESPACE)
        assert made.returncode == 0, made.stderr
        assert f"claim {K8S_NAMESPACE}/{name} is Bound to {folder.resolve()}" in made.stderr, made.stderr
        claim = self.client.CoreV1Api(self.api).read_namespaced_persistent_volume_claim(name, K8S_NAMESPACE)
        assert claim.status.phase == "Bound" and claim.spec.access_modes == ["ReadWriteMany"]
        return name, shlex.split(made.stdout)

    def options(self, config: Path, folder: Path, **extra: Any) -> dict:
        return {
            "kubeconfig": str(self.cluster.kubeconfig),
            "namespace": K8S_NAMESPACE,
            "python": sys.executable,
            "workspace_claim": self.claim(folder)[0],
            "poll_seconds": 0.3,
            "poll_max_seconds": 1.0,
            **extra,
        }

    def chain_project(self, root):
        config = write_chain_project(root, K8S_CHAIN)
        raw = yaml.safe_load(config.read_text())
        raw["backends"]["kubernetes"] = self.options(
            config, root / "workspace", image="python:3.11", code_dir=str(config.parent / "stages")
        )
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        return config

    def chain_workspace(self, config):
        return config.parent / "workspace"

    def _jobs(self, run_id: str | None = None) -> list[Any]:
        from bcp_pipeline.backends.kubernetes.render import selector_labels

        selector = selector_labels(run_id) if run_id else "app.kubernetes.io/managed-by"
        return self.client.BatchV1Api(self.api).list_namespaced_job(K8S_NAMESPACE, label_selector=selector).items

    def native_state(self, config, job_id):
        """ "running" while one of the Job's pods runs, else its phase ("pending", "succeeded", ...)."""
        pods = (
            self.client.CoreV1Api(self.api)
            .list_namespaced_pod(K8S_NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job_id}")
            .items
        )
        phases = {p.status.phase.lower() for p in pods if p.metadata.deletion_timestamp is None}
        return "running" if "running" in phases else (sorted(phases)[0] if phases else None)

    def jobs(self, config, run_id):
        from bcp_pipeline.backends.kubernetes.render import LABEL_KIND, LABEL_STAGE

        found: dict[str, list[str]] = {}
        for job in sorted(self._jobs(run_id), key=lambda j: j.metadata.creation_timestamp):
            labels = job.metadata.labels
            key = labels[LABEL_STAGE] + (".verify" if labels[LABEL_KIND] == "verify" else "")
            found.setdefault(key, []).append(job.metadata.name)
        return found

    def demo_project(self, root):
        # The demo runs as docs/backends/kubernetes.md's recipe runs it: with the options `workspace` printed.
        _, self.demo_run_args = self.claim(root / "workspace")
        options = {"poll_seconds": 0.3, "poll_max_seconds": 1.0}
        sections = {
            stage: {"kubernetes": {"replicas": pods, "processes": processes}}
            for stage, (pods, processes) in self.SPREAD.items()
        }
        sections["download"]["kubernetes"]["secrets"] = ["hf-token:token:HF_TOKEN"]
        return demo_config(root, {"kubernetes": options}, sections)

    def demo_workspace(self, config):
        return config.parent / "workspace"

    def check_demo(self, config, state, capsys, tmp_path):
        nodes = {
            n.metadata.name: next(a.address for a in n.status.addresses if a.type == "InternalIP")
            for n in self.client.CoreV1Api(self.api).list_node().items
        }
        for stage, (folder, program_stage) in DEMO_OUTPUTS.items():
            pods, processes = self.SPREAD[stage]
            assert state.stages[stage].sharding == {"replicas": pods, "processes": processes}
            ranks = ranks_of(self.demo_workspace(config) / folder, program_stage)
            world = pods * processes
            assert [(r["rank"], r["world_size"]) for r in ranks] == [(rank, world) for rank in range(world)]
            used = {address for r in ranks for address in r["ran_on"]["addresses"]}
            assert used == set(nodes.values()), f"{stage} ran on {used}, not on both nodes {nodes}"
            assert state.stages[stage].verification["ok"]
        capsys.readouterr()
        assert cli(config, "status") == 0
        shown = capsys.readouterr().out  # each Job by its name less RUN-STAGE (the table fits a terminal), and the key
        job = state.stages["download"].jobs[-1].job_id
        assert job == f"{state.run_id}-download-verify-a1" and "download-verify-a1" not in shown, shown
        assert "-verify-a1*(" in next(line for line in shown.splitlines() if line.startswith("download "))
        assert f"-X = job {state.run_id}-STAGE-X" in shown
        assert cli(config, "logs", state.run_id, "concat", "--rank", "1") == 0
        assert '"rank": 1' in capsys.readouterr().out  # rank 1's pod log, through pods/log
        for path in (config.parent / ".bcp-pipeline").rglob("*"):  # state, plan records, logs: the secret is only
            if path.is_file():  # ever named, never copied
                assert K8S_SECRET not in path.read_bytes(), path

    def count_status_calls(self, poll, monkeypatch):
        calls: list[tuple[str, str]] = []
        real = self.client.ApiClient.call_api

        def counting(api, resource_path, method, *args, **kwargs):
            calls.append((method, resource_path))
            return real(api, resource_path, method, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(self.client.ApiClient, "call_api", counting)
            statuses = poll()
        listed_jobs = [c for c in calls if c == ("GET", "/apis/batch/v1/namespaces/{namespace}/jobs")]
        return statuses, {"status": len(listed_jobs), "all": len(calls), "requests": calls}


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The demo's data stages run on the local backend: the bytes every backend must give."""
    config = LocalDriver().demo_project(tmp_path_factory.mktemp("local-demo") / "p")
    assert cli(config, "run", "demo", "--backend", "local") == 0
    return tree(config.parent / ".bcp-pipeline/workspaces/demo")


@pytest.fixture(scope="module")
def local_chain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The chain pipeline run on the local backend, uninterrupted: the outputs a resumed run must end with (every
    backend's chain has its sharding, so its items say the same ranks)."""
    config = write_chain_project(tmp_path_factory.mktemp("local-chain") / "p", CHAIN_CONFIG)
    assert cli(config, "run", "chain", "--backend", "local") == 0
    return tree(config.parent / "ws" / "main")


class Conformance:
    """The scenario (see the module's docstring); a subclass per backend gives the `driver` fixture."""

    def test_the_demo_s_data_stages_give_the_local_run_s_bytes(
        self, driver: Driver, local_demo: dict, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        config = driver.demo_project(tmp_path / "p")
        assert cli(config, "run", "demo", "--backend", driver.name, *driver.demo_run_args) == 0, capsys.readouterr().out
        state = latest(config)
        assert state.backend == driver.name
        assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
        assert tree(driver.demo_workspace(config)) == local_demo
        capsys.readouterr()
        assert cli(config, "status") == 0
        shown = capsys.readouterr().out
        assert f"backend {driver.name}" in shown and all(f"{stage}  " in shown for stage in DATA_STAGES), shown
        assert cli(config, "logs", state.run_id, "concat") == 0
        driver.check_demo(config, state, capsys, tmp_path)

    def test_a_streamed_edge_tokenizes_beside_the_download_and_gives_the_local_bytes(
        self, driver: Driver, local_demo: dict, tmp_path: Path, capsys: pytest.CaptureFixture
    ) -> None:
        """The demo's data as demo-fast prepares it: tokenize-preprocess straight from the shards, on a streamed
        edge from the download (two jobs at once on the backend); the same .bin/.idx as the local demo."""
        config = streamed(driver.demo_project(tmp_path / "p"))
        assert cli(config, "run", "demo", "--backend", driver.name, *driver.demo_run_args) == 0, capsys.readouterr().out
        state = latest(config)
        assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
        download, tokenize = state.stages["download"], state.stages["tokenize-preprocess"]
        assert tokenize.jobs[0].submitted_at < download.finished_at, "submitted while the download was not done"
        assert tokenize.jobs[-1].kind == "verify" and tokenize.jobs[-1].submitted_at >= download.finished_at
        made = {
            name: data
            for name, data in tree(driver.demo_workspace(config)).items()
            if name.startswith("data/slimpajama/preprocessed/") and name.endswith((".bin", ".idx"))
        }
        assert made and made == {name: data for name, data in local_demo.items() if name in made}

    @pytest.mark.both_transports
    def test_sigkilled_orchestrator_resumes_without_duplicate_jobs(
        self, driver: Driver, local_chain: dict, tmp_path: Path
    ) -> None:
        config = driver.chain_project(tmp_path / "p")
        release = driver.stall(config, "second")
        orchestrator = start_orchestrator(config, "run", "chain", "--backend", driver.name)
        try:
            job_id = wait_for(
                lambda: (
                    (job := stage_job_of(config, "second")) and driver.native_state(config, job) in driver.live and job
                ),
                timeout=120,
                what="stage second's job alive",
            )
            orchestrator.kill()  # SIGKILL: no cleanup at all
            orchestrator.wait()
            run_id = latest(config).run_id
            time.sleep(0.5)
            assert driver.native_state(config, job_id) in driver.live  # the job outlived its orchestrator

            resumed = start_orchestrator(config, "resume")
            time.sleep(1.5)
            assert resumed.poll() is None  # re-attached and waiting on the live job, not failing
            assert driver.jobs(config, run_id)["second"] == [job_id]  # not submitted again
            release()
            output, _ = resumed.communicate(timeout=180)
            assert resumed.returncode == 0, output
        finally:
            for process in (orchestrator, locals().get("resumed")):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.communicate(timeout=30)
        state = latest(config)
        assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
        assert state.stages["second"].attempts == 1

        # One job for each stage and each verification, in the backend's own records (accounting may lag).
        def every_job_listed() -> dict | None:
            found = driver.jobs(config, run_id)
            return found if len(found) == len(CHAIN_JOBS) else None

        jobs = wait_for(every_job_listed, timeout=30, what="every job of the run listed")
        assert {name: len(ids) for name, ids in jobs.items()} == {name: 1 for name in CHAIN_JOBS}, jobs
        assert jobs["second"] == [job_id]
        assert tree(driver.chain_workspace(config)) == local_chain

    @pytest.mark.both_transports
    def test_a_poll_cycle_makes_one_status_call_whatever_the_number_of_jobs(
        self, driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        config = driver.chain_project(tmp_path / "p")
        stages = with_copies_of_the_first_stage(config, 6)
        releases = [driver.stall(config, stage) for stage in stages]
        calls, statuses = {}, {}
        backends = []
        try:
            for count in (1, 6):
                backend, ids = driver.submit_stalled(config, f"chain-poll-{count}", stages[:count])
                backends.append((backend, ids))

                def poll(backend=backend, ids=ids):
                    return backend.poll(ids)

                wait_for(
                    lambda poll=poll, count=count: len(poll()) == count, timeout=60, what=f"the {count} job(s) listed"
                )
                statuses[count], calls[count] = driver.count_status_calls(poll, monkeypatch)
                assert set(statuses[count]) == set(ids), statuses[count]
                assert not any(s.state.finished for s in statuses[count].values()), statuses[count]
            assert {count: c["status"] for count, c in calls.items()} == {
                1: driver.status_calls_per_poll,
                6: driver.status_calls_per_poll,
            }, calls
            driver.check_poll(calls, statuses)
            # Nothing else a poll asks grows with the jobs either.
            assert calls[1]["all"] == calls[6]["all"], calls
        finally:
            for backend, ids in backends:
                backend.cancel(ids)
            for release in releases:
                release()


class TestLocal(Conformance):
    @pytest.fixture
    def driver(self) -> LocalDriver:
        return LocalDriver()


@needs_ngcsdk
class TestBcp(Conformance):
    @pytest.fixture
    def driver(self, fake) -> BcpDriver:
        return BcpDriver(fake)


class TestSlurm(Conformance):
    @pytest.fixture
    def driver(self, slurm_cluster) -> SlurmDriver:
        return SlurmDriver()


class TestGridEngine(Conformance):
    @pytest.fixture
    def driver(self, sge_cell) -> GridEngineDriver:
        return GridEngineDriver(sge_cell)


@pytest.fixture(scope="module")
def k8s_namespace(k8s_cluster) -> Iterator[str]:
    """This module's namespace on the test cluster, with the Secret the demo's download names."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_cluster.api())
    core.create_namespace({"metadata": {"name": K8S_NAMESPACE}})
    core.create_namespaced_secret(
        K8S_NAMESPACE, {"metadata": {"name": "hf-token"}, "data": {"token": base64.b64encode(K8S_SECRET).decode()}}
    )
    yield K8S_NAMESPACE


class TestKubernetes(Conformance):
    @pytest.fixture
    def driver(self, k8s_cluster, k8s_namespace) -> KubernetesDriver:
        pytest.importorskip("kubernetes")
        return KubernetesDriver(k8s_cluster)
