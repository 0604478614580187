"""Pure status helpers: conditions with observedGeneration, and the phase summary derived from them.

Follows the Kubernetes API conventions for conditions: ``lastTransitionTime`` changes only when
``status`` flips.
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass
from typing import Any

# How the status writes times: RFC 3339 in UTC with whole seconds (``2026-11-30T15:04:05Z``),
# as Kubernetes writes ``metav1.Time``.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(moment: dt.datetime) -> str:
    """``moment`` (aware, UTC) as the status writes times (:data:`TIME_FORMAT`); read back
    with :func:`.deadlines.parse_time`."""
    return moment.strftime(TIME_FORMAT)


# Condition types.
WORKERS_READY = "WorkersReady"  # every worker pod is Ready (sshd accepts connections)
RUNNING = "Running"  # the launcher pod exists and has not finished
SUCCEEDED = "Succeeded"  # the launcher exited 0
FAILED = "Failed"  # the job cannot succeed; reason says why
SUSPENDED = "Suspended"  # spec.suspend: no workers, no launcher
QUEUED = "Queued"  # waiting for Kueue to admit its Workload: no workers, no launcher (kueue/)

# Reasons (CamelCase).
REASON_WAITING_FOR_WORKERS = "WaitingForWorkers"
REASON_ALL_WORKERS_READY = "AllWorkersReady"
REASON_LAUNCHER_STARTED = "LauncherStarted"
# The launcher failed while a node of its workers has not heartbeated since (verdicts.py).
REASON_AWAITING_NODE_HEARTBEAT = "AwaitingNodeHeartbeat"
# Failed: a worker's torchmonarch, torch, monarch-operator or Python differs from the
# launcher's (field case C27).
REASON_VERSION_SKEW = "VersionSkew"
# Running: a worker is being drained or preempted and the launcher was asked to stop first.
REASON_CHECKPOINT_BEFORE_DISRUPTION = "CheckpointBeforeDisruption"
REASON_LAUNCHER_SUCCEEDED = "LauncherSucceeded"
REASON_LAUNCHER_FAILED = "LauncherFailed"
REASON_STARTUP_TIMEOUT = "StartupTimeout"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_CHILD_NOT_OWNED = "ChildNotOwned"
# Run policy (controller/spec/policy.py): an attempt ended and another one starts.
REASON_RESTARTING = "Restarting"
# Infrastructure failures, naming the pod: deleted, evicted or preempted; restarted in place;
# the launcher pod itself lost.
REASON_WORKER_EVICTED = "WorkerEvicted"
REASON_WORKER_RESTARTED = "WorkerRestarted"
REASON_LAUNCHER_LOST = "LauncherLost"
# The launcher's pre-flight could not reach workers recreated for the attempt (C20).
REASON_WORKER_UNREACHABLE = "WorkerUnreachable"
# A device of a worker turned Unhealthy (KEP-4680 allocatedResourcesStatus), or a rank's
# output named a hardware fault (monarch_operator/hwerrors.py): Infrastructure
# (controller/judge/hardware.py, docs/gpu-health.md).
REASON_GPU_UNHEALTHY = "GPUUnhealthy"
REASON_GPU_HARDWARE_ERROR = "GPUHardwareError"
# runPolicy.progressDeadlineSeconds (controller/judge/stalls.py)
REASON_PROGRESS_STALLED = "ProgressStalled"
# A podFailurePolicy rule with action FailJob matched the launcher's exit code.
REASON_FATAL_EXIT_CODE = "FatalExitCode"
# spec.suspend.
REASON_SUSPENDED = "JobSuspended"
REASON_RESUMED = "JobResumed"
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"  # spec.activeDeadlineSeconds passed
REASON_TEMPLATE_REFUSED = "TemplateRefused"  # the API server refused a child built from spec
REASON_OPERATOR_FORBIDDEN = "OperatorForbidden"  # the API server refused the operator (403)
REASON_WORKER_CANNOT_START = "WorkerCannotStart"  # e.g. invalid image, init crash loop
REASON_TTL_EXPIRED = "TTLExpired"  # the job was deleted by spec.ttlSecondsAfterFinished
# A pod of the job stuck terminating past its grace period (node lost, a finalizer) was
# force-deleted so that the job goes on (controller/release/stuckpods.py).
REASON_POD_FORCE_DELETED = "PodForceDeleted"
# Reasons of a condition that need someone's attention: their Events are Warnings.
WARNING_REASONS = frozenset({REASON_CHILD_NOT_OWNED, REASON_RESTARTING})

# Phases shown in the STATUS printer column.
PHASE_PENDING = "Pending"
PHASE_STARTING = "Starting"
PHASE_RUNNING = "Running"
PHASE_RESTARTING = "Restarting"
PHASE_SUSPENDED = "Suspended"
PHASE_QUEUED = "Queued"
PHASE_SUCCEEDED = "Succeeded"
PHASE_FAILED = "Failed"


def get_condition(status: dict[str, Any], condition_type: str) -> dict[str, Any] | None:
    """The condition of that type in ``status``, or ``None``."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == condition_type:
            return dict(condition)
    return None


def is_true(status: dict[str, Any], condition_type: str) -> bool:
    """Whether the condition exists with status ``"True"``."""
    condition = get_condition(status, condition_type)
    return condition is not None and condition.get("status") == "True"


def set_condition(
    status: dict[str, Any],
    condition_type: str,
    is_set: bool,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> dict[str, Any]:
    """Return a copy of ``status`` with the condition set.

    Args:
        is_set: condition status True or False.
        generation: ``metadata.generation`` this condition was computed for.
        now: RFC 3339 timestamp used as ``lastTransitionTime`` if the status flips.
    """
    new_status = copy.deepcopy(status)
    conditions = new_status.setdefault("conditions", [])
    value = "True" if is_set else "False"
    condition = {
        "type": condition_type,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now,
    }
    for index, existing in enumerate(conditions):
        if existing.get("type") == condition_type:
            if existing.get("status") == value:
                condition["lastTransitionTime"] = existing.get("lastTransitionTime", now)
            conditions[index] = condition
            return new_status
    conditions.append(condition)
    return new_status


def reason_of(status: dict[str, Any], condition_type: str) -> str | None:
    """Reason of the condition if it is ``"True"``, else ``None``."""
    condition = get_condition(status, condition_type)
    if condition is None or condition.get("status") != "True":
        return None
    return str(condition.get("reason") or "")


def is_finished(status: dict[str, Any]) -> bool:
    """Whether the job reached Succeeded or Failed (both final)."""
    return is_true(status, SUCCEEDED) or is_true(status, FAILED)


def summarize_phase(status: dict[str, Any]) -> str:
    """The one-word phase for ``kubectl get``: derived from the conditions, never stored alone."""
    if is_true(status, FAILED):
        return PHASE_FAILED
    if is_true(status, SUCCEEDED):
        return PHASE_SUCCEEDED
    if is_true(status, SUSPENDED):
        return PHASE_SUSPENDED
    if is_true(status, QUEUED):
        return PHASE_QUEUED
    if is_true(status, RUNNING):
        return PHASE_RUNNING
    running = get_condition(status, RUNNING)
    if running is not None and running.get("reason") == REASON_RESTARTING:
        return PHASE_RESTARTING
    if get_condition(status, WORKERS_READY) is not None:
        return PHASE_STARTING
    return PHASE_PENDING


# status.message (the MESSAGE column of `kubectl get -o wide`) keeps at most this many
# characters; the whole text stays in the condition it comes from.
SUMMARY_MESSAGE_LIMIT = 200


def summarize_message(status: dict[str, Any]) -> str:
    """Why the job is in its phase, in one line: the message of the condition that decided
    :func:`summarize_phase` (while workers are not all Ready, ``WorkersReady``'s, which names
    each waiting worker and why), cut to :data:`SUMMARY_MESSAGE_LIMIT` characters; "" when no
    condition says anything yet. Derived like the phase, never stored on its own."""
    phase = summarize_phase(status)
    by_phase = {PHASE_FAILED: FAILED, PHASE_SUCCEEDED: SUCCEEDED, PHASE_SUSPENDED: SUSPENDED,
                PHASE_QUEUED: QUEUED, PHASE_RUNNING: RUNNING, PHASE_STARTING: WORKERS_READY}
    source = by_phase.get(phase)
    if phase == PHASE_RESTARTING:  # the gate's wait says more than the restart once it runs
        workers = get_condition(status, WORKERS_READY) or {}
        waiting = workers.get("status") == "False" and workers.get("reason") != REASON_RESTARTING
        source = WORKERS_READY if waiting else RUNNING
    message = " ".join(str((get_condition(status, source) or {}).get("message") or "").split()
                       ) if source else ""
    if len(message) > SUMMARY_MESSAGE_LIMIT:
        message = message[:SUMMARY_MESSAGE_LIMIT - 3] + "..."
    return message


@dataclass(frozen=True)
class Transition:
    """A condition that changed status or reason between two statuses (an Event to post)."""

    type: str  # Event type: "Normal" or "Warning"
    reason: str
    message: str


def condition_transitions(before: dict[str, Any], after: dict[str, Any]) -> list[Transition]:
    """Conditions of ``after`` whose status or reason differs from ``before`` (new ones too).

    A changed message alone (``1/2 workers ready`` -> ``2/2``) is no transition. A condition
    ``Failed=True``, or one with a reason in :data:`WARNING_REASONS`, is a Warning.
    """
    transitions = []
    for condition in after.get("conditions") or []:
        old = get_condition(before, condition["type"]) or {}
        if (old.get("status"), old.get("reason")) == (condition.get("status"),
                                                       condition.get("reason")):
            continue
        warning = (condition["type"] == FAILED and condition.get("status") == "True") or (
            condition.get("reason") in WARNING_REASONS)
        transitions.append(Transition("Warning" if warning else "Normal",
                                      str(condition.get("reason") or condition["type"]),
                                      str(condition.get("message") or "")))
    return transitions


def only_progress_changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether ``after`` differs from ``before`` only in progress: ``readyWorkers``, the
    summary ``message`` and the messages of conditions whose status and reason stay (e.g.
    which workers are still waiting, and why). Such a change may wait a little before it is
    written; any other may not."""
    def essential(status: dict[str, Any]) -> dict[str, Any]:
        kept = {key: value for key, value in status.items()
                if key not in ("readyWorkers", "message")}
        kept["conditions"] = [{key: value for key, value in condition.items()
                               if key != "message"}
                              for condition in status.get("conditions") or []]
        return kept

    return before != after and essential(before) == essential(after)
