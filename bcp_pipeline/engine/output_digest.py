"""What defines a data stage's outputs, as one digest its jobs are given and its completion records carry.

A workspace outlives runs: outputs another config made (other args, another program, another image, other
inputs) sit where a new run looks for its own, and a stage program that skips complete outputs would take them
for its own. Each data stage's job therefore gets the digest of what defines its outputs, and the stage's
`other_outputs` setting; the program compares the digest with the one its output folder was made under
(stages/_common.py `claim_outputs`) and redoes, refuses or reuses them.

What it hashes, and why each:
- the program's name and content digest: the program file AND every module of stages/ it imports
  (config/programs.py), because the code that writes the outputs may live in a private helper (`_common.py`,
  `_hub_download.py`, ...), and a change there changes the outputs as much as one in the program;
- its args with the pipeline's vars substituted (the built-ins such as ${workspace} stay as written, so the
  digest is the same on every backend, where the workspace's path differs);
- the image of every backend section that names one, so another container (another tokenizer library, say)
  counts as another config, whichever backend runs the stage;
- the digests of the stages it needs, so a change upstream reaches every stage below.
Not hashed: the resources (replicas, processes, instance), which change how the work is split, never its result.

The pretrain stage (`nemo:`) is not covered here: its checkpoints have their own rules (config/nemo.py).
"""

from __future__ import annotations

import hashlib
import json

from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.resources import RESOURCE_TYPES


def output_digest(pipeline: PipelineConfig, name: str) -> str:
    """The digest of what defines stage `name`'s outputs (pure: the program's hash was taken when loading)."""
    stage = pipeline.stages[name]
    # Twice: a var may name another var (`data: ${workspace}/...` then `${data}/zst`); built-ins stay as written,
    # so the digest is the same on every backend.
    args = [substitute(substitute(arg, pipeline.vars), pipeline.vars) for arg in stage.args]
    # An unset image of a backend whose section says `digest_unset_image = False` (one added later: hooks.py) is
    # left out, so adding a backend leaves every digest made before it as it was.
    images = {
        name: image
        for name, resources in RESOURCE_TYPES.items()
        if resources.image_field
        for image in [getattr(stage.resources(name), resources.image_field)]
        if image is not None or resources.digest_unset_image
    }
    defining = {
        "program": stage.program,
        "program_sha256": stage.program_sha256,
        "args": args,
        "images": images,
        "needs": {need: output_digest(pipeline, need) for need in sorted(stage.needs)},
    }
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]
