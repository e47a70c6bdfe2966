"""A small FineWeb-shaped dataset for the FAKE Hugging Face Hub (tests/fakes/hf_hub.py): parquet files written by
pyarrow (FineWeb's columns), a README and .gitattributes, and the token the hub requires."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
from support.stage_fixtures import iter_documents

TOKEN = "hf_secretTOKEN123"
HF_REPO = "org/web-edu"  # the dataset's repository on the Hub


def parquet_bytes(seed: int, rows: int, row_group_size: int = 16) -> bytes:
    """A small parquet file written by pyarrow: FineWeb's columns (text, id, score), several row groups."""
    docs = list(iter_documents(seed, rows, mean_words=40))
    table = pa.table(
        {
            "text": [d["text"] for d in docs],
            "id": [f"doc-{seed}-{i}" for i in range(rows)],
            "score": [float(i % 5) for i in range(rows)],
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


def dataset_files(version: int = 0) -> dict[str, bytes]:
    files = {f"sample/10BT/{i:03d}_00000.parquet": parquet_bytes(10 * version + i, 40) for i in range(3)}
    files["sample/100BT/000_00000.parquet"] = parquet_bytes(99, 8)
    files["README.md"] = b"---\nlicense: odc-by\n---\n# web-edu (a test fixture)\n"
    files[".gitattributes"] = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
    return files
