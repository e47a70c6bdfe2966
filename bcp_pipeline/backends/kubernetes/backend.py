"""Kubernetes: every stage a headless Service and one Indexed batch/v1 Job (or a Kubeflow PyTorchJob), through the
official `kubernetes` Python client, configured from a kubeconfig (path, context) as kubectl reads it.

Rendering is pure (render.py): `plan` prints the exact manifests. Every object carries the labels
`app.kubernetes.io/managed-by=bcp-pipeline` and `bcp-pipeline/run|stage|kind`, so one list call by label answers
a poll for all of a run's jobs, and `find_active` finds a job a dead orchestrator left. A job's id is its name
(in the configured namespace). Logs come from `pods/log`; `cancel` deletes with foreground propagation (the pods
go first, so nothing of the stage is left running when the Job is gone). What a poll lists becomes a JobState
through the one map of states.py (pure).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import Backend, JobProgress, JobRequest, JobStatus, Submission, outage_seconds
from bcp_pipeline.backends.kubernetes.client import api_client, api_error, create_object
from bcp_pipeline.backends.kubernetes.describe import job_rendezvous, what_it_runs
from bcp_pipeline.backends.kubernetes.kueue import check_queue, suspended_in_a_queue, workload_messages
from bcp_pipeline.backends.kubernetes.log_stream import followed_lines, stream_pod_log
from bcp_pipeline.backends.kubernetes.render import (
    LABEL_JOB,
    is_pytorchjob,
    label_value,
    manifests,
    printable,
    selector_labels,
    shape,
)
from bcp_pipeline.backends.kubernetes.states import (
    REPLICA_TYPE_LABEL,
    completion_index,
    job_condition,
    pytorchjob_status,
    ready_node_names,
    status_of,
)
from bcp_pipeline.backends.kubernetes.training_checks import check_stages_in_image, efa_warning
from bcp_pipeline.backends.shared.locks import user_writer_lock
from bcp_pipeline.backends.shared.logs import last_lines, progress_from_logs, rank_lines, why_it_failed
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.resources import KubernetesOptions
from bcp_pipeline.errors import BackendCallError, SubmissionError

FAILURE_LOG_LINES = 200  # of a failed pod's log: enough to hold a training's traceback above torchrun's summary
READY_TIMEOUT_SECONDS = 15  # the one API call before a run is recorded: a cluster that answers does so at once
FOLLOW_POLL_SECONDS = 1.0  # `logs --follow`: new pods and the job's end looked for this often
FOLLOW_DRAIN_SECONDS = 10.0  # ... and, once it ended, each pod's stream given this long to deliver its last lines


class KubernetesBackend(Backend):
    name = "kubernetes"

    def __init__(
        self, options: KubernetesOptions, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str
    ) -> None:
        self.options = options
        self.config_dir = config_dir
        self.run_id = run_dir.name  # run_dir is STATE/runs/RUN
        self.poll_min_seconds = options.poll_seconds
        self.status_outage_seconds = outage_seconds(options.status_outage_limit)
        self.poll_max_seconds = max(options.poll_seconds, options.poll_max_seconds)
        self.image_pull_grace = parse_duration(options.image_pull_grace)
        self._api: Any = None

    @classmethod
    def check_ready(cls, config: Config, pipeline: PipelineConfig | None) -> None:
        """A kubeconfig that names a cluster which answers, before a run is recorded: a run whose jobs could never
        be created would otherwise be recorded, its submissions retried, and then block the next run."""
        options = config.options[cls.name]
        api = api_client(options, config.file.parent.resolve())
        try:
            from kubernetes import client

            client.VersionApi(api).get_code(_request_timeout=READY_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - refused connections, TLS, 401 and timeouts alike
            raise api_error("the version look-up before the run", exc) from None

    @classmethod
    def check_limits(
        cls, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
    ) -> None:
        """What this backend never renders, refused before a run is recorded rather than when its stage is due:
        a Kueue queue named badly or through `labels` (kueue.check_queue); `kubernetes.processes` on a training
        engine's stage other than its ranks a pod (one a GPU), which would otherwise be silently overruled."""
        for request in requests:
            check_queue(request)
            check_stages_in_image(request, config.options[cls.name], shape(request, config.options[cls.name]).image)
            given = request.resources("kubernetes").processes
            if request.kind == "stage" and request.stage.engine and given is not None:
                ranks = shape(request, config.options[cls.name]).processes
                if given != ranks:
                    raise SubmissionError(
                        f"{request.label}: kubernetes.processes is {given}, but its {request.stage.engine} training "
                        f"runs one rank a GPU, {ranks} a pod (kubernetes.gpus, else the BCP instance's GPUs): drop "
                        f"kubernetes.processes or make it {ranks}"
                    )

    # -- rendering (pure) ------------------------------------------------------------------------------
    def writer_lock_path(self) -> Path:
        """The workspace is a volume claim of a cluster: locked in this user's state folder, by cluster context,
        namespace and claim (shared/locks.py user_writer_lock)."""
        context = self.options.context or os.environ.get("KUBECONFIG") or "default-kubeconfig"
        return user_writer_lock(f"kubernetes-{context}", f"{self.options.namespace}.{self.options.workspace_claim}")

    def sharding(self, request: JobRequest) -> dict[str, int]:
        size = shape(request, self.options)
        return {"replicas": size.pods, "processes": size.processes}

    def render(self, request: JobRequest) -> Submission:
        objects = manifests(request, self.options)
        runs = f"# runs: {what_it_runs(request, self.options)}\n"  # a YAML comment: the text still loads as submitted
        size = shape(request, self.options)
        if said := efa_warning(request, size.processes if request.stage.engine else request.resources(self.name).gpus):
            runs += f"# warning: {said}\n"
        return Submission(
            request=request,
            printable=runs + printable(objects),
            payload={"manifests": objects, **self.sharding(request)},
            rendezvous=job_rendezvous(request, self.options),
        )

    # -- the API -----------------------------------------------------------------------------------------
    def api(self) -> Any:
        """The API client of the kubeconfig, made on first use (so `plan` needs no cluster)."""
        if self._api is None:
            self._api = api_client(self.options, self.config_dir)
        return self._api

    def _batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api())

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api())

    def create(self, obj: dict[str, Any], dry_run: bool = False) -> None:
        """Create one rendered object (a Service, a Job or a PyTorchJob); `dry_run`: the apiserver validates and
        admits it without storing it (server-side dry run)."""
        create_object(self.api(), obj, dry_run=dry_run)

    # -- side effects ------------------------------------------------------------------------------------
    def submit(self, submission: Submission) -> str:
        objects = submission.payload["manifests"]
        self._delete_earlier_attempts(submission.request, objects[-1]["metadata"]["name"])
        for obj in objects:
            try:
                self.create(obj)
            except BackendCallError as exc:
                if "AlreadyExists" not in str(exc) or obj["kind"] != "Service":
                    raise SubmissionError(f"creating {obj['kind']} {obj['metadata']['name']} failed: {exc}") from None
        return objects[-1]["metadata"]["name"]

    def _delete_earlier_attempts(self, request: JobRequest, name: str) -> None:
        """An earlier attempt's Job (or PyTorchJob) of this stage that has not ended (no Complete or Failed
        condition: lost with its node, say, or left running by a killed orchestrator) is deleted (foreground) before
        the next attempt's is created: it would otherwise run, or replace its pod once the node is removed, beside
        the new attempt. Ended ones stay, with their pods' logs."""
        if is_pytorchjob(request):
            earlier = [
                obj["metadata"]["name"]
                for obj in self._list_pytorchjobs(request.stage.name, request.kind)
                if obj["metadata"]["name"] != name
                and not obj["metadata"].get("deletionTimestamp")
                and not pytorchjob_status(obj).state.finished
            ]
        else:
            earlier = [
                job.metadata.name
                for job in self._list_jobs(request.stage.name, request.kind)
                if job.metadata.name != name
                and job.metadata.deletion_timestamp is None
                and not (job_condition(job) or ("",))[0].startswith(("COMPLETE", "SUCCESS", "FAILED/"))
            ]
        if earlier:
            self.cancel(earlier)

    def _list_jobs(self, stage: str | None = None, kind: str | None = None) -> list[Any]:
        selector = selector_labels(self.run_id, stage, kind)
        try:
            return self._batch().list_namespaced_job(self.options.namespace, label_selector=selector).items
        except Exception as exc:  # noqa: BLE001 - the client raises ApiException, urllib3 and OS errors
            raise api_error("list jobs", exc) from None

    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """One list call, by the run's label, for every job of the run; ids no longer there are omitted."""
        if not job_ids:
            return {}
        wanted = set(job_ids)
        jobs = [job for job in self._list_jobs() if job.metadata.name in wanted]
        pytorchjobs = (
            [obj for obj in self._list_pytorchjobs() if obj["metadata"]["name"] in wanted]
            if wanted - {job.metadata.name for job in jobs}
            else []
        )  # `launcher: pytorchjob`: not a batch/v1 Job
        pods_and_nodes = self._pods_and_nodes(jobs)  # once a poll, not once a Job
        said = workload_messages(self.api(), self.options.namespace, suspended_in_a_queue(jobs, pytorchjobs))
        found = {
            job.metadata.name: self._status(
                job, *pods_and_nodes[job.metadata.name], kueue_message=said.get(job.metadata.name)
            )
            for job in jobs
        }
        found.update(self._pytorchjob_statuses(pytorchjobs, said))
        return found

    def _status(
        self, job: Any, pods: list[Any], ready_nodes: set[str] | None, *, kueue_message: str | None = None
    ) -> JobStatus:
        return status_of(job, pods, ready_nodes, image_pull_grace=self.image_pull_grace, kueue_message=kueue_message)

    def _pytorchjob_statuses(self, objects: list[dict[str, Any]], kueue_said: dict[str, str]) -> dict[str, JobStatus]:
        """Each PyTorchJob's status; a failed one's pods are listed (once a poll, by the run's label) to tell a
        time limit's exit from a failure."""
        statuses = {
            (name := obj["metadata"]["name"]): pytorchjob_status(obj, kueue_message=kueue_said.get(name))
            for obj in objects
        }
        if not any(status.native == "FAILED" for status in statuses.values()):
            return statuses
        try:
            pods = (
                self._core()
                .list_namespaced_pod(self.options.namespace, label_selector=selector_labels(self.run_id))
                .items
            )
        except Exception as exc:  # noqa: BLE001
            raise api_error("list pods", exc) from None
        for obj in objects:
            name = obj["metadata"]["name"]
            if statuses[name].native == "FAILED":
                statuses[name] = pytorchjob_status(
                    obj, [p for p in pods if (p.metadata.labels or {}).get(LABEL_JOB) == name]
                )
        return statuses

    def _pods_and_nodes(self, jobs: list[Any]) -> dict[str, tuple[list[Any], set[str] | None]]:
        """Each Job's pods and the Ready nodes, for the Jobs no condition decides: one list of the run's pods (by
        label) and one of the nodes, whatever the number of Jobs. Where this identity may not list nodes (a
        namespaced user), nodes are not judged (None)."""
        from kubernetes.client.rest import ApiException

        open_jobs = [job for job in jobs if job_condition(job) is None]
        if not open_jobs:
            return {job.metadata.name: ([], None) for job in jobs}
        try:
            pods = (
                self._core()
                .list_namespaced_pod(self.options.namespace, label_selector=selector_labels(self.run_id))
                .items
            )
        except Exception as exc:  # noqa: BLE001
            raise api_error("list pods", exc) from None
        ready: set[str] | None
        try:
            ready = ready_node_names(self._core().list_node().items)
        except ApiException as exc:
            if exc.status != 403:
                raise api_error("list nodes", exc) from None
            ready = None
        except Exception as exc:  # noqa: BLE001
            raise api_error("list nodes", exc) from None
        by_job: dict[str, list[Any]] = {}
        for pod in pods:
            by_job.setdefault((pod.metadata.labels or {}).get(LABEL_JOB, ""), []).append(pod)
        return {job.metadata.name: (by_job.get(job.metadata.name, []), ready) for job in jobs}

    def _list_pytorchjobs(self, stage: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            return client.CustomObjectsApi(self.api()).list_namespaced_custom_object(
                "kubeflow.org",
                "v1",
                self.options.namespace,
                "pytorchjobs",
                label_selector=selector_labels(self.run_id, stage, kind),
            )["items"]
        except ApiException as exc:
            if exc.status == 404:  # no training operator (its CRD) on this cluster
                return []
            raise api_error("list pytorchjobs", exc) from None

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        if label_value(run_id) != label_value(self.run_id):
            return []
        jobs = self._list_jobs(stage, kind)
        found = self._pods_and_nodes(jobs)
        return [job.metadata.name for job in jobs if not self._status(job, *found[job.metadata.name]).state.finished]

    def find_submitted(self, run_id: str, stage: str, kind: str) -> list[str]:
        if label_value(run_id) != label_value(self.run_id):
            return []
        jobs = sorted(self._list_jobs(stage, kind), key=lambda job: job.metadata.creation_timestamp)
        return [job.metadata.name for job in jobs]

    def _pods(self, job_id: str) -> list[Any]:
        """The job's pods (an Indexed Job's or a PyTorchJob's: both carry the job's own label), by completion index
        (the latest pod of an index last)."""
        try:
            pods = (
                self._core().list_namespaced_pod(self.options.namespace, label_selector=f"{LABEL_JOB}={job_id}").items
            )
        except Exception as exc:  # noqa: BLE001
            raise api_error("list pods", exc) from None
        return sorted(pods, key=lambda p: (completion_index(p), p.metadata.creation_timestamp))

    def _pod_log(self, pod: Any, tail: int | None = None) -> str:
        try:
            # Unparsed: the client would otherwise read a log that happens to be JSON ("67108864") as a value.
            return (
                self._core()
                .read_namespaced_pod_log(
                    pod.metadata.name, self.options.namespace, tail_lines=tail, _preload_content=False
                )
                .data.decode("utf-8", "replace")
            )
        except Exception as exc:  # noqa: BLE001
            return f"(no log: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        """The job's pods' logs (each headed by its pod's name where there are several). `rank`: that rank's lines
        (their `[rankN]:` prefix off: the pod launcher and torchrun write them so) from the pod it runs in; a log
        written without prefixes (one rank a pod, a job from before them) is that pod's whole log."""
        pods = self._pods(job_id)
        if not pods:
            raise SubmissionError(f"job {job_id} has no pods (yet, or any more) in namespace {self.options.namespace}")
        by_index = {completion_index(p): p for p in pods}
        if rank is not None:
            texts = [self._pod_log(pod) for pod in self._rank_pods(job_id, pods, rank)]
            found = [lines for lines in (rank_lines(text, rank) for text in texts) if lines is not None]
            text = "\n".join(found) if found else "\n".join(texts)
            return last_lines(text, tail) if tail else text
        if len(by_index) == 1:
            return self._pod_log(next(iter(by_index.values())), tail)
        return "\n".join(f"==> {pod.metadata.name} <==\n{self._pod_log(pod, tail)}" for pod in by_index.values())

    def _rank_pods(self, job_id: str, pods: list[Any], rank: int) -> list[Any]:
        """The pod rank `rank` runs in: index rank // processes (an Indexed Job's completion index; a PyTorchJob's
        Master 0, Worker i i + 1, as torchrun numbers its nodes there). An elastic PyTorchJob (Workers, no Master)
        gives ranks out at its rendezvous: every pod, the rank's lines found by their prefix."""
        by_index = {completion_index(p): p for p in pods}
        roles = {(p.metadata.labels or {}).get(REPLICA_TYPE_LABEL) for p in pods}
        if "worker" in roles and "master" not in roles:
            return list(by_index.values())
        processes = int(
            next((e.value for e in pods[0].spec.containers[0].env or [] if e.name == "BCP_PIPELINE_PROCESSES"), "1")
        )
        pod = by_index.get(rank // processes)
        if pod is None:
            raise SubmissionError(
                f"job {job_id} has no pod for rank {rank} ({processes} rank(s) a pod; pod indexes {sorted(by_index)})"
            )
        return [pod]

    def follow_logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> Iterator[str]:
        """The pods' lines as they write them (pods/log with follow=true, one stream a pod, a replaced pod's
        successor followed as it appears), until the job has ended and every stream is done. Several pods: each
        line headed `[pod/NAME] `; `rank`: that rank's lines only, from every pod it may run in."""
        lines: queue.Queue[tuple[str, str]] = queue.Queue()
        streams: dict[str, threading.Thread] = {}
        stop = threading.Event()
        try:
            while True:
                ended = self._job_ended(job_id)  # asked first: the streams then hold what was written before
                pods = self._pods(job_id)
                wanted = pods if rank is None or not pods else self._rank_pods(job_id, pods, rank)
                for pod in wanted:
                    name = pod.metadata.name
                    if name not in streams:
                        streams[name] = threading.Thread(
                            target=stream_pod_log,
                            daemon=True,
                            name=f"log-{name}",
                            args=(self._core(), self.options.namespace, name, tail, lines, stop),
                        )
                        streams[name].start()
                if ended:
                    for stream in streams.values():  # each ends with its container (which has ended)
                        stream.join(FOLLOW_DRAIN_SECONDS)
                # Lines as they come, until the next look at the pods and the job (none once it has ended).
                until = time.monotonic() + (0 if ended else FOLLOW_POLL_SECONDS)
                yield from followed_lines(lines, rank, several=len(streams) > 1, until=until)
                if ended:
                    return
        finally:
            stop.set()

    def _job_ended(self, job_id: str) -> bool:
        status = self.poll([job_id]).get(job_id)
        return status is None or status.state.finished  # None: deleted, nothing more to come

    def progress(self, job_id: str, *, training: bool = False) -> JobProgress | None:
        return progress_from_logs([self._pod_log(pod, 50) for pod in self._pods(job_id)], training=training)

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        """The Job's condition message, the failed pods' exit codes and the first one's log tail."""
        lines = [status.detail] if status.detail else []
        failed = []
        for pod in self._pods(job_id):
            for container in pod.status.container_statuses or []:
                terminated = container.state.terminated if container.state else None
                if terminated is not None and terminated.exit_code != 0:
                    failed.append((pod, terminated))
        if failed:
            lines.append(
                "; ".join(
                    f"pod {pod.metadata.name} on {pod.spec.node_name} exited {t.exit_code} ({t.reason})"
                    for pod, t in failed
                )
            )
            name, log = failed[0][0].metadata.name, self._pod_log(failed[0][0], FAILURE_LOG_LINES)
            lines += why_it_failed(log, f"{name}'s")
        return "\n".join(lines)

    def cancel(self, job_ids: list[str]) -> None:
        """Delete each job, foreground (its pods first): an Indexed Job and its Service, or a PyTorchJob (whose
        pods and Service the training operator owns); whichever of them is not there is a 404, ignored."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        def delete_pytorchjob(name: str, namespace: str, **options: Any) -> Any:
            return client.CustomObjectsApi(self.api()).delete_namespaced_custom_object(
                "kubeflow.org", "v1", namespace, "pytorchjobs", name, **options
            )

        for name in job_ids:
            for delete in (
                self._batch().delete_namespaced_job,
                self._core().delete_namespaced_service,
                delete_pytorchjob,
            ):
                try:
                    delete(name, self.options.namespace, propagation_policy="Foreground")
                except ApiException as exc:
                    if exc.status != 404:  # also a cluster without the training operator's CRD
                        raise api_error(f"delete {name}", exc) from None

    @classmethod
    def check_service(cls, given: Any) -> Any:
        from bcp_pipeline.backends.kubernetes.check import check_kubernetes  # its probes' imports load only for `check`

        return check_kubernetes(given)


BACKEND = KubernetesBackend
