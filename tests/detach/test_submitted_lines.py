"""What a driver submitted reaches the laptop's `report` as BCPP-SUBMITTED lines in its log (issue 50, item 4):
the workspace's `submitted/` folder is out of the laptop's reach."""

from __future__ import annotations

from bcp_pipeline.detach.protocol import MAX_LINE_BYTES, submitted_commands, submitted_lines


def test_a_long_command_goes_in_capped_lines_and_comes_back_whole_among_other_lines():
    long = "ngc base-command job run --name chain.second --commandline '" + "x" * 9000 + "' ü"
    lines = [
        "driver job 7: starting",
        *submitted_lines("3000004", long),
        "BCPP-STATE 1 1/1 {}",
        *submitted_lines("3000005", "short"),
    ]
    assert all(len(line.encode()) <= MAX_LINE_BYTES for line in lines)
    assert submitted_commands("\n".join(lines)) == {"3000004": long, "3000005": "short"}


def test_a_command_cut_off_by_a_kill_is_left_out():
    lines = submitted_lines("3000004", "y" * 9000)
    assert len(lines) > 1
    assert submitted_commands("\n".join(lines[:-1])) == {}
