"""What every check reads: the config, the pipeline (when one was named), its rendered jobs, where state lives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bcp_pipeline.backends.contract import Backend, Submission
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.report.estimates import estimate_pipeline
from bcp_pipeline.config.instances import instances_table

CHECK_RUN_ID = "{pipeline}-CHECK"  # the run id the rendered jobs carry (never submitted under it)


@dataclass(kw_only=True)
class CheckContext:
    config: Config
    pipeline: PipelineConfig | None  # None: only the service is checked, no per-stage rows
    backend_name: str
    state_root: Path
    environ: Mapping[str, str]
    jobs: bool = True  # probe jobs allowed (`--no-jobs`: False)
    detach: bool = False  # judge the ACE also for `run --detach`'s driver
    announce: Callable[[str], None] = lambda line: None  # says what is about to cost something (probe jobs)
    _submissions: list[Submission] | None = field(default=None, repr=False)

    def backend(self) -> Backend:
        assert self.pipeline is not None
        run_id = CHECK_RUN_ID.format(pipeline=self.pipeline.name)
        return make_backend(self.backend_name, self.config, self.pipeline, self.state_root / "runs" / run_id)

    def submissions(self) -> list[Submission]:
        """Every job of the pipeline rendered as `plan` renders it (the backend's pure renderer); [] without one."""
        if self.pipeline is None:
            return []
        if self._submissions is None:
            backend = self.backend()
            run_id = CHECK_RUN_ID.format(pipeline=self.pipeline.name)
            self._submissions = [backend.render(r) for r in planned_requests(self.pipeline, run_id)]
        return self._submissions

    def declared_bytes(self) -> tuple[float, list[str]]:
        """Bytes the pipeline's stages leave in the workspace (estimates.py's bytes out), and the stages that add
        them; (0, []) where the pipeline declares no sizes."""
        if self.pipeline is None:
            return 0.0, []
        estimate = estimate_pipeline(self.pipeline, instances_table(self.config.options["bcp"].instances))
        sized = [(s.stage, s.bytes_out) for s in estimate.stages if s.bytes_out]
        return float(sum(b for _, b in sized)), [name for name, _ in sized]


def job_label(submission: Submission) -> str:
    """`stage X` or `stage X (verification)`, as the rows name a job."""
    request = submission.request
    return f"stage {request.stage.name}" + (" (verification)" if request.kind == "verify" else "")
