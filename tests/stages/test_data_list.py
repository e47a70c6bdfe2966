"""The data list (NeMo `data_prefix` / megatron `blend`) built from preprocess manifests."""

from __future__ import annotations

import json
import math
import random
from decimal import Decimal
from pathlib import Path

import data_list
import pytest
from data_list import DataListError
from support.manifests import chunk_name, fabricate


@pytest.fixture
def guide_folder(tmp_path: Path) -> tuple[Path, list[int]]:
    """74 outputs like the guide's, with unequal token counts (±30% around 8 billion)."""
    rng = random.Random(74)
    tokens = [rng.randint(5_600_000_000, 10_400_000_000) for _ in range(74)]
    for i, count in enumerate(tokens):
        fabricate(tmp_path / "data", chunk_name(i), count, documents=3, with_files=False)
    return tmp_path / "data", tokens


def test_74_chunks_weights_proportional_and_summing_to_one(guide_folder: tuple[Path, list[int]]) -> None:
    folder, tokens = guide_folder
    entries = data_list.build_data_list(folder, render_dir="/mount_workspace/data/preprocessed", check_files=False)
    by_name = {e.name: e for e in entries}
    total = sum(tokens)
    assert len(entries) == 74
    for i, count in enumerate(tokens):
        assert abs(by_name[chunk_name(i)].weight - count / total) <= 1e-6  # within one unit of the 6th digit
    weights = [e.weight for e in entries]
    assert sum(Decimal(repr(w)) for w in weights) == 1  # exactly 1 as rendered
    assert math.isclose(sum(weights), 1.0, abs_tol=1e-12)
    # Larger token counts never get smaller weights.
    ranked = sorted(entries, key=lambda e: e.tokens)
    assert all(a.weight <= b.weight for a, b in zip(ranked, ranked[1:]))
    # Deterministic order: by prefix name (as sorted strings: chunk_10 before chunk_2).
    assert [e.name for e in entries] == sorted(chunk_name(i) for i in range(74))
    assert entries[0].prefix == "/mount_workspace/data/preprocessed/train_chunk_0.jsonl_text_document"


def test_full_precision_weights(guide_folder: tuple[Path, list[int]]) -> None:
    folder, tokens = guide_folder
    entries = data_list.build_data_list(folder, digits=None, check_files=False)
    total = sum(tokens)
    assert [e.weight for e in entries] == [e.tokens / total for e in entries]
    assert math.isclose(math.fsum(e.weight for e in entries), 1.0, rel_tol=1e-15)


def test_apportion_exact_and_never_zero() -> None:
    assert data_list.apportion([1, 1, 1], digits=4) == [0.3334, 0.3333, 0.3333]
    assert data_list.apportion([5]) == [1.0]
    tiny = data_list.apportion([10**9, 1, 1], digits=3)
    assert tiny == [0.998, 0.001, 0.001]  # a non-empty output keeps a non-zero weight
    with pytest.raises(DataListError, match="cannot give 3 outputs"):
        data_list.apportion([1, 1, 1], digits=0)


def test_blend_and_renderers(tmp_path: Path) -> None:
    fabricate(tmp_path, "b_text_document", 300)
    fabricate(tmp_path, "a_text_document", 100)
    flat = data_list.blend(data_list.build_data_list(tmp_path, render_dir="/ws/data"))
    assert flat == [0.25, "/ws/data/a_text_document", 0.75, "/ws/data/b_text_document"]
    assert data_list.split_blend(flat) == (["/ws/data/a_text_document", "/ws/data/b_text_document"], [0.25, 0.75])
    assert data_list.render_hydra(flat) == (
        "model.data.data_prefix=[0.25,/ws/data/a_text_document,0.75,/ws/data/b_text_document]"
    )
    nested = data_list.render_hydra(flat, key="training.model.data.data_prefix")
    assert nested.startswith("training.model.data.data_prefix=[0.25,")
    assert json.loads(data_list.render_json(flat)) == flat
    assert data_list.render_yaml(flat) == (
        "model:\n  data:\n    data_prefix:\n"
        '      - 0.25\n      - "/ws/data/a_text_document"\n      - 0.75\n      - "/ws/data/b_text_document"\n'
    )


def test_yaml_reads_back_with_pyyaml(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    fabricate(tmp_path, "x_text_document", 7)
    flat = data_list.blend(data_list.build_data_list(tmp_path, render_dir="/data/with space, comma"))
    assert yaml.safe_load(data_list.render_yaml(flat)) == {"model": {"data": {"data_prefix": flat}}}


def test_hydra_quotes_unusual_paths_and_refuses_unsafe_ones() -> None:
    assert data_list.hydra_value("/data/a-b_c.d+e") == "/data/a-b_c.d+e"
    assert data_list.hydra_value("/data/with space") == "'/data/with space'"
    assert data_list.hydra_value("/data/x,y]") == "'/data/x,y]'"
    assert data_list.hydra_value("12") == "'12'"  # bare, it would parse as a number
    for bad in ("/data/it's", "/data/${oops}", "/data/back\\slash"):
        with pytest.raises(DataListError, match="rename the data folder"):
            data_list.hydra_value(bad)


def test_empty_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataListError, match="run the preprocess stage first"):
        data_list.build_data_list(tmp_path)
    with pytest.raises(DataListError, match="not a folder"):
        data_list.build_data_list(tmp_path / "nope")
    # A killed writer's hidden temporary is not a manifest.
    (tmp_path / ".x.manifest.json").write_text("{")
    with pytest.raises(DataListError, match="run the preprocess stage first"):
        data_list.build_data_list(tmp_path)


def test_missing_or_resized_data_files(tmp_path: Path) -> None:
    fabricate(tmp_path, "a_text_document", 10)
    (tmp_path / "a_text_document.idx").unlink()
    with pytest.raises(DataListError, match=r"a_text_document\.idx is missing"):
        data_list.build_data_list(tmp_path)
    assert data_list.build_data_list(tmp_path, check_files=False)[0].weight == 1.0
    fabricate(tmp_path, "a_text_document", 10)
    (tmp_path / "a_text_document.bin").write_bytes(b"\0" * 5)
    with pytest.raises(DataListError, match="5 bytes, the manifest says 20"):
        data_list.build_data_list(tmp_path)


def test_zero_tokens_and_bad_manifests(tmp_path: Path) -> None:
    fabricate(tmp_path / "zero", "a_text_document", 0)
    with pytest.raises(DataListError, match="zero tokens"):
        data_list.build_data_list(tmp_path / "zero")
    fabricate(tmp_path / "renamed", "a_text_document", 10, prefix="b_text_document")
    with pytest.raises(DataListError, match="does not match the file name"):
        data_list.build_data_list(tmp_path / "renamed")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.manifest.json").write_text('{"prefix": "a", "tok')
    with pytest.raises(DataListError, match="unreadable manifest"):
        data_list.build_data_list(tmp_path / "broken")
    fabricate(tmp_path / "mixed", "a_text_document", 10)
    fabricate(
        tmp_path / "mixed",
        "b_text_document",
        10,
        tokenizer={"kind": "hf-tokenizer-json", "vocab_size": 32000, "eod": 2},
    )
    with pytest.raises(DataListError, match="same tokenizer"):
        data_list.build_data_list(tmp_path / "mixed")


def test_cli_writes_file_atomically(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fabricate(tmp_path / "data", "a_text_document", 1)
    fabricate(tmp_path / "data", "b_text_document", 2)
    out = tmp_path / "conf" / "data.yaml"
    assert (
        data_list.main(
            ["--data-dir", str(tmp_path / "data"), "--render-dir", "/d", "--format", "yaml", "--out", str(out)]
        )
        == 0
    )
    assert "- 0.333333\n" in out.read_text() and "- 0.666667\n" in out.read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["data.yaml"]
    assert data_list.main(["--data-dir", str(tmp_path / "data"), "--render-dir", "/d"]) == 0
    assert capsys.readouterr().out == (
        "model.data.data_prefix=[0.333333,/d/a_text_document,0.666667,/d/b_text_document]\n"
    )
    assert data_list.main(["--data-dir", str(tmp_path / "empty")]) == 1
    assert "not a folder" in capsys.readouterr().err
