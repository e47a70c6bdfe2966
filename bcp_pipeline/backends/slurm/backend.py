"""Slurm: every stage an `sbatch` job of nodes x ntasks_per_node tasks started by `srun`, tracked with `squeue`.

Rendering is pure (render.py): `plan` prints the exact batch script. Jobs are named `RUN.STAGE` or
`RUN.STAGE.verify` (and carry `--comment "bcp-pipeline run=... stage=... kind=..."`), so `find_active` finds
them again with one `squeue` call after the orchestrator died between `sbatch` and recording the id. One
`squeue --jobs=...` call per poll cycle covers every job; for ids Slurm no longer lists (finished longer than
MinJobAge ago) `sacct` is asked when accounting is enabled, else the exit record the batch script writes last.
Logs are the per-task files under `<run>/logs/JOBID/` (see render.py for the layout).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import JobRequest, JobState, JobStatus, Submission
from bcp_pipeline.backends.shared.batch import BatchBackend, job_name
from bcp_pipeline.backends.shared.logs import indent, last_lines, read_tail
from bcp_pipeline.backends.slurm.client import HINT, squeue
from bcp_pipeline.backends.slurm.render import (
    NEMO_SUFFIX,
    batch_script,
    job_rendezvous,
    nemo_job_name_prefix,
    nemo_launcher_script,
    nemo_rendezvous,
    shape,
)
from bcp_pipeline.backends.slurm.states import Row, failed_tasks, status_of
from bcp_pipeline.config.nemo import nemo_run_name
from bcp_pipeline.config.resources import SlurmOptions
from bcp_pipeline.errors import CommandError, PipelineError, SubmissionError
from bcp_pipeline.procs import run_command

LAUNCHER_JOB_ID = re.compile(r"(?:Submitted batch job|submitted with Job ID) (\d+)")
# How sbatch (inside the launcher) says the controller did not answer: the one failure of the launcher's step that
# may pass if made again. Slurm's own wording (slurm_strerror and sbatch's messages).
CONTROLLER_UNANSWERED = re.compile(
    r"unable to contact slurm controller|socket timed out|connection refused|"
    r"resource temporarily unavailable|slurmctld.*(?:not responding|down)|"
    r"try again",
    re.IGNORECASE,
)


def launcher_failure(exc: CommandError) -> PipelineError:
    """The NeMo launcher's step failed on this machine. A failure of its own (no launcher at launcher_dir, hydra not
    installed, a bad override, a data list that cannot be built) is the same every time: a SubmissionError, which
    fails the stage at once instead of being tried again for half a minute (as a bad request is on the other
    backends: errors.is_transient). Only a timeout or sbatch not reaching the controller stays retryable."""
    if exc.returncode == 124 or CONTROLLER_UNANSWERED.search(exc.stderr):
        return exc
    return SubmissionError(f"the NeMo launcher failed on this machine, as it would again: {exc}")


class SlurmBackend(BatchBackend):
    name = "slurm"

    def __init__(
        self, options: SlurmOptions, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str
    ) -> None:
        super().__init__(
            options, config_dir=config_dir, stages_dir=stages_dir, run_dir=run_dir, workspace_name=workspace_name
        )
        self._sacct_enabled = True  # until sacct says accounting is off here

    # -- rendering (pure) ------------------------------------------------------------------------------
    def sharding(self, request: JobRequest) -> dict[str, int]:
        size = shape(request, self.options)
        return {"replicas": size.nodes, "processes": size.ntasks_per_node}

    def render(self, request: JobRequest) -> Submission:
        if request.kind == "stage" and request.stage.nemo and not request.resources("slurm").command:
            script = nemo_launcher_script(request, self.options, self.paths)
            training_job = f"{nemo_job_name_prefix(request)}{nemo_run_name(request.stage, request.run_id)}"
            printable = (
                "# runs on this machine: NeMo's launcher (cluster_type=bcm) writes and sbatch-es the "
                f"training job {training_job}\n{script}"
            )
            return Submission(
                request=request,
                printable=printable,
                payload={"submit_with": "nemo-launcher"},
                rendezvous=nemo_rendezvous(request, self.options),
            )
        return Submission(
            request=request,
            printable=batch_script(request, self.options, self.paths),
            payload={
                "submit_with": "sbatch",
                "job_name": job_name(request.run_id, request.stage.name, request.kind),
                **self.sharding(request),
            },
            rendezvous=job_rendezvous(request, self.options),
        )

    # -- side effects ------------------------------------------------------------------------------------
    def submit(self, submission: Submission) -> str:
        self.logs_dir.mkdir(parents=True, exist_ok=True)  # sbatch opens the batch log here before the script runs
        Path(self.paths.workspace).mkdir(parents=True, exist_ok=True)  # the job's --chdir
        if submission.payload["submit_with"] == "nemo-launcher":
            try:
                output = run_command(
                    ["bash", "-c", submission.printable],
                    timeout=1800,
                    hint="the NeMo launcher runs on this machine: it needs launcher_dir and hydra-core/omegaconf here",
                ).stdout
            except CommandError as exc:
                raise launcher_failure(exc) from exc
            found = LAUNCHER_JOB_ID.findall(output)
            if not found:
                raise SubmissionError(
                    f"the NeMo launcher printed no Slurm job id; its output ends:\n{last_lines(output, 20)}"
                )
            return found[-1]
        output = run_command(["sbatch", "--parsable"], input_text=submission.printable, hint=HINT).stdout
        lines = output.strip().splitlines()
        job_id = lines[-1].split(";")[0].strip() if lines else ""  # --parsable: ID or ID;CLUSTER
        if not job_id.isdigit():
            raise SubmissionError(f"`sbatch --parsable` printed no job id: {output[:500]!r}")
        return job_id

    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """One squeue call for all ids; sacct, then the exit record, for ids Slurm no longer lists."""
        if not job_ids:
            return {}
        wanted = set(job_ids)
        rows = [row for row in squeue("--jobs=" + ",".join(job_ids)) if row.job_id in wanted]
        too_big = self._too_big_for_partition(rows)
        statuses = {row.job_id: status_of(row, too_big=row.job_id in too_big) for row in rows}
        missing = [job_id for job_id in job_ids if job_id not in statuses]
        if missing:
            statuses.update(self._forgotten(missing))
        stuck = [s.job_id for s in statuses.values() if s.native.startswith("PENDING") and s.state is JobState.FAILED]
        if stuck:
            self.cancel(stuck)
        return statuses

    def _too_big_for_partition(self, rows: list[Row]) -> set[str]:
        """Pending jobs asking for more nodes than their partition has. Slurm's PartitionNodeLimit also means
        "some nodes are down right now", which passes, so the partition's size decides (one scontrol call)."""
        waiting = [row for row in rows if row.state == "PENDING" and row.reason == "PartitionNodeLimit"]
        if not waiting:
            return set()
        try:
            text = run_command(["scontrol", "-o", "show", "partition"], timeout=30).stdout
        except CommandError:
            return set()
        sizes = {}
        for line in text.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            if fields.get("TotalNodes", "").isdigit():
                max_nodes = fields.get("MaxNodes", "")
                sizes[fields.get("PartitionName")] = min(
                    int(fields["TotalNodes"]), int(max_nodes) if max_nodes.isdigit() else 1 << 30
                )
        return {
            row.job_id
            for row in waiting
            if row.nodes.isdigit() and row.partition in sizes and int(row.nodes) > sizes[row.partition]
        }

    def _forgotten(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Jobs Slurm no longer lists: sacct's answer, else the exit record; neither means the job is LOST, unless
        sacct failed this time (then the job is left out, i.e. "not finished", and asked about again)."""
        rows = self._sacct(job_ids)
        statuses = {row.job_id: status_of(row) for row in rows or []}
        for job_id in job_ids:
            if job_id in statuses:
                continue
            record = self.logs_dir / f"slurm-{job_id}.exit"
            try:
                code = int(record.read_text().strip())
            except (OSError, ValueError):
                if rows is not None:
                    statuses[job_id] = JobStatus(
                        job_id=job_id,
                        state=JobState.LOST,
                        native="GONE",
                        detail=(
                            f"Slurm no longer knows job {job_id} and its batch script left no exit record ({record}): "
                            "it ended without finishing (cancelled, timed out or its node failed) long enough ago for "
                            "Slurm to forget it"
                        ),
                    )
                continue
            statuses[job_id] = JobStatus(
                job_id=job_id,
                state=JobState.SUCCEEDED if code == 0 else JobState.FAILED,
                native="COMPLETED" if code == 0 else "FAILED",
                exit_code=code,
                detail="" if code == 0 else f"exit code {code} (from {record})",
            )
        return statuses

    def _sacct(self, job_ids: list[str]) -> list[Row] | None:
        """sacct's rows for `job_ids`: [] where accounting is off, None when sacct failed this time."""
        if not self._sacct_enabled:
            return []
        argv = [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--jobs=" + ",".join(job_ids),
            "--format=JobIDRaw,State,ExitCode",
        ]
        try:
            output = run_command(argv, timeout=60).stdout
        except CommandError as exc:
            if exc.returncode == 127 or "accounting storage is disabled" in exc.stderr.lower():
                self._sacct_enabled = False  # no slurmdbd on this cluster: stop asking
                return []
            return None
        rows = []
        for line in output.splitlines():
            parts = line.split("|")
            if len(parts) >= 3 and parts[1]:
                rows.append(Row(parts[0], parts[1].split()[0], parts[2], ""))  # "CANCELLED by 123" -> CANCELLED
        return rows

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        """This user's unfinished jobs named RUN.STAGE[.verify] (or RUN.STAGE.nemo.* from the NeMo launcher)."""
        name = job_name(run_id, stage, kind)
        found = []
        for row in squeue(f"--user={os.getuid()}"):
            mine = row.name == name or (kind == "stage" and row.name.startswith(name + NEMO_SUFFIX))
            if mine and not status_of(row).state.finished:
                found.append(row.job_id)
        return found

    def batch_log(self, job_id: str) -> Path:
        return self.logs_dir / f"slurm-{job_id}.log"

    def scheduler_logs(self, job_id: str) -> list[Path]:
        return [log] if (log := self.batch_log(job_id)).is_file() else []

    def missing_rank_log(self, job_id: str, rank: int, path: Path) -> str:
        return (
            f"{super().missing_rank_log(job_id, rank, path)}; the batch script's output ends:\n"
            f"{indent(last_lines(read_tail(self.batch_log(job_id)), 10) or '(empty)')}"
        )

    def other_logs(self, job_id: str) -> list[Path]:
        """The files Slurm says the job writes (e.g. the NeMo launcher's own job)."""
        try:
            text = run_command(["scontrol", "-o", "show", "job", job_id], timeout=30).stdout
        except CommandError:
            return []
        found = dict.fromkeys(Path(m) for m in re.findall(r"\bStd(?:Out|Err)=(\S+)", text))
        return [path for path in found if path.is_file()]

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        """Slurm's reason and exit code, the failing tasks (from srun's messages) and the first one's log tail."""
        lines = [status.detail] if status.detail else []
        batch = read_tail(self.logs_dir / f"slurm-{job_id}.log")
        failed = failed_tasks(batch)
        if failed:
            lines.append("; ".join(f"rank {rank} {why}" for rank, why in failed.items()))
            lines.append(self.rank_log_tail(job_id, min(failed)))
        elif batch.strip():
            lines.append(f"last lines of {self.logs_dir / f'slurm-{job_id}.log'}:\n" + indent(last_lines(batch, 10)))
        return "\n".join(lines)

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            run_command(["scancel", *job_ids], timeout=60, hint=HINT)  # finished or unknown ids: no error

    def resume(self, job_id: str) -> bool:
        """Requeue a PREEMPTED job: it runs again under the same id (its logs are appended to)."""
        try:
            run_command(["scontrol", "requeue", job_id], timeout=60, hint=HINT)
        except CommandError:
            return False
        return True

    @classmethod
    def check_service(cls, given: Any) -> Any:
        from bcp_pipeline.backends.slurm.check import check_slurm  # its probes' imports load only for `check`

        return check_slurm(given)


BACKEND = SlurmBackend
