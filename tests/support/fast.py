"""The fast loop, `pytest -m fast` (docs/testing.md, "Fast loop"): the tests FAST names, which tests/conftest.py
marks `fast` (`mark`). Together they import every module of bcp_pipeline/ at least once, in the test process or a
process it starts: `scripts/fast-coverage` runs the loop with an import tracer and names any module none of them
imports, so a new module needs a fast test before the check passes again.

An entry is a test module (all its tests) or one test of a slower module (`path::name`, or `path::Class`): the unit
tests of renderers, state maps and config, and one run through each backend's own path (the local supervisor, the
emulated BCP on ngcsdk), never a cluster or an end-to-end run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "bcp_pipeline"

FAST = (
    # config/: loading, bounds, typed YAML errors, streamed edges, profiling keys
    "tests/config/test_config.py",
    "tests/config/test_bounds.py",
    "tests/config/test_yaml_input.py",
    "tests/config/test_streamed_needs.py",
    "tests/config/test_profiling.py::test_a_plain_key_is_refused_where_the_config_has_no_section",
    # backends/: each backend's renderer (a golden plan), state map and client without its service
    "tests/backends/test_shared_logs.py::test_progress_counts_each_rank_once_whatever_the_logs_hold",
    "tests/backends/bcp/test_plan.py::test_plan_slimpajama_126m_golden",
    "tests/backends/bcp/test_policy.py::test_a_roomy_ace_has_nothing_to_say",
    "tests/backends/bcp/test_clock.py",
    "tests/backends/bcp/test_code_hash.py",
    "tests/backends/bcp/test_job_url.py::test_a_ui_url_the_config_gives_is_kept_whatever_the_service",
    "tests/backends/bcp/test_telemetry.py::test_the_answer_is_read_as_nvidias_printer_has_it",
    "tests/backends/bcp/test_transport.py::test_preempt_through_either_transport_and_a_refusal_keeps_its_http_status",
    "tests/backends/bcp/test_check.py::test_no_jobs_check_of_the_emulated_ace",
    "tests/backends/bcp/test_check_jobs.py::test_an_unknown_array_type_is_different",
    "tests/backends/bcp/test_check_nemo.py::test_the_reader_names_each_difference_and_its_fix",
    "tests/backends/bcp/test_check_preemption.py::test_unknown_preemption_outcomes_are_never_ok",
    "tests/backends/gridengine/test_backend.py::test_plan_demo_golden",
    "tests/backends/gridengine/test_backend.py::test_qstat_state_codes_map_explicitly_and_an_unknown_one_is_not_finished",
    "tests/backends/gridengine/test_records.py",
    "tests/backends/gridengine/test_start_hosts.py::"
    "test_check_s_probe_without_a_parallel_environment_asks_what_the_stage_asks_and_starts_hosts_its_way",
    "tests/backends/kubernetes/test_render.py::test_plan_demo_golden",
    "tests/backends/kubernetes/test_render.py::test_job_conditions_map_to_states",
    "tests/backends/kubernetes/test_states.py",
    "tests/backends/kubernetes/test_fit.py",
    "tests/backends/kubernetes/test_kueue.py::test_a_queue_renders_the_label_on_the_job_only_and_creates_it_suspended",
    "tests/backends/kubernetes/test_master_last.py",
    "tests/backends/kubernetes/test_policies.py::"
    "test_the_pod_launcher_heads_each_ranks_lines_and_exits_with_the_programs_status",
    "tests/backends/kubernetes/test_ready.py",
    "tests/backends/local/test_check.py::test_local_check_reports_each_row_and_saves_the_profile",
    "tests/backends/local/test_supervisor.py",
    "tests/backends/slurm/test_backend.py::test_plan_demo_golden",
    "tests/backends/slurm/test_backend.py::test_state_map_is_explicit_and_unknown_is_not_finished",
    "tests/backends/slurm/test_backend.py::test_poll_is_one_squeue_call_with_sacct_and_exit_record_fallbacks",
    "tests/backends/slurm/test_check.py::test_sinfo_time_limits_and_what_is_not_recognised",
    # engine/, detach/, report/, cli/
    "tests/engine/test_stall_decision.py",
    "tests/engine/test_streams.py",
    "tests/engine/test_orchestrator_local.py::test_chain_runs_in_order_and_verifies",
    "tests/detach/test_protocol.py",
    "tests/report/test_estimates.py",
    "tests/report/test_mfu.py",
    "tests/report/test_schedule.py",
    "tests/report/test_status_table.py",
    "tests/report/test_timers.py",
    "tests/cli/test_set_errors.py",
    "tests/cli/test_entry_points.py",
    # the tree's own rules
    "tests/test_architecture.py",
    "tests/test_fast.py",
)

DESCRIPTION = (
    "fast: set by tests/conftest.py on the tests tests/support/fast.py lists: the inner loop "
    "(`pytest -m fast`, about two minutes), which imports every module of bcp_pipeline/ "
    "(scripts/fast-coverage checks it)"
)


def without_parameters(nodeid: str) -> str:
    """`path::Class::name[param]` -> `path::Class::name`."""
    return nodeid.split("[", 1)[0]


def is_fast(nodeid: str) -> bool:
    """The test is an entry of FAST, or inside one (its module, or its class)."""
    test = without_parameters(nodeid)
    return any(test == entry or test.startswith(entry + "::") for entry in FAST)


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        if is_fast(item.nodeid):
            item.add_marker("fast")


def fast_modules() -> list[str]:
    """The test modules the entries are in, in FAST's order: what `scripts/fast-coverage` collects."""
    return list(dict.fromkeys(entry.split("::", 1)[0] for entry in FAST))


def package_modules() -> list[str]:
    """Every module of bcp_pipeline/, by dotted name (a package by its own name, not `.__init__`)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names
