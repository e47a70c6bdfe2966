"""What the download stage fetches from a Hugging Face dataset repo: one revision, pinned to its commit.

The Hub's API gives, for a dataset revision:

* `GET {endpoint}/api/datasets/{repo}/revision/{revision}` -> `{"sha": COMMIT, ...}`: the commit a branch, tag or
  commit id stands for right now;
* `GET {endpoint}/api/datasets/{repo}/tree/{COMMIT}?recursive=true` -> `[{"type": "file", "path", "size", "oid",
  "lfs": {"oid": SHA256, "size"}}, ...]`, in pages linked by `Link: <URL>; rel="next"`;
* `GET {endpoint}/datasets/{repo}/resolve/{COMMIT}/{path}`: the file (a 302 to a CDN for LFS files).

The listing is always taken at the commit, never at the branch name, so a branch that moves while the pages are
read cannot mix two versions; and the manifest records the commit, so every rank and every resume downloads the
same version. A resume whose revision now resolves to another commit is refused (`PinnedRevisionError`) rather
than finished with files of two versions.

This module is the listing and the manifest only (standard library, pure but for the `get_json` it is handed);
the transfer, its retries and its checks (sha256 of LFS files, git blob id of the others) are the download
stage's (_fetch_attempt.py, _fetcher.py).
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import json
import os
import posixpath
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

import _common

DEFAULT_ENDPOINT = "https://huggingface.co"
ENDPOINT_ENV = "HF_ENDPOINT"  # the same variable huggingface_hub reads (a mirror, or the tests' emulator)
COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# SlimPajama's layout keeps the names the pipelines have always used: train/chunk1/example_train_0.jsonl.zst ->
# example_train_chunk1_0.jsonl.zst (the same flat names as download.py's built-in list).
SLIMPAJAMA_PATH = re.compile(r"(?:train|validation|test)/chunk(\d+)/(example_(?:train|holdout))_(\d+)\.jsonl\.zst")
MAX_PAGES = 100_000  # a Link header that never ends is a server bug, not a dataset

# get_json(url) -> (decoded JSON body, the URL of the next page or None); raises on failure after its own retries.
GetJson = Callable[[str], tuple[object, str | None]]


class ListingError(Exception):
    """The Hub's answer cannot be used, or the request cannot be met; the message says what and what to do."""


class PinnedRevisionError(ListingError):
    """The output folder holds part of another version (commit or selection) than this run asks for."""


@dataclass(frozen=True)
class HubItem:
    """One file of the listing: its flat local name, its path in the repo, and what the listing says it is."""

    name: str
    path: str
    size: int
    sha256: str | None = None  # LFS files: the sha256 of the content
    git_oid: str | None = None  # other files: the git blob id (sha1 of "blob SIZE\\0" + content)

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/{quote(self.path)}"


@dataclass(frozen=True)
class Source:
    """What a download folder holds: which dataset, which revision was asked, the commit it resolved to, which
    files were selected. Written into the manifest; a resume must ask for the same."""

    hf_dataset: str
    revision: str
    commit: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    endpoint: str

    def resolve_base(self) -> str:
        """The URL the files of this commit are under (`item.url(base)`)."""
        return f"{self.endpoint.rstrip('/')}/datasets/{self.hf_dataset}/resolve/{self.commit}"


def endpoint_from_env(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return (env.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")


def revision_url(endpoint: str, repo: str, revision: str) -> str:
    return f"{endpoint}/api/datasets/{repo}/revision/{quote(revision, safe='')}"


def tree_url(endpoint: str, repo: str, commit: str, under: str = "") -> str:
    folder = f"/{quote(under)}" if under else ""
    return f"{endpoint}/api/datasets/{repo}/tree/{commit}{folder}?recursive=true"


def listing_root(include: Iterable[str]) -> str:
    """The deepest folder every `include` glob lies under (its leading components without a wildcard), so only
    that part of the tree is listed: `train/chunk*/*.jsonl.zst` -> `train`. "" (the whole repo) when none."""
    roots = [
        list(itertools.takewhile(lambda part: part and not any(c in part for c in "*?["), pattern.split("/")[:-1]))
        for pattern in include
    ]
    common: list[str] = []
    for parts in zip(*roots) if roots else ():
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return "/".join(common)


# ---------------------------------------------------------------------------------------------------------------
# Reading the Hub's answers
# ---------------------------------------------------------------------------------------------------------------


def parse_commit(payload: object, url: str) -> str:
    sha = payload.get("sha") if isinstance(payload, dict) else None
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise ListingError(f'{url}: expected a JSON object with a 40-hex-digit "sha", got {str(payload)[:200]!r}')
    return sha


def parse_tree_page(payload: object, url: str) -> list[HubItem]:
    """The files of one page (folders are skipped; `recursive=true` lists their files too). Names come later."""
    if not isinstance(payload, list):
        raise ListingError(f"{url}: expected a JSON list of tree entries, got {type(payload).__name__}")
    files: list[HubItem] = []
    for number, entry in enumerate(payload, 1):
        if not isinstance(entry, dict) or entry.get("type") not in ("file", "directory"):
            raise ListingError(f"{url}: entry {number} is not a file or directory entry: {str(entry)[:200]!r}")
        if entry["type"] != "file":
            continue
        path, size, lfs = entry.get("path"), entry.get("size"), entry.get("lfs")
        if not isinstance(path, str) or not path or not isinstance(size, int) or size < 0:
            raise ListingError(f"{url}: entry {number} has no usable path and size: {str(entry)[:200]!r}")
        sha256 = lfs.get("oid") if isinstance(lfs, dict) else None
        if lfs is not None and not (isinstance(sha256, str) and SHA256.fullmatch(sha256)):
            raise ListingError(f"{url}: {path}: its lfs.oid is not a sha256: {str(lfs)[:200]!r}")
        oid = entry.get("oid")
        git_oid = oid if sha256 is None and isinstance(oid, str) and re.fullmatch(r"[0-9a-f]{40}", oid) else None
        files.append(HubItem(name="", path=path, size=size, sha256=sha256, git_oid=git_oid))
    return files


def list_revision(
    get_json: GetJson, endpoint: str, repo: str, revision: str, under: str = ""
) -> tuple[str, list[HubItem]]:
    """(commit, every file of the repo at that commit below the folder `under`), all pages read. The tree is
    listed at the commit, not at `revision`, so pages cannot come from two versions even when the branch moves."""
    url = revision_url(endpoint, repo, revision)
    commit = parse_commit(get_json(url)[0], url)
    files: list[HubItem] = []
    next_url: str | None = tree_url(endpoint, repo, commit, under)
    for _ in range(MAX_PAGES):
        if next_url is None:
            break
        payload, following = get_json(next_url)
        files += parse_tree_page(payload, next_url)
        next_url = following
    else:
        raise ListingError(
            f"{tree_url(endpoint, repo, commit, under)}: more than {MAX_PAGES} pages; a pagination loop?"
        )
    paths = [item.path for item in files]
    if len(set(paths)) != len(paths):
        duplicate = next(p for p in paths if paths.count(p) > 1)
        raise ListingError(f"{repo}@{commit}: the listing names {duplicate!r} twice (pages overlap)")
    return commit, files


# ---------------------------------------------------------------------------------------------------------------
# Selecting and naming
# ---------------------------------------------------------------------------------------------------------------


def select(files: Iterable[HubItem], include: Iterable[str], exclude: Iterable[str]) -> list[HubItem]:
    """Files matching an `include` glob (all when none) and no `exclude` glob (fnmatch on the whole path, `*`
    crosses `/`); dot files and folders (`.gitattributes`, `.cache/`) never: they are repository plumbing."""
    include, exclude = list(include) or ["*"], list(exclude)
    return [
        item
        for item in files
        if not any(part.startswith(".") for part in item.path.split("/"))
        and any(fnmatch.fnmatchcase(item.path, pattern) for pattern in include)
        and not any(fnmatch.fnmatchcase(item.path, pattern) for pattern in exclude)
    ]


def flat_name(path: str, common: str) -> str:
    """SlimPajama's own names for its layout; otherwise the path below the common folder, `/` written `__`."""
    if match := SLIMPAJAMA_PATH.fullmatch(path):
        return f"{match[2]}_chunk{match[1]}_{match[3]}.jsonl.zst"
    return path[len(common) :].lstrip("/").replace("/", "__")


def named(files: list[HubItem]) -> list[HubItem]:
    """The files with their flat local names, sorted by name (the order ranks cut their shards from)."""
    folders = [posixpath.dirname(item.path) for item in files]
    common = posixpath.commonpath(folders) if folders and all(folders) else ""
    items = sorted(
        (HubItem(flat_name(i.path, common), i.path, i.size, i.sha256, i.git_oid) for i in files),
        key=lambda item: item.name,
    )
    for before, after in zip(items, items[1:]):
        if before.name == after.name:
            raise ListingError(
                f"{before.path!r} and {after.path!r} would both be saved as {before.name!r}; "
                "narrow the selection with --include/--exclude"
            )
    return items


# ---------------------------------------------------------------------------------------------------------------
# The manifest: written once, then the only truth for every rank and every resume
# ---------------------------------------------------------------------------------------------------------------


def manifest_payload(stage: str, source: Source, items: list[HubItem]) -> dict:
    """`files` (flat names) is what later stages read; `source` and `entries` are what a resume downloads."""
    return {
        "stage": stage,
        "count": len(items),
        "files": [item.name for item in items],
        "source": {**asdict(source), "include": list(source.include), "exclude": list(source.exclude)},
        "entries": [asdict(item) for item in items],
    }


def read_manifest(path: Path) -> tuple[Source, list[HubItem]] | None:
    """The pinned source and items of an existing manifest; None when there is none. A manifest of the SlimPajama
    list (no `source`) or an unreadable one is an error naming the file: it is not this run's to overwrite."""
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ListingError(f"{path}: unreadable download manifest ({exc}); fix or remove it") from exc
    try:
        raw = payload["source"]
        source = Source(
            raw["hf_dataset"],
            raw["revision"],
            raw["commit"],
            tuple(raw["include"]),
            tuple(raw["exclude"]),
            raw["endpoint"],
        )
        items = [HubItem(**entry) for entry in payload["entries"]]
    except (KeyError, TypeError) as exc:
        raise ListingError(
            f"{path}: not a manifest of a Hugging Face listing (no {exc}); this folder holds "
            "another download: use another --out, or remove the manifest to start over"
        ) from exc
    return source, items


def check_same_request(pinned: Source, wanted: Source, commit_now: str, path: Path) -> None:
    """Refuse to add files of another dataset, selection or commit to a folder that holds part of one."""
    out = path.parent.parent
    if (pinned.hf_dataset, pinned.include, pinned.exclude) != (wanted.hf_dataset, wanted.include, wanted.exclude):
        raise PinnedRevisionError(
            f"{path}: {out} holds {pinned.hf_dataset} with --include {list(pinned.include)} --exclude "
            f"{list(pinned.exclude)}; this run asks for {wanted.hf_dataset} with --include {list(wanted.include)} "
            f"--exclude {list(wanted.exclude)}. Use another --out, or remove {out} to start over"
        )
    if commit_now != pinned.commit:
        raise PinnedRevisionError(
            f"{path}: revision {wanted.revision!r} of {wanted.hf_dataset} now resolves to commit {commit_now}, but "
            f"this download started at commit {pinned.commit} (revision {pinned.revision!r}); finishing it now would "
            f"mix two versions of the dataset. Rerun with --revision {pinned.commit} to finish the version already "
            f"started, or remove {out} to download commit {commit_now} from the start"
        )


def publish_once(path: Path, data: bytes) -> bool:
    """Create `path` with `data` unless it exists (atomically: a link, which fails on an existing name). True if
    this call created it. Ranks that list at the same time race here; the first manifest wins for all of them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _common.temp_path_for(path)
    with _common.atomic_output(tmp) as handle:
        handle.write(data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _common.fsync_dir(path.parent)
    return True


def wait_for(path: Path, seconds: float, poll: float = 0.5) -> None:
    """Return once `path` exists or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(poll)


def pin(
    get_json: GetJson,
    wanted: Source,
    manifest_path: Path,
    stage: str,
    log: Callable[[str], None],
    wait_seconds: float = 0.0,
) -> tuple[Source, list[HubItem]]:
    """The source and items this rank downloads: the manifest's when there is one (after checking that the
    revision still resolves to its commit), else a fresh listing, published as the manifest unless another rank
    published one first (then that one, checked the same way). With `wait_seconds`, first wait that long for
    another rank's manifest: a hundred ranks each reading SlimPajama's sixty-odd tree pages would only be told
    to slow down (429)."""
    url = revision_url(wanted.endpoint, wanted.hf_dataset, wanted.revision)
    if wait_seconds > 0:
        wait_for(manifest_path, wait_seconds)
    existing = read_manifest(manifest_path)
    if existing is not None:
        check_same_request(existing[0], wanted, parse_commit(get_json(url)[0], url), manifest_path)
        return existing
    commit, files = list_revision(
        get_json, wanted.endpoint, wanted.hf_dataset, wanted.revision, listing_root(wanted.include)
    )
    items = named(select(files, wanted.include, wanted.exclude))
    if not items:
        raise ListingError(
            f"{wanted.hf_dataset}@{commit}: no file matches --include {list(wanted.include)} "
            f"--exclude {list(wanted.exclude)} ({len(files)} files in the revision)"
        )
    source = Source(wanted.hf_dataset, wanted.revision, commit, wanted.include, wanted.exclude, wanted.endpoint)
    data = (json.dumps(manifest_payload(stage, source, items), indent=2, sort_keys=True) + "\n").encode()
    if publish_once(manifest_path, data):
        log(
            f"{wanted.hf_dataset}: revision {wanted.revision!r} is commit {commit}: {len(items)} files, "
            f"{sum(i.size for i in items):,} bytes"
        )
        return source, items
    published = read_manifest(manifest_path)
    assert published is not None, "publish_once found the manifest, so it exists"
    check_same_request(published[0], wanted, commit, manifest_path)
    return published
