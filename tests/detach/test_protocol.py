"""What a detached run's driver prints into its job log, and what the laptop reads back (detach/protocol.py):
no line over 4 KiB, however long the run, and a snapshot cut by a kill is never read as whole."""

from __future__ import annotations

import io
import json

from bcp_pipeline.detach.driver import CappedLines, SnapshotStore, fail, handover_line
from bcp_pipeline.detach.protocol import MAX_LINE_BYTES, capped, last_error, last_snapshot, snapshot_lines
from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus


def long_run(records: int) -> RunState:
    """A run whose stages went through `records` jobs in all (resubmissions, verifications, continuations)."""
    stages = {}
    for s, name in enumerate(["download", "extract", "concat", "tokenize-preprocess", "pretrain"]):
        jobs = [
            JobRecord(
                job_id=str(4_000_000 + s * 1000 + i),
                kind="verify" if i % 2 else "stage",
                attempt=i // 2 + 1,
                submitted_at=1.7e9 + i,
                state="succeeded",
                native="FINISHED_SUCCESS",
                detail="Replica 0 exited with code 0",
                started_at=1.7e9 + i + 5,
                ended_at=1.7e9 + i + 50,
            )
            for i in range(records // 5)
        ]
        stages[name] = StageState(
            status=StageStatus.RUNNING,
            jobs=jobs,
            attempts=len(jobs) // 2,
            extra={"steps_after_attempt": list(range(0, 30000, 1000))},
        )
    return RunState(
        run_id="slimpajama-8b-20261124-101010-abcd",
        pipeline="slimpajama-8b",
        backend="bcp",
        config_file="/home/me/pipelines.yaml",
        created_at=1.7e9,
        stages=stages,
    )


def test_a_run_with_hundreds_of_job_records_prints_no_line_over_4_kib_and_reads_back_whole(tmp_path, capsys):
    state = long_run(records=400)
    store = SnapshotStore(tmp_path)
    store.save(state)
    store.save(state)  # a second snapshot: numbered apart from the first
    log = capsys.readouterr().out
    lines = log.splitlines()
    assert len(json.dumps(state.to_json())) > 20 * MAX_LINE_BYTES  # the point: far over any line limit
    assert max(len(line.encode()) for line in lines) <= MAX_LINE_BYTES < 4096
    assert all(line.startswith("BCPP-STATE 1 ") for line in lines[: len(lines) // 2])
    assert all(line.startswith("BCPP-STATE 2 ") for line in lines[len(lines) // 2 :])
    read_back = last_snapshot(log)
    saved = json.loads((tmp_path / "runs" / state.run_id / "state.json").read_text())
    assert read_back["stages"] == saved["stages"] == state.to_json()["stages"]
    assert read_back["run_id"] == saved["run_id"] and read_back["updated_at"] <= saved["updated_at"]


def test_a_snapshot_cut_by_a_kill_or_by_the_tail_is_skipped_for_the_last_whole_one():
    older, newer = long_run(records=20), long_run(records=60)
    newer.stages["pretrain"].status = StageStatus.SUCCEEDED
    first, second = snapshot_lines(older.to_json(), 1), snapshot_lines(newer.to_json(), 2)
    assert len(second) > 2
    killed_between_parts = "\n".join([*first, "some progress line", *second[:-1]])
    assert last_snapshot(killed_between_parts) == older.to_json()
    killed_mid_line = "\n".join([*first, *second[:-1], second[-1][:50]])
    assert last_snapshot(killed_mid_line) == older.to_json()
    tail_cut_first = "\n".join([*first[1:], *second])  # `job log --tail` began inside the first snapshot
    assert last_snapshot(tail_cut_first) == newer.to_json()
    assert last_snapshot("\n".join(first[1:])) is None


def test_every_line_the_driver_prints_is_capped_between_characters():
    sink = io.StringIO()
    out = CappedLines(sink)
    text = "é" * 3000 + "x" * 5000  # 11,000 bytes of UTF-8 in one line
    out.write(text[:100])
    out.write(text[100:] + "\nshort line\n")
    lines = sink.getvalue().splitlines()
    assert max(len(line.encode()) for line in lines) <= MAX_LINE_BYTES
    assert "".join(lines[:-1]) == text and lines[-1] == "short line"
    assert capped("ok") == ["ok"]


def test_the_reason_a_driver_gives_up_is_one_capped_line(capsys):
    assert fail("the driver cannot call the NGC API: " + "429 Too Many Requests " * 500, 4) == 4
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1 and len(out.splitlines()[0].encode()) <= MAX_LINE_BYTES
    assert last_error(out).startswith("the driver cannot call the NGC API: 429 Too Many Requests")


def test_the_driver_says_when_it_hands_over_as_a_duration_and_a_time():
    """Its first line said `hand-over in 430198 s` (issue 50, item 12): a duration and the UTC time it falls at."""
    line = handover_line("3000010", "demo-20261201-200457-caca", "demo", left=430_198.4, used=75.0, now=1_796_000_000)
    assert line == (
        "driver job 3000010: driving run demo-20261201-200457-caca (demo); hand-over in 4d23h, at "
        "2026-12-05 00:23 UTC (1m15s of its runtime spent before this start)"
    )
    short = handover_line("1", "r", "p", left=1_790, used=0, now=0)
    assert short.endswith("; hand-over in 29m50s, at 1970-01-01 00:29 UTC"), short
