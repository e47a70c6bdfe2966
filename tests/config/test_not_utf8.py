"""A pipelines.yaml that is not UTF-8 text is refused in one line naming the file and the byte offset, exit 2
(issue 50, item 8: latin-1, UTF-16 and binary files gave a 38-line UnicodeDecodeError traceback and exit 1)."""

from __future__ import annotations

import pytest
from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, write_chain_project

NUL = bytes(1)


@pytest.mark.parametrize(
    "name, make, wanted",
    [
        (
            "latin-1",
            lambda text: text.replace("three stages in a row", "caf\u00e9 \u00ff").encode("latin-1"),
            lambda data: f"not UTF-8 text: byte 0xe9 at offset {data.index(b'caf') + 3}; save it as UTF-8",
        ),
        (
            "utf-16",
            lambda text: text.encode("utf-16"),
            lambda data: (
                "not UTF-8 text: byte 0xff at offset 0 (it starts with a UTF-16 byte order mark: it is UTF-16 "
                "text); save it as UTF-8"
            ),
        ),
        (
            "binary",
            lambda text: text.encode() + b"\x00\x01\x02binary",
            lambda data: (
                f"not a text file: character 0x00 at byte offset {data.index(NUL)} (special characters are not allowed)"
            ),
        ),
    ],
)
@pytest.mark.parametrize("command", [("plan", "chain"), ("list",)])
def test_a_file_that_is_not_utf8_text_is_refused_in_one_line_with_the_byte_offset(
    tmp_path, capsys, name, make, wanted, command
):
    config = write_chain_project(tmp_path)
    data = make(CHAIN_CONFIG)
    config.write_bytes(data)
    assert cli(config, *command) == 2
    err = capsys.readouterr().err
    assert err == f"bcp-pipeline: error: {config}: {wanted(data)}\n", err
