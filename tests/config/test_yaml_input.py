"""YAML aliases that no pipeline needs are refused at load, in one line naming the file and the place, exit 2
(issue 50, item 2): aliases that expand a billion times (`plan` ran past 60 s and 6 GB on nine anchors used once
as a description), and a recursive alias; and shown() never renders a value whole to show its start."""

from __future__ import annotations

import pytest
from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, REPO, write_chain_project

from bcp_pipeline.config import typed
from bcp_pipeline.config.typed import SHOWN_CHARS, shown
from bcp_pipeline.config.yaml_lines import MAX_EXPANDED_VALUES

# Values any walk of the loaded config may visit before the test calls it an expansion (the bundled file: 2,608).
WALK_LIMIT = 10_000


@pytest.fixture
def walks(monkeypatch) -> list[int]:
    """Counts the values shown() renders (typed._plain, recursive through the module), failing past WALK_LIMIT: an
    expansion of 9^9 values is caught at once rather than waited for."""
    count = [0]
    real = typed._plain

    def counted(value, *args):
        count[0] += 1
        if count[0] > WALK_LIMIT:
            raise AssertionError(f"shown() walked more than {WALK_LIMIT:,} values: the value was expanded")
        return real(value, *args)

    monkeypatch.setattr(typed, "_plain", counted)
    return count


def laughs(levels: int, width: int = 9, merge: bool = False) -> str:
    """`levels` x-* anchors, each `width` aliases of the one before: width**levels values once expanded."""
    if merge:  # mappings merging the one before `width` times, each adding a key
        lines = ["x-a: &a {k: lol}"]
        lines += [
            f"x-{chr(98 + i)}: &{chr(98 + i)} {{<<: [{', '.join([f'*{chr(97 + i)}'] * width)}], k{i}: 1}}"
            for i in range(levels - 1)
        ]
    else:
        lines = [f"x-a: &a [{', '.join(['lol'] * width)}]"]
        lines += [
            f"x-{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * width)}]" for i in range(levels - 1)
        ]
    return "\n".join(lines) + "\n"


def refused(tmp_path, capsys, text: str, *args: str) -> str:
    config = write_chain_project(tmp_path, text)
    assert cli(config, *(args or ("plan", "chain"))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bcp-pipeline: error: {config}:") and err.count("\n") == 1, err
    return err.removeprefix(f"bcp-pipeline: error: {config}").strip()


def test_a_billion_laughs_used_once_as_a_description_is_refused_at_load_without_expanding(tmp_path, capsys, walks):
    text = laughs(9) + CHAIN_CONFIG.replace("description: three stages in a row", "description: *i")
    err = refused(tmp_path, capsys, text)
    # Refused at the anchor whose aliases pass the bound (x-f: 9^5 values), before anything walks the values.
    assert err.startswith(
        ":6: the alias *e stands for 66,430 values, and the document holds more than "
        f"{MAX_EXPANDED_VALUES:,} values with its aliases expanded"
    ), err
    assert walks[0] == 0


def test_a_merge_key_bomb_is_refused_too(tmp_path, capsys):
    # `<<: [*a, *a, ...]` copies the merged keys into each mapping before building it: 9^6 copies here.
    text = laughs(7, merge=True) + CHAIN_CONFIG.replace("description: three stages in a row", "description: {<<: *g}")
    err = refused(tmp_path, capsys, text)
    assert "values with its aliases expanded" in err and err.startswith(":6: the alias *e stands for 23,783"), err


def test_a_recursive_alias_is_refused_at_its_line(tmp_path, capsys):
    text = "x-loop: &loop [1, [2, *loop]]\n" + CHAIN_CONFIG
    err = refused(tmp_path, capsys, text)
    assert err == (
        ":1: the alias *loop is inside the value it names (a recursive alias): no pipelines.yaml value holds itself"
    ), err


def test_anchors_within_the_bound_still_load_and_the_bundled_file_is_far_below_it(tmp_path, capsys):
    text = laughs(4) + CHAIN_CONFIG.replace("description: three stages in a row", 'description: "ok"')
    assert cli(write_chain_project(tmp_path, text), "plan", "chain") == 0
    assert cli(REPO / "pipelines.yaml", "plan", "demo") == 0


def test_a_bomb_in_a_set_value_is_refused_naming_the_set(capsys, walks):
    levels = ["&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"&{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]" for i in range(5)
    ]
    override = f"download.description=[{', '.join(levels)}]"
    assert cli(REPO / "pipelines.yaml", "plan", "demo", "--set", override) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bcp-pipeline: error: --set {override}: VALUE: the alias *d stands for 11,111 values"), err
    assert walks[0] == 0


def test_shown_renders_only_the_start_of_a_value_that_aliases_make_huge(walks):
    value = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9  # 9^9 values, shared: what PyYAML builds for the laughs above
    text = shown(value)
    assert text.startswith("a list [[[[[[[[[lol, lol, lol") and text.endswith("...")
    assert len(text) == len("a list ") + SHOWN_CHARS + len("...")
    assert walks[0] <= SHOWN_CHARS + 1
    assert shown("x" * 10_000) == f"text {'x' * SHOWN_CHARS}..."
    assert shown([1, [2, {"a": None}]]) == "a list [1, [2, {a: null}]]"
