"""Every node and process count has an upper bound, refused at load at its line or --set (issue 50, item 1): a
local job by this machine's cores (or `backends.local.max_processes`), a BCP replica by its instance's cores, any
job by MAX_RANKS. Before, `local: {replicas: 100000}` forked ranks without end and `bcp.replicas: 10^20` planned a
download of 0 s."""

from __future__ import annotations

import pytest
from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, REPO, write_chain_project

from bcp_pipeline.config.bounds import MAX_PER_NODE, MAX_RANKS, PROCESSES_PER_CORE, usable_cores
from bcp_pipeline.config.load import load_config
from bcp_pipeline.errors import ConfigError

BUNDLED = REPO / "pipelines.yaml"


def refusal(tmp_path, text: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write_chain_project(tmp_path, text), overrides=overrides, pipeline="chain")
    return str(info.value)


def line_of(text: str, snippet: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if snippet in line)


@pytest.mark.parametrize("count", ["100000", "99999999999999999999999"])
def test_a_local_count_past_any_job_is_refused_at_its_line(tmp_path, count):
    text = CHAIN_CONFIG.replace("local: {replicas: 2, processes: 1}", f"local: {{replicas: {count}, processes: 1}}")
    message = refusal(tmp_path, text)
    assert message.startswith(
        f"{tmp_path / 'pipelines.yaml'}:{line_of(text, count)}: pipelines.chain.stages.first.local.replicas: "
    ), message
    assert f"{int(count):,} is more than any job can hold: at most {MAX_RANKS:,}" in message


def test_a_huge_bcp_replica_count_from_a_set_names_the_set(tmp_path):
    message = refusal(tmp_path, CHAIN_CONFIG, ["first.bcp.replicas=99999999999999999999"])
    assert message.startswith(
        "--set first.bcp.replicas=99999999999999999999: pipelines.chain.stages.first.bcp."
        "replicas: 99,999,999,999,999,999,999 is more than any job can hold"
    ), message


def test_a_local_job_wider_than_this_machine_is_let_start_is_refused_and_the_override_raises_the_bound(tmp_path):
    most = PROCESSES_PER_CORE * usable_cores()
    text = CHAIN_CONFIG.replace("local: {replicas: 1, processes: 3}", f"local: {{replicas: 1, processes: {most + 1}}}")
    message = refusal(tmp_path, text)
    assert message.startswith(
        f"{tmp_path / 'pipelines.yaml'}:{line_of(text, f'processes: {most + 1}')}: "
        "pipelines.chain.stages.second.local.processes: "
    ), message
    assert (
        f"1 replica(s) x {most + 1} process(es) = {most + 1} local processes, more than this machine is let "
        f"start: at most {most} ({PROCESSES_PER_CORE} per usable core x {usable_cores()} core(s)); start fewer, "
        f"or where this machine takes more, raise the bound: --set backends.local.max_processes={most + 1}"
    ) in message
    config = load_config(tmp_path / "pipelines.yaml", overrides=[f"backends.local.max_processes={most + 1}"])
    assert config.pipeline("chain").stages["second"].local.processes == most + 1


def test_backends_local_max_processes_bounds_the_verification_jobs_too_and_is_itself_bounded(tmp_path):
    text = CHAIN_CONFIG.replace(
        "  local: {workspace_dir: ws, poll_seconds: 0.05}",
        "  local: {workspace_dir: ws, poll_seconds: 0.05, max_processes: 2}",
    )
    message = refusal(tmp_path, text)  # the second stage's 1 x 3
    assert "pipelines.chain.stages.second.local.processes: 1 replica(s) x 3 process(es) = 3 local processes" in message
    assert "at most 2 (backends.local.max_processes)" in message
    text = text.replace("local: {replicas: 1, processes: 3}", "local: {replicas: 1, processes: 2}").replace(
        "    stages:\n", "    verification: {local: {replicas: 3}}\n    stages:\n", 1
    )
    message = refusal(tmp_path, text)
    assert f":{line_of(text, 'verification:')}: pipelines.chain.verification.local.replicas: 3 replica(s)" in message
    message = refusal(tmp_path, CHAIN_CONFIG, ["backends.local.max_processes=100000"])
    assert message == (
        "--set backends.local.max_processes=100000: backends.local.max_processes: max_processes "
        f"must be 1..{MAX_RANKS:,}, got 100,000"
    )


def test_a_bcp_replica_s_processes_are_bounded_by_its_instance_s_cores(tmp_path):
    text = CHAIN_CONFIG.replace(
        "    stages:\n", "    defaults:\n      bcp: {instance: dgxa100.80g.1.norm}\n    stages:\n", 1
    )
    message = refusal(tmp_path, text, ["second.bcp.processes=129"])
    assert message == (
        "--set second.bcp.processes=129: pipelines.chain.stages.second.bcp.processes: 129 processes on "
        "one dgxa100.80g.1.norm replica, which has 16 cores: at most 128 (8 per core)"
    )
    assert load_config(tmp_path / "pipelines.yaml", overrides=["second.bcp.processes=128"], pipeline="chain")


def test_a_job_of_more_ranks_than_any_job_holds_is_refused_on_every_backend(tmp_path):
    message = refusal(tmp_path, CHAIN_CONFIG, ["first.slurm.nodes=1000", "first.slurm.ntasks_per_node=100"])
    assert message == (
        "--set first.slurm.nodes=1000: pipelines.chain.stages.first.slurm.nodes: 1,000 node(s) x 100 "
        f"process(es) = 100,000 ranks is more than any job can hold: at most {MAX_RANKS:,}"
    )
    message = refusal(tmp_path, CHAIN_CONFIG, [f"first.kubernetes.processes={MAX_PER_NODE + 1}"])
    assert message.endswith(
        f"kubernetes.processes: {MAX_PER_NODE + 1:,} is more than any job can hold: at most "
        f"{MAX_PER_NODE:,} processes on one node"
    ), message


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "demo", "--set", "download.local.replicas=100000"],
        ["plan", "demo", "--backend", "bcp", "--set", "download.bcp.replicas=99999999999999999999"],
    ],
)
def test_plan_refuses_a_count_past_the_bound_in_one_line_and_never_prints_its_world_size(capsys, argv):
    assert cli(BUNDLED, *argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"bcp-pipeline: error: --set {argv[-1]}: pipelines.demo.stages.download."), (
        captured.err
    )
    assert captured.err.count("\n") == 1 and "WORLD_SIZE" not in captured.out and "0s" not in captured.out
