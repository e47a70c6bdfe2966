"""`check`'s NeMo probe on BCP: the pretrain stage's own image composes its training config, nothing trains.

For each stage that runs NVIDIA's NeMo launcher, one one-replica job in that stage's image on the ACE's smallest
instance runs the launcher with Hydra's `--cfg job --package training --resolve` and exactly the overrides `run`
renders for it (render.py nemo_launcher_overrides: the node count written out, and a data list of the form the
job builds from the manifests, here two sample prefixes under the stage's data_dir: the flat list, or with
nemo.valid_data_dir, NeMo's per-split dict in its three overrides, the held-out split a sample prefix under that
folder). Hydra composes the config and prints it: an unknown key, a bad override or a missing config is refused as
it would be at the start of the real job. The composed TP/PP, batch sizes, num_nodes, max_steps, per-run time
limit and data list are then compared with what `plan` assumed (config/nemo.py's facts of the image's launcher
release, or the stage's declared sizes).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from bcp_pipeline.backends.bcp.nemo_job import nemo_launcher_overrides, nemo_overrides_digest
from bcp_pipeline.backends.bcp.paths import job_values
from bcp_pipeline.backends.checks import CheckInput, Row, different, lines_of, ok, unchecked
from bcp_pipeline.config.nemo import DATA_LIST, launcher_dir, model_config, time_limits
from bcp_pipeline.config.placeholders import substitute

SAMPLE_PREFIXES = ("bcpp-check-a_text_document", "bcpp-check-b_text_document")
SAMPLE_HELD_OUT = "bcpp-check-v_text_document"  # under nemo.valid_data_dir
CFG = "BCPP-NEMO-CFG"  # each line the launcher printed
DATA = "BCPP-NEMO-DATA"  # each data-list override as the job's shell passed it
EXIT = "BCPP-NEMO-EXIT"
SPLIT = re.compile(r"(\w+):(\[[^\]]*\])")  # one split of NeMo's per-split dict: `train:[0.5,/a,0.5,/b]`
# What plan assumed, by the composed key (under `training`) that must show it.
COMPARED = (
    ("model.tensor_model_parallel_size", "TP"),
    ("model.pipeline_model_parallel_size", "PP"),
    ("model.global_batch_size", "global batch"),
    ("model.micro_batch_size", "micro batch"),
    ("trainer.num_nodes", "num_nodes"),
    ("trainer.max_steps", "max_steps"),
    ("exp_manager.max_time_per_run", "per-run time limit"),
)
FIX_KEY = {
    "model.tensor_model_parallel_size": "tensor_parallel",
    "model.pipeline_model_parallel_size": "pipeline_parallel",
    "model.global_batch_size": "global_batch_size",
    "model.micro_batch_size": "micro_batch_size",
    "trainer.max_steps": "max_steps",
}


@dataclass(frozen=True, kw_only=True)
class NemoProbe:
    stage: str
    image: str
    launcher: str  # main.py of the launcher inside the image
    overrides: list[str]  # as the stage's job passes them, data list excluded
    data_list: list[str]  # the data list file's overrides, in the form stages/data_list.py writes for the job
    expected: dict[str, str]  # composed key under `training` -> the value plan assumed

    @property
    def digest(self) -> str:
        return nemo_overrides_digest(self.image, self.overrides)


def sample_data_list(data_dir: str, valid_data_dir: str | None) -> list[str]:
    """The lines stages/data_list.py writes for the job (one override each) had its manifests been the samples':
    the flat list, or with a held-out split NeMo's per-split dict (render_nemo_per_split: delete the flat list, add
    the dict, splits_string null), the held-out split as validation and test."""
    key = DATA_LIST.key
    train = f"[{','.join(item for prefix in SAMPLE_PREFIXES for item in ('0.5', f'{data_dir}/{prefix}'))}]"
    if valid_data_dir is None:
        return [f"{key}={train}"]
    held_out = f"[1.0,{valid_data_dir}/{SAMPLE_HELD_OUT}]"
    splits_string = f"{key.rpartition('.')[0]}.splits_string"
    return [f"~{key}", f"+{key}={{train:{train},validation:{held_out},test:{held_out}}}", f"{splits_string}=null"]


def plan_nemo_probes(ctx: CheckInput) -> list[NemoProbe]:
    """One probe per stage whose job runs the NeMo launcher (a stage with its own `command` runs none)."""
    probes = []
    backend = None
    for submission in ctx.submissions():
        request = submission.request
        stage = request.stage
        if request.kind != "stage" or stage.nemo is None or request.resources("bcp").command:
            continue
        backend = backend or ctx.backend()
        options = ctx.config.options["bcp"]
        overrides = nemo_launcher_overrides(request, options, backend.stages_dir)
        model = model_config(stage, "bcp")
        resources = request.resources("bcp")
        values = job_values(request, options, backend.stages_dir)  # as the renderer resolves them
        data_dir = substitute(stage.nemo.data_dir, values).rstrip("/")
        valid = stage.nemo.valid_data_dir
        valid_data_dir = substitute(valid, values).rstrip("/") if valid else None
        expected = {
            "model.tensor_model_parallel_size": model.tensor_parallel,
            "model.pipeline_model_parallel_size": model.pipeline_parallel,
            "model.global_batch_size": model.global_batch_size,
            "model.micro_batch_size": model.micro_batch_size,
            "trainer.num_nodes": request.rank_layout("bcp").nodes,
            "trainer.max_steps": model.max_steps,
            "exp_manager.max_time_per_run": time_limits(stage, resources.total_runtime).per_run,
        }
        probes.append(
            NemoProbe(
                stage=stage.name,
                image=submission.payload["spec"]["image"],
                launcher=f"{launcher_dir(stage, 'bcp')}/main.py",
                overrides=overrides,
                data_list=sample_data_list(data_dir, valid_data_dir),
                expected={key: str(value) for key, value in expected.items()},
            )
        )
    return probes


def nemo_commandline(probe: NemoProbe) -> str:
    """Print each data-list override as the job's shell passes it, then the launcher's composed `training`."""
    launcher = shlex.join(["python3", probe.launcher, *probe.overrides, *probe.data_list])
    return "\n".join(
        [
            f"printf '{DATA} %s\\n' {shlex.join(probe.data_list)}",
            "out=$(mktemp)",
            f'{launcher} --cfg job --package training --resolve > "$out" 2>&1; status=$?',
            f"sed 's/^/{CFG} /' \"$out\"",
            f'echo "{EXIT} $status"',
            'rm -f "$out"',
        ]
    )


# -- reading what the job printed (pure) ------------------------------------------------------------------------
def _select(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _missing(tree: Any, path: str = "training") -> list[str]:
    """Keys left at OmegaConf's `???` (a mandatory value nobody gave)."""
    if isinstance(tree, dict):
        return [m for key, value in tree.items() for m in _missing(value, f"{path}.{key}")]
    if isinstance(tree, list):
        return [m for i, value in enumerate(tree) for m in _missing(value, f"{path}[{i}]")]
    return [path] if tree == "???" else []


def _items(value: str) -> list[str] | None:
    """`[0.5,/a,0.5,'/b c']` -> ['0.5', '/a', '0.5', '/b c']; None when it is not that shape."""
    if not (value.startswith("[") and value.endswith("]")):
        return None
    return [item.strip().strip("'") for item in value[1:-1].split(",")] if value[1:-1] else []


def _flat_list(override: str) -> list[str] | None:
    """`key=[0.5,/a,...]` -> its items; None when it is not that shape."""
    return _items(override.partition("=")[2])


def _split_lists(override: str) -> dict[str, list[str]] | None:
    """`+key={train:[0.5,/a],validation:[1.0,/v],test:[1.0,/v]}` -> each split's items; None when not that shape."""
    _, _, value = override.partition("=")
    if not (value.startswith("{") and value.endswith("}")):
        return None
    splits = {name: _items(items) for name, items in SPLIT.findall(value)}
    return {name: items for name, items in splits.items() if items is not None} or None


def _data_as_given(tree: Any, given: list[str]) -> bool:
    """The composed data list is the one the overrides gave: the flat list, or the per-split dict (three lines)."""
    composed = _select(tree, "model.data.data_prefix")
    if len(given) == 1:
        flat = _flat_list(given[0])
        return flat is not None and _same_list(composed, flat)
    if len(given) != 3 or not given[0].startswith("~"):
        return False
    splits = _split_lists(given[1])
    key, _, value = given[2].partition("=")
    return (
        splits is not None
        and isinstance(composed, dict)
        and set(composed) == set(splits)
        and all(_same_list(composed[name], items) for name, items in splits.items())
        and str(_select(tree, key.removeprefix("training."))) == value
    )


def _same_list(composed: Any, given: list[str]) -> bool:
    if not isinstance(composed, list) or len(composed) != len(given):
        return False
    for i, (got, want) in enumerate(zip(composed, given)):
        if i % 2 == 0:
            try:
                if float(got) != float(want):
                    return False
            except (TypeError, ValueError):
                return False
        elif str(got) != want:
            return False
    return True


def nemo_row(probe: NemoProbe, log: str | None, ended) -> tuple[Row, dict[str, Any]]:
    """The row of one stage's probe, and its fact for the profile (composed: True/False/None, what differed)."""
    topic = f"nemo config ({probe.stage})"
    assumes = (
        f"the launcher in {probe.image} composes stage {probe.stage}'s training config from the overrides "
        f"`run` passes, with "
        + ", ".join(f"{name} {probe.expected[key]}" for key, name in COMPARED)
        + " and the data list as built"
    )
    fact: dict[str, Any] = {"stage": probe.stage, "image": probe.image, "digest": probe.digest, "composed": None}
    if ended is None:
        return unchecked(
            topic,
            assumes,
            "the probe job had not ended in time (killed)",
            "a NeMo image is large: its first pull can take long; run `check` again",
        ), fact
    exits = lines_of(log or "", EXIT)
    if not exits:
        return unchecked(
            topic,
            assumes,
            f"the probe job ended {ended.native} without the launcher's answer in its log",
            "its log says why (`ngc base-command job log`)",
        ), fact
    printed = lines_of(log or "", CFG)
    if exits[-1].strip() != "0":
        # Hydra's error ends its output; its closing hint about HYDRA_FULL_ERROR says nothing about this stage.
        said = [line.strip() for line in printed if line.strip() and "HYDRA_FULL_ERROR" not in line][-6:]
        fact.update(composed=False, error=" | ".join(said)[-600:])
        return different(
            topic,
            assumes,
            f"the launcher refused (exit {exits[-1].strip()}): {fact['error']}",
            f"stage {probe.stage} would fail as it starts: fix the key Hydra names (the stage's "
            f"nemo: section, its overrides, or nemo.launcher_dir for this image); `run` refuses it "
            f"while this profile stands",
        ), fact
    try:
        tree = yaml.load("\n".join(printed), Loader=yaml.BaseLoader)  # every value a string: no YAML 1.1 guesses
    except yaml.YAMLError as exc:
        return different(
            topic,
            assumes,
            f"the launcher's output is not YAML: {exc}"[:300],
            "the image's launcher prints its config differently: report it",
        ), fact
    missing = _missing(tree)
    differences = []
    for key, name in COMPARED:
        got = _select(tree, key)
        if str(got) != probe.expected[key]:
            differences.append((key, name, got))
    given = lines_of(log or "", DATA)
    data_ok = _data_as_given(tree, given)
    composed = ", ".join(f"{name} {_select(tree, key)}" for key, name in COMPARED)
    showed = f"composed: {composed}; data list " + (
        "as given" if data_ok else f"{_select(tree, 'model.data.data_prefix')!r}, given {given!r}"
    )
    fact.update(
        composed=True,
        values={key: _select(tree, key) for key, _ in COMPARED},
        data_list_as_given=data_ok,
        missing=missing,
        differences=[key for key, _, _ in differences],
    )
    if missing:
        row = different(
            topic,
            assumes,
            showed + f"; missing values (???): {', '.join(missing[:8])}",
            "the launcher stops on these when it reads them: give them in the stage's nemo.overrides",
        )
        return row, fact
    if differences or not data_ok:
        fixes = [f"--set {probe.stage}.nemo.{FIX_KEY[key]}={got}" for key, _, got in differences if key in FIX_KEY]
        meaning = (
            "plan's node counts, estimates and continuation used the values it assumed: declare what this "
            "image's launcher has" + (f" ({' '.join(fixes)})" if fixes else "")
            if differences
            else ""
        )
        if not data_ok:
            meaning = (meaning + "; " if meaning else "") + (
                "the launcher changed the data list: training would read other data than preprocessing wrote; report it"
            )
        return different(
            topic,
            assumes,
            showed
            + "; differs: "
            + "; ".join(f"{name} {got} (plan assumed {probe.expected[key]})" for key, name, got in differences),
            meaning,
        ), fact
    return ok(topic, assumes, showed), fact
