"""The progress a failed rank leaves behind: its last `progress` line counts the outputs it completed, so `status`
and the live view show 7/8 files after one of 8 failed, not the count of seconds before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.stage_fixtures import make_shards

from bcp_pipeline.backends.shared.logs import progress_from_logs

STAGES = Path(__file__).resolve().parents[2] / "stages"


def test_a_rank_that_fails_one_file_of_eight_reports_the_seven_it_completed(tmp_path):
    shards = make_shards(tmp_path / "in", files=8, docs_per_file=3)
    shards[-1].write_bytes(b"not zstd at all")  # the last one fails, after seven good ones in well under 2 s
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(STAGES / "extract.py"),
            "--in",
            str(tmp_path / "in"),
            "--out",
            str(tmp_path / "out"),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert len(list((tmp_path / "out").glob("*.jsonl"))) == 7
    progress = progress_from_logs([done.stdout])
    assert progress is not None and (progress.done, progress.total) == (7, 8), done.stdout
