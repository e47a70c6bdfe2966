"""The bundled `fineweb-edu-126m` pipeline, offline: its bpe, download and tokenize-preprocess stages and its
held-out file's (download-validation, tokenize-validation), exactly as pipelines.yaml declares them, on the local
backend against the FAKE Hugging Face Hub (tests/fakes/hf_hub.py) on loopback; megatron-core reads the result. (Its
pretrain stage is the NeMo launcher on BCP; `plan` renders it.)"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

from megatron.core.datasets.indexed_dataset import IndexedDataset
from support.gpt2_reference import EOD, reference_tokenizer
from support.hf_dataset import HF_REPO as REPO_ID
from support.hf_dataset import TOKEN, dataset_files

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.selection import RunStore
from bcp_pipeline.engine.state import StageStatus

sys.path.insert(0, str(Path(__file__).parents[1] / "fakes"))
from hf_hub import FakeHub  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_fineweb_edu_pipeline_downloads_and_tokenizes_parquet_from_the_hub_emulator(tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    project = tmp_path / "project"
    shutil.copytree(REPO / "stages", project / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    config = project / "pipelines.yaml"
    shutil.copy(REPO / "pipelines.yaml", config)
    files = dataset_files()
    with FakeHub(page_size=3, token=TOKEN) as hub:
        commit = hub.commit(REPO_ID, files)
        hub.fault("cdn", "001_00000.parquet", "wrong_body")  # caught by its sha256, then fetched again
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        argv = [
            "--config",
            str(config),
            "run",
            "fineweb-edu-126m",
            "--backend",
            "local",
            "--only",
            "bpe",
            "--only",
            "download",
            "--only",
            "tokenize-preprocess",
            "--only",
            "download-validation",
            "--only",
            "tokenize-validation",
            "--set",
            f"vars.repo={REPO_ID}",
            "--set",
            "vars.include=sample/10BT/*.parquet",
            "--set",
            "vars.files=2",  # of the fixture's 3 in sample/10BT: 000_00000.parquet is held out
            "--set",
            "download.local={replicas: 2, processes: 1}",
            "--set",
            "tokenize-preprocess.local={replicas: 1, processes: 2}",
        ]
        assert main(argv) == 0, capsys.readouterr().out
    state = RunStore(project / ".bcp-pipeline").latest()
    counts = {
        name: [c["found"] for c in s.verification["checks"]]
        for name, s in state.stages.items()
        if s.status is StageStatus.SUCCEEDED
    }
    assert counts == {
        "bpe": [2],
        "download": [2],
        "tokenize-preprocess": [2, 2],
        "download-validation": [1],
        "tokenize-validation": [1, 1],
    }
    data = next(project.rglob("data/fineweb-edu"))
    manifest = json.loads((data / "parquet" / ".manifest" / "download.json").read_text())
    assert manifest["source"]["commit"] == commit
    for entry in manifest["entries"]:
        assert hashlib.sha256((data / "parquet" / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
    reference = reference_tokenizer()
    held_out = json.loads((data / "validation" / "parquet" / ".manifest" / "download.json").read_text())
    assert held_out["source"]["commit"] == commit and held_out["files"] == ["000_00000.parquet"]
    assert manifest["files"] == ["001_00000.parquet", "002_00000.parquet"]  # not the held-out one
    for folder, names, stem in (
        (data / "parquet", manifest["files"], data / "preprocessed" / "train_chunk"),
        (data / "validation" / "parquet", held_out["files"], data / "validation" / "preprocessed" / "validation_chunk"),
    ):
        for index, name in enumerate(names):
            texts = pq.read_table(folder / name, columns=["text"]).column(0).to_pylist()
            dataset = IndexedDataset(f"{stem}_{index}.jsonl_text_document")
            tokens = [reference.encode(t).ids + [EOD] for t in texts]
            assert [dataset[i].tolist() for i in range(len(dataset))] == tokens
    assert len(hub.requests_to("cdn", "001_00000.parquet")) == 2
    assert TOKEN not in "".join(p.read_text(errors="replace") for p in project.rglob("*.log"))


def test_plan_renders_the_fineweb_edu_pipeline_for_bcp(capsys):
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", "fineweb-edu-126m", "--json"]) == 0
    jobs = {job["name"]: job for job in json.loads(capsys.readouterr().out)["jobs"]}
    command = lambda name: jobs[name]["argv"][jobs[name]["argv"].index("--commandline") + 1]  # noqa: E731
    assert "download.py --hf-dataset HuggingFaceFW/fineweb-edu --revision main --include " in command(
        "fineweb-edu-126m.download"
    )
    assert "--exclude sample/10BT/000_00000.parquet" in command("fineweb-edu-126m.download")
    assert "'/mount_workspace/data/fineweb-edu/parquet/*.parquet=13'" in command("fineweb-edu-126m.download-verify")
    # The held-out file at the commit the training files' download pinned (tests/stages/test_hf_download.py).
    assert (
        "--revision-of /mount_workspace/data/fineweb-edu/parquet --include sample/10BT/000_00000.parquet "
        "--out /mount_workspace/data/fineweb-edu/validation/parquet"
    ) in command("fineweb-edu-126m.download-validation")
    assert "--files-per-output 1 --json-key text" in command("fineweb-edu-126m.tokenize-preprocess")
    [script] = jobs["fineweb-edu-126m.pretrain"]["files"].values()  # the job's script, run by its commandline
    assert command("fineweb-edu-126m.pretrain").startswith("bash /mount_workspace/.bcp-pipeline/jobs/")
    assert "training=gpt3/126m" in script and "training.trainer.max_steps=17700" in script
    assert '--valid-data-dir "$workspace/data/fineweb-edu/validation/preprocessed" --split-form nemo' in script
    assert "HF_TOKEN" not in json.dumps(jobs)
