"""The preprocess stage's tokenizer processes (stages/_tokenize_workers.py): results in input order and equal to
tokenizing in this process, a batch's own error raised for that batch only, a killed worker named, abandoned
batches drained, large batches never deadlocking the pipes, and workers that end with their parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import _fast_bpe
import _tokenize_workers as workers
import pytest
from _preprocess_batches import Batch
from support.gpt2_reference import MERGES, VOCAB
from support.stage_fixtures import iter_documents, jsonl_bytes
from tokenizers_gpt2 import TokenizerSpec

SPEC = TokenizerSpec(vocab=VOCAB, merges=MERGES)


@pytest.fixture(scope="module")
def loaded() -> None:
    workers.init_worker(SPEC, "text", SPEC.load())


@pytest.fixture
def pool(loaded):
    tokenizer_pool = workers.TokenizerPool(2, SPEC, "text")
    yield tokenizer_pool
    tokenizer_pool.close()


def batches(count: int, documents: int = 30) -> list[Batch]:
    return [Batch(source=0, data=jsonl_bytes(iter_documents(seed, documents))) for seed in range(count)]


def inline(batch: Batch) -> tuple:
    result = workers.tokenize_batch(batch)
    return bytes(result.tokens), result.lengths, result.documents, result.lines


def as_tuple(result: workers.BatchResult) -> tuple:
    return bytes(result.tokens), result.lengths, result.documents, result.lines


def test_results_come_in_input_order_and_equal_tokenizing_here(pool):
    sent = batches(9)
    received = [as_tuple(r) for r in workers.ordered_results(iter(sent), pool, window=3)]
    assert received == [inline(b) for b in sent]
    assert pool.in_flight == 0


def test_the_engines_cache_is_dropped_between_batches_inline_and_in_each_worker(tmp_path, monkeypatch):
    # Every reading of the resident memory after the first (the build here) is just past the bound, so each
    # process's tokenizer is due for a drop after its first batch and never past twice the bound: only the drop
    # between batches (_tokenize_workers.drop_cache_if_due) rebuilds it, once a process, and each build counts.
    drops = tmp_path / "drops"
    drop = _fast_bpe.GigatokenEncoder._drop_cache

    def counted_drop(encoder: _fast_bpe.GigatokenEncoder) -> None:
        with open(drops, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        drop(encoder)

    floor, past_the_bound = 1 << 30, (1 << 30) + _fast_bpe.CACHE_GROWTH_BYTES + 1
    readings = iter(())

    def fresh_tokenizer() -> None:  # built here, reading the floor; what it (or a fork of it) reads next is past it
        nonlocal readings
        readings = iter([floor])
        workers.init_worker(SPEC, "text", SPEC.load())
        assert workers._STATE.tokenizer.engine.startswith("gigatoken ")

    monkeypatch.setattr(_fast_bpe.GigatokenEncoder, "_drop_cache", counted_drop)
    monkeypatch.setattr(_fast_bpe, "CACHE_CHECK_CHARS", 100)
    monkeypatch.setattr(_fast_bpe, "resident_bytes", lambda: next(readings, past_the_bound))
    monkeypatch.setattr(workers, "_STATE", None)  # put back after the test: the other tests' tokenizer

    fresh_tokenizer()
    list(workers.ordered_results(iter(batches(3)), None, window=2))
    assert drops.read_text().split() == [str(os.getpid())]

    drops.unlink()
    fresh_tokenizer()
    tokenizer_pool = workers.TokenizerPool(2, SPEC, "text")
    try:
        list(workers.ordered_results(iter(batches(4)), tokenizer_pool, window=2))
    finally:
        tokenizer_pool.close()
    pids = drops.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2 and str(os.getpid()) not in pids


def test_a_batch_error_is_raised_for_that_batch_and_the_pool_goes_on(pool, tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl_bytes(iter_documents(1, 5)))
    shrunk = Batch(source=0, path=str(good), start=0, end=good.stat().st_size + 100)  # the file "shrank"
    with pytest.raises(OSError, match="good.jsonl shrank while being read"):
        list(workers.ordered_results(iter([*batches(3), shrunk, *batches(3)]), pool, window=4))
    assert pool.in_flight == 0  # the batches sent after the bad one were received and dropped
    again = batches(4)
    assert [as_tuple(r) for r in workers.ordered_results(iter(again), pool, window=4)] == [inline(b) for b in again]


def test_an_abandoned_output_leaves_no_result_behind_for_the_next(pool):
    results = workers.ordered_results(iter(batches(8)), pool, window=6)
    next(results)
    results.close()  # the caller stopped (an error while writing): 5 batches were still in flight
    assert pool.in_flight == 0
    after = batches(2, documents=7)
    assert [as_tuple(r) for r in workers.ordered_results(iter(after), pool, window=2)] == [inline(b) for b in after]


def test_a_killed_worker_is_named(pool):
    victim = pool._processes[1]
    victim.kill()
    victim.join()
    with pytest.raises(workers.WorkerDied, match=rf"tokenizer process {victim.pid} ended with exit code -9"):
        list(workers.ordered_results(iter(batches(4)), pool, window=4))


def test_large_batches_do_not_deadlock_the_pipes(pool):
    # Decompressed text travels to the workers, and tokens come back, each larger than a pipe holds (1 MiB at
    # most): with several batches in flight per worker, neither side may wait on the other while both are full.
    big = [Batch(source=0, data=jsonl_bytes(iter_documents(seed, 1500, mean_words=400))) for seed in range(6)]
    assert all(len(b.data) > 2 << 20 for b in big)
    received: list[tuple] = []
    reader = threading.Thread(
        target=lambda: received.extend(as_tuple(r) for r in workers.ordered_results(iter(big), pool, window=6)),
        daemon=True,
    )
    reader.start()
    reader.join(timeout=120)
    if reader.is_alive():  # deadlocked: free the stuck thread before failing
        for process in pool._processes:
            process.kill()
        pytest.fail("the pipes deadlocked with large batches in flight")
    assert received == [inline(b) for b in big]


def test_workers_end_when_their_parent_is_killed(tmp_path):
    stages = Path(workers.__file__).parent
    code = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{str(stages)!r}, {str(Path(__file__).parents[1])!r}]
        import _tokenize_workers as workers
        from support.gpt2_reference import MERGES, VOCAB
        from tokenizers_gpt2 import TokenizerSpec
        spec = TokenizerSpec(vocab=VOCAB, merges=MERGES)
        workers.init_worker(spec, "text", spec.load())
        pool = workers.TokenizerPool(2, spec, "text")
        print(" ".join(str(p.pid) for p in pool._processes), flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(pids) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids), "a tokenizer worker outlived its killed parent"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# Lines where orjson and json disagree or might: a duplicate key (both take the last), what only json takes (NaN,
# Infinity, an out-of-range float, lone surrogates escaped or encoded, a byte-order mark), what both refuse, and
# ordinary UTF-8 text.
JSON_LINES = [
    b'{"text": "a", "text": "b"}',
    b'{"text": "x", "n": NaN}',
    b'{"text": "x", "n": Infinity}',
    b'{"text": "x", "n": 1e400}',
    b'{"text": "\\ud800x"}',
    b'{"text": "\xed\xa0\x80"}',
    b'\xef\xbb\xbf{"text": "bom"}',
    b'{"text": "x", "n": 123456789012345678901234567890}',
    b'{"text": "caf\xc3\xa9 \xf0\x9f\x98\x80"}',
    b'{"text": "a\tb"}',
    b'{"text": "x",}',
    b'{"text": "\xff"}',
    b'{"text": 5}',
    b'{"body": "x"}',
    b'["text"]',
    b'{"text": "x"}\r',
    b' {"text": "lead"} ',
    b'{"text": "x"} trailing',
    b'{"text": "\\u0000\\/\\n"}',
]


@pytest.mark.parametrize("line", JSON_LINES)
def test_a_json_line_gives_what_the_standard_json_gives(line, monkeypatch):
    assert workers.fast_loads is not None, "orjson is in the stage requirements: the fast path must be tested"
    fast = workers.json_text(line, "text")
    monkeypatch.setattr(workers, "fast_loads", None)
    standard = workers.json_text(line, "text")
    assert fast == standard and type(fast) is type(standard)


@pytest.mark.parametrize("data", [b"", b"\n", b"a", b"a\n", b"a\nb", b"a\n\nb\n", b"\n\n", b"a\r\nb\r\n"])
def test_json_lines_are_the_lines_bytes_split_gives(data):
    expected = data.split(b"\n")
    if expected[-1] == b"":
        expected.pop()  # a final newline ends the last line; it starts no empty one
    assert [bytes(line) for line in workers.json_lines(data)] == expected
