"""The completion record a rank writes last (stages/_completion.py): its keys, and where the rank ran."""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path

import _completion


def test_record_keeps_its_keys_and_says_where_the_rank_ran(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    _completion.write_completion(tmp_path, "extract", 1, 4, {"files": 3})
    record = json.loads((tmp_path / ".completions/extract-00001-of-00004.json").read_text())
    assert {"stage": "extract", "rank": 1, "world_size": 4, "files": 3}.items() <= record.items()
    assert record["started_at"] <= record["finished_at"]
    where = record["ran_on"]
    assert (where["hostname"], where["slurmd_nodename"]) == (socket.gethostname(), "node7")
    assert all(not ipaddress.ip_address(a).is_loopback for a in where["addresses"])


def test_no_slurm_node_name_outside_slurm() -> None:
    where = _completion.ran_on({})
    assert set(where) == {"hostname", "addresses"} and where["addresses"] == sorted(where["addresses"])
