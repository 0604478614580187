"""Pure readings of observed children: which workers are Ready, how the launcher ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monarch_operator import names


def pod_is_ready(pod: dict[str, Any]) -> bool:
    """Whether the pod runs, is not being deleted, and has condition ``Ready=True``."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )


def ready_worker_ordinals(job_name: str, replicas: int, pods: list[dict[str, Any]]) -> set[int]:
    """Ordinals ``0..replicas-1`` whose worker pod is Ready (other pods are ignored)."""
    wanted = {names.worker_pod(job_name, ordinal): ordinal for ordinal in range(replicas)}
    return {
        wanted[pod["metadata"]["name"]]
        for pod in pods
        if pod["metadata"]["name"] in wanted and pod_is_ready(pod)
    }


def why_not_ready(pod: dict[str, Any] | None) -> str:
    """Say in a few words why a worker pod is not Ready, from what Kubernetes reports.

    Args:
        pod: the pod, or None when it does not exist (yet).

    Returns:
        E.g. ``"Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."``
        (scheduler), ``"ImagePullBackOff: ..."`` (kubelet), ``"sshd not accepting connections
        yet"`` (running, readiness probe failing), ``"not created"``.
    """
    if pod is None:
        return "not created"
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "being deleted"
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return _reason_text(condition)
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return _reason_text(waiting)
    phase = status.get("phase") or "Pending"
    if phase == "Running":
        return "sshd not accepting connections yet (readiness probe)"
    return phase


def _reason_text(entry: dict[str, Any]) -> str:
    reason, message = entry.get("reason") or "", " ".join((entry.get("message") or "").split())
    return f"{reason}: {message}" if reason and message else reason or message or "unknown"


@dataclass(frozen=True)
class LauncherOutcome:
    """How the launcher Job ended: ``finished`` False while it runs."""

    finished: bool
    succeeded: bool = False
    exit_code: int | None = None
    message: str = ""


def launcher_outcome(job: dict[str, Any], pods: list[dict[str, Any]]) -> LauncherOutcome:
    """Read the launcher batch Job's conditions and its pod's exit code.

    Args:
        job: the batch/v1 Job as a dict.
        pods: the Job's pods (the exit code is taken from the first terminated container).
    """
    conditions = (job.get("status") or {}).get("conditions") or []
    finished = {c["type"]: c for c in conditions if c.get("status") == "True"}
    if "Complete" not in finished and "Failed" not in finished:
        return LauncherOutcome(finished=False)
    exit_code = None
    message = ""
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if terminated is not None:
                exit_code = int(terminated.get("exitCode", 0))
                message = terminated.get("message") or terminated.get("reason") or ""
    if "Complete" in finished:
        return LauncherOutcome(finished=True, succeeded=True, exit_code=exit_code or 0)
    reason = finished["Failed"].get("message") or finished["Failed"].get("reason") or ""
    return LauncherOutcome(
        finished=True, succeeded=False, exit_code=exit_code, message=message or reason
    )
