"""Score an exported model with lm-evaluation-harness (PyPI `lm-eval`) on small tasks over local files, offline.

The tasks are lm-evaluation-harness custom tasks (its own YAML task format, loaded by its own TaskManager) over the
JSON-lines files shipped in stages/lm_eval_tasks/: nothing is fetched from the Hugging Face Hub, and the data set
loads through `datasets`' local json builder. The task configs are written at run time into a scratch folder,
as the harness reads `data_files` relative to the working directory; JSON is YAML, so they are written as JSON.

- `demo_cloze`: 20 sentences and four continuations each, one of them sensible (multiple choice: acc, acc_norm);
- `demo_lastword`: 20 sentences whose last word is nearly fixed by the rest (LAMBADA's idea: perplexity of the last
  word, and acc: whether it is the greedy continuation).

The scores land in SCORES/step-NNNNNNNN.json, in the shape of the evaluate stage's results (step, split, loss,
perplexity, tokens, checkpoint, tasks), the held-out fields left null: this file holds only the tasks.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import _common

TASKS = {
    "demo_cloze": {
        "data": "demo_cloze.jsonl",
        "output_type": "multiple_choice",
        "doc_to_text": "{{context}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{answer}}",
        "target_delimiter": "",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
    },
    "demo_lastword": {
        "data": "demo_lastword.jsonl",
        "output_type": "loglikelihood",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{target}}",
        "target_delimiter": "",
        "metric_list": [
            {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
        ],
    },
}
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def write_task_configs(names: list[str], tasks_dir: Path, folder: Path) -> None:
    """One harness task config per name, its data the shipped file by absolute path."""
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise _common.StageError(f"unknown task(s) {', '.join(unknown)}; the shipped ones: {', '.join(TASKS)}")
    for name in names:
        spec = dict(TASKS[name])
        data = tasks_dir / spec.pop("data")
        if not data.is_file():
            raise _common.StageError(f"{data}: the data of task {name} is missing")
        config = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test",
            "metadata": {"version": 1.0},
            **spec,
        }
        (folder / f"{name}.yaml").write_text(json.dumps(config, indent=2), encoding="utf-8")


def score(model_dir: Path, names: list[str], tasks_dir: Path, batch_size: int = 8) -> dict[str, dict[str, float]]:
    """`{task: {metric: value}}` of lm-evaluation-harness's `hf` model on the CPU (float32, as trained)."""
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    with tempfile.TemporaryDirectory(prefix="lm-eval-") as scratch:
        folder = Path(scratch)
        (folder / "tasks").mkdir()
        write_task_configs(names, tasks_dir, folder / "tasks")
        # The datasets cache of this scoring alone: nothing read from, or left in, the user's cache
        os.environ["HF_DATASETS_CACHE"] = str(folder / "datasets")
        import lm_eval
        from lm_eval.tasks import TaskManager

        manager = TaskManager(include_path=str(folder / "tasks"), include_defaults=False)
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(model_dir), "dtype": "float32"},
            tasks=names,
            device="cpu",
            batch_size=batch_size,
            task_manager=manager,
            log_samples=False,
            bootstrap_iters=0,
        )
    scores = {}
    for name in names:
        metrics = results["results"][name]
        scores[name] = {
            key.split(",", 1)[0]: float(value)
            for key, value in sorted(metrics.items())
            if "," in key and "_stderr" not in key and isinstance(value, (int, float))
        }
    return scores


def result_path(scores_dir: Path, step: int) -> Path:
    return scores_dir / f"step-{step:08d}.json"


def score_and_record(
    model_dir: Path, names: list[str], tasks_dir: Path, scores_dir: Path, record: dict, batch_size: int = 8
) -> dict[str, dict[str, float]]:
    """Score the export `record` describes and write its result file (atomically); returns the scores."""
    scores = score(model_dir, names, tasks_dir, batch_size)
    _common.atomic_write_json(
        result_path(scores_dir, record["step"]),
        {
            "step": record["step"],
            "split": None,
            "loss": None,
            "perplexity": None,
            "tokens": None,
            "checkpoint": record["source"],
            "tasks": scores,
            "model_dir": str(model_dir),
            "weights_sha256": record["weights_sha256"],
        },
    )
    return scores


def describe(scores: dict[str, dict[str, float]]) -> str:
    """`demo_cloze acc 0.450, demo_lastword perplexity 812.3 acc 0.050` (the summary line's part)."""
    return ", ".join(
        f"{task} " + " ".join(f"{metric} {value:.4g}" for metric, value in metrics.items())
        for task, metrics in scores.items()
    )
