"""DGX Cloud Lepton: every stage one Lepton batch job, created, followed, read and stopped through NVIDIA's own SDK
(`leptonai.api.v2`: `client.job.create / list_all / get_replicas / get_log / get_events / update`), never
hand-written HTTP.

Rendering is pure (render.py): `plan` prints each job as the spec `lep job create --file` takes. Every job carries
the labels `managed-by=bcp-pipeline` and `bcp-pipeline.run|stage|kind`, so one list call by label selector answers a
poll for all of a run's jobs (finished and archived ones too: `alive_and_archive`), and `find_submitted` finds the
jobs a dead orchestrator left. A job's id is the name render.job_id gives it. Logs are each worker's (a replica's),
its ranks' lines headed `[rankN]:`.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import (
    Backend,
    JobProgress,
    JobRequest,
    JobState,
    JobStatus,
    PreparedAction,
    Submission,
    outage_seconds,
)
from bcp_pipeline.backends.lepton import code, render
from bcp_pipeline.backends.lepton.client import api_client, call, dumped
from bcp_pipeline.backends.lepton.states import status_of
from bcp_pipeline.backends.shared.locks import user_writer_lock
from bcp_pipeline.backends.shared.logs import job_running, last_lines, progress_from_logs, rank_lines, why_it_failed
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.resources import LeptonOptions
from bcp_pipeline.errors import BackendCallError, SubmissionError

ARCHIVED_TOO = "alive_and_archive"  # LeptonJobQueryMode: a finished job is archived after its TTL, then only
# listed with an archive mode
# One replica's log call streams what the service holds, then a live job's new lines for as long as it runs: read
# until it is quiet this long, or this long at most in all (a busy training never goes quiet).
LOG_QUIET_SECONDS = 3
LOG_BUDGET_SECONDS = 10.0
FOLLOW_POLL_SECONDS = 1.0
PROGRESS_SECONDS = 15.0  # a running job's logs read for its progress at most this often
MOVER_TIMEOUT_SECONDS = 1800.0
FAILURE_LOG_LINES = 200


class LeptonBackend(Backend):
    name = "lepton"

    def __init__(
        self, options: LeptonOptions, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str
    ) -> None:
        self.options = options
        self.stages_dir = stages_dir
        self.run_dir = run_dir
        self.run_id = run_dir.name  # run_dir is STATE/runs/RUN
        self.workspace_name = workspace_name
        self.storage_folder = f"{options.storage_path.rstrip('/')}/{workspace_name}"
        self.poll_min_seconds = options.poll_seconds
        self.poll_max_seconds = max(options.poll_seconds, options.poll_max_seconds)
        self.status_outage_seconds = outage_seconds(options.status_outage_limit)
        self.lookup_grace_seconds = options.lookup_grace_seconds
        self._client: Any = None
        self._code_hash: str | None = None
        self._progress: dict[str, tuple[float, JobProgress | None]] = {}

    @classmethod
    def check_ready(cls, config: Config, pipeline: PipelineConfig | None) -> None:
        """A workspace that answers with this token, before a run is recorded."""
        client = api_client(config.options[cls.name])
        call("the workspace look-up before the run", lambda: client.info(timeout=15))

    @classmethod
    def check_service(cls, given: Any) -> Any:
        from bcp_pipeline.backends.lepton.check import check_lepton

        return check_lepton(given)

    def writer_lock_path(self) -> Path:
        """The workspace is a folder of the node group's storage: locked in this user's state folder, by workspace."""
        workspace = self.options.workspace_id or "default"
        return user_writer_lock(f"lepton-{workspace}", f"{self.options.storage}{self.storage_folder}".replace("/", "_"))

    # -- rendering (pure) ----------------------------------------------------------------------------------
    def code_hash(self) -> str:
        if self._code_hash is None:
            self._code_hash = code.code_hash(self.stages_dir)
        return self._code_hash

    def sharding(self, request: JobRequest) -> dict[str, int]:
        size = render.shape(request, self.options)
        return {"replicas": size.workers, "processes": size.processes}

    def render(self, request: JobRequest) -> Submission:
        job = render.job_spec(request, self.options, self.code_hash(), self.storage_folder)
        return Submission(
            request=request,
            printable=render.printable(job),
            payload={"job": job, **self.sharding(request)},
            rendezvous=render.rendezvous(request, self.options),
        )

    def prepare(self, pipeline: PipelineConfig, execute: bool) -> list[PreparedAction]:
        """Copy stages/ into the storage once per content hash, by a job (code.py), waited for here."""
        mount = pipeline.workspace.mount.rstrip("/")
        destination = render.code_folder(self.options, mount, self.code_hash())
        # One name per version and storage folder: a second copy of the same code there is refused (409) and
        # read as done, as the copy already made is that code.
        where = hashlib.sha256(f"{self.options.storage}\0{self.storage_folder}".encode()).hexdigest()
        name = f"bp-code-{self.code_hash()[:8]}-{where[:8]}"
        action = PreparedAction(
            description=f"copy stages/ to {self.options.storage}:{self.storage_folder} at "
            f"{destination} by a job (once per content hash)",
            printable=f"lep job create --name {name} --file {name}.json  # image "
            f"{self.options.mover_image}, stages/ as base64 pieces in its env, "
            f"unpacked to {destination}",
        )
        folder = self.storage_folder.strip("/").replace("/", "_")
        marker = self.run_dir.parent.parent / "lepton-uploads" / f"{folder}-{self.code_hash()}"
        if execute and not marker.is_file():
            job = code.mover_job(
                name,
                self.stages_dir,
                destination,
                image=self.options.mover_image,
                shape=self.options.resource_shape,
                storage=self.options.storage,
                storage_folder=self.storage_folder,
                mount=mount,
                node_group=self.options.node_group,
                labels={render.LABEL_MANAGED: render.MANAGED_BY, render.LABEL_KIND: "code"},
            )
            job_id = self._create(job, "the job copying stages/")
            self._wait_for(job_id, "the job copying stages/")
            from bcp_pipeline.atomic import atomic_write_json

            atomic_write_json(
                marker,
                {"storage": self.storage_folder, "destination": destination, "job": job_id, "copied_at": time.time()},
            )
        return [action]

    # -- through the SDK -----------------------------------------------------------------------------------
    def client(self) -> Any:
        """The SDK's client, made on first use (so `plan` needs neither the SDK nor a workspace)."""
        if self._client is None:
            self._client = api_client(self.options)
        return self._client

    def _create(self, job: dict[str, Any], what: str) -> str:
        from leptonai.api.v2.types.job import LeptonJob

        try:
            model = LeptonJob(**job)
        except ValueError as exc:
            raise SubmissionError(f"{what}: the SDK refuses the job spec: {exc}") from None
        try:
            created = call(f"creating {what}", lambda: self.client().job.create(model))
        except BackendCallError as exc:
            if exc.http_status == 409:  # our own earlier create, whose answer was lost: that job is this one
                return str(job["metadata"]["id"])
            if exc.http_status is not None and 400 <= exc.http_status < 500 and exc.http_status != 429:
                raise SubmissionError(f"{what}: Lepton refused the job: {exc}") from None
            raise
        except ValueError as exc:  # the SDK's own checks before it sends (validate_job_create)
            raise SubmissionError(f"{what}: the SDK refuses the job: {exc}") from None
        return str(created.metadata.id_)

    def _wait_for(self, job_id: str, what: str) -> None:
        deadline, interval = time.monotonic() + MOVER_TIMEOUT_SECONDS, 0.2
        while time.monotonic() < deadline:
            status = self.poll([job_id], query=f"{render.LABEL_MANAGED}={render.MANAGED_BY}").get(job_id)
            if status is not None and status.state.finished:
                if status.state is not JobState.SUCCEEDED:
                    detail = self.failure_detail(job_id, status)
                    raise SubmissionError(f"{what} ({job_id}) ended {status.native}: {detail}")
                return
            time.sleep(interval)
            interval = min(interval * 1.5, self.poll_max_seconds)
        raise SubmissionError(f"{what} ({job_id}) has not finished in {MOVER_TIMEOUT_SECONDS:.0f} s")

    def submit(self, submission: Submission) -> str:
        return self._create(submission.payload["job"], submission.request.label)

    def _listed(self, query: str) -> list[dict[str, Any]]:
        jobs = call("listing jobs", lambda: self.client().job.list_all(job_query_mode=ARCHIVED_TOO, query=query))
        return [dumped(job) for job in jobs]

    def poll(self, job_ids: list[str], *, query: str | None = None) -> dict[str, JobStatus]:
        """ONE list call (the SDK follows its pages) by the run's label selector; ids it does not list are left out."""
        wanted = set(job_ids)
        listed = self._listed(query or render.label_query(self.run_id)) if wanted else []
        found = {str(job["metadata"]["id"]): status_of(job) for job in listed if job["metadata"]["id"] in wanted}
        return found | self._forgotten([job_id for job_id in job_ids if job_id not in found])

    def _forgotten(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Jobs the list left out, asked for one by one (rare: the list holds archived jobs too): a job the service
        answers 404 for, alive or archived, is LOST; one it has after all (a listing that lagged) is as it says."""
        statuses = {}
        for job_id in job_ids:
            try:
                job = call(f"job {job_id}", partial(self.client().job.get, job_id, job_query_mode=ARCHIVED_TOO))
            except BackendCallError as exc:
                if exc.http_status != 404:
                    continue  # not known this time: left out, i.e. "not finished", asked about again
                statuses[job_id] = JobStatus(
                    job_id=job_id,
                    state=JobState.LOST,
                    native="GONE",
                    detail=(
                        f"Lepton no longer knows job {job_id}, neither alive nor archived ({exc}): it was deleted, or "
                        "the service lost it, before it finished"
                    ),
                )
                continue
            statuses[job_id] = status_of(dumped(job))
        return statuses

    def find_submitted(self, run_id: str, stage: str, kind: str) -> list[str]:
        jobs = self._listed(render.label_query(run_id, stage, kind))
        return [str(job["metadata"]["id"]) for job in sorted(jobs, key=lambda j: j["metadata"].get("created_at") or 0)]

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        jobs = self._listed(render.label_query(run_id, stage, kind))
        return [
            str(job["metadata"]["id"])
            for job in sorted(jobs, key=lambda j: j["metadata"].get("created_at") or 0)
            if not status_of(job).state.finished
        ]

    def cancel(self, job_ids: list[str]) -> None:
        """Stop each job, as `lep job stop` does (spec.stopped); one the service no longer has is already gone."""
        for job_id in job_ids:
            try:
                call(
                    f"stopping job {job_id}",
                    partial(self.client().job.update, job_id, spec={"spec": {"stopped": True}}),
                )
            except BackendCallError as exc:
                if exc.http_status != 404:
                    raise

    # -- logs ------------------------------------------------------------------------------------------------
    def replica_logs(self, job_id: str) -> list[tuple[str, str]]:
        """(replica id, its log) of each worker, by replica id: the service's logs as they are so far."""
        replicas = call(f"the replicas of job {job_id}", lambda: self.client().job.get_replicas(job_id))
        found = []
        for replica in sorted(replicas, key=replica_order):
            found.append(
                (
                    str(replica.metadata.id_),
                    call(
                        f"the log of job {job_id} worker {replica.metadata.id_}",
                        partial(self._read_log, job_id, replica),
                    ),
                )
            )
        return found

    def _read_log(self, job_id: str, replica: Any, budget: float = LOG_BUDGET_SECONDS) -> str:
        chunks: list[str] = []
        until = time.monotonic() + budget
        try:
            for chunk in self.client().job.get_log(id_or_job=job_id, replica=replica, timeout=LOG_QUIET_SECONDS):
                chunks.append(chunk)
                if time.monotonic() > until:
                    break
        except Exception:  # noqa: BLE001 - a stream that went quiet or was cut: what came is the log so far
            if not chunks:
                raise
        return "".join(chunks)

    def follow_logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> Iterator[str]:
        """One worker's lines as they come (rank `rank`'s worker, else worker 0), its stream opened again whenever
        the service cuts it, the lines already shown skipped, until the job has ended."""
        shown, worker = 0, 0
        if rank is not None:  # its worker: rank // the processes a worker runs (the job's BCP_PIPELINE_PROCESSES)
            job = call(f"job {job_id}", lambda: self.client().job.get(job_id, job_query_mode=ARCHIVED_TOO))
            envs = {e.name: e.value for e in job.spec.envs or []}
            worker = rank // max(1, int(envs.get("BCP_PIPELINE_PROCESSES") or 1))
        while True:
            ended = not job_running(self, job_id)  # asked first: the log read after it holds all lines before
            replicas = sorted(
                call(f"the replicas of job {job_id}", lambda: self.client().job.get_replicas(job_id)), key=replica_order
            )
            if replicas:
                replica = replicas[min(worker, len(replicas) - 1)]
                lines = call(f"the log of job {job_id}", partial(self._read_log, job_id, replica)).splitlines()
                start = max(shown, len(lines) - tail) if tail and not shown else shown
                for line in lines[start:]:
                    text = line if rank is None else rank_lines(line, rank)
                    if text is None or text:
                        yield text if text is not None else line
                shown = max(shown, len(lines))
            if ended:
                return
            time.sleep(FOLLOW_POLL_SECONDS)

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        found = self.replica_logs(job_id)
        if not found:
            raise SubmissionError(
                f"job {job_id} has no workers with logs (not started yet, or its logs expired after its TTL)"
            )
        if rank is not None:
            for _, text in found:
                if (lines := rank_lines(text, rank)) is not None and lines:
                    return last_lines(lines, tail) if tail else lines
            raise SubmissionError(f"job {job_id} has no lines of rank {rank} (yet)")
        if len(found) == 1:
            return last_lines(found[0][1], tail) if tail else found[0][1]
        return "\n".join(f"==> worker {name} <==\n{last_lines(text, tail) if tail else text}" for name, text in found)

    def progress(self, job_id: str, *, training: bool = False) -> JobProgress | None:
        """From the workers' logs, read at most every PROGRESS_SECONDS (a log call a worker)."""
        seen = self._progress.get(job_id)
        if seen and time.monotonic() - seen[0] < PROGRESS_SECONDS:
            return seen[1]
        try:
            found = progress_from_logs([text for _, text in self.replica_logs(job_id)], training=training)
        except (BackendCallError, SubmissionError):
            found = seen[1] if seen else None
        self._progress[job_id] = (time.monotonic(), found)
        return found

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        """The service's reason (the job's events) and the end of each worker's log."""
        parts = [status.detail] if status.detail else []
        try:
            events = call(f"the events of job {job_id}", lambda: self.client().job.get_events(job_id))
            parts += [f"Lepton: {e.type_} {e.reason}" + (f" ({e.count}x)" if e.count > 1 else "") for e in events]
        except BackendCallError as exc:
            parts.append(f"(its events could not be read: {exc})")
        try:
            for name, text in self.replica_logs(job_id):
                parts += why_it_failed(last_lines(text, FAILURE_LOG_LINES), f"worker {name}")
        except (BackendCallError, SubmissionError) as exc:
            parts.append(f"(its logs could not be read: {exc})")
        return "\n".join(parts)

    @classmethod
    def describe_limits(
        cls, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
    ) -> Any:
        return None


def replica_order(replica: Any) -> list[Any]:
    """Replicas by their names' numbers as numbers (JOB-2 before JOB-10): the workers in their index order."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", replica.metadata.id_ or "")]


BACKEND = LeptonBackend
