"""`logs --follow` on Kubernetes: one pod's log read as its container writes it (pods/log with follow=true), and
the lines of all the streams handed on as they come (KubernetesBackend.follow_logs runs a stream a pod)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from bcp_pipeline.training_log import RANK_LINE_PREFIX

RETRY_SECONDS = 1.0  # a stream whose container has not started (or a passing API error) is asked again this often


def followed_lines(lines: queue.Queue, rank: int | None, *, several: bool, until: float) -> Iterator[str]:
    """The lines the streams have read, and those they read until `until` (the clock's), each as it comes: every
    line (headed `[pod/NAME] ` where there are `several` pods), or with `rank` that rank's, as `logs --rank` shows
    them."""
    while True:
        try:
            pod, line = lines.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return
        if rank is not None:
            match = RANK_LINE_PREFIX.match(line)
            if match and int(match.group(1)) == rank:
                yield line[match.end() :]
        else:
            yield f"[pod/{pod}] {line}" if several else line


def stream_pod_log(
    core: Any, namespace: str, pod: str, tail: int | None, lines: queue.Queue, stop: threading.Event
) -> None:
    """One pod's log, followed, each line put on `lines` as (pod, line): retried while its container has not
    started (the API answers 400 "waiting to start"), read to its end once it has (the stream ends with the
    container). `core`: a CoreV1Api."""
    while not stop.is_set():
        try:
            response = core.read_namespaced_pod_log(
                pod, namespace, follow=True, tail_lines=tail, _preload_content=False
            )
        except Exception:  # noqa: BLE001 - not started yet (400), gone (404), a passing API error: retried
            stop.wait(RETRY_SECONDS)
            continue
        pending = b""
        try:
            for chunk in response.stream(4096, decode_content=True):
                *complete, pending = (pending + chunk).split(b"\n")
                for line in complete:
                    lines.put((pod, line.decode("utf-8", errors="replace")))
                if stop.is_set():
                    return
        except Exception:  # noqa: BLE001 - the connection dropped: what came is kept, nothing read twice
            pass
        finally:
            response.release_conn()
        if pending:
            lines.put((pod, pending.decode("utf-8", errors="replace")))
        return
