#!/usr/bin/env python3
"""Benchmark a streamed edge: download -> tokenize-preprocess one stage after the other, then overlapped
(`needs: [{stage: download, stream: true}]`), on the same data, on the local backend.

    python benchmarks/bench_stream.py [--files-per-chunk 32] [--docs-per-file 2000] [--per-output 2]
                                   [--rate-mb-s auto] [--workdir DIR] [--keep]

The shards are a SlimPajama-shaped mirror (stages/sample.py, 2 chunks) served by a loopback HTTP server that paces
every response to one shared rate, so the download is network-bound as a real one is. `--rate-mb-s auto` first
times the tokenize stage alone (a run with an unpaced server) and sets the rate so the download alone takes as
long: the two stages then have similar lengths on this machine, where the overlap matters most.

Then two runs of the same pipeline, each in its own project: serial (a plain edge: the tokenize job starts after
the download is verified) and overlapped (a streamed edge). Times come from the stages' own completion records
(when each rank's program started and finished), so both runs are measured alike: download alone and tokenize
alone are their spans in the serial run; each run's wall is from the first download rank's start to the last
tokenize rank's end. It prints the serial wall, the overlapped wall and overlapped / max(download alone, tokenize
alone) (docs/performance.md: target <= 1.15), and asserts nothing about time: it fails only where the two runs'
outputs are not byte-identical or a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PIECE = 64 * 1024  # bytes sent between two pacing decisions
MB = 1e6


class Pace:
    """One rate shared by every response: each piece waits for its slot (a token bucket without a burst)."""

    def __init__(self, bytes_per_second: float | None) -> None:
        self.rate = bytes_per_second
        self.lock = threading.Lock()
        self.next_slot = time.monotonic()

    def wait(self, size: int) -> None:
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            start = max(self.next_slot, now)
            self.next_slot = start + size / self.rate
        time.sleep(max(0.0, self.next_slot - now))


class PacedMirror:
    """A loopback HTTP/1.1 server of a folder, every body sent at the shared pace."""

    def __init__(self, root: Path, bytes_per_second: float | None) -> None:
        pace, base = Pace(bytes_per_second), root.resolve()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = (base / self.path.lstrip("/").split("?")[0]).resolve()
                if base not in path.parents or not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for start in range(0, len(data), PIECE):
                    pace.wait(min(PIECE, len(data) - start))
                    self.wfile.write(data[start : start + PIECE])

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> PacedMirror:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def config_text(url: str, args: argparse.Namespace, streamed: bool) -> str:
    need = "{stage: download, stream: true}" if streamed else "download"
    files = 2 * args.files_per_chunk
    return f"""\
version: 1
stages_dir: {REPO / "stages"}
backends:
  local: {{workspace_dir: ws, poll_seconds: 0.2}}
pipelines:
  bench:
    workspace: {{name: bench}}
    stages:
      bpe:
        program: gpt2_files.py
        args: [--out, "${{workspace}}/bpe"]
      download:
        program: download.py
        args: [--base-url, "{url}", --out, "${{workspace}}/zst", --chunks, "1-2", --files-per-chunk,
               "{args.files_per_chunk}", --workers, "2"]
        io_bound: true
        local: {{replicas: 1, processes: 1}}
        verify: [{{glob: "${{workspace}}/zst/*.jsonl.zst", expect: {files}}}]
      tokenize-preprocess:
        program: preprocess.py
        args: [--in, "${{workspace}}/zst", --out, "${{workspace}}/out", --files-per-output, "{args.per_output}",
               --vocab, "${{workspace}}/bpe/vocab.json", --merges, "${{workspace}}/bpe/merges.txt", --workers, "1"]
        needs: [{need}, bpe]
        local: {{replicas: 1, processes: {args.ranks}}}
        verify:
          - {{glob: "${{workspace}}/out/*.bin", expect_from: download, group: {args.per_output}}}
          - {{glob: "${{workspace}}/out/*.idx", expect_from: download, group: {args.per_output}}}
"""


def run_pipeline(project: Path, url: str, args: argparse.Namespace, streamed: bool) -> Path:
    """Run the bench pipeline in `project` (fresh); returns its workspace."""
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    (project / "pipelines.yaml").write_text(config_text(url, args, streamed))
    done = subprocess.run(
        [sys.executable, "-m", "bcp_pipeline", "--config", "pipelines.yaml", "run", "bench"],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench_stream: the {'overlapped' if streamed else 'serial'} run failed:\n{done.stdout}\n{done.stderr}"
        )
    return project / "ws" / "bench"


def span(folder: Path, stage: str) -> tuple[float, float]:
    """(first rank's start, last rank's end) of `stage`'s program, from its completion records."""
    records = [json.loads(p.read_text()) for p in (folder / ".completions").glob(f"{stage}-*-of-*.json")]
    if not records:
        raise SystemExit(f"bench_stream: no {stage} completion records in {folder}")
    return min(r["started_at"] for r in records), max(r["finished_at"] for r in records)


def outputs(workspace: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((workspace / "out").iterdir()) if p.is_file()}


def measure(workspace: Path) -> dict[str, float]:
    download, tokenize = span(workspace / "zst", "download"), span(workspace / "out", "preprocess")
    return {
        "download": download[1] - download[0],
        "tokenize": tokenize[1] - tokenize[0],
        "wall": max(download[1], tokenize[1]) - min(download[0], tokenize[0]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files-per-chunk", type=int, default=32, help="shards per chunk, 2 chunks (default 32)")
    parser.add_argument("--docs-per-file", type=int, default=2000, help="documents per shard (default 2000)")
    parser.add_argument("--per-output", type=int, default=2, help="shards per tokenized output (default 2)")
    parser.add_argument("--ranks", type=int, default=2, help="tokenize ranks, one worker each (default 2)")
    parser.add_argument("--rate-mb-s", default="auto", help="the server's pace in MB/s, or auto (default)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to work (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-stream-"))
    try:
        return bench(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def bench(args: argparse.Namespace, work: Path) -> int:
    mirror = work / "mirror"
    if not (mirror / "train").is_dir():
        subprocess.run(
            [
                sys.executable,
                str(REPO / "stages" / "sample.py"),
                "--out",
                str(mirror),
                "--chunks",
                "2",
                "--files-per-chunk",
                str(args.files_per_chunk),
                "--docs-per-file",
                str(args.docs_per_file),
                "--seed",
                "0",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    zst_bytes = sum(p.stat().st_size for p in mirror.rglob("*.jsonl.zst"))
    load = os.getloadavg()[0]
    if args.rate_mb_s == "auto":
        with PacedMirror(mirror, None) as server:
            tokenize_alone = measure(run_pipeline(work / "calibrate", server.url, args, streamed=False))["tokenize"]
        rate = zst_bytes / tokenize_alone
    else:
        rate = float(args.rate_mb_s) * MB
    with PacedMirror(mirror, rate) as server:
        serial_ws = run_pipeline(work / "serial", server.url, args, streamed=False)
        streamed_ws = run_pipeline(work / "streamed", server.url, args, streamed=True)
    serial, streamed = measure(serial_ws), measure(streamed_ws)
    same = outputs(serial_ws) == outputs(streamed_ws)
    longer = max(serial["download"], serial["tokenize"])
    groups = len(list((streamed_ws / "out").glob("*.bin")))
    print(
        f"data: {2 * args.files_per_chunk} shards, {zst_bytes / MB:.1f} MB zstd, {groups} outputs of "
        f"{args.per_output} shards; tokenize: {args.ranks} rank(s) x 1 worker; {os.cpu_count()} CPUs, load "
        f"{load:.2f} at the start"
    )
    print(
        f"server pace                        {rate / MB:8.2f} MB/s"
        + (" (auto: the download alone as long as the tokenize alone)" if args.rate_mb_s == "auto" else "")
    )
    print(f"download alone (serial run)        {serial['download']:8.2f} s")
    print(f"tokenize alone (serial run)        {serial['tokenize']:8.2f} s")
    print(f"serial wall                        {serial['wall']:8.2f} s")
    print(f"overlapped wall                    {streamed['wall']:8.2f} s")
    print(f"overlapped / max(download, tokenize) {streamed['wall'] / longer:6.3f}   (target <= 1.15)")
    print(f"overlapped / serial                {streamed['wall'] / serial['wall']:8.3f}")
    print(f"outputs byte-identical             {'yes' if same else 'NO'} ({len(outputs(serial_ws))} files)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
