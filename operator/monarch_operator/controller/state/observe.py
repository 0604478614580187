"""Pure readings of observed children: which workers are Ready, how the launcher ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.launcher import LAUNCHER_CONTAINER

# status.launcher.reason keeps at most this many characters (its head and its tail).
LAUNCHER_REASON_LIMIT = 1024


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


def ready_worker_names(wanted: list[str], pods: list[dict[str, Any]]) -> set[str]:
    """Those of the worker pod names ``wanted`` whose pod is Ready (other pods are ignored)."""
    wanted_names = set(wanted)
    return {pod["metadata"]["name"] for pod in pods
            if pod["metadata"]["name"] in wanted_names and pod_is_ready(pod)}


def why_not_ready(pod: dict[str, Any] | None) -> str:
    """Say in a few words why a worker pod is not Ready, from what Kubernetes reports.

    Args:
        pod: the pod, or None when it does not exist (yet).

    Returns:
        E.g. ``"Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."``
        (scheduler), ``"Init:CrashLoopBackOff: init container prep exited 1"`` (an init
        container that fails, named as ``kubectl get pods`` shows it), ``"ImagePullBackOff:
        ..."`` or ``"CrashLoopBackOff: container worker exited 1"`` (kubelet), ``"sshd not
        accepting connections yet"`` (running, readiness probe failing; in attach mode
        the Monarch worker loop), ``"not created"``.
    """
    if pod is None:
        return "not created"
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "being deleted"
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return _reason_text(condition)
    if status.get("reason"):  # the whole pod: Evicted, NodeAgentError, ...
        return _reason_text(status)
    init_problem = _init_containers_problem(status.get("initContainerStatuses") or [])
    if init_problem:
        return init_problem
    for container in status.get("containerStatuses") or []:
        problem = _container_problem(container, "container")
        if problem:
            return problem
    phase = status.get("phase") or "Pending"
    if phase == "Running":
        return f"{_probed_server(pod)} not accepting connections yet (readiness probe)"
    return phase


def _probed_server(pod: dict[str, Any]) -> str:
    """What the worker's readiness probe waits for: the Monarch worker loop (attach mode's
    probe port) or sshd."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        probe = (container.get("readinessProbe") or {}).get("tcpSocket") or {}
        if probe.get("port") == constants.MONARCH_ATTACH_PORT:
            return "the Monarch worker loop"
    return "sshd"


def _init_containers_problem(statuses: list[dict[str, Any]]) -> str:
    """The first init container that has not succeeded, as ``kubectl get pods`` words it
    (``Init:<reason>`` or ``Init:<done>/<all>``), naming it and how it last ended."""
    for done, container in enumerate(statuses):
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode") == 0:
            continue
        problem = _container_problem(container, "init container")
        if problem:
            return f"Init:{problem}"
        return f"Init:{done}/{len(statuses)}: init container {container.get('name')} running"
    return ""


def _container_problem(container: dict[str, Any], kind: str) -> str:
    """``<reason>: <kind> <name> exited <code>[: <message>]`` for a container that failed or
    waits to be restarted, ``<reason>: <message>`` for one waiting otherwise, else ""."""
    state = container.get("state") or {}
    name = container.get("name")
    terminated = state.get("terminated")
    if terminated and terminated.get("exitCode") != 0:
        return f"{terminated.get('reason') or 'Error'}: {_exit_text(kind, name, terminated)}"
    waiting = state.get("waiting") or {}
    reason = waiting.get("reason") or ""
    if not waiting or reason == "PodInitializing":
        return ""
    last = (container.get("lastState") or {}).get("terminated")
    if last and reason == "CrashLoopBackOff":
        return f"{reason}: {_exit_text(kind, name, last)}"
    return _reason_text(waiting)


def _exit_text(kind: str, name: Any, terminated: dict[str, Any]) -> str:
    text = f"{kind} {name} exited {terminated.get('exitCode')}"
    message = " ".join((terminated.get("message") or "").split())
    return f"{text}: {message[:200]}" if message else text


def _reason_text(entry: dict[str, Any]) -> str:
    reason, message = entry.get("reason") or "", " ".join((entry.get("message") or "").split())
    return f"{reason}: {message}" if reason and message else reason or message or "unknown"


# Waiting reasons of a container that no retry cures: the image reference cannot even be
# parsed (the kubelet's InvalidImageName, kubernetes/kubernetes pkg/kubelet/images).
UNRECOVERABLE_WAITING_REASONS = frozenset({"InvalidImageName"})


def unrecoverable_problem(pod: dict[str, Any]) -> str | None:
    """Why the worker pod can never become Ready, or ``None`` if waiting may still help.

    Unrecoverable: a container or init container whose image name is invalid, and an init
    container in ``CrashLoopBackOff`` (it failed, was restarted and failed again; the main
    container never starts). Worded as :func:`why_not_ready` words it.
    """
    status = pod.get("status") or {}
    for container in status.get("initContainerStatuses") or []:
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason == "CrashLoopBackOff" or reason in UNRECOVERABLE_WAITING_REASONS:
            return f"Init:{_container_problem(container, 'init container')}"
    for container in status.get("containerStatuses") or []:
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason in UNRECOVERABLE_WAITING_REASONS:
            return _container_problem(container, "container")
    return None


def create_failure(events: list[dict[str, Any]]) -> str | None:
    """The newest ``FailedCreate`` event's message (the StatefulSet controller could not create
    a pod: an admission refusal, a quota, a missing ServiceAccount), or ``None``."""
    failures = [event for event in events if event.get("reason") == "FailedCreate"]
    if not failures:
        return None
    newest = max(failures, key=lambda event: str(event.get("lastTimestamp")
                                                 or event.get("eventTime") or ""))
    return " ".join(str(newest.get("message") or "FailedCreate").split())


def is_invalid_object_message(message: str) -> bool:
    """Whether an API error message says the object itself is invalid (HTTP 422
    ``... is invalid: <field>: ...``): resending it can never succeed, unlike a quota or a
    missing ServiceAccount."""
    return " is invalid: " in message


@dataclass(frozen=True)
class LauncherOutcome:
    """How the launcher pod ended: ``finished`` False while it runs.

    ``message`` is the last line of the launcher container's termination message (its final
    failure line, or its log's last line) when the kubelet reported one, else the container's or
    the pod's reason.
    """

    finished: bool
    succeeded: bool = False
    exit_code: int | None = None
    message: str = ""


# The kubelet's reason for a container it could not find any more when the pod was
# terminated (pkg/kubelet/kubelet_pods.go; its node or runtime lost it): exit code 137 is
# written in place of an exit that never came.
CONTAINER_STATUS_UNKNOWN = "ContainerStatusUnknown"


def launcher_outcome(pod: dict[str, Any] | None,
                     container_name: str = LAUNCHER_CONTAINER) -> LauncherOutcome:
    """Judge the launcher pod by its phase and its launcher container's termination state.

    Args:
        pod: the launcher Pod as a dict (``restartPolicy: Never``), or None when there is none.
        container_name: the container whose exit code and message count (a sidecar from
            ``spec.launcher.template`` is not the launcher).

    Returns:
        Not finished while the pod is Pending or Running (or absent); Succeeded and Failed are
        final (kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase). A failed
        pod whose launcher never ended (evicted, its node lost) has ``exit_code`` None and the
        pod's own reason and message, e.g. ``Evicted: The node was low on resource: memory``;
        so has one whose container the kubelet lost (``ContainerStatusUnknown``, 137 written
        in place of an exit: found by the chaos soak, a node down for seconds under a launcher).
    """
    status = (pod or {}).get("status") or {}
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return LauncherOutcome(finished=False)
    terminated = _launcher_terminated([pod] if pod else [], container_name)
    if terminated is not None and terminated.get("reason") == CONTAINER_STATUS_UNKNOWN:
        # No exit at all: the kubelet lost the container (its node went down under it) and
        # wrote 137 in its place. Judged as a pod lost, not as the program's exit code.
        pod_failure = terminated.get("message") or CONTAINER_STATUS_UNKNOWN
        return LauncherOutcome(finished=True, succeeded=False, exit_code=None,
                               message=f"{CONTAINER_STATUS_UNKNOWN}: {pod_failure}")
    exit_code = None if terminated is None else int(terminated.get("exitCode", 0))
    message = ""
    if terminated is not None:
        # One line: monarch-launch's final failure line, or (a command of the user's, a crash:
        # the kubelet's log tail, FallbackToLogsOnError) the tail's last line, e.g. the
        # exception of a traceback. The whole tail is in status.attempts[].outputTail.
        lines = [line.strip() for line in (terminated.get("message") or "").splitlines()]
        message = next((line for line in reversed(lines) if line), "") or str(
            terminated.get("reason") or "")
    if phase == "Succeeded":
        # Its message too: a program that exits 0 once its launcher stopped it for a stall
        # wrote the stall there, and the stall decides (controller/judge/judging.py).
        return LauncherOutcome(finished=True, succeeded=True, exit_code=exit_code or 0,
                               message="" if message == "Completed" else message)
    pod_failure = ": ".join(part for part in (status.get("reason"), status.get("message"))
                            if part) or "pod failed"
    return LauncherOutcome(
        finished=True, succeeded=False, exit_code=exit_code, message=message or pod_failure
    )


def _launcher_terminated(pods: list[dict[str, Any]], container_name: str) -> dict[str, Any] | None:
    found = None
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if container.get("name") == container_name and terminated is not None:
                found = terminated
    return found


def launcher_failure_message(outcome: LauncherOutcome) -> str:
    """The Failed condition's message, e.g. ``launcher exited with code 3: trainer rank 1
    (host demo-worker-0, local rank 1): raised ValueError: boom at step 2``."""
    return f"launcher exited with code {outcome.exit_code}: {outcome.message}".strip()


def launcher_reason(outcome: LauncherOutcome, limit: int = LAUNCHER_REASON_LIMIT) -> str:
    """``status.launcher.reason``: the message, its middle left out beyond ``limit`` characters
    (a log tail's last line, the exception, matters as much as the first)."""
    message = outcome.message
    if len(message) <= limit:
        return message
    marker = " ... "
    head = (limit - len(marker)) // 2
    tail = limit - len(marker) - head
    return message[:head] + marker + message[-tail:]
