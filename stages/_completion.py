"""The records in an output folder's `.completions/`: which config made its outputs, and which ranks finished.

* `claim_outputs`: before any output is skipped as complete, the folder is made this config's (its output digest
  recorded in `.completions/STAGE.digest`; outputs of another config redone, refused or reused);
* `write_completion`: the last thing a rank writes, `.completions/STAGE-RANK-of-WORLD.json`, proof that every item
  of its shard is complete, with where it ran (datatrove's convention).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from _atomic_outputs import atomic_write_json, fsync_dir, remove_stale_temporaries_of
from _progress_lines import emit
from _stage_error import StageError

STARTED_AT = time.time()  # about when this stage program started (its imports before this one aside)
COMPLETIONS_DIR = ".completions"
# What defines this stage's outputs (bcp_pipeline/engine/output_digest.py).
OUTPUT_DIGEST_ENV = "BCP_PIPELINE_OUTPUT_DIGEST"
OTHER_OUTPUTS_ENV = "BCP_PIPELINE_OTHER_OUTPUTS"  # redo | refuse | reuse: outputs made under another digest
DIGEST_WAIT_SECONDS = 1800.0  # how long ranks other than 0 wait for rank 0 to settle the output folder
CLAIMED: list[dict] = []  # what claim_outputs did in this process: said again at the end (write_completion)


def completion_path(output_dir: Path, stage: str, rank: int, world_size: int) -> Path:
    return output_dir / COMPLETIONS_DIR / f"{stage}-{rank:05d}-of-{world_size:05d}.json"


def write_completion(output_dir: Path, stage: str, rank: int, world_size: int, summary: dict) -> None:
    """The last thing a rank writes: proof that every item of its shard is complete, and where it ran."""
    path = completion_path(output_dir, stage, rank, world_size)
    remove_stale_temporaries_of([path])  # a rank killed while writing this record left its temporary (scripts/chaos)
    atomic_write_json(
        path,
        {
            "stage": stage,
            "rank": rank,
            "world_size": world_size,
            "started_at": STARTED_AT,
            "finished_at": time.time(),
            "ran_on": ran_on(),
            # what defines the outputs it vouches for (claim_outputs); absent when run by hand
            **({"output_digest": os.environ[OUTPUT_DIGEST_ENV]} if os.environ.get(OUTPUT_DIGEST_ENV) else {}),
            **summary,
        },
    )
    for claimed in CLAIMED:  # again at the end, where the orchestrator reads a log's tail (engine/outcomes.py)
        emit("outputs", claimed)


def claim_outputs(
    out_dir: Path,
    stage: str,
    outputs: Iterable[Path],
    rank: int,
    environ: Mapping[str, str] | None = None,
    wait_seconds: float = DIGEST_WAIT_SECONDS,
) -> dict:
    """Make `out_dir` this config's before any output is skipped as complete: what was found, as a dict.

    The orchestrator gives each data stage's job the digest of what defines its outputs. Rank 0 compares it with
    the one the folder's outputs were made under (`.completions/STAGE.digest`); where they differ, the existing
    `outputs` are redone (moved aside into `.superseded-DIGEST-TIME/` first: never deleted), refused (StageError
    naming the setting that reuses them) or reused, as OTHER_OUTPUTS_ENV says. It then records the new digest;
    the other ranks wait for that record, so no rank skips an output that is about to be moved aside. Without a
    digest (the program run by hand) nothing is checked."""
    env = os.environ if environ is None else environ
    digest = env.get(OUTPUT_DIGEST_ENV, "")
    if not digest:
        return {"outputs": "unchecked"}
    record = out_dir / COMPLETIONS_DIR / f"{stage}.digest"
    previous = _recorded_digest(record)
    if previous == digest:
        return {"outputs": "same", "digest": digest}  # no line: nothing to tell
    found = sorted(path for path in outputs if path.exists())
    policy = env.get(OTHER_OUTPUTS_ENV, "redo")
    if found and policy == "refuse":
        stage_name = env.get("BCP_PIPELINE_STAGE") or stage  # the pipeline's name of the stage, for --set
        raise StageError(
            f"{len(found)} output(s) in {out_dir} were made by another config (digest "
            f"{previous or 'not recorded'}, this one {digest}), and redoing this stage is costly: "
            f"reuse them with `--set {stage_name}.other_outputs=reuse`, or redo them with "
            f"`--set {stage_name}.other_outputs=redo` (they are moved aside, not deleted)"
        )
    if rank != 0:
        _wait_for_digest(record, digest, wait_seconds)
        return {"outputs": "same", "digest": digest}
    outcome: dict = {
        "outputs": "new" if not found else ("reused" if policy == "reuse" else "redone"),
        "digest": digest,
        "previous_digest": previous,
        "count": len(found),
    }
    if found and policy != "reuse":
        aside = out_dir / f".superseded-{previous or 'unrecorded'}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        for path in [*found, *sorted((out_dir / COMPLETIONS_DIR).glob(f"{stage}-*.json"))]:
            target = aside / path.relative_to(out_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, target)
        fsync_dir(out_dir)
        outcome["set_aside"] = str(aside)
    atomic_write_json(record, {"digest": digest})
    CLAIMED.append({"stage": stage, **outcome})
    emit("outputs", CLAIMED[-1])  # `status` shows what was done with outputs of another config
    return outcome


def claim_or_refuse(out_dir: Path, stage: str, outputs: Iterable[Path], rank: int) -> int:
    """claim_outputs for a stage's main: 0 to go on, or 1 after printing why the outputs were refused."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        claim_outputs(out_dir, stage, outputs, rank)
    except StageError as exc:
        print(f"{stage}: {exc}", file=sys.stderr)
        return 1
    return 0


def _recorded_digest(record: Path) -> str | None:
    return recorded_text(record, "digest")


def recorded_text(path: Path, key: str) -> str | None:
    """The string at `key` of a JSON record, None where there is none (no file yet, unreadable, another shape)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _wait_for_digest(record: Path, digest: str, wait_seconds: float) -> None:
    deadline = time.monotonic() + wait_seconds
    while _recorded_digest(record) != digest:
        if time.monotonic() > deadline:
            raise StageError(f"rank 0 did not record output digest {digest} in {record} within {wait_seconds:.0f} s")
        time.sleep(0.2)


def ran_on(environ: dict[str, str] | None = None) -> dict:
    """Where this process runs: hostname, Slurm's node name (when under Slurm) and the machine's IPv4 addresses.

    Containers and network namespaces may share one hostname across nodes; the node name and the addresses tell
    the nodes apart in the completion records.
    """
    env = os.environ if environ is None else environ
    where: dict = {"hostname": socket.gethostname()}
    if env.get("SLURMD_NODENAME"):
        where["slurmd_nodename"] = env["SLURMD_NODENAME"]
    where["addresses"] = ipv4_addresses()
    return where


def ipv4_addresses() -> list[str]:
    """The IPv4 address of every interface but loopback (Linux ioctl, no subprocess); [] where unavailable."""
    try:
        import fcntl
        import struct

        names = [name for _, name in socket.if_nameindex() if name != "lo"]
    except (ImportError, OSError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:  # SIOCGIFADDR: the interface's primary IPv4 address, at bytes 20..24 of the struct ifreq answer
                answer = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            found.append(socket.inet_ntoa(answer[20:24]))
    return sorted(found)
