"""pipelines.yaml validation: every invalid case names file, line and key with an actionable message."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.pipeline_fixtures import CHAIN_CONFIG, REPO, write_chain_project

from bcp_pipeline.config.durations import format_duration, parse_duration
from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.model import expected_count
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.errors import ConfigError


def load_text(tmp_path: Path, text: str, overrides: list[str] | None = None):
    config = write_chain_project(tmp_path, text)
    return load_config(config, overrides=overrides, pipeline="chain")


def line_no(text: str, snippet: str, occurrence: int = 1) -> int:
    """1-based line of the `occurrence`-th line containing `snippet`: tests name lines without counting by hand."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if snippet in line]
    return hits[occurrence - 1]


def error_of(tmp_path: Path, text: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text, overrides)
    return str(info.value)


def test_bundled_pipelines_load_with_the_guides_numbers():
    config = load_and_check(REPO / "pipelines.yaml")
    assert {"slimpajama-8b", "slimpajama-126m", "demo"} <= set(config.pipelines)
    big = config.pipeline("slimpajama-8b")
    assert big.order()[-1] == "pretrain"
    download = big.stages["download"].bcp
    assert (download.instance, download.replicas, download.processes) == ("dgxa100.80g.8.norm", 2, 48)
    assert download.image == "nvcr.io/nvaie/nemo-framework-training:23.11"
    assert [(m.name, m.mount, m.mode) for m in download.workspaces] == [("nemo-framework", "/mount_workspace", "RW")]
    assert (download.priority, download.order, download.preempt, download.result) == (
        "NORMAL",
        50,
        "RUNONCE",
        "/results",
    )
    assert parse_duration(download.total_runtime) == 10 * 3600
    assert big.stages["extract"].bcp.replicas == 2 and big.stages["tokenize-preprocess"].bcp.replicas == 2
    assert big.stages["concat"].bcp.replicas == 1
    assert "--files-per-output" in big.stages["concat"].args
    assert big.stages["pretrain"].bcp.replicas == 8
    assert parse_duration(big.stages["pretrain"].bcp.total_runtime) == 5 * 86400
    assert big.verification.bcp.instance == "dgxa100.80g.1.norm"
    counts = {name: [expected_count(big, name, c) for c in stage.verify] for name, stage in big.stages.items()}
    assert counts["download"] == [59166] and counts["extract"] == [59166]
    assert counts["concat"] == [74] and counts["tokenize-preprocess"] == [74, 74]
    small = config.pipeline("slimpajama-126m")
    assert small.stages["pretrain"].bcp.replicas == 4 and small.stages["pretrain"].nemo.model == "gpt3/126m"
    assert big.stages["pretrain"].nemo.model == "gpt3/7b_improved"
    # Continuation is derived from the NeMo section: checkpoints of the run, up to the model's max_steps.
    assert (
        big.stages["pretrain"].continuation.checkpoints == "${workspace}/results/gpt_8b-${run_id}/results/checkpoints"
    )
    assert big.stages["pretrain"].continuation.target_steps == 300000
    assert [expected_count(small, "concat", c) for c in small.stages["concat"].verify] == [8]
    fast = config.pipeline("slimpajama-8b-fast")
    assert fast.order() == [  # the held-out splits' small stages first (they need only the BPE files)
        "download-validation",
        "download-test",
        "bpe",
        "tokenize-validation",
        "tokenize-test",
        "download",
        "tokenize-preprocess",
        "pretrain",
    ]
    assert "--files-per-output" in fast.stages["tokenize-preprocess"].args
    checks = fast.stages["tokenize-preprocess"].verify
    assert [expected_count(fast, "tokenize-preprocess", c) for c in checks] == [74, 74]


def test_valid_chain_config_and_derived_counts(tmp_path):
    config = load_text(tmp_path, CHAIN_CONFIG)
    chain = config.pipeline("chain")
    assert chain.order() == ["first", "second", "third"]
    assert expected_count(chain, "second", chain.stages["second"].verify[0]) == 6
    assert expected_count(chain, "third", chain.stages["third"].verify[0]) == 3


def test_unknown_key_lists_valid_keys_with_line(tmp_path):
    text = CHAIN_CONFIG.replace("        needs: [first]\n", "        needz: [first]\n", 1)
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'needz')}:" in message
    assert "pipelines.chain.stages.second.needz" in message
    assert "unknown key 'needz'" in message and "valid keys: program, args, needs" in message


def test_unknown_backend_resource_key(tmp_path):
    text = CHAIN_CONFIG.replace("local: {replicas: 2, processes: 1}", "local: {replicas: 2, gpus: 1}")
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'gpus')}:" in message and "stages.first.local.gpus" in message
    assert "valid keys: replicas, processes" in message


def test_wrong_type(tmp_path):
    text = CHAIN_CONFIG.replace("local: {replicas: 1, processes: 3}", "local: {replicas: two}")
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'replicas: two')}:" in message and "stages.second.local.replicas" in message
    assert "expected an integer, got text two" in message


def test_unknown_needs(tmp_path):
    text = CHAIN_CONFIG.replace("needs: [second]", "needs: [secnod]")
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'secnod')}:" in message and "stages.third.needs[0]" in message
    assert "unknown stage 'secnod'" in message and "first, second, third" in message


def test_cycle(tmp_path):
    text = CHAIN_CONFIG.replace(
        "      first:\n        program", "      first:\n        needs: [third]\n        program"
    )
    message = error_of(tmp_path, text)
    assert "the stages form a cycle: first -> third -> second -> first" in message
    assert f"pipelines.yaml:{line_no(text, 'first:')}:" in message


def test_missing_program(tmp_path):
    text = CHAIN_CONFIG.replace(
        'program: items.py\n        args: [--out, "${workspace}/third"',
        'program: itemz.py\n        args: [--out, "${workspace}/third"',
    )
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'itemz.py')}:" in message and "stages.third.program" in message
    assert "'itemz.py' not found" in message


@pytest.mark.parametrize("bad", ["10x", "10", "h10", "0h"])
def test_bad_duration(tmp_path, bad):
    text = CHAIN_CONFIG.replace(
        "local: {replicas: 2, processes: 1}",
        f"local: {{replicas: 2, processes: 1}}\n        bcp: {{total_runtime: {bad}}}",
    )
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'total_runtime')}:" in message
    assert "stages.first.bcp.total_runtime" in message
    assert "e.g. 10h, 5D, 1h30m" in message or "zero" in message


@pytest.mark.parametrize(
    "text,seconds,canonical",
    [("10h", 36000, "10H"), ("5D", 432000, "5D"), ("1h30m", 5400, "1H30M"), ("45M", 2700, "45M")],
)
def test_durations_like_ngc(text, seconds, canonical):
    assert parse_duration(text) == seconds
    assert format_duration(seconds) == canonical


def test_bad_mount_mode(tmp_path):
    text = CHAIN_CONFIG.replace(
        "local: {replicas: 2, processes: 1}",
        "local: {replicas: 2, processes: 1}\n        bcp: {workspaces: [{name: ws, mount: /mnt, mode: rw}]}",
    )
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'mode: rw')}:" in message
    assert "stages.first.bcp.workspaces[0].mode" in message
    assert "'rw' is not one of 'RW', 'RO'" in message


def test_unknown_placeholder(tmp_path):
    message = error_of(tmp_path, CHAIN_CONFIG.replace('"${workspace}/third"', '"${workspace}/${thrid}"'))
    assert "unknown placeholder ${thrid}" in message and "stages.third.args" in message


def test_yaml_syntax_error_has_line(tmp_path):
    text = CHAIN_CONFIG.replace("description: three stages in a row", "description: three: stages")
    message = error_of(tmp_path, text)
    assert f"pipelines.yaml:{line_no(text, 'three: stages')}:" in message and "invalid YAML" in message


def test_duplicate_key_is_an_error(tmp_path):
    message = error_of(
        tmp_path, CHAIN_CONFIG.replace('    vars: {count: "6"}\n', '    vars: {count: "6"}\n    vars: {count: "7"}\n')
    )
    assert "duplicate key 'vars'" in message


def test_multi_replica_bcp_needs_total_runtime(tmp_path):
    text = CHAIN_CONFIG.replace(
        "local: {replicas: 2, processes: 1}", "local: {replicas: 2, processes: 1}\n        bcp: {replicas: 2}"
    )
    assert "needs total_runtime" in error_of(tmp_path, text)


def test_set_overrides_apply_and_errors_name_the_override(tmp_path):
    config = load_text(tmp_path, CHAIN_CONFIG, ["first.local.replicas=4", "vars.count=10", "second.bcp.order=7"])
    chain = config.pipeline("chain")
    assert chain.stages["first"].local.replicas == 4
    assert chain.stages["second"].bcp.order == 7
    assert expected_count(chain, "second", chain.stages["second"].verify[0]) == 10
    message = error_of(tmp_path, CHAIN_CONFIG, ["first.local.replicas=lots"])
    assert "--set first.local.replicas=lots" in message and "expected an integer" in message
    message = error_of(tmp_path, CHAIN_CONFIG, ["fist.local.replicas=2"])
    assert "no stage 'fist'" in message and "first, second, third" in message
    message = error_of(tmp_path, CHAIN_CONFIG, ["first.local.replicas"])
    assert "expected STAGE.KEY=VALUE" in message


def test_missing_file_names_it(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: file not found"):
        load_config(tmp_path / "nope.yaml")


def test_a_bad_driver_secret_name_is_refused_with_its_line(tmp_path):
    config = tmp_path / "pipelines.yaml"
    config.write_text(
        "version: 1\nbackends:\n  bcp: {driver: {secret: 'bad name'}}\n"
        "pipelines:\n  x: {workspace: {name: a, mount: /m}, stages: {}}\n"
    )
    with pytest.raises(ConfigError, match=r"pipelines.yaml:3: backends.bcp: driver.secret 'bad name'"):
        load_config(config)


@pytest.mark.parametrize(
    "option, message",
    [
        ("retry_attempts: 0", "retry_attempts must be >= 1, got 0"),
        ("lookup_grace_seconds: -1", "lookup_grace_seconds must be >= 0"),
    ],
)
def test_bad_bcp_retry_and_lookup_options_are_refused_with_their_line(tmp_path, option, message):
    config = tmp_path / "pipelines.yaml"
    config.write_text(
        f"version: 1\nbackends:\n  bcp: {{{option}}}\n"
        "pipelines:\n  x: {workspace: {name: a, mount: /m}, stages: {}}\n"
    )
    with pytest.raises(ConfigError, match=rf"pipelines.yaml:3: backends.bcp: {message}"):
        load_config(config)


def test_pipelines_sharing_anchored_stages_do_not_share_their_defaults(tmp_path):
    write_chain_project(tmp_path)
    config = tmp_path / "pipelines.yaml"
    config.write_text("""\
version: 1
stages_dir: stages
x-stages: &stages
  first: {program: items.py, args: [--out, "${workspace}/a", --count, "1"]}
pipelines:
  small:
    workspace: {name: a, mount: /m}
    defaults: {slurm: {nodes: 1, ntasks_per_node: 2, time: 2h}, local: {processes: 2}}
    stages: {<<: *stages}
  big:
    workspace: {name: a, mount: /m}
    stages: {<<: *stages}
""")
    loaded = load_config(config)
    assert loaded.pipeline("small").stages["first"].slurm.ntasks_per_node == 2
    assert loaded.pipeline("small").stages["first"].local.processes == 2
    big = loaded.pipeline("big").stages["first"]
    assert big.slurm.ntasks_per_node is None and big.slurm.time is None and big.local.processes == 1


# -- --set errors: one line, naming the --set, exit 2 ----------------------------------------------------------
@pytest.mark.parametrize(
    "override, wanted",
    [
        (
            "first.local.replicas=-2",
            "--set first.local.replicas=-2: pipelines.chain.stages.first.local.replicas: must be >= 1, got -2",
        ),
        (
            "second.local.processes=0",
            "--set second.local.processes=0: pipelines.chain.stages.second.local.processes: must be >= 1, got 0",
        ),
        (
            "first.slurm.cpus_per_task=0",
            "--set first.slurm.cpus_per_task=0: pipelines.chain.stages.first.slurm.cpus_per_task: must be >= 1, got 0",
        ),
        (
            "vars.count=-5",
            "--set vars.count=-5: pipelines.chain.stages.first.verify[0]: expect ${count} must be >= 0, got -5",
        ),
        (
            "first.args=[--out, x: y",
            "--set first.args=[--out, x: y: VALUE '[--out, x: y' is not valid YAML (expected "
            "',' or ']', but got '<stream end>')",
        ),
        (
            "first.local.replicas={a: 1}",
            "--set first.local.replicas={a: 1}: pipelines.chain.stages.first.local.replicas: "
            "expected an integer, got a mapping {a: 1}",
        ),
    ],
)
def test_a_bad_set_is_one_line_naming_the_set(tmp_path, override, wanted):
    message = error_of(tmp_path, CHAIN_CONFIG, [override])
    assert message.startswith(wanted), message
    assert "\n" not in message and "pipelines.yaml" not in message and "{'a'" not in message


def test_set_reaches_the_backend_options_of_the_detach_driver(tmp_path):
    config = load_text(
        tmp_path,
        CHAIN_CONFIG,
        ["backends.bcp.driver.total_runtime=1H30M", "first.local.replicas=3", "backends.local.poll_seconds=2"],
    )
    assert config.options["bcp"].driver.total_runtime == "1H30M"
    assert config.options["local"].poll_seconds == 2
    assert config.pipeline("chain").stages["first"].local.replicas == 3
    message = error_of(tmp_path, CHAIN_CONFIG, ["backends.bcp.driver.total_runtime=soon"])
    assert message.startswith("--set backends.bcp.driver.total_runtime=soon: backends.bcp.driver.total_runtime:"), (
        message
    )
    message = error_of(tmp_path, CHAIN_CONFIG, ["backends.nope.x=1"])
    assert message.startswith(
        "--set backends.nope.x=1: expected backends.BACKEND.KEY=VALUE with BACKEND one of local, bcp, slurm"
    ), message
