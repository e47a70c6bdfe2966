"""The clock row of `check` on BCP (backends/bcp/clock.py), pure: a job's createdDate against this machine's clock
around its submission."""

from __future__ import annotations

from datetime import datetime, timezone

from bcp_pipeline.backends.bcp.clock import clock_check, created_of

SUBMITTED = datetime(2026, 1, 31, 12, 0, 0, tzinfo=timezone.utc).timestamp()


def test_a_stamp_within_the_call_is_no_skew_and_a_small_one_is_ok():
    inside = clock_check(SUBMITTED, SUBMITTED + 1.5, SUBMITTED + 0.7)
    assert (inside.row.verdict.value, inside.skew_seconds) == ("ok", 0.0)
    assert "falls within its `job run` call (1.5 s)" in inside.row.showed
    behind = clock_check(SUBMITTED, SUBMITTED + 1.5, SUBMITTED - 30)  # a stamp truncated, or a clock a bit behind
    assert (behind.row.verdict.value, behind.skew_seconds) == ("ok", -30.0)


def test_a_skew_past_the_list_window_is_named_as_one_that_loses_jobs():
    far = clock_check(SUBMITTED, SUBMITTED + 1, SUBMITTED + 1 + 2 * 86400)
    assert far.row.verdict.value == "different" and far.skew_seconds == 2 * 86400
    assert "172800 s ahead of" in far.row.showed
    assert "would miss new jobs and submit stages twice" in far.row.meaning


def test_the_created_date_in_ngcs_forms_and_none_when_absent():
    assert created_of({"createdDate": "2026-01-31T12:00:00.250Z"}) == SUBMITTED + 0.25
    assert created_of({"jobStatus": {"createdDate": "2026-01-31T12:00:00Z"}}) == SUBMITTED
    assert created_of({"createdDate": "yesterday"}) is None and created_of({}) is None
    missing = clock_check(SUBMITTED, SUBMITTED + 1, None)
    assert (missing.row.verdict.value, missing.skew_seconds) == ("could not check", None)
