"""`plan` on the BCP backend: golden command lines, and every one accepted by NVIDIA's own ngc parser."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest
from support import ngc_parser
from support.golden_files import REPO, assert_golden, normalize
from support.pipeline_fixtures import make_stages_dir

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.preflight import load_and_check

needs_parser = pytest.mark.skipif(
    not ngc_parser.available(), reason="ngcsdk[telemetry]==4.19.1 is not installed (pip install -e '.[test]')"
)


def plan(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", *args]) == 0
    return capsys.readouterr().out


def test_plan_slimpajama_8b_golden(capsys):
    assert_golden("bcp/plan-slimpajama-8b.txt", normalize(plan(capsys, "slimpajama-8b")))


def test_plan_slimpajama_126m_golden(capsys):
    assert_golden("bcp/plan-slimpajama-126m.txt", normalize(plan(capsys, "slimpajama-126m", "--backend", "bcp")))


def jobs_of(capsys, pipeline: str) -> list[dict]:
    return json.loads(plan(capsys, pipeline, "--backend", "bcp", "--json"))["jobs"]


@needs_parser
@pytest.mark.parametrize("pipeline", sorted(load_config(REPO / "pipelines.yaml").pipelines))
def test_every_bundled_command_passes_nvidias_parser(capsys, pipeline):
    config = load_and_check(REPO / "pipelines.yaml").pipeline(pipeline)  # as plan has it: derived stages filled in
    for job in jobs_of(capsys, pipeline):
        request = ngc_parser.job_create_request(job["argv"])
        stage = config.stages[job["stage"]]
        res = config.verification.bcp if job["kind"] == "verify" else stage.bcp
        assert request["name"] == job["name"]
        assert request["aceInstance"] == res.instance
        assert "nvcr.io/" + request["dockerImageName"] == res.image
        assert request.get("replicaCount", 1) == res.replicas
        if res.replicas > 1:
            assert request["arrayType"] == res.array_type
        assert request["workspaceMounts"] == [
            {"id": m.name, "containerMountPoint": m.mount, "mountMode": m.mode} for m in res.workspaces
        ]
        assert request["resultContainerMountPoint"] == res.result
        assert request["runPolicy"]["preemptClass"] == res.preempt
        if res.total_runtime:
            assert request["runPolicy"]["totalRuntimeSeconds"] == parse_duration(res.total_runtime)
        labels = request["userLabels"]
        assert f"bcpp_stage_{job['stage'].replace('-', '_')}" in labels and f"bcpp_kind_{job['kind']}" in labels
        assert request["command"] == job["argv"][job["argv"].index("--commandline") + 1]


@needs_parser
def test_guide_numbers_reach_the_job_request(capsys):
    jobs = {(j["stage"], j["kind"]): j for j in jobs_of(capsys, "slimpajama-8b")}
    download = ngc_parser.job_create_request(jobs[("download", "stage")]["argv"])
    assert (download["aceInstance"], download["replicaCount"], download["arrayType"]) == (
        "dgxa100.80g.8.norm",
        2,
        "PYTORCH",
    )
    assert download["runPolicy"] == {"preemptClass": "RUNONCE", "totalRuntimeSeconds": 36000}
    assert download["jobPriority"] == "NORMAL" and download["jobOrder"] == 50
    assert download["command"].startswith("bcprun --nnodes 2 --npernode 48 -no_redirect --cmd ")  # NVIDIA's spelling
    concat = ngc_parser.job_create_request(jobs[("concat", "stage")]["argv"])  # one node, 48 ranks: no bcprun
    assert "replicaCount" not in concat and concat["command"].startswith(
        "bash -c 'export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29500 + ${NGC_JOB_ID:-0} % 1000)); pids=(); "
        "for rank in $(seq 0 47)"
    )  # its ranks meet on the node's loopback
    assert "bcprun" not in concat["command"]
    verify = ngc_parser.job_create_request(jobs[("download", "verify")]["argv"])
    assert verify["aceInstance"] == "dgxa100.80g.1.norm" and "replicaCount" not in verify
    assert verify["workspaceMounts"][0]["mountMode"] == "RO"
    pretrain = ngc_parser.job_create_request(jobs[("pretrain", "stage")]["argv"])
    assert (pretrain["replicaCount"], pretrain["runPolicy"]["totalRuntimeSeconds"]) == (8, 5 * 86400)
    # One short line running the job's script, which `plan --json` carries beside the job (see test_nemo.py).
    [(path, script)] = jobs[("pretrain", "stage")]["files"].items()
    assert pretrain["command"] == f"bash /mount_workspace/{path} /mount_workspace /results"
    assert "NEMO_LAUNCHER_DEBUG=1 python3 /opt/NeMo-Megatron-Launcher/launcher_scripts/main.py" in script
    assert 'if [ "${NGC_ARRAY_INDEX:-0}" != 0 ]; then' in script  # replica 0 only
    assert '"training.trainer.num_nodes=${NGC_ARRAY_SIZE:-1}"' in script


ODD_CONFIG = """\
version: 1
stages_dir: stages
backends:
  local: {workspace_dir: "local ws", poll_seconds: 0.05}
pipelines:
  odd:
    workspace: {name: team.ws_2-b, mount: /mount_workspace}  # all BCP accepts besides letters and digits
    defaults:
      bcp: {image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.8.norm, total_runtime: 1h,
            workspaces: [{name: team.ws_2-b, mount: /mount_workspace, mode: RW}]}
    stages:
      write:
        program: items.py
        args: [--out, "${workspace}/it's here; rm -rf \\"x\\" $HOME", --count, "2", --name, "a b"]
        bcp: {replicas: 2, processes: 3, env: {NOTE: "a 'quoted' value; with spaces"}}
        verify:
          - {glob: "${workspace}/it's here; rm -rf \\"x\\" $HOME/item-*.txt", expect: 2}
"""


def odd_project(tmp_path):
    make_stages_dir(tmp_path)
    config = tmp_path / "pipelines.yaml"
    config.write_text(ODD_CONFIG)
    return config


def test_plan_quotes_names_with_spaces_quotes_and_semicolons(tmp_path, capsys):
    config = odd_project(tmp_path)
    capsys.readouterr()
    assert main(["--config", str(config), "plan", "odd", "--backend", "bcp"]) == 0
    text = capsys.readouterr().out
    assert_golden("bcp/plan-odd.txt", normalize(text, tmp_path))
    assert main(["--config", str(config), "plan", "odd", "--backend", "local"]) == 0
    assert_golden("local/plan-odd.txt", normalize(capsys.readouterr().out, tmp_path))
    # The printed ngc line is copy-pasteable: a shell splits it back into exactly the argv we would run.
    assert main(["--config", str(config), "plan", "odd", "--backend", "bcp", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    assert shlex.split(job["printable"]) == job["argv"]
    commandline = job["argv"][job["argv"].index("--commandline") + 1]
    bcprun = shlex.split(commandline)
    assert bcprun[:6] == ["bcprun", "--nnodes", "2", "--npernode", "3", "-no_redirect"]
    inner = shlex.split(bcprun[bcprun.index("--cmd") + 1])
    assert inner[-6:] == ["--out", '/mount_workspace/it\'s here; rm -rf "x" $HOME', "--count", "2", "--name", "a b"]
    assert "--env-var" in job["argv"] and "NOTE:a 'quoted' value; with spaces" in job["argv"]


def test_odd_names_run_on_the_local_backend(tmp_path):
    config = odd_project(tmp_path)
    assert main(["--config", str(config), "run", "odd"]) == 0
    out_dir = tmp_path / "local ws" / "team.ws_2-b" / 'it\'s here; rm -rf "x" $HOME'
    assert sorted(p.name for p in out_dir.glob("item-*.txt")) == ["item-0000.txt", "item-0001.txt"]


@needs_parser
def test_the_detached_driver_job_passes_nvidias_parser_with_the_key_only_as_a_secret(capsys, monkeypatch):
    monkeypatch.setenv("NGC_CLI_API_KEY", "canary-key-never-in-a-job-definition")
    monkeypatch.setenv("NGC_CLI_ORG", "my-org")
    monkeypatch.setenv("NGC_CLI_ACE", "my-ace")
    payload = json.loads(plan(capsys, "slimpajama-8b", "--backend", "bcp", "--json", "--detach"))
    driver = payload["driver"]
    assert "canary-key" not in json.dumps(payload)
    request = ngc_parser.job_create_request(driver["argv"])
    assert request["name"] == "slimpajama-8b.driver"
    assert request["aceInstance"] == "dgxa100.80g.1.norm"  # the pipeline's verification instance: its smallest
    assert request["userSecretsSpec"] == [
        {
            "name": "bcp-pipeline-ngc",
            "allKeys": False,
            "keysSpec": [{"keyName": "api_key", "envName": "NGC_CLI_API_KEY"}],
        }
    ]
    assert {"name": "NGC_CLI_ORG", "value": "my-org"} in request["envs"]
    assert {"name": "NGC_CLI_ACE", "value": "my-ace"} in request["envs"]
    assert request["runPolicy"]["totalRuntimeSeconds"] == 5 * 86400
    assert request["workspaceMounts"] == [
        {"id": "nemo-framework", "containerMountPoint": "/mount_workspace", "mountMode": "RW"}
    ]
    assert sorted(request["userLabels"]) == ["bcpp_kind_driver", "bcpp_run_slimpajama_8b_RUN"]
    assert "python3 -m bcp_pipeline.detach.driver --workspace-root /mount_workspace" in request["command"]
    assert "--hand-over-after 430200" in request["command"]  # 5 days less the 30-minute hand-over margin
    assert driver["upload"].startswith(
        "ngc workspace upload nemo-framework --source BUNDLE --destination .bcp-pipeline/runs/slimpajama-8b-RUN"
    )
    # The API cannot be reached here (tests/support/offline.py): plan tries the ACE twice, not run's whole back-off.
    assert payload["limits"]["checked"] is False and "failed 2 times" in payload["limits"]["reason"], payload["limits"]


def test_detach_needs_the_bcp_backend(capsys):
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", "demo", "--backend", "local", "--detach"]) == 2
    assert "--detach runs the orchestrator as a BCP job: it needs --backend bcp" in capsys.readouterr().err


def test_plan_detach_prints_the_driver_and_its_cost(capsys):
    text = plan(capsys, "slimpajama-8b", "--backend", "bcp", "--detach")
    assert "# --detach: the driver job, which submits everything below from inside BCP" in text
    assert "--secret bcp-pipeline-ngc:api_key:NGC_CLI_API_KEY" in text
    assert (
        "driver (--detach): 1 x dgxa100.80g.1.norm for the whole run: 473 node-hours, 473 GPU-hours, "
        "1.6 % of the run's GPU-hours" in text
    )


def test_one_node_ranks_start_without_bcprun(tmp_path):
    """A one-replica multi-process stage starts its ranks itself (bcprun may be missing from such a job): every
    rank runs the exact program and arguments, with RANK/WORLD_SIZE; the job fails with a failing rank's code."""
    from bcp_pipeline.backends.bcp.render import local_ranks
    from bcp_pipeline.backends.shared.command import shell_join

    odd = 'it\'s; $HOME "x"'
    program = shell_join(
        [
            "sh",
            "-c",
            'echo "$RANK/$WORLD_SIZE/$LOCAL_RANK $1" > "$2/rank-$RANK"; exit $((RANK == 1 ? 5 : 0))',
            "sh",
            odd,
            str(tmp_path),
        ]
    )
    done = subprocess.run(
        shlex.split(local_ranks(program, 3)),
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 5, done.stderr
    assert sorted(p.read_text() for p in tmp_path.glob("rank-*")) == [f"{r}/3/{r} {odd}\n" for r in range(3)]


def plan_json(capsys, *args: str) -> dict:
    return json.loads(plan(capsys, *args, "--json"))


def test_plan_shows_each_backends_rendezvous_from_the_one_rank_layout(capsys):
    """The node and process counts of a multi-rank stage come from config.resources.rank_layout on every backend:
    the job itself (srun's/bcprun's counts, the supervisor's), the recorded sharding, the rendezvous `plan` shows
    and the estimates agree, and a one-rank job shows no rendezvous."""
    sets = ["--set", "download.slurm.nodes=2", "--set", "download.bcp.replicas=3", "--set", "concat.bcp.processes=2"]
    local, slurm, bcp = (plan_json(capsys, "demo", "--backend", name, *sets) for name in ("local", "slurm", "bcp"))
    jobs = {
        name: {(j["stage"], j["kind"]): j for j in plan["jobs"]}
        for name, plan in (("local", local), ("slurm", slurm), ("bcp", bcp))
    }
    download = {name: by_stage[("download", "stage")] for name, by_stage in jobs.items()}
    assert download["local"]["rendezvous"] == {
        "MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": 4,
        "nodes": 2,
        "per_node": 2,
        "MASTER_PORT": download["local"]["rendezvous"]["MASTER_PORT"],
    }
    assert (download["local"]["replicas"], download["local"]["processes"]) == (2, 2)
    slurm_meet = download["slurm"]["rendezvous"]
    assert (slurm_meet["WORLD_SIZE"], slurm_meet["nodes"], slurm_meet["per_node"]) == (8, 2, 4)
    assert slurm_meet["MASTER_PORT"] == "$((20000 + SLURM_JOB_ID % 20000))"
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n" in download["slurm"]["printable"]
    assert (
        'export MASTER_ADDR="$(hostname)" MASTER_PORT="$((20000 + SLURM_JOB_ID % 20000))"'
        in download["slurm"]["printable"]
    )
    assert (download["slurm"]["replicas"], download["slurm"]["processes"]) == (2, 4)
    bcp_meet = download["bcp"]["rendezvous"]
    assert (bcp_meet["WORLD_SIZE"], bcp_meet["nodes"], bcp_meet["per_node"]) == (6, 3, 2)
    assert (
        download["bcp"]["spec"]["replicas"] == 3
        and "bcprun --nnodes 3 --npernode 2 " in download["bcp"]["spec"]["commandline"]
    )
    assert {s["stage"]: s["nodes"] for s in bcp["estimates"]["stages"]}["download"] == 3
    # One replica x 2 processes on BCP: the job's shell starts them, meeting on loopback.
    assert jobs["bcp"][("concat", "stage")]["rendezvous"]["MASTER_ADDR"] == "127.0.0.1"
    for name, by_stage in jobs.items():  # one-rank jobs: no rendezvous
        assert (
            "rendezvous" not in by_stage[("sample", "stage")] and "rendezvous" not in by_stage[("download", "verify")]
        ), name
    text = plan(capsys, "demo", "--backend", "slurm", *sets)
    assert (
        "# stage download (after sample)\n# rendezvous: MASTER_ADDR=$(hostname) of the job's first node (the "
        "batch script), MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)), WORLD_SIZE=8 (2 node(s) x 4)\n#!/bin/bash"
    ) in text


def test_a_stage_program_on_several_replicas_without_bcprun_is_refused(tmp_path, capsys):
    """`launcher: none` runs the commandline with no RANK/WORLD_SIZE: every replica would take all items as rank 0
    of 1 (or, if BCP runs the commandline on replica 0 only, just one would run). A NeMo stage starts its own."""
    config = tmp_path / "pipelines.yaml"
    config.write_text(
        (REPO / "pipelines.yaml").read_text().replace("stages_dir: stages\n", f"stages_dir: {REPO / 'stages'}\n", 1)
    )
    args = ["plan", "slimpajama-126m", "--backend", "bcp", "--config", str(config)]
    assert main([*args, "--set", "download.bcp.launcher=none"]) == 2
    error = capsys.readouterr().err
    assert "stage download: launcher none with replicas > 1 runs download.py with no rank variables" in error
    assert "`--set download.bcp.launcher=bcprun`" in error and "download.bcp" in error
    assert main([*args, "--set", "download.bcp.replicas=1", "--set", "download.bcp.launcher=none"]) == 0
    assert main(args) == 0  # its pretrain stage (NeMo) has launcher: none on 4 replicas
