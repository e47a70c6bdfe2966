"""The job scripts' `.sh` templates (backends/shared/templates.py): how a template is read and filled, shellcheck
over every one of them, and their shipping as package data. What each renders is held by the goldens
(tests/golden/) and the render tests."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from bcp_pipeline.backends.gridengine.training import FIND_QRSH
from bcp_pipeline.backends.shared.templates import TOKEN, fill, load

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bcp_pipeline"
TEMPLATES = sorted(PACKAGE.rglob("*.sh"))
# A value of the kind each token takes where it is rendered, so that shellcheck reads the script a job gets.
SAMPLES = {
    "PORT_EXPRESSION": "29500 + ${JOB_ID:-0} % 1000",  # hosts.sh, local_ranks.sh: shell arithmetic
    "MASTER_ADDR_COMMAND": "master_addr=$(hostname -i)",  # hosts.sh: master_addr_command.sh's text
    "FIND_QRSH": FIND_QRSH,
    "COMMAND": "hostname -i | awk '{print $1}'",  # master_addr_command.sh: the site's gridengine.master_addr_command
    "TASKS": "4",
    "TIME_LIMIT_EXIT": "124",
    "PYTHON": "/usr/bin/python3",
    "PROBE": "'import sys; print(sys.version)'",
    "MODULES": "numpy torch",
    "WORKSPACE": "'/mnt/work space'",
    "MARKER": "bcpp-check-1a2b",
    "MARKER_FILE": "'/mnt/work space/bcpp-check-1a2b'",
    "LAST_RANK": "2",
    "PROCESSES": "3",
    "PROGRAM": "python3 -u /code/stage.py --out 'a b'",
}


def test_a_template_is_its_body_without_the_header_and_the_shellcheck_directives(tmp_path, monkeypatch):
    package = tmp_path / "sample_templates"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "part.sh").write_text(
        "# shellcheck shell=bash\n# What it is.\n\nfor x in 1 2; do\n"
        '  # shellcheck disable=SC2034  # why\n  echo @WHAT@ "$x"\n'
        "  # a comment that is the script's\ndone\n"
    )
    (package / "line.sh").write_text(
        "# header\n\nwhile :; do\n  sleep 1;\n# shellcheck disable=SC2016  # why\ndone; exit 0\n"
    )
    (package / "bad.sh").write_text("# header\n\nwhile :; do\n# a comment would end the line\ndone\n")
    (package / "headless.sh").write_text("echo no header\n\necho body\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load(package.name, "part.sh") == (
            'for x in 1 2; do\n  echo @WHAT@ "$x"\n  # a comment that is the script\'s\ndone'
        )
        assert load(package.name, "line.sh", one_line=True) == "while :; do   sleep 1; done; exit 0"
        with pytest.raises(AssertionError, match="a comment inside a one-line program"):
            load(package.name, "bad.sh", one_line=True)
        with pytest.raises(AssertionError, match="no header"):
            load(package.name, "headless.sh")
    finally:
        sys.modules.pop(package.name, None)


def test_filling_replaces_each_token_once_and_refuses_a_missing_or_unused_one():
    template = "a=@A@\n@B@\nc=@A@ d\n"
    assert fill(template, A="$((1 + 2))", B="b @A@") == "a=$((1 + 2))\nb @A@\nc=$((1 + 2)) d\n"  # values not rescanned
    assert fill(template, A="1", B="") == "a=1\nc=1 d\n"  # an empty token alone on its line takes the line
    assert fill("x @A@ y", A="") == "x  y"
    with pytest.raises(AssertionError, match="tokens"):
        fill(template, A="1")
    with pytest.raises(AssertionError, match="tokens"):
        fill(template, A="1", B="2", C="3")


def test_every_template_has_a_sample_for_each_of_its_tokens():
    assert TEMPLATES, f"no .sh template under {PACKAGE}"
    missing = {
        path.name: sorted(set(TOKEN.findall(path.read_text().partition("\n\n")[2])) - set(SAMPLES))
        for path in TEMPLATES
    }
    assert {name: tokens for name, tokens in missing.items() if tokens} == {}


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="shellcheck is not installed (scripts/setup --test installs Debian's shellcheck as root with apt-get)",
)
def test_shellcheck_finds_nothing_in_the_job_script_templates(tmp_path):
    """Each template as shellcheck sees it: its tokens filled with samples, its header and directives kept (the
    header's directives hold for the whole file: a part's variables set by the script it is rendered into)."""
    checked = []
    for path in TEMPLATES:
        header, _, body = path.read_text().partition("\n\n")
        target = tmp_path / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(header + "\n\n" + TOKEN.sub(lambda match: SAMPLES[match.group(1)], body))
        checked.append(str(target))
    done = subprocess.run(
        ["shellcheck", "--shell=bash", "--format=gcc", *checked], capture_output=True, text=True, timeout=120
    )
    found = done.stdout.replace(f"{tmp_path}/", "").splitlines()
    assert (done.returncode, found) == (0, []), "\n".join(found)


def test_the_templates_ship_as_package_data():
    """pyproject's [tool.setuptools.package-data] names every template's folder: a wheel without them would fail
    at import."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    unshipped = [
        str(path.relative_to(ROOT))
        for path in TEMPLATES
        if not any(
            fnmatch.fnmatch(path.name, pattern)
            for pattern in data.get(".".join(path.parent.relative_to(ROOT).parts), [])
        )
    ]
    assert unshipped == []
