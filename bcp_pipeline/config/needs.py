"""A stage's `needs`: names, or `{stage: NAME, stream: true}` for an edge whose downstream starts on the upstream's
finished outputs while the upstream still runs (docs/pipelines-yaml.md, "Streamed edges").

    needs: [bpe, {stage: download, stream: true}]

Loading turns each entry into its name (StageConfig.needs, which every DAG walk reads as before) and keeps the
streamed ones in StageConfig.streamed. A streamed edge is refused where it cannot keep its promise: the downstream
program must take its inputs as they land, by the upstream's own completion records (STREAM_READERS), from an
upstream that publishes them so (STREAM_WRITERS), and the downstream must have a verification, which waits for the
upstream's: nothing is declared done on partial input.
"""

from __future__ import annotations

from typing import Any

from bcp_pipeline.config.typed import Where, shown

# Programs that read their inputs as they land, and how a stage must call them to do so (its args): the
# tokenizer takes groups of downloaded shards, the evaluation each checkpoint the training saves.
STREAM_READERS = {"preprocess.py": "--files-per-output", "evaluate.py": "--checkpoints"}
# Programs that publish each output only when complete (a rename into place): the download, which lists every
# output it will write before the first one (`OUT/.manifest/download.json`, with the output digest it is written
# under), and the smoke pretrain, whose checkpoints land in its run's own folder (stages/_pretrain_checkpoints.py).
STREAM_WRITERS = {"download.py", "pretrain_local.py"}
NEED_KEYS = ("stage", "stream")


def split_needs(raw: Any, where: Where) -> tuple[Any, list[str]]:
    """`needs` as the loader builds it (names only), and the names of its streamed edges; a malformed entry is
    refused at its line. Anything not a list is left for the typed loader to refuse."""
    if not isinstance(raw, list):
        return raw, []
    names: list[Any] = []
    streamed: list[str] = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict):
            names.append(entry)
            continue
        at = where.child(index, raw)
        unknown = [key for key in entry if key not in NEED_KEYS]
        if unknown:
            raise at.child(unknown[0], entry).error(
                f"unknown key {unknown[0]!r} in a need; a need is a stage name or {{stage: NAME, stream: true}}"
            )
        stage, stream = entry.get("stage"), entry.get("stream", False)
        if not isinstance(stage, str):
            raise at.error(
                f"a need written as a mapping names its stage: {{stage: NAME, stream: true}}, got stage {shown(stage)}"
            )
        if not isinstance(stream, bool):
            raise at.child("stream", entry).error(f"stream is true or false, got {shown(stream)}")
        names.append(stage)
        if stream:
            streamed.append(stage)
    return names, streamed


def validate_streamed(stage: Any, stages: dict[str, Any], where: Where) -> None:
    """Refuse a streamed edge that could not keep its promise, naming why and what would."""
    for upstream in stage.streamed:
        writer = stages[upstream].program
        if writer not in STREAM_WRITERS:
            raise where.error(
                f"needs {upstream} with stream: true, but {upstream}'s program {writer} does not "
                f"publish its outputs as they complete (programs that do: "
                f"{', '.join(sorted(STREAM_WRITERS))}); drop `stream: true`"
            )
        if getattr(stage, "evaluate_of", None):
            continue  # its args and verification are derived from its training's, and checked then (evaluate.py)
        flag = STREAM_READERS.get(stage.program)
        if flag is None or flag not in stage.args:
            readers = ", ".join(f"{program} with {arg}" for program, arg in STREAM_READERS.items())
            program = f"{stage.program} without {flag}" if flag else stage.program
            raise where.error(
                f"needs {upstream} with stream: true, but {program} cannot start on a part of its "
                f"inputs (programs that can: {readers}); drop `stream: true`"
            )
        if stage.program == "evaluate.py" and stages[upstream].engine is not None:
            engine = stages[upstream].engine
            how = (
                f"for Megatron-Bridge's, give this stage evaluate_of: {upstream} and no args (they are derived)"
                if engine == "megatron_bridge"
                else "the NeMo launcher's are not read: evaluate a megatron_bridge: training"
            )
            raise where.error(
                f"needs {upstream} with stream: true, but evaluate.py given args evaluates the smoke pretrain's "
                f"checkpoints (step=N.pt) only; {how}"
            )
        if not stage.verify:
            raise where.error(
                f"needs {upstream} with stream: true, so its outputs are made while {upstream} runs: "
                "it needs a `verify:` check, which then waits for the upstream's verification"
            )
