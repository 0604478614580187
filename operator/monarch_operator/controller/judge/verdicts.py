"""One verdict per attempt, from what happened and when (issue 20 item 1, field case C19).

Pure: no I/O; the time comes in. An attempt is judged by the order in which things happened,
read from the timestamps Kubernetes keeps on the pods, never by the order in which the watch
delivered them (a worker's kubelet may report its container's end after the launcher's kubelet
reported the launcher's, although the worker ended first and the launcher failed because of it):

- a worker lost at or before the launcher's end (its container's ``finishedAt``) makes the
  attempt Infrastructure, whatever exit code the launcher gave after;
- an exit code is a claim: a launcher stopped from outside (its pod deleted, evicted,
  preempted, its node drained) at or before its end never makes the attempt Succeeded, nor an
  Application failure, whatever the program did with its SIGTERM;
- a launcher that ended with neither is judged by its exit code, but only once the reports of
  what happened before its end have had :data:`SETTLE_SECONDS` to arrive.

Times have whole seconds (``metav1.Time``): a loss in the same second as the launcher's end
counts as before it (the launcher most likely ended because of it). The operator's own
deletions (a suspend, the previous attempt's launcher, released workers, the hostfile) happen
only after it recorded the attempt's end, so they are never judged here.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from monarch_operator.controller.builders.launcher import LAUNCHER_CONTAINER
from monarch_operator.controller.state import attempts, causes
from monarch_operator.controller.state.timestamps import parse

# How long after the launcher's end its verdict waits for reports of what happened before it.
# A kubelet reports a container's end within about 2 s (PLEG relists every second, then the
# status manager writes at once); a node lost without a word is noticed much later (the node
# controller's grace period) and is judged when the node is known NotReady.
SETTLE_SECONDS = 3.0

# How long at most a failed launcher's verdict waits for the nodes of its workers to show
# they live (:func:`silent_nodes`): a node that crashed is marked NotReady once its Lease went
# unrenewed for the node controller's grace period (``--node-monitor-grace-period``, 50 s by
# default since Kubernetes 1.32, 40 s before) and its next look (5 s), then taken as lost
# once NotReady for NODE_LOSS_CONFIRM_SECONDS. Past this, the exit code decides. While
# waiting, the verdict looks again every HEARTBEAT_RECHECK_SECONDS.
NODE_SILENCE_HOLD_SECONDS = 65.0 + attempts.NODE_LOSS_CONFIRM_SECONDS
HEARTBEAT_RECHECK_SECONDS = 2.0

# Verdict kinds.
RUNNING = "Running"  # nothing decided yet: the launcher runs, nobody was lost
SETTLING = "Settling"  # the launcher ended; its verdict waits for late reports
SUCCEEDED = "Succeeded"
WORKER_LOST = "WorkerLost"  # Infrastructure: a worker was lost at or before the launcher's end
LAUNCHER_STOPPED = "LauncherStopped"  # Infrastructure: the launcher was stopped from outside
EXIT_CODE = "ExitCode"  # judge the launcher's non-zero exit code (the run policy's rules)


@dataclass(frozen=True)
class Verdict:
    """What the attempt's observed pods say.

    ``kind`` is one of the verdict kinds above; ``lost``: the workers that make it
    :data:`WORKER_LOST`; ``stopped``: how the launcher was stopped, in :mod:`.causes`' words
    (``deleted``, ``evicted by a drain of node n1`` ...) for :data:`LAUNCHER_STOPPED`;
    ``wait_seconds``: for :data:`SETTLING`, when to look again.
    """

    kind: str
    lost: tuple[attempts.LostWorker, ...] = field(default_factory=tuple)
    stopped: str = ""
    wait_seconds: float | None = None


def deletion_requested(pod: dict[str, Any]) -> dt.datetime | None:
    """When the pod's deletion was asked for: its ``deletionTimestamp`` is that moment plus
    ``deletionGracePeriodSeconds`` (the API server sets both on a graceful delete)."""
    metadata = pod.get("metadata") or {}
    deleted = parse(metadata.get("deletionTimestamp"))
    if deleted is None:
        return None
    return deleted - dt.timedelta(seconds=int(metadata.get("deletionGracePeriodSeconds") or 0))


def _condition_time(pod: dict[str, Any], kind: str) -> dt.datetime | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return parse(condition.get("lastTransitionTime"))
    return None


def _not_ready_since(pod: dict[str, Any]) -> dt.datetime | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") != "True":
            return parse(condition.get("lastTransitionTime"))
    return None


def _container_ends(pod: dict[str, Any]) -> list[dt.datetime]:
    """``finishedAt`` of every container instance of the pod that ended, now or last time."""
    ends = []
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            moment = parse((state.get("terminated") or {}).get("finishedAt"))
            if moment is not None:
                ends.append(moment)
    return ends


def worker_loss_time(entry: dict[str, Any], pod: dict[str, Any] | None,
                     started: dt.datetime | None = None) -> dt.datetime | None:
    """When the worker of snapshot ``entry`` was lost, as its pod ``pod`` says; None when
    nothing tells (the pod is gone, or its node went silent).

    The earliest of: the deletion request, a ``DisruptionTarget`` condition, and for a pod
    that failed or whose container ended or restarted, that container's ``finishedAt`` (else
    when it stopped being Ready). A replacement pod (another uid) was created after the loss:
    its ``creationTimestamp`` bounds it. ``started``: container ends before it (the attempt's
    launch) are not losses of this attempt.
    """
    if pod is None:
        return None
    metadata = pod.get("metadata") or {}
    if metadata.get("uid") != entry.get("uid"):
        return parse(metadata.get("creationTimestamp"))
    moments = [moment for moment in (deletion_requested(pod),
                                     _condition_time(pod, "DisruptionTarget")) if moment]
    ends = [moment for moment in _container_ends(pod) if started is None or moment >= started]
    moments.extend(ends)
    status = pod.get("status") or {}
    if not ends and (status.get("reason") or status.get("phase") in ("Failed", "Unknown")):
        moments.extend(moment for moment in [_not_ready_since(pod)] if moment)
    return min(moments) if moments else None


def launcher_end(pod: dict[str, Any], container: str = LAUNCHER_CONTAINER) -> dt.datetime | None:
    """``finishedAt`` of the launcher container, None while it runs (or if never reported)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return parse(((status.get("state") or {}).get("terminated") or {}).get("finishedAt"))
    return None


def launcher_stop(pod: dict[str, Any],
                  cordoned: frozenset[str] = frozenset()) -> tuple[str, dt.datetime | None] | None:
    """How and when the launcher pod was stopped from outside, or None.

    How: :mod:`.causes`' words for it (``deleted``, ``evicted through the Eviction API``,
    ``evicted by a drain of node n1`` with ``cordoned``, ``evicted by the kubelet of node n1:
    ...``, ``preempted by the scheduler ...``); when: the earliest moment that tells (its
    deletion request, its ``DisruptionTarget`` condition), None for a kubelet reason without
    one (it counts as before the launcher's end).
    """
    cause = causes.of_pod(pod, cordoned)
    if cause is None:
        return None
    moments = [moment for moment in (deletion_requested(pod),
                                     _condition_time(pod, "DisruptionTarget")) if moment]
    return cause.words(), (min(moments) if moments else None)


def judge(launcher: dict[str, Any], finished: bool, succeeded: bool,
          lost: list[attempts.LostWorker], snapshot: list[dict[str, Any]],
          worker_pods: list[dict[str, Any]], now: dt.datetime,
          launched: dt.datetime | None = None,
          cordoned: frozenset[str] = frozenset()) -> Verdict:
    """The verdict on the attempt whose launcher pod is ``launcher``.

    Args:
        finished, succeeded: how the launcher pod's phase says it ended
            (:func:`.observe.launcher_outcome`).
        lost: the workers of ``snapshot`` (the attempt's workers, taken at its launch) that
            :func:`.attempts.lost_workers` finds lost in ``worker_pods``.
        now: the operator's time.
        launched: the attempt's ``launchTime``: a worker container that ended before it was
            not lost by this attempt.
        cordoned: nodes known to be cordoned: a launcher evicted from one was drained.

    Returns:
        :data:`RUNNING` while the launcher runs and nothing was lost (the caller still checks
        its node); :data:`WORKER_LOST` with the workers lost at or before its end (any loss
        while it runs); :data:`LAUNCHER_STOPPED` when it was stopped from outside at or before
        its end; :data:`SETTLING` with the seconds to wait while reports of what happened
        before its end may still come; then :data:`SUCCEEDED` or :data:`EXIT_CODE`.
    """
    if not finished:
        return Verdict(WORKER_LOST, tuple(lost)) if lost else Verdict(RUNNING)
    ended = launcher_end(launcher)
    pods = {pod["metadata"]["name"]: pod for pod in worker_pods}
    entries = {entry["name"]: entry for entry in snapshot}
    before = []
    for worker in lost:
        moment = worker_loss_time(entries.get(worker.name, {}), pods.get(worker.name), launched)
        if moment is None and not succeeded:
            before.append(worker)  # when is unknown: the failure is not the program's alone
        elif moment is not None and (ended is None or moment <= ended):
            before.append(worker)
    if before:
        return Verdict(WORKER_LOST, tuple(before))
    stop = launcher_stop(launcher, cordoned)
    if stop is not None and (stop[1] is None or ended is None or stop[1] <= ended):
        return Verdict(LAUNCHER_STOPPED, stopped=stop[0])
    if ended is not None:
        left = (ended - now).total_seconds() + SETTLE_SECONDS
        if left > 0:
            return Verdict(SETTLING, wait_seconds=min(left, SETTLE_SECONDS))
    return Verdict(SUCCEEDED) if succeeded else Verdict(EXIT_CODE)


def silent_nodes(snapshot: list[dict[str, Any]], worker_pods: list[dict[str, Any]],
                 heartbeats: dict[str, dt.datetime], ended: dt.datetime) -> list[str]:
    """The nodes of the attempt's workers whose kubelet has not heartbeated since the
    launcher's end: no Lease renewal in ``heartbeats`` (:func:`.nodes.node_heartbeats`) after
    the second of ``ended`` (``finishedAt`` has whole seconds).

    A launcher that failed because a host went away (ssh exits 255, a pre-flight cannot
    connect, a Monarch proc is lost) ends seconds after a node crash, long before the node
    controller marks the node NotReady. Until one of these nodes heartbeats again (it lives:
    the exit code decides) or is marked NotReady (its workers are lost: Infrastructure), the
    failure is not the program's to be charged with. Sorted node names; a worker pod not bound
    to a node is not waited for.
    """
    alive_after = ended + dt.timedelta(seconds=1)
    return sorted(node for node in _worker_nodes(snapshot, worker_pods)
                  if node not in heartbeats or heartbeats[node] < alive_after)


def _worker_nodes(snapshot: list[dict[str, Any]], worker_pods: list[dict[str, Any]]) -> set[str]:
    """The nodes that the pods of the snapshot's workers are bound to."""
    names_ = {entry["name"] for entry in snapshot}
    return {str(pod["spec"]["nodeName"]) for pod in worker_pods
            if pod["metadata"]["name"] in names_ and (pod.get("spec") or {}).get("nodeName")}


def nodes_down_since(snapshot: list[dict[str, Any]], worker_pods: list[dict[str, Any]],
                     readiness: dict[str, tuple[bool, dt.datetime | None]] | None,
                     ended: dt.datetime | None) -> list[str]:
    """The nodes of the attempt's workers that were not Ready at some moment since the
    launcher's end ``ended``: gone, not Ready now (for any time: no confirmation is waited
    for), or Ready again through a transition in or after the second of ``ended``.

    A node that crashed makes the launcher fail within seconds, is marked NotReady only after
    the node controller's grace period, and may be back before the verdict's hold
    (:func:`heartbeat_hold`) ends: its first heartbeat then must not let the exit code decide
    (chaos soak, seed 1: a node down 37 s, NotReady 12 s of it). A control-plane outage that
    marks every node NotReady for a few seconds while a failed launcher's verdict is pending
    makes that attempt Infrastructure too: one restart of the infrastructure budget, never a
    program blamed for a host.

    Args:
        readiness: per node, whether it is Ready and since when its ``Ready`` condition has
            its status (:func:`.nodes.node_readiness`); None when nodes may not be read.
        ended: the launcher's ``finishedAt``; None (not reported) decides nothing.

    Returns:
        Sorted node names; ``[]`` when ``readiness`` or ``ended`` is None.
    """
    if readiness is None or ended is None:
        return []
    down = []
    for node in _worker_nodes(snapshot, worker_pods):
        ready, since = readiness.get(node, (False, None))
        if not ready or (since is not None and since >= ended):
            down.append(node)
    return sorted(down)


def heartbeat_hold(snapshot: list[dict[str, Any]], worker_pods: list[dict[str, Any]],
                   heartbeats: dict[str, dt.datetime] | None, ended: dt.datetime | None,
                   now: dt.datetime) -> list[str]:
    """The nodes a failed launcher's verdict (:data:`EXIT_CODE`) still waits for
    (:func:`silent_nodes`), or ``[]`` to judge now: heartbeats unknown (``None``: the
    operator may not read them), the end not reported, or :data:`NODE_SILENCE_HOLD_SECONDS`
    passed since ``ended``."""
    if heartbeats is None or ended is None:
        return []
    if (now - ended).total_seconds() >= NODE_SILENCE_HOLD_SECONDS:
        return []
    return silent_nodes(snapshot, worker_pods, heartbeats, ended)
