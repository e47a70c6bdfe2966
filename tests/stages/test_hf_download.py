"""download.py --hf-dataset against the FAKE Hugging Face Hub (tests/fakes/hf_hub.py) on loopback: listing through
the tree API's pages, the commit pinned in the manifest, sha256 / git blob checks before the rename, and faults."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import _slimpajama_files
import download
import hf_listing
import pytest
from support.hf_dataset import HF_REPO as REPO
from support.hf_dataset import TOKEN, dataset_files
from support.stage_fixtures import iter_documents, jsonl_bytes, run_as_rank, temporaries

sys.path.insert(0, str(Path(__file__).parents[1] / "fakes"))
from hf_hub import FakeHub  # noqa: E402


def args(out: Path, *extra: str) -> list[str]:
    return [
        "--hf-dataset",
        REPO,
        "--include",
        "sample/10BT/*",
        "--out",
        str(out),
        "--workers",
        "2",
        "--backoff",
        "0.01",
        "--max-wait",
        "2",
        "--timeout",
        "10",
        *extra,
    ]


@pytest.fixture
def hub(monkeypatch) -> FakeHub:
    with FakeHub(page_size=2, token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield hub


def manifest(out: Path) -> dict:
    return json.loads((out / ".manifest" / "download.json").read_text())


def test_ranks_list_every_page_pin_the_commit_and_check_sha256(hub, tmp_path, monkeypatch, capsys):
    files = dataset_files()
    commit = hub.commit(REPO, files)
    out = tmp_path / "out"
    for rank in (1, 0):  # rank 1 first: it waits --listing-wait for rank 0's manifest, then lists itself
        assert run_as_rank(download.main, args(out, "--listing-wait", "0.2"), rank, 2, monkeypatch) == 0
    written = manifest(out)
    assert written["source"]["commit"] == commit and written["source"]["revision"] == "main"
    assert written["files"] == ["000_00000.parquet", "001_00000.parquet", "002_00000.parquet"]
    for entry in written["entries"]:
        data = files[entry["path"]]
        assert (out / entry["name"]).read_bytes() == data
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size"] == len(data)
    # The tree is read at the commit, page after page (8 entries, 2 a page); files come from the commit too.
    # Listed once, below the include's folder (3 entries, 2 a page); rank 0 used rank 1's manifest.
    tree = hub.requests_to("hub", "/tree/")
    assert len(tree) == 2 and all(path.endswith(f"/tree/{commit}/sample/10BT") for _, path, _ in tree)
    assert all(f"/resolve/{commit}/" in path for _, path, _ in hub.requests_to("hub", "/resolve/"))
    # The token goes to the hub, never to the CDN the downloads are redirected to, and is never printed.
    assert {auth for _, _, auth in hub.requests_to("hub")} == {f"Bearer {TOKEN}"}
    assert len(hub.requests_to("cdn")) == 3 and {auth for _, _, auth in hub.requests_to("cdn")} == {None}
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err
    assert len(list((out / ".completions").iterdir())) == 2 and temporaries(out) == []


def test_sha256_mismatch_is_retried_and_a_persistent_one_fails_the_file_by_name(hub, tmp_path, monkeypatch, capsys):
    files = dataset_files()
    files["sample/10BT/notes.txt"] = b"kept in git, checked by its blob id\n"
    hub.commit(REPO, files)
    hub.fault("cdn", "000_00000.parquet", "wrong_body")  # once: the retry gets the right bytes
    hub.fault("hub", "notes.txt", "wrong_body")  # a git file: its blob id catches it
    hub.fault("cdn", "002_00000.parquet", "wrong_body", times=3)  # as many as --attempts
    out = tmp_path / "out"
    assert run_as_rank(download.main, args(out, "--attempts", "3"), 0, 1, monkeypatch) == 1
    err = capsys.readouterr().err
    assert "000_00000.parquet: sha256 mismatch" in err and "notes.txt: git blob id mismatch" in err
    assert "002_00000.parquet: sha256 mismatch" in err and "3 attempt(s)" in err
    assert (out / "000_00000.parquet").read_bytes() == files["sample/10BT/000_00000.parquet"]
    assert (out / "notes.txt").read_bytes() == files["sample/10BT/notes.txt"]
    assert not (out / "002_00000.parquet").exists() and temporaries(out) == []
    assert not (out / ".completions").exists()
    # The next run fetches only what is missing, and finishes.
    assert run_as_rank(download.main, args(out), 0, 1, monkeypatch) == 0
    assert len(hub.requests_to("cdn", "000_00000.parquet")) == 2


def test_rate_limits_and_cut_bodies_are_retried(hub, tmp_path, monkeypatch, capsys):
    files = dataset_files()
    hub.commit(REPO, files)
    hub.fault("hub", "/revision/", "too_many")
    hub.fault("hub", "/tree/", "too_many", times=2)
    hub.fault("hub", "001_00000.parquet", "too_many", retry_after="1")
    hub.fault("cdn", "002_00000.parquet", "cut", times=2)
    out = tmp_path / "out"
    assert run_as_rank(download.main, args(out), 0, 1, monkeypatch) == 0
    err = capsys.readouterr().err
    assert "listing: HTTP 429" in err and "001_00000.parquet: HTTP 429" in err and "retrying in 1." in err
    assert "002_00000.parquet: ChunkedEncodingError: Connection broken: IncompleteRead" in err
    for entry in manifest(out)["entries"]:
        assert (out / entry["name"]).read_bytes() == files[entry["path"]]


def test_a_branch_moving_mid_listing_or_between_resumes_never_mixes_versions(hub, tmp_path, monkeypatch, capsys):
    old = hub.commit(REPO, dataset_files(0))
    new_files = {path.replace("_00000", "_00001"): data for path, data in dataset_files(1).items()}
    new = hub.commit(REPO, new_files, branch="next")
    hub.move_branch_after_page(REPO, "main", new)  # main moves to `new` once the first tree page is out
    hub.fault("cdn", "001_00000.parquet", "too_many", times=99)  # leave the run unfinished
    out = tmp_path / "out"
    assert run_as_rank(download.main, args(out, "--attempts", "2"), 0, 1, monkeypatch) == 1
    assert manifest(out)["source"]["commit"] == old
    assert manifest(out)["files"] == ["000_00000.parquet", "001_00000.parquet", "002_00000.parquet"]
    capsys.readouterr()

    # main now is `new`: the resume is refused, naming both commits and the way to finish the started version.
    hub.clear_faults()
    assert run_as_rank(download.main, args(out), 0, 1, monkeypatch) == 2
    err = capsys.readouterr().err
    assert f"now resolves to commit {new}" in err and f"started at commit {old}" in err
    assert f"--revision {old}" in err
    assert not (out / "001_00000.parquet").exists()

    assert run_as_rank(download.main, args(out, "--revision", old), 0, 1, monkeypatch) == 0
    assert sorted(p.name for p in out.glob("*.parquet")) == manifest(out)["files"]
    assert (out / "001_00000.parquet").read_bytes() == dataset_files(0)["sample/10BT/001_00000.parquet"]
    # Another selection in the same folder is refused as well.
    assert run_as_rank(download.main, args(out, "--revision", old, "--include", "*.md"), 0, 1, monkeypatch) == 2
    assert "use another --out" in capsys.readouterr().err.lower()


def held_out_args(out: Path, *extra: str, repo: str = REPO) -> list[str]:
    return ["--hf-dataset", repo, "--include", "sample/10BT/000_00000.parquet", "--out", str(out), *extra]


def test_revision_of_downloads_the_commit_another_download_pinned_after_the_branch_moved(
    hub, tmp_path, monkeypatch, capsys
):
    old = hub.commit(REPO, dataset_files(0))
    training = tmp_path / "parquet"
    assert run_as_rank(download.main, args(training, "--exclude", "*/000_00000.parquet"), 0, 1, monkeypatch) == 0
    hub.commit(REPO, dataset_files(1))  # main moves on, the held-out file with it, before that file is fetched
    held_out = tmp_path / "validation"
    assert run_as_rank(download.main, held_out_args(held_out, "--revision-of", str(training)), 0, 1, monkeypatch) == 0
    assert manifest(held_out)["source"]["commit"] == manifest(training)["source"]["commit"] == old
    assert manifest(held_out)["files"] == ["000_00000.parquet"]
    assert (held_out / "000_00000.parquet").read_bytes() == dataset_files(0)["sample/10BT/000_00000.parquet"]
    assert dataset_files(0)["sample/10BT/000_00000.parquet"] != dataset_files(1)["sample/10BT/000_00000.parquet"]
    capsys.readouterr()

    # No manifest there yet (the download it follows has not run), or another repo's: refused, naming the folder.
    early = tmp_path / "early"
    assert run_as_rank(download.main, held_out_args(early, "--revision-of", str(tmp_path)), 0, 1, monkeypatch) == 2
    assert f"--revision-of {tmp_path}: no download manifest there yet" in capsys.readouterr().err
    other_repo = held_out_args(early, "--revision-of", str(training), repo="someone/else")
    assert run_as_rank(download.main, other_repo, 0, 1, monkeypatch) == 2
    assert f"that folder holds {REPO}, not someone/else" in capsys.readouterr().err
    assert list(early.glob("*.parquet")) == []
    with pytest.raises(SystemExit):
        download.parse_args(held_out_args(early, "--revision-of", str(training), "--revision", old))
    assert "give it or --revision, not both" in capsys.readouterr().err


def test_unknown_repo_or_revision_fails_with_its_name(hub, tmp_path, monkeypatch, capsys):
    hub.commit(REPO, dataset_files())
    out = tmp_path / "out"
    assert run_as_rank(download.main, args(out, "--revision", "v9", "--attempts", "1"), 0, 1, monkeypatch) == 1
    err = capsys.readouterr().err
    assert f"cannot list {REPO} at revision 'v9'" in err and "HTTP 404" in err
    other = ["--hf-dataset", REPO, "--include", "sample/*/*.csv", "--out", str(tmp_path / "other")]
    assert run_as_rank(download.main, other, 0, 1, monkeypatch) == 1
    assert (
        "no file matches --include ['sample/*/*.csv'] --exclude [] (4 files in the revision)" in capsys.readouterr().err
    )
    missing = ["--hf-dataset", REPO, "--include", "nothing/*", "--out", str(tmp_path / "other"), "--attempts", "1"]
    assert run_as_rank(download.main, missing, 0, 1, monkeypatch) == 1
    assert "/tree/" in capsys.readouterr().err
    assert not (out / ".completions").exists() and not (tmp_path / "other" / ".completions").exists()


def test_bad_arguments_exit_2(tmp_path, capsys):
    for argv in (
        ["--hf-dataset", "a b"],
        ["--hf-dataset", "o/n", "--chunks", "1"],
        ["--include", "*.parquet"],
        ["--revision-of", str(tmp_path)],
    ):
        with pytest.raises(SystemExit) as exit_info:
            download.parse_args([*argv, "--out", str(tmp_path)])
        assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "expected a repo id" in err and "--chunks do not apply" in err and "need --hf-dataset" in err


def test_names_selection_and_bad_listings():
    assert hf_listing.listing_root(["train/chunk*/*.jsonl.zst"]) == "train"
    assert hf_listing.listing_root(["sample/10BT/*.parquet", "sample/100BT/a.parquet"]) == "sample"
    assert hf_listing.listing_root(["*.md", "data/x"]) == "" and hf_listing.listing_root([]) == ""
    item = lambda path: hf_listing.HubItem("", path, 1)  # noqa: E731
    named = hf_listing.named(
        hf_listing.select(
            [item("a/b/x.parquet"), item("a/b/c/y.parquet"), item("a/.cache/z"), item("a/b/.gitattributes")], [], []
        )
    )
    assert [i.name for i in named] == ["c__y.parquet", "x.parquet"]  # below the common folder a/b
    slim = hf_listing.named(
        [item("train/chunk1/example_train_0.jsonl.zst"), item("train/chunk10/example_train_12.jsonl.zst")]
    )
    assert [i.name for i in slim] == ["example_train_chunk10_12.jsonl.zst", "example_train_chunk1_0.jsonl.zst"]
    with pytest.raises(hf_listing.ListingError, match="would both be saved as 'x__y'"):
        hf_listing.named([item("d/x__y"), item("d/x/y")])
    with pytest.raises(hf_listing.ListingError, match="URL: entry 2 has no usable path and size"):
        hf_listing.parse_tree_page([{"type": "file", "path": "a", "size": 1}, {"type": "file", "path": "b"}], "URL")
    with pytest.raises(hf_listing.ListingError, match="lfs.oid is not a sha256"):
        hf_listing.parse_tree_page([{"type": "file", "path": "a", "size": 1, "lfs": {"oid": "x"}}], "URL")
    with pytest.raises(hf_listing.ListingError, match="40-hex-digit"):
        hf_listing.parse_commit({"sha": "main"}, "URL")


def test_slimpajama_through_the_listing_keeps_its_names_and_checks_zstd_and_sha256(hub, tmp_path, monkeypatch, capsys):
    """The slimpajama-* pipelines' download args (pipelines.yaml) against a SlimPajama-shaped repo."""
    from support.stage_fixtures import compress

    from bcp_pipeline.config.load import load_config

    shard = lambda seed: compress(jsonl_bytes(iter_documents(seed, 5)))  # noqa: E731
    files = {
        f"{split}/chunk{c}/{stem}_{i}.jsonl.zst": shard(100 * c + i)
        for split, stem in (("train", "example_train"), ("validation", "example_holdout"))
        for c in (1, 2)
        for i in range(3)
    }
    files["README.md"] = b"# SlimPajama-627B\n"
    hub.commit("cerebras/SlimPajama-627B", files)
    hub.fault("cdn", "train/chunk1/example_train_2.jsonl.zst", "cut")
    pipeline = load_config(Path(__file__).resolve().parents[2] / "pipelines.yaml").pipeline("slimpajama-126m")
    argv = [
        arg.replace("${include}", stage_vars(pipeline)["include"]).replace("${data}", str(tmp_path))
        for arg in pipeline.stages["download"].args
    ] + ["--backoff", "0.01"]
    assert "--hf-dataset" in argv and "train/chunk1/*.jsonl.zst" in argv
    assert run_as_rank(download.main, argv, 0, 1, monkeypatch) == 0
    out = tmp_path / "zst"
    names = [f"example_train_chunk1_{i}.jsonl.zst" for i in range(3)]
    assert manifest(out)["files"] == names == sorted(p.name for p in out.glob("*.jsonl.zst"))
    for name, entry in zip(names, manifest(out)["entries"]):
        assert (out / name).read_bytes() == files[entry["path"]] and entry["sha256"]
    # The built-in counts stay what verification expects: the pipeline's `files` is chunk 1's real count.
    assert stage_vars(pipeline)["files"] == str(_slimpajama_files.TRAIN_FILES_PER_CHUNK[0])


def stage_vars(pipeline) -> dict[str, str]:
    return {key: str(value) for key, value in pipeline.vars.items()}
