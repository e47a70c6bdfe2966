"""What defines a data stage's outputs, as one digest its jobs are given and its completion records carry.

A workspace outlives runs: outputs another config made (other args, another program, another image, other
inputs) sit where a new run looks for its own, and a stage program that skips complete outputs would take them
for its own. Each data stage's job therefore gets the digest of what defines its outputs (the program's content,
its args with the pipeline's vars in, the image, and the digests of the stages it needs, so a change upstream
reaches every stage below) and the stage's `other_outputs` setting; the program compares the digest with the one
its output folder was made under (stages/_common.py `claim_outputs`) and redoes, refuses or reuses them.

The pretrain stage (`nemo:`) is not covered here: its checkpoints have their own rules (config/nemo.py).
"""

from __future__ import annotations

import hashlib
import json

from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.config.placeholders import substitute


def output_digest(pipeline: PipelineConfig, name: str) -> str:
    """The digest of what defines stage `name`'s outputs (pure: the program's hash was taken when loading)."""
    stage = pipeline.stages[name]
    # Twice: a var may name another var (`data: ${workspace}/...` then `${data}/zst`); built-ins stay as written,
    # so the digest is the same on every backend.
    args = [substitute(substitute(arg, pipeline.vars), pipeline.vars) for arg in stage.args]
    defining = {"program": stage.program, "program_sha256": stage.program_sha256, "args": args,
                "images": {"bcp": stage.bcp.image, "slurm": stage.slurm.container_image},
                "needs": {need: output_digest(pipeline, need) for need in sorted(stage.needs)}}
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]
