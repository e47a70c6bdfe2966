"""The log readers every backend shares: a crashed job's own traceback found above its launcher's summary."""

from bcp_pipeline.backends.shared.logs import last_traceback

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
