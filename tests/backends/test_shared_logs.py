"""The log readers every backend shares: a crashed job's own traceback found above its launcher's summary, and
progress counted once per rank."""

import json
import os
import subprocess
import sys
from pathlib import Path

from bcp_pipeline.backends.shared.logs import (
    LINE_PREFIX,
    failed_rank_lines,
    last_traceback,
    progress_from_logs,
    why_it_failed,
)

STAGES = Path(__file__).resolve().parents[2] / "stages"

WORKER_TRACEBACK = """\
[rank0]: iteration 11/30 | lm loss: 1.1E+01
Traceback (most recent call last):
  File "/workspace/bridge_pretrain.py", line 88, in <module>
    pretrain(config)
  File "/opt/megatron/bridge/training/pretrain.py", line 40, in pretrain
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
RuntimeError: CUDA error: an illegal memory access was encountered
"""

TORCHRUN_TRACEBACK = """\
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/usr/lib/python3/dist-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Root Cause (first observed failure):
  exitcode  : 1 (pid: 28910)
============================================================
"""


def test_the_workers_traceback_is_chosen_over_torchruns_that_follows_it():
    found = last_traceback(WORKER_TRACEBACK + TORCHRUN_TRACEBACK)
    assert found is not None
    assert found.splitlines()[0] == "Traceback (most recent call last):"
    assert found.splitlines()[-1] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "ChildFailedError" not in found and "Root Cause" not in found


def test_a_traceback_on_the_line_of_a_progress_bar_without_a_newline_is_found():
    """Lightning redraws its bar with carriage returns and no newline, so in a log of stdout and stderr (a pod's)
    the rank's traceback starts on the bar's line."""
    bar = "Epoch 0: 11/30 [00:01<00:02, reduced_train_loss=8.52, global_step=11.000]"
    found = last_traceback(f"{bar}\r{bar}" + WORKER_TRACEBACK.split("\n", 1)[1] + TORCHRUN_TRACEBACK)
    assert found is not None and found.splitlines()[0] == "Traceback (most recent call last):"
    assert found.splitlines()[-1] == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_launcher_traceback_alone_is_still_shown():
    found = last_traceback(TORCHRUN_TRACEBACK)
    assert found is not None and found.rstrip().endswith("ChildFailedError:")


def test_the_last_of_several_tracebacks_wins_and_long_ones_keep_their_end():
    second = WORKER_TRACEBACK.replace("RuntimeError: CUDA error", "OSError: disk full")
    found = last_traceback(WORKER_TRACEBACK + second, max_lines=3)
    assert found is not None and len(found.splitlines()) == 3
    assert found.splitlines()[-1].startswith("OSError: disk full")


def test_a_log_without_a_traceback_gives_none():
    assert last_traceback("step 1\nstep 2\n") is None


def progress_line(rank: int, done: int, total: int) -> str:
    return f"{LINE_PREFIX}progress " + json.dumps({"done": done, "total": total, "rank": rank, "unit": "files"})


def test_progress_counts_each_rank_once_whatever_the_logs_hold(tmp_path):
    # gpt2_files.py on two ranks: each writes (and reports) the same two files, as rank 0.
    logs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"}
        done = subprocess.run(
            [sys.executable, str(STAGES / "gpt2_files.py"), "--out", str(tmp_path / "bpe")],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        logs.append(done.stdout)
    found = progress_from_logs(logs)
    assert (found.done, found.total) == (2, 2) == (len(list((tmp_path / "bpe").iterdir())), 2)
    # One pod's log holds its two processes' lines, interleaved: both ranks count.
    pod = "\n".join([progress_line(0, 1, 4), progress_line(1, 1, 4), progress_line(0, 3, 4), progress_line(1, 2, 4)])
    assert (progress_from_logs([pod]).done, progress_from_logs([pod]).total) == (5, 8)
    # An index's replaced pod, then its successor (oldest first): the successor's count only.
    replaced, successor = progress_line(0, 3, 4), progress_line(0, 4, 4)
    both = progress_from_logs([replaced, successor, progress_line(1, 4, 4)])
    assert (both.done, both.total) == (8, 8)
    # Logs without a rank in their lines (an older program) are summed per log, as before.
    bare = f"{LINE_PREFIX}progress " + json.dumps({"done": 2, "total": 2})
    assert progress_from_logs([bare, bare]).done == 4
    assert progress_from_logs(["no progress here"]) is None


def test_the_rank_torchrun_names_first_to_fail_is_found_with_its_last_lines(tmp_path):
    """A real torchrun (2 ranks, --tee 3 and the `[rankN]:` prefix as the Kubernetes pods run it): rank 1 says why
    and exits 3 without a traceback; torchrun's summary names rank 1, whose lines are taken out of the shared log."""
    script = tmp_path / "rank.sh"
    script.write_text(
        'echo "rank $RANK starts"; if [ "$RANK" = 1 ]; then echo "no space left on /dev/shm"; exit 3; fi; sleep 30\n'
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--tee=3",
            "--no-python",
            "--master_port=0",
            "bash",
            str(script),
        ],
        env={**os.environ, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = done.stdout + done.stderr
    assert done.returncode != 0 and "Root Cause" in log, log
    assert failed_rank_lines(log) == (1, "rank 1 starts\nno space left on /dev/shm")
    assert failed_rank_lines("[rank0]:fine\nTraceback of nothing") is None  # no torchrun summary: nothing named


def test_why_it_failed_shows_the_programs_traceback_else_the_named_ranks_lines_then_the_tail():
    crashed = why_it_failed(WORKER_TRACEBACK + "padding\n" * 20 + TORCHRUN_TRACEBACK, "pod p's")
    assert crashed[0].startswith("the last traceback in pod p's log:") and "illegal memory access" in crashed[0]
    assert crashed[1].startswith("last lines of pod p's log:") and "Root Cause" in crashed[1]
    summary = TORCHRUN_TRACEBACK.replace("  exitcode  : 1", "  rank      : 1 (local_rank: 0)\n  exitcode  : 3")
    exited = why_it_failed("[rank0]:step 3\n[rank1]:step 3\n[rank1]:no space left on device\n" + summary, "pod p's")
    assert exited[0] == (
        "the last lines of rank 1, the first to fail, in pod p's log:\n    step 3\n    no space left on device"
    )
    assert len(why_it_failed("just one line\n", "the job")) == 1  # nothing more to say than the tail
