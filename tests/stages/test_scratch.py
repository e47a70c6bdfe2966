"""Node-local scratch for a stage's temporary files (stages/_scratch.py): BCP_PIPELINE_SCRATCH, as Grid Engine's
`gridengine.node_scratch` sets it; preprocess spills its document lengths there and still writes its outputs
atomically in the workspace. On the real cell: tests/e2e/test_gridengine_site_e2e.py."""

from __future__ import annotations

from pathlib import Path

import preprocess
from _scratch import SCRATCH_ENV, scratch_path_for
from support.gpt2_reference import GPT2
from support.stage_fixtures import iter_documents, jsonl_bytes, run_as_rank, snapshot, temporaries


def write_chunk(folder: Path, index: int, payload: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"train_chunk_{index}.jsonl").write_bytes(payload)


def test_a_temporary_goes_to_scratch_where_the_job_has_some_else_next_to_its_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "out" / "x.lengths"
    monkeypatch.delenv(SCRATCH_ENV, raising=False)
    assert scratch_path_for(target).parent == target.parent and scratch_path_for(target).name.startswith(".x.")
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path / "gone"))  # a folder that is not there: no scratch
    assert scratch_path_for(target).parent == target.parent
    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path / "scratch"))
    assert scratch_path_for(target).parent == tmp_path / "scratch"


def test_preprocess_spills_to_scratch_and_its_outputs_are_the_same_bytes_in_the_workspace(
    tmp_path, monkeypatch
) -> None:
    for index in range(2):
        write_chunk(tmp_path / "in", index, jsonl_bytes(iter_documents(10 + index, 30)) * 4)
    monkeypatch.delenv(SCRATCH_ENV, raising=False)
    plain = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "plain"), *GPT2, "--workers", "1"]
    assert run_as_rank(preprocess.main, plain, 0, 1, monkeypatch) == 0

    spills: list[str] = []

    class Watched(preprocess.IndexedDatasetWriter):  # the real writer, its spill file's name noted
        def __init__(self, bin_out, spill, dtype) -> None:
            spills.append(spill.name)
            super().__init__(bin_out, spill, dtype)

    monkeypatch.setattr(preprocess, "IndexedDatasetWriter", Watched)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv(SCRATCH_ENV, str(scratch))
    scratched = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "scratched"), *GPT2, "--workers", "1"]
    assert run_as_rank(preprocess.main, scratched, 0, 1, monkeypatch) == 0
    assert len(spills) == 2 and all(Path(name).parent == scratch for name in spills), spills
    assert snapshot(tmp_path / "scratched") == snapshot(tmp_path / "plain")
    assert temporaries(tmp_path / "scratched") == [] and list(scratch.iterdir()) == []
