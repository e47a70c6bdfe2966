"""_durable: direct-I/O and page-cache writes give the same bytes; refusals fall back; failures leave nothing behind."""

from __future__ import annotations

import os
import random

import _durable
import pytest

BLOCK = 8192  # small blocks: a few KB of data crosses several whole blocks and leaves a tail


@pytest.fixture
def writers():
    return _durable.Writers(buffers=3, block_bytes=BLOCK, threads=2)


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.mark.parametrize("size", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 5 * BLOCK, 7 * BLOCK + 4097, 100_003])
@pytest.mark.parametrize("direct", [True, False])
def test_writes_and_appends_in_any_pieces_give_exact_bytes(tmp_path, writers, size, direct):
    data = payload(size, seed=size)
    source = tmp_path / "source"
    source.write_bytes(data[size // 3 :])
    out = _durable.DurableFile(tmp_path / "out", writers, direct=direct)
    rng, at = random.Random(1), 0
    while at < size // 3:  # the first third in pieces of odd sizes, the rest read straight from a file
        piece = rng.randint(1, 3 * BLOCK)
        out.write(data[at : min(at + piece, size // 3)])
        at = min(at + piece, size // 3)
    with open(source, "rb") as handle:
        out.append_from(handle.fileno(), size - size // 3)
    assert out.size == size
    assert out.close() == size
    assert (tmp_path / "out").read_bytes() == data


def test_whole_blocks_go_by_direct_io_where_the_filesystem_takes_it(tmp_path, writers):
    out = _durable.DurableFile(tmp_path / "out", writers, direct=True)
    if not out.direct:
        out.abort()
        pytest.skip(f"{tmp_path}: this filesystem refuses O_DIRECT at open (the page-cache path is tested above)")
    out.write(payload(4 * BLOCK))
    out.close()
    assert out.direct, "a whole aligned block was refused by direct I/O"


def test_a_write_the_kernel_refuses_under_direct_io_goes_on_through_the_page_cache(tmp_path, writers):
    out = _durable.DurableFile(tmp_path / "out", writers, direct=True)
    if not out.direct:
        out.abort()
        pytest.skip(f"{tmp_path}: no O_DIRECT here, so there is no refusal to recover from")
    data = payload(3 * BLOCK + 100)
    # 100 bytes at offset 0 is not aligned: the kernel answers EINVAL to a direct write of it.
    out._pwrite_all(memoryview(data[:100]), 0)
    assert not out.direct
    out.write(data)  # rewrites from offset 0: whole blocks, then the tail
    assert out.close() == len(data)
    assert (tmp_path / "out").read_bytes() == data


def test_environment_switch_turns_direct_io_off(tmp_path, writers, monkeypatch):
    monkeypatch.setenv(_durable.DIRECT_IO_ENV, "0")
    out = _durable.DurableFile(tmp_path / "out", writers)
    assert not out.direct
    out.write(payload(2 * BLOCK + 5))
    out.close()
    assert (tmp_path / "out").stat().st_size == 2 * BLOCK + 5
    monkeypatch.setenv(_durable.DIRECT_IO_ENV, "1")
    assert _durable.direct_io_wanted() == bool(_durable.O_DIRECT)


def test_durable_output_appears_only_complete_and_a_failure_leaves_nothing(tmp_path, writers):
    final = tmp_path / "deep" / "out.jsonl"
    with pytest.raises(RuntimeError):
        with _durable.durable_output(final, writers) as out:
            out.write(payload(3 * BLOCK))
            raise RuntimeError("the producer failed half way")
    assert sorted(os.listdir(final.parent)) == []
    with _durable.durable_output(final, writers) as out:
        out.write(payload(3 * BLOCK + 1))
    assert sorted(os.listdir(final.parent)) == ["out.jsonl"]
    assert final.read_bytes() == payload(3 * BLOCK + 1)


def test_a_failed_background_write_fails_the_output_and_leaves_nothing(tmp_path, writers):
    final = tmp_path / "out"
    with pytest.raises(OSError):
        with _durable.durable_output(final, writers, direct=False) as out:
            read_only = os.open(tmp_path, os.O_RDONLY)
            os.dup2(read_only, out._fd)  # from now on every write to this file fails (EBADF), in the writer threads
            os.close(read_only)
            out.write(payload(20 * BLOCK))  # the failure surfaces here (a later hand-off) or at close
    assert os.listdir(tmp_path) == []
    # The buffers came back to the pool: another file can still use all of them.
    other = _durable.DurableFile(tmp_path / "other", writers)
    other.write(payload(6 * BLOCK))
    assert other.close() == 6 * BLOCK


def test_an_input_that_shrinks_while_appended_is_an_error(tmp_path, writers):
    source = tmp_path / "source"
    source.write_bytes(payload(1000))
    out = _durable.DurableFile(tmp_path / "out", writers)
    with open(source, "rb") as handle, pytest.raises(_durable._common.StageError, match="shrank"):
        out.append_from(handle.fileno(), 5000)
    out.abort()


def test_block_size_must_be_aligned():
    with pytest.raises(ValueError, match="multiple of 4096"):
        _durable.BufferPool(2, 5000)
