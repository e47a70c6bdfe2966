"""What stages/' content hash (the upload's destination in the workspace) covers: every file the upload takes, in
every folder, so a stage program's private helper in a subfolder gets a new destination when it changes."""

from __future__ import annotations

from pathlib import Path

from bcp_pipeline.backends.bcp.paths import code_hash, uploaded_files


def make_stages(root: Path) -> Path:
    stages = root / "stages"
    (stages / "_helpers").mkdir(parents=True)
    (stages / "extract.py").write_text("import _helpers.io\n")
    (stages / "_helpers" / "io.py").write_text("CHUNK = 1\n")
    (stages / "bootstrap.sh").write_text('exec "$@"\n')
    return stages


def test_a_change_in_a_subfolder_changes_the_hash(tmp_path):
    stages = make_stages(tmp_path)
    before = code_hash(stages)
    (stages / "_helpers" / "io.py").write_text("CHUNK = 2\n")
    assert code_hash(stages) != before


def test_a_moved_file_changes_the_hash_and_compiled_caches_do_not(tmp_path):
    stages = make_stages(tmp_path)
    before = code_hash(stages)
    (stages / "_helpers" / "__pycache__").mkdir()
    (stages / "_helpers" / "__pycache__" / "io.cpython-311.pyc").write_bytes(b"\0compiled")
    (stages / "__pycache__").mkdir()
    (stages / "__pycache__" / "extract.cpython-311.pyc").write_bytes(b"\0compiled")
    assert code_hash(stages) == before
    (stages / "_helpers" / "io.py").rename(stages / "_helpers" / "files.py")
    assert code_hash(stages) != before


def test_the_hash_covers_exactly_the_uploaded_files(tmp_path):
    stages = make_stages(tmp_path)
    (stages / "__pycache__").mkdir()
    (stages / "__pycache__" / "x.pyc").write_bytes(b"")
    assert [p.relative_to(stages).as_posix() for p in uploaded_files(stages)] == [
        "_helpers/io.py",
        "bootstrap.sh",
        "extract.py",
    ]
