"""download stage: against a real fault-injecting HTTP server on 127.0.0.1, over several ranks, killed and rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from email.utils import formatdate
from pathlib import Path

import _fetch_attempt
import _slimpajama_files
import download
import pytest
import sample
import zstandard
from support.http_faults import Fault, FaultServer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "stages" / "download.py"
CHUNKS, PER_CHUNK = 2, 6
FAST = ["--backoff", "0.01", "--max-wait", "0.05", "--timeout", "5"]
TOKEN = "hf_TESTsecretTOKEN0123456789"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small SlimPajama-shaped mirror; one file is rewritten as three zstd frames (valid, and must stay so)."""
    root = tmp_path_factory.mktemp("mirror")
    assert (
        sample.main(
            [
                "--out",
                str(root),
                "--chunks",
                str(CHUNKS),
                "--files-per-chunk",
                str(PER_CHUNK),
                "--docs-per-file",
                "40",
                "--mean-words",
                "150",
                "--seed",
                "7",
            ]
        )
        == 0
    )
    multi = root / "train" / "chunk1" / "example_train_1.jsonl.zst"
    text = zstandard.ZstdDecompressor().stream_reader(multi.read_bytes()).read()
    third = len(text) // 3
    compressor = zstandard.ZstdCompressor(level=3)
    multi.write_bytes(b"".join(compressor.compress(text[i : i + third]) for i in range(0, len(text), third)))
    return root


def url_path(chunk: int, index: int) -> str:
    return f"/train/chunk{chunk}/example_train_{index}.jsonl.zst"


def all_items() -> list[tuple[int, int]]:
    return [(c, i) for c in range(1, CHUNKS + 1) for i in range(PER_CHUNK)]


def assert_complete_copy(out: Path, mirror: Path) -> None:
    """0 missing, 0 corrupt: every expected file equals its source byte for byte and decompresses; no temporaries."""
    for chunk, index in all_items():
        got = out / f"example_train_chunk{chunk}_{index}.jsonl.zst"
        assert got.is_file(), f"missing {got.name}"
        source = (mirror / url_path(chunk, index).lstrip("/")).read_bytes()
        assert got.read_bytes() == source, f"corrupt {got.name}"
        assert zstandard.ZstdDecompressor().stream_reader(got.read_bytes(), read_across_frames=True).read()
    assert not list(out.rglob(".*.tmp-*"))


def run_stage(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def args_for(base: str, out: Path, *extra: str) -> list[str]:
    return [
        "--base-url",
        base,
        "--out",
        str(out),
        "--chunks",
        f"1-{CHUNKS}",
        "--files-per-chunk",
        str(PER_CHUNK),
        *FAST,
        *extra,
    ]


# --- pure parts -----------------------------------------------------------------------------------------------


def test_expected_items_use_the_real_counts_and_caps() -> None:
    assert len(_slimpajama_files.expected_items("train", list(range(1, 11)), None, None)) == 59166
    assert _slimpajama_files.parse_chunks("1-3,7", 10) == [1, 2, 3, 7]
    for bad in ("0", "11", "3-1", "a", "1-"):
        with pytest.raises(ValueError):
            _slimpajama_files.parse_chunks(bad, 10)
    capped = _slimpajama_files.expected_items("train", [1, 2], 7000, None)
    assert len(capped) == 5912 + 5911  # a cap above the real count asks for no file that does not exist
    first = _slimpajama_files.expected_items("train", [1], None, 12)
    assert {item.index for item in first} == set(range(12))  # the first 12 by index, not by name
    assert [item.name for item in first] == sorted(item.name for item in first)
    assert first[0].url("https://h/x/") == "https://h/x/train/chunk1/example_train_0.jsonl.zst"


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    for bad in (
        ["--chunks", "11"],
        ["--chunks", "x"],
        ["--base-url", "ftp://h"],
        ["--workers", "0"],
        ["--split", "validation"],
    ):
        with pytest.raises(SystemExit) as exc:
            download.main(["--out", str(tmp_path), *bad])
        assert exc.value.code == 2


def test_server_wait_hints() -> None:
    now = 1_700_000_000.0
    assert _fetch_attempt.server_wait_hint({}, now) is None
    assert _fetch_attempt.server_wait_hint({"Retry-After": "7"}, now) == 7
    assert _fetch_attempt.server_wait_hint({"Retry-After": formatdate(now + 30, usegmt=True)}, now) == pytest.approx(30)
    assert _fetch_attempt.server_wait_hint({"Retry-After": formatdate(now - 30, usegmt=True)}, now) == 0
    assert _fetch_attempt.server_wait_hint({"RateLimit": '"api";r=0;t=55'}, now) == 55
    assert _fetch_attempt.server_wait_hint({"RateLimit": "limit=100, remaining=0, reset=12"}, now) == 12
    assert _fetch_attempt.server_wait_hint({"RateLimit-Reset": "9"}, now) == 9
    assert _fetch_attempt.server_wait_hint({"X-RateLimit-Reset": str(int(now) + 40)}, now) == pytest.approx(40)
    assert _fetch_attempt.server_wait_hint({"Retry-After": "3", "RateLimit": "r=0;t=20"}, now) == 20  # the largest
    assert _fetch_attempt.server_wait_hint({"Retry-After": "soon"}, now) is None


def test_zstd_check_detects_truncated_and_corrupt_streams() -> None:
    compressor = zstandard.ZstdCompressor(level=3)
    stream = compressor.compress(os.urandom(3000) + b"x" * 50_000) + compressor.compress(b"second frame " * 999)
    for piece in (1, 7, 4096, len(stream)):  # whole stream fed in pieces of any size passes
        check = _fetch_attempt.ZstdStreamCheck()
        for start in range(0, len(stream), piece):
            check.feed(stream[start : start + piece])
        check.finish()
        assert check.frames == 2 and check.decompressed_bytes == 53_000 + 13 * 999
    for cut in (1, 10, len(stream) // 3, len(stream) - 200, len(stream) - 1):  # cut inside either frame
        check = _fetch_attempt.ZstdStreamCheck()
        check.feed(stream[:cut])
        with pytest.raises(_fetch_attempt.FetchError, match="truncated"):
            check.finish()
    with pytest.raises(_fetch_attempt.FetchError, match="corrupt"):
        _fetch_attempt.ZstdStreamCheck().feed(b"this is not zstd at all")
    with pytest.raises(_fetch_attempt.FetchError, match="empty"):
        _fetch_attempt.ZstdStreamCheck().finish()


def test_failed_validation_leaves_no_file(tmp_path: Path) -> None:
    data = zstandard.ZstdCompressor().compress(b"hello\n" * 1000)
    dest = tmp_path / "x.jsonl.zst"
    with pytest.raises(_fetch_attempt.FetchError, match="short body"):
        _fetch_attempt.save_stream([data[:10]], len(data), dest)
    with pytest.raises(_fetch_attempt.FetchError, match="truncated"):
        _fetch_attempt.save_stream([data[:-3]], len(data) - 3, dest)
    assert list(tmp_path.iterdir()) == []
    assert _fetch_attempt.save_stream([data[:5], data[5:]], len(data), dest) == len(data)
    assert dest.read_bytes() == data


# --- against the real server ----------------------------------------------------------------------------------


def test_ranks_survive_every_fault(mirror: Path, tmp_path: Path) -> None:
    """Acceptance: 3 concurrent ranks, every file hit by 429/500/503/drops/short bodies: 0 missing, 0 corrupt."""
    scripts = [
        (Fault.too_many(retry_after="0"),),
        (Fault.error(500), Fault.error(503)),
        (Fault.drop(),),
        (Fault.short(),),
        (Fault.truncate(),),
        (Fault.too_many(retry_after=None, ratelimit='"api";r=0;t=0'), Fault.drop(), Fault.short()),
        (Fault.error(502), Fault.truncate()),
        (Fault.error(503, Retry_After=formatdate(time.time() - 5, usegmt=True)),),
        (Fault.drop(), Fault.drop(), Fault.error(500), Fault.short()),
        (None,),  # served on the first try
        (Fault.error(429, RateLimit_Reset="0"), Fault.drop()),
        (Fault.short(), Fault.too_many(retry_after="0"), Fault.truncate()),
    ]
    out = tmp_path / "out"
    with FaultServer(mirror) as server:
        for (chunk, index), faults in zip(all_items(), scripts):
            server.script(url_path(chunk, index), *faults)
        procs = [
            subprocess.Popen(
                [sys.executable, str(SCRIPT), *args_for(server.url, out, "--workers", "3")],
                env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "3"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(3)
        ]
        results = [(proc.wait(timeout=60), *proc.communicate()) for proc in procs]
        for rank, (code, stdout, stderr) in enumerate(results):
            assert code == 0, f"rank {rank}: {stderr}"
            assert '##bcp-pipeline progress {"done": 4,' in stdout
            assert "retrying in" in stderr  # every rank met faults and said so
        for (chunk, index), faults in zip(all_items(), scripts):  # each fault really happened, then one success
            assert server.requests[url_path(chunk, index)] == len([f for f in faults if f]) + 1
    assert_complete_copy(out, mirror)
    manifest = json.loads((out / ".manifest" / "download.json").read_text())
    assert manifest["count"] == 12 and sorted(manifest["files"]) == manifest["files"]
    assert set(manifest["files"]) == {f"example_train_chunk{c}_{i}.jsonl.zst" for c, i in all_items()}
    completions = sorted(p.name for p in (out / ".completions").iterdir())
    assert completions == [f"download-{r:05d}-of-00003.json" for r in range(3)]


def test_permanent_failures_are_named_and_token_never_printed(mirror: Path, tmp_path: Path) -> None:
    """A file that answers 500 forever or 404 fails (404 at once), the run exits 1 naming both; the rest lands."""
    out = tmp_path / "out"
    with FaultServer(mirror) as server:
        server.always(url_path(1, 2), Fault.error(500, reason="{auth}"))  # echoes the token in its reason phrase
        server.always(url_path(2, 4), Fault.error(404))
        result = run_stage(args_for(server.url, out, "--attempts", "4"), env={"HF_TOKEN": TOKEN})
        assert server.requests[url_path(1, 2)] == 4
        assert server.requests[url_path(2, 4)] == 1  # never retried
        assert set().union(*server.authorizations.values()) == {f"Bearer {TOKEN}"}  # the token was sent...
    assert result.returncode == 1
    assert TOKEN not in result.stdout + result.stderr  # ...and never printed, even though the server echoed it
    assert "<HF_TOKEN>" in result.stderr
    failed = [line.strip() for line in result.stderr.splitlines() if line.startswith("  example_")]
    assert len(failed) == 2
    assert failed[0].startswith("example_train_chunk1_2.jsonl.zst: HTTP 500") and "4 attempt(s)" in failed[0]
    assert failed[1].startswith("example_train_chunk2_4.jsonl.zst: HTTP 404") and "1 attempt(s)" in failed[1]
    assert not (out / ".completions").exists()
    assert len(list(out.glob("*.jsonl.zst"))) == 10 and not list(out.glob(".*.tmp-*"))


def test_token_is_not_sent_after_a_redirect_to_another_host(
    mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hugging Face redirects file downloads to a CDN host: the token must stay with huggingface.co."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with FaultServer(mirror) as server:
        other_host = server.url.replace("127.0.0.1", "localhost")
        server.script(url_path(1, 0), Fault.redirect(other_host + url_path(1, 0)))
        assert download.main(args_for(server.url, tmp_path, "--max-files", "1")) == 0
        port = server.url.rsplit(":", 1)[1]
        assert server.authorizations == {f"127.0.0.1:{port}": {f"Bearer {TOKEN}"}, f"localhost:{port}": {None}}


def test_retry_after_is_honoured_and_capped(mirror: Path, tmp_path: Path) -> None:
    with FaultServer(mirror) as server:
        server.script(url_path(1, 0), Fault.too_many(retry_after="1"))
        started = time.monotonic()
        assert download.main(args_for(server.url, tmp_path / "a", "--max-files", "1", "--max-wait", "5")) == 0
        assert time.monotonic() - started >= 0.95
        server.script(url_path(1, 0), Fault.too_many(retry_after="30"))
        server.requests.clear()
        started = time.monotonic()
        assert download.main(args_for(server.url, tmp_path / "b", "--max-files", "1", "--max-wait", "0.2")) == 0
        assert time.monotonic() - started < 5
        assert server.requests[url_path(1, 0)] == 2


def test_a_stalled_body_times_out_and_is_retried(mirror: Path, tmp_path: Path) -> None:
    with FaultServer(mirror) as server:
        server.script(url_path(1, 0), Fault.stall(2.0))
        started = time.monotonic()
        assert download.main(args_for(server.url, tmp_path, "--max-files", "1", "--timeout", "0.3")) == 0
        assert time.monotonic() - started < 1.5
        assert server.requests[url_path(1, 0)] == 2


def test_rerun_fetches_only_what_is_missing_over_pooled_connections(mirror: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with FaultServer(mirror) as server:
        assert download.main(args_for(server.url, out, "--workers", "2")) == 0
        assert sum(server.requests.values()) == 12
        assert server.connections <= 2  # keep-alive: the pool reuses its connections
        (out / "example_train_chunk2_3.jsonl.zst").unlink()
        stale = out / ".example_train_chunk1_0.jsonl.zst.tmp-4242"
        stale.write_bytes(b"left by a killed run")
        server.requests.clear()
        assert download.main(args_for(server.url, out, "--workers", "2")) == 0
        assert dict(server.requests) == {url_path(2, 3): 1}
    assert not stale.exists()
    assert_complete_copy(out, mirror)


def test_file_urls_work_offline_and_missing_files_fail(mirror: Path, tmp_path: Path) -> None:
    assert download.main(args_for(mirror.as_uri(), tmp_path / "ok")) == 0
    assert_complete_copy(tmp_path / "ok", mirror)
    result = run_stage(
        [
            "--base-url",
            mirror.as_uri(),
            "--out",
            str(tmp_path / "bad"),
            "--chunks",
            "1-2",
            "--files-per-chunk",
            str(PER_CHUNK + 1),
            *FAST,
        ]
    )
    assert result.returncode == 1
    assert "example_train_chunk1_6.jsonl.zst: not found" in result.stderr
    assert "example_train_chunk2_6.jsonl.zst: not found" in result.stderr


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, "the download finished before the kill point"
        assert time.monotonic() < deadline, "kill point never reached"
        time.sleep(0.005)


def test_sigkill_at_several_points_then_rerun_is_byte_identical(mirror: Path, tmp_path: Path) -> None:
    """Killed mid-file, after 3 files and after 7, then rerun: same bytes as an uninterrupted run, no temporaries."""
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    with FaultServer(mirror, body_delay=0.08) as server:  # slow bodies: kills land mid-file
        assert run_stage(args_for(server.url, clean, "--workers", "2")).returncode == 0
        finals = lambda: len(list(killed.glob("example_*.jsonl.zst")))  # noqa: E731
        temps = lambda: bool(list(killed.glob(".*.tmp-*")))  # noqa: E731
        for point in (temps, lambda: finals() >= 3, lambda: finals() >= 7):
            proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), *args_for(server.url, killed, "--workers", "2")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_for(point, proc)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            for done in killed.glob("example_*.jsonl.zst"):  # whatever has its final name is whole
                assert done.read_bytes() == (clean / done.name).read_bytes()
        assert finals() < 12
        assert run_stage(args_for(server.url, killed, "--workers", "2")).returncode == 0

    def tree(root):
        return {
            p.relative_to(root): p.read_bytes()
            for p in root.rglob("*")  # noqa: E731
            if p.is_file() and ".completions" not in p.parts
        }

    assert tree(killed) == tree(clean)
    assert_complete_copy(killed, mirror)
