"""A record of every pod of a job that the API server announces while a test runs: when each
pod (by uid) was first seen, when it was seen being deleted and when it was gone, as seen by a
``kubectl get --watch`` of the test. Used to count launcher pods per attempt (C19) and to
measure how long worker pods live while a job is suspended (C22)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

LABEL_JOB = "monarch-operator.dev/job"
LABEL_ROLE = "monarch-operator.dev/role"
LABEL_ATTEMPT = "monarch-operator.dev/attempt"


@dataclass
class SeenPod:
    """One pod (one uid) as the watch saw it; times are ``time.monotonic()`` of this process."""

    name: str
    uid: str
    role: str
    attempt: str
    first_seen: float
    deleting_since: float | None = None
    gone_at: float | None = None
    grace_seconds: int = 30
    last: dict[str, Any] | None = None  # the object as last announced


class PodLog:
    """``with PodLog(kubectl, namespace, job) as log: ...``; then ``log.pods(role=...)``.

    ``kind``: another kind of the job's children to log the same way (``statefulsets``).
    """

    def __init__(self, kubectl: Any, namespace: str, job: str, kind: str = "pods") -> None:
        self._pods: dict[str, SeenPod] = {}
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            ["kubectl", "get", kind, "-n", namespace, "--watch", "--output-watch-events",
             "-l", f"{LABEL_JOB}={job}", "-o", "json"],
            stdout=subprocess.PIPE, text=True, env=kubectl.env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> PodLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self._process.stdout is not None
        for line in self._process.stdout:
            buffer += line
            try:
                event, _ = decoder.raw_decode(buffer.strip())
            except ValueError:
                continue
            buffer = ""
            self._note(event, time.monotonic())

    def _note(self, event: dict[str, Any], now: float) -> None:
        pod = event["object"]
        metadata = pod["metadata"]
        labels = metadata.get("labels") or {}
        with self._lock:
            seen = self._pods.setdefault(metadata["uid"], SeenPod(
                metadata["name"], metadata["uid"], labels.get(LABEL_ROLE, ""),
                labels.get(LABEL_ATTEMPT, ""), now,
                grace_seconds=int((pod.get("spec") or {}).get(
                    "terminationGracePeriodSeconds", 30))))
            if metadata.get("deletionTimestamp") and seen.deleting_since is None:
                seen.deleting_since = now
            seen.last = pod
            if event.get("type") == "DELETED":
                seen.gone_at = now

    def stop(self) -> None:
        """End the watch (idempotent)."""
        if self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._reader.join(timeout=10)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def pods(self, role: str | None = None) -> list[SeenPod]:
        """The pods seen so far (of ``role``: ``worker`` or ``launcher``), oldest first."""
        with self._lock:
            found = [pod for pod in self._pods.values() if role is None or pod.role == role]
        return sorted(found, key=lambda pod: pod.first_seen)
