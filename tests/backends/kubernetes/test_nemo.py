"""A `nemo:` pretrain on the Kubernetes backend without a cluster (backends/kubernetes/nemo_pod.py): the golden
manifest of slimpajama-8b's pretrain, the launcher's overrides and the GPU request in it, the PyTorchJob form, the
layout checks at load, and the pod script RUN by bash as two pods (the real launcher stand-in composes; torchrun
is a recording stand-in), so what is asserted is what each pod executes. The real cluster:
tests/e2e/test_kubernetes_nemo_pretrain.py."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.golden_files import REPO, assert_golden, normalize
from support.nemo_project import fabricate_nemo_data, nemo_pipelines_yaml

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.kubernetes.backend import KubernetesBackend
from bcp_pipeline.backends.kubernetes.nemo_pod import COMPOSED_MARK
from bcp_pipeline.backends.kubernetes.render import MASTER_LAST, TIME_LIMITER, manifests
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.errors import ConfigError

pytest.importorskip("kubernetes")

TRAINER = "/opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py"


def pod_command(container: dict) -> list[str]:
    """The pod's own command, inside the time limit's timer (render.time_limited) where the stage has one, and
    inside a PyTorchJob's MASTER_LAST (master_last.sh)."""
    command = container["command"]
    command = command[5:] if command[:4] == ["bash", "-c", TIME_LIMITER, "bcp-pipeline-time-limit"] else command
    return command[8:] if command[:4] == ["bash", "-c", MASTER_LAST, "bcp-pipeline-master-last"] else command


def nemo_request(
    *overrides: str, config_file: Path = REPO / "pipelines.yaml", pipeline: str = "slimpajama-8b"
) -> tuple[KubernetesBackend, JobRequest]:
    config = load_and_check(config_file, overrides=list(overrides), pipeline=pipeline)
    chosen = config.pipeline(pipeline)
    backend = KubernetesBackend(
        config.options["kubernetes"],
        config_dir=config_file.parent,
        stages_dir=config.stages_dir,
        run_dir=config_file.parent / ".bcp-pipeline/runs/x",
        workspace_name=chosen.workspace.name,
    )
    requests = planned_requests(chosen, f"{pipeline}-RUN")
    return backend, next(r for r in requests if r.stage.name == "pretrain" and r.kind == "stage")


def pod_of(obj: dict) -> dict:
    """The pod spec of a Job, or of a PyTorchJob's Master."""
    if obj["kind"] == "Job":
        return obj["spec"]["template"]["spec"]
    return obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


def launcher_overrides(script: str) -> dict[str, str]:
    """The launcher's overrides as the pod script's bash array holds them (the data list's lines, read from its file
    with mapfile, left out)."""
    block = script.split("overrides=(\n", 1)[1].split("\n  )\n", 1)[0]
    words = [shlex.split(line)[0] for line in block.splitlines() if '"${data_list[@]}"' not in line]
    return dict(word.split("=", 1) for word in words)


def test_the_nemo_pretrain_manifest_golden() -> None:
    backend, request = nemo_request()
    assert_golden("kubernetes/nemo-pretrain.yaml", normalize(backend.render(request).printable))


def test_each_pod_asks_for_its_gpus_and_runs_torchrun_of_nemo_s_script_with_the_composed_config() -> None:
    backend, request = nemo_request()
    service, job = manifests(request, backend.options)
    assert service["kind"] == "Service" and job["spec"]["completions"] == job["spec"]["parallelism"] == 8
    pod = pod_of(job)
    container = pod["containers"][0]
    assert container["resources"] == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]  # NCCL's shared memory
    assert job["spec"]["podFailurePolicy"]["rules"][0]["action"] == "FailJob"  # 8 pods meet: stand or fall together
    command, script = pod_command(container)[:2], pod_command(container)[2]
    assert command == ["bash", "-c"] and subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert container["args"] == [
        TRAINER,
        "--config-path=/mount_workspace/results/gpt_8b-slimpajama-8b-RUN",
        "--config-name=gpt_8b-slimpajama-8b-RUN_hydra.yaml",
    ]
    # The launcher in its debug mode, with config/nemo.py's overrides for 8 pods x 8 GPUs.
    assert "NEMO_LAUNCHER_DEBUG=1 python3 /opt/NeMo-Megatron-Launcher/launcher_scripts/main.py" in script
    overrides = launcher_overrides(script)
    assert overrides["cluster_type"] == "bcp" and overrides["stages"] == "[training]"
    assert overrides["training.run.name"] == "gpt_8b-slimpajama-8b-RUN"  # this run's own: continuations resume it
    assert (overrides["training.trainer.num_nodes"], overrides["training.trainer.devices"]) == ("8", "8")
    assert overrides["+training.exp_manager.max_time_per_run"] == "4:23:15:00"  # 5 days minus the 45m margin
    # One torchrun a pod, a rank a GPU, at the index-0 pod (the same rendezvous as Megatron-Bridge's pods).
    assert script.rstrip().endswith(
        "exec python3 -m torch.distributed.run --nproc_per_node=8 --tee=3 --nnodes=8 "
        '--node_rank="$JOB_COMPLETION_INDEX" --master_addr="$MASTER_ADDR" '
        '--master_port="$MASTER_PORT" "$@"'
    )
    assert backend.render(request).rendezvous["WORLD_SIZE"] == 64


def test_as_a_pytorchjob_the_master_composes_and_torchrun_takes_the_operator_s_rendezvous() -> None:
    backend, request = nemo_request("pretrain.kubernetes.launcher=pytorchjob")
    (obj,) = manifests(request, backend.options)
    assert obj["kind"] == "PyTorchJob" and obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 7
    container = pod_of(obj)["containers"][0]
    script = pod_command(container)[2]
    assert container["name"] == "pytorch" and container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert 'node="$PET_NODE_RANK"' in script  # the operator's: 0 on the Master, 1.. on the Workers
    assert script.rstrip().endswith('exec python3 -m torch.distributed.run --nproc_per_node=8 --tee=3 "$@"')
    assert obj["spec"]["nprocPerNode"] == "8"


def test_the_pods_gpus_image_and_layout_come_from_the_kubernetes_section() -> None:
    backend, request = nemo_request(
        "pretrain.kubernetes.replicas=2",
        "pretrain.kubernetes.gpus=4",
        "pretrain.kubernetes.image=nvcr.io/nvidia/nemo:24.07",
    )
    _, job = manifests(request, backend.options)
    container = pod_of(job)["containers"][0]
    overrides = launcher_overrides(pod_command(container)[2])
    assert (overrides["training.trainer.num_nodes"], overrides["training.trainer.devices"]) == ("2", "4")
    assert overrides["launcher_scripts_path"] == "/opt/NeMo-Framework-Launcher/launcher_scripts"  # 24.07's folder
    assert container["image"] == "nvcr.io/nvidia/nemo:24.07"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_a_layout_or_image_the_nemo_launcher_cannot_train_is_refused_at_load() -> None:
    # gpt3/7b_improved at 23.11 has TP 4: 1 pod x 3 GPUs cannot split into model-parallel groups.
    with pytest.raises(ConfigError, match=r"stages.pretrain.*1 node\(s\) x 3 GPUs = 3 is not divisible by TP 4"):
        nemo_request("pretrain.kubernetes.replicas=1", "pretrain.kubernetes.gpus=3")
    with pytest.raises(ConfigError, match=r"kubernetes.image nvcr.io/nvidia/nemo:25.11 .* megatron_bridge"):
        nemo_request("pretrain.kubernetes.image=nvcr.io/nvidia/nemo:25.11")


def two_pod_project(mount: Path, python: Path) -> str:
    """The pipeline slimpajama-8b in 2 pods of 1 GPU, whose workspace mount is the folder `mount` here, so the
    rendered pod script runs on this machine as written, with `python` as the image's."""
    return nemo_pipelines_yaml(
        "kubernetes",
        f"{{code_dir: {REPO / 'stages'}, python: {python}}}",
        "{replicas: 2, gpus: 1}",
        pipeline="slimpajama-8b",
        workspace=f"{{name: main, mount: {mount}}}",
    )


# The image's python: the real one for the data list; as `-m torch.distributed.run`, a recording stand-in.
PYTHON = """#!/bin/sh
if [ "$1 $2" = "-m torch.distributed.run" ]; then
  printf '%s\\n' "$JOB_COMPLETION_INDEX $*" >> "$(dirname "$0")/torchrun.log"; exit 0
fi
exec {python} "$@"
"""


def run_pods(tmp_path: Path) -> tuple[Path, list[subprocess.CompletedProcess]]:
    mount = tmp_path / "ws"
    fabricate_nemo_data(mount / "data/preprocessed")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(PYTHON.format(python=sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    config = tmp_path / "pipelines.yaml"
    config.write_text(two_pod_project(mount, python))
    backend, request = nemo_request(config_file=config)
    _, job = manifests(request, backend.options)
    container = pod_of(job)["containers"][0]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MASTER_ADDR": "pod-0",
        "MASTER_PORT": "29500",
    }
    # Pod 1 starts first and must wait for pod 0's config of this attempt (an earlier attempt's mark is there).
    config_dir = Path(container["args"][1].split("=", 1)[1])
    config_dir.mkdir(parents=True)
    (config_dir / COMPOSED_MARK).write_text(f"{job['metadata']['name'].replace('-a1', '-a0')}\n")
    argv = [*container["command"], *container["args"]]
    second = subprocess.Popen(
        argv, env={**env, "JOB_COMPLETION_INDEX": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(3)
    assert second.poll() is None, second.communicate()  # still waiting
    assert not (python.parent / "torchrun.log").exists()
    first = subprocess.run(argv, env={**env, "JOB_COMPLETION_INDEX": "0"}, capture_output=True, text=True, timeout=120)
    out, err = second.communicate(timeout=30)
    return python.parent, [first, subprocess.CompletedProcess(argv, second.returncode, out, err)]


def test_two_pods_run_the_script_pod_0_composes_pod_1_waits_then_each_starts_torchrun(tmp_path: Path) -> None:
    bin_dir, (first, second) = run_pods(tmp_path)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    run = "gpt-slimpajama-8b-RUN"
    config_dir = tmp_path / "ws/results" / run
    composed = yaml.safe_load((config_dir / f"{run}_hydra.yaml").read_text())  # the launcher stand-in's, by hydra
    assert composed["trainer"]["num_nodes"] == 2 and composed["trainer"]["devices"] == 1
    assert composed["model"]["data"]["data_prefix"][1].endswith("train_chunk_0.jsonl_text_document")
    assert (config_dir / COMPOSED_MARK).read_text() == "slimpajama-8b-run-pretrain-a1\n"
    started = sorted((bin_dir / "torchrun.log").read_text().splitlines())
    assert [line.split()[0] for line in started] == ["0", "1"]  # one torchrun a pod, after the compose
    assert all(line.endswith(f"--config-path={config_dir} --config-name={run}_hydra.yaml") for line in started)


def test_a_pod_waits_no_longer_than_its_limit_for_a_first_pod_that_never_composes(tmp_path: Path) -> None:
    backend, request = nemo_request()
    script = pod_command(manifests(request, backend.options)[1]["spec"]["template"]["spec"]["containers"][0])[2]
    quick = script.replace("-ge 1800 ]", "-ge 2 ]").replace("mark=/mount_workspace", f"mark={tmp_path}")
    done = subprocess.run(
        ["bash", "-c", quick, "pod"],
        env={**os.environ, "JOB_COMPLETION_INDEX": "3"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "pod 3: the first pod composed no training config for job " in done.stderr


def test_processes_other_than_the_trainings_ranks_a_pod_are_refused_before_the_run() -> None:
    """A training engine runs one rank a GPU of its pod: `kubernetes.processes` can only say the same, else it would
    be silently overruled."""
    from bcp_pipeline.errors import SubmissionError

    def check(*overrides: str) -> None:
        config = load_and_check(REPO / "pipelines.yaml", overrides=list(overrides), pipeline="slimpajama-8b")
        pipeline = config.pipeline("slimpajama-8b")
        KubernetesBackend.check_limits(config, pipeline, planned_requests(pipeline, "r"))

    with pytest.raises(
        SubmissionError,
        match=r"stage pretrain.*kubernetes.processes is 4, but its nemo training "
        r"runs one rank a GPU, 8 a pod .*make it 8",
    ):
        check("pretrain.kubernetes.processes=4")
    check("pretrain.kubernetes.processes=8")  # the same as its GPUs: accepted
    check("pretrain.kubernetes.processes=2", "pretrain.kubernetes.gpus=2")
