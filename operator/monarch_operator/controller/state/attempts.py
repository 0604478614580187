"""Attempts of a MonarchJob: their records in ``status.attempts[]`` and the worker pods they run on.

Pure: no I/O, no clock (times come in as RFC 3339 text). An attempt is one run of the launcher
over the job's workers: the gate (every worker Ready), the launcher pod, and its end. A snapshot
of the worker pods (name, uid, restart count) is taken when the launcher starts; a worker whose
pod is gone, replaced, being deleted, evicted or whose container restarted since then is lost
for that attempt (field case C8), an infrastructure failure.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from monarch_operator import names
from monarch_operator.controller.state import causes

# status.attempts keeps the latest records only; `number` says which attempt each one was.
MAX_ATTEMPTS_KEPT = 10
# Last lines of the launcher's output kept per attempt, each cut to this many characters.
OUTPUT_TAIL_LINES = 20
OUTPUT_LINE_CHARS = 240
# Longest message kept per attempt (head and tail kept).
MESSAGE_CHARS = 1024

# A launcher pod that is not Ready (yet) is looked at again this often (seconds) for this long
# after its Ready condition last changed: if its node was lost before the pod ever became
# Ready, the node controller has nothing to mark and no pod event comes. The window covers
# the node-monitor grace period (50 s by default) and its period (5 s).
LAUNCHER_RECHECK_SECONDS = 5.0
LAUNCHER_RECHECK_WINDOW_SECONDS = 90.0

# A node not Ready for less than this (seconds) is not taken as lost yet. After an outage of
# the control plane longer than the node-monitor grace period, the node controller marks every
# node NotReady (and every pod on it not Ready) until the kubelets' next Lease renewals reach it
# (each 10 s by default, its look each 5 s): a blip that must not end every running attempt.
# A node that is really gone stays NotReady; its loss is judged this much later.
NODE_LOSS_CONFIRM_SECONDS = 20.0

# The launcher's failure line: "trainer rank 1 (host demo-worker-0, local rank 1): ..." (role
# mode, programs/roles.py and job.py) or "rank 3 of 4 (host demo-worker-1, local rank 1) ..."
# (SPMD, programs/spmd.py).
_FAILING_RANK = re.compile(
    r"(?:\b(?P<role>[A-Za-z_][\w-]*) )?\brank (?P<rank>\d+)(?: of \d+)? \(host (?P<host>[^,)\s]+)"
)


@dataclass(frozen=True)
class LostWorker:
    """A worker pod the running attempt lost, and how, in :mod:`.causes`' words (``deleted``,
    ``evicted by a drain of node n1`` ...).

    ``node_lost``: its node is not Ready and it is not either; nobody else deletes such a pod
    soon (taint-based eviction waits 300 s), so the operator does, to have it recreated
    (``recreatedWorkers`` of the ended attempt, :func:`.release.recreate_lost_workers`). Also
    set for a worker whose device turned Unhealthy (``GPUUnhealthy``, judge/hardware.py): its
    pod is recreated so that it gets another device. ``uid``: the pod's, as the verdict read it,
    for a ``node_lost`` one (its delete names that pod, never a namesake created since).
    """

    name: str
    cause: str
    node_lost: bool = False
    uid: str = ""

    @property
    def in_place(self) -> bool:
        """Whether only a container of the pod ended or restarted (the pod itself stays)."""
        return self.cause.startswith("container ")

    def describe(self, group: str | None = None) -> str:
        """E.g. ``demo-worker-3 (deleted)``; with its worker ``group`` (a job with
        ``spec.workerGroups``) ``rl-generator-1 (group generator, deleted)``."""
        if group:
            return f"{self.name} (group {group}, {self.cause})"
        return f"{self.name} ({self.cause})"


def worker_snapshot(job_name: str, replicas: int,
                    pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`snapshot_of` the worker pods ``0..replicas-1`` of a job without worker groups."""
    return snapshot_of([names.worker_pod(job_name, ordinal) for ordinal in range(replicas)],
                       pods)


def snapshot_of(pod_names: list[str], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{name, uid, restartCount}]`` of the worker pods named ``pod_names`` (hostfile order,
    ``JobSpec.worker_pod_names``), those that exist, taken when an attempt's launcher
    starts."""
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    snapshot = []
    for name in pod_names:
        pod = by_name.get(name)
        if pod is not None:
            snapshot.append({"name": pod["metadata"]["name"], "uid": pod["metadata"].get("uid"),
                             "restartCount": restart_count(pod)})
    return snapshot


def snapshot_as_of(pod_names: list[str], pods: list[dict[str, Any]],
                   moment: str) -> list[dict[str, Any]]:
    """The :func:`snapshot_of` that would have been taken at ``moment`` (an RFC 3339 time:
    a launcher pod's ``creationTimestamp``), as well as the pods now tell it: a pod created
    after it stands for one that was lost since (its uid is not the one recorded, so
    :func:`lost_workers` finds it ``deleted and recreated``), and a container started after
    it with restarts counts one restart fewer (it restarted since). For an attempt whose
    launch was never recorded: the operator stopped between creating the launcher pod and
    writing the attempt's status (chaos soak, seed 1)."""
    snapshot = snapshot_of(pod_names, pods)
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    for entry in snapshot:
        pod = by_name[entry["name"]]
        if str(pod["metadata"].get("creationTimestamp") or "") > moment:
            entry["uid"] = f"replaced after {moment}"
            continue
        started = [str(((status.get("state") or {}).get("running") or {}).get("startedAt") or "")
                   for status in (pod.get("status") or {}).get("containerStatuses") or []]
        if entry["restartCount"] > 0 and any(time > moment for time in started):
            entry["restartCount"] -= 1
    return snapshot


# At most this many distinct worker image digests are recorded per attempt.
MAX_WORKER_IMAGES = 8


def image_ids(pods: list[dict[str, Any]], container: str) -> list[str]:
    """The distinct image digests (``containerStatuses[].imageID``) that ``container`` of
    ``pods`` runs, sorted, at most :data:`MAX_WORKER_IMAGES`; pods that report none are left
    out. Part of an attempt's fingerprint (issue 23 item 3): the versions that ran."""
    found = {str(status["imageID"]) for pod in pods
             for status in (pod.get("status") or {}).get("containerStatuses") or []
             if status.get("name") == container and status.get("imageID")}
    return sorted(found)[:MAX_WORKER_IMAGES]


def restart_count(pod: dict[str, Any]) -> int:
    """Sum of the pod's container restart counts (kubectl's RESTARTS)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(container.get("restartCount") or 0) for container in statuses)


def lost_workers(snapshot: list[dict[str, Any]], pods: list[dict[str, Any]],
                 unready_nodes: frozenset[str] = frozenset(),
                 cordoned: frozenset[str] = frozenset()) -> list[LostWorker]:
    """Workers of ``snapshot`` that the attempt lost, in snapshot (ordinal) order.

    Lost: the pod is gone or replaced (another uid), being deleted, failed or evicted (pod
    ``reason``, a ``DisruptionTarget`` condition), a container restarted or stopped since
    the snapshot, or the pod is on a node in ``unready_nodes`` (its node lost or NotReady,
    long before the node controller evicts it), Ready or not: the node controller marks the
    pods of a lost node not Ready one at a time, and every one of them is named together. A
    pod that is only briefly not Ready (a slow readiness probe) on a healthy node is not lost.
    Each is worded by :mod:`.causes` (``cordoned``: nodes being drained).
    """
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    lost = []
    for entry in snapshot:
        pod = by_name.get(entry["name"])
        cause = _loss_cause(entry, pod, cordoned)
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        if not cause and node in unready_nodes:
            lost.append(LostWorker(entry["name"],
                                   causes.Cause(causes.NODE_NOT_READY, str(node)).words(),
                                   node_lost=True, uid=_uid(pod)))
        elif cause:
            lost.append(LostWorker(entry["name"], cause))
    return lost


def leaving_gracefully(lost: list[LostWorker], pods: list[dict[str, Any]]) -> bool:
    """Whether every one of ``lost`` is being stopped from outside with a grace period and
    still runs: the pod is there, asked to go (a ``deletionTimestamp``: a drain's eviction, a
    preemption, the taint manager, ``kubectl delete``) or marked ``DisruptionTarget``, and its
    containers have not ended. Its ranks can still save the job's state then, if the launcher
    is asked to stop first (checkpoint before a stop); a crashed container, a pod gone or a
    lost node cannot."""
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    for worker in lost:
        pod = by_name.get(worker.name)
        if pod is None or worker.node_lost or worker.in_place:
            return False
        status = pod.get("status") or {}
        disrupted = any(condition.get("type") == "DisruptionTarget"
                        and condition.get("status") == "True"
                        for condition in status.get("conditions") or [])
        if not (pod["metadata"].get("deletionTimestamp") or disrupted):
            return False
        if status.get("phase") != "Running" or any(
                "terminated" in (container.get("state") or {})
                for container in status.get("containerStatuses") or []):
            return False
    return bool(lost)


def nodes_to_check(snapshot: list[dict[str, Any]], pods: list[dict[str, Any]]) -> set[str]:
    """Nodes of the snapshot's pods that are not Ready now: only their node's health can tell
    a lost node from a slow probe (so nodes are read only then)."""
    names_ = {entry["name"] for entry in snapshot}
    return {str(pod["spec"]["nodeName"]) for pod in pods
            if pod["metadata"]["name"] in names_ and not _ready(pod)
            and (pod.get("spec") or {}).get("nodeName")}


def launcher_nodes_to_check(pods: list[dict[str, Any]]) -> set[str]:
    """Nodes of the attempt's launcher ``pods`` that still run (phase not final) but are not
    Ready: only their node's health can tell a lost node from a launcher that is merely not
    Ready, so nodes are read only then (a launcher has no readiness probe: on a live node it
    is Ready while its container runs)."""
    return {str(pod["spec"]["nodeName"]) for pod in pods if _launcher_unready(pod)}


def lost_launcher(pods: list[dict[str, Any]],
                  unready_nodes: frozenset[str]) -> tuple[str, str] | None:
    """``(pod name, node name)`` of the first launcher pod of ``pods`` that is not finished,
    not Ready, and bound to a node in ``unready_nodes`` (NotReady or gone), else None.

    Such a pod is lost with its node: its container cannot be seen any more and nothing ends
    the pod until Kubernetes' taint-based eviction (``tolerationSeconds`` 300 of the
    ``node.kubernetes.io/unreachable`` and ``not-ready`` taints, set by the DefaultTolerationSeconds
    admission plugin), so the attempt ends now as an infrastructure failure, as for a worker.
    A launcher that is Ready, finished, or not Ready on a Ready node is not lost.
    """
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if _launcher_unready(pod) and node in unready_nodes:
            return str(pod["metadata"]["name"]), str(node)
    return None


def confirmed_lost(not_ready_since: dict[str, dt.datetime | None],
                   now: dt.datetime) -> tuple[frozenset[str], float | None]:
    """The nodes taken as lost, and when to look again at those that may be.

    Args:
        not_ready_since: per node, when it stopped being Ready (aware UTC; None: Ready), as
            :func:`.nodes.node_not_ready_since` answers.
        now: the pass's time (aware UTC).

    Returns:
        The nodes not Ready for :data:`NODE_LOSS_CONFIRM_SECONDS` or longer, and the seconds
        until the first of the others would be (None when there is none).
    """
    lost, waits = set(), []
    for node, since in not_ready_since.items():
        if since is None:
            continue
        left = NODE_LOSS_CONFIRM_SECONDS - (now - since).total_seconds()
        if left <= 0:
            lost.add(node)
        else:
            waits.append(left)
    return frozenset(lost), (min(waits) if waits else None)


def launcher_recheck_in(pods: list[dict[str, Any]], now: dt.datetime) -> float | None:
    """Seconds until the attempt's launcher ``pods`` are to be looked at again, or None.

    :data:`LAUNCHER_RECHECK_SECONDS` while a running launcher pod is not Ready and its Ready
    condition changed less than :data:`LAUNCHER_RECHECK_WINDOW_SECONDS` before ``now`` (a
    pod not Ready without such a condition counts from now); None otherwise, so that a
    launcher kept not Ready on a healthy node (its own readiness probe) costs no passes.
    """
    for pod in pods:
        if not _launcher_unready(pod):
            continue
        since = next((condition.get("lastTransitionTime") for condition in
                      (pod.get("status") or {}).get("conditions") or []
                      if condition.get("type") == "Ready"), None)
        if not since:
            return LAUNCHER_RECHECK_SECONDS
        changed = dt.datetime.fromisoformat(str(since))
        if changed.tzinfo is None:
            changed = changed.replace(tzinfo=dt.UTC)
        if (now - changed).total_seconds() < LAUNCHER_RECHECK_WINDOW_SECONDS:
            return LAUNCHER_RECHECK_SECONDS
    return None


def _launcher_unready(pod: dict[str, Any]) -> bool:
    """Bound to a node, still running as far as the API says, and not Ready."""
    phase = (pod.get("status") or {}).get("phase")
    return (bool((pod.get("spec") or {}).get("nodeName"))
            and phase not in ("Succeeded", "Failed") and not _ready(pod))


def _ready(pod: dict[str, Any] | None) -> bool:
    return any(condition.get("type") == "Ready" and condition.get("status") == "True"
               for condition in ((pod or {}).get("status") or {}).get("conditions") or [])


def _uid(pod: dict[str, Any] | None) -> str:
    return str(((pod or {}).get("metadata") or {}).get("uid") or "")


def _loss_cause(entry: dict[str, Any], pod: dict[str, Any] | None,
                cordoned: frozenset[str] = frozenset()) -> str:
    if pod is None or pod["metadata"].get("uid") != entry.get("uid"):
        return "deleted" if pod is None else "deleted and recreated"
    stopped = causes.of_pod(pod, cordoned)  # deleted, evicted, preempted, drained ...
    if stopped is not None:
        return stopped.words()
    status = pod.get("status") or {}
    if status.get("reason"):  # NodeAgentError and other reasons of a pod that failed
        reason = str(status["reason"])
        message = " ".join(str(status.get("message") or "").split())[:200]
        return f"pod {reason}: {message}" if message else f"pod {reason}"
    if status.get("phase") in ("Failed", "Succeeded", "Unknown"):
        return f"pod {status['phase']}"
    if restart_count(pod) > int(entry.get("restartCount") or 0):
        return "container restarted"
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return f"container {container.get('name')} exited {terminated.get('exitCode')}"
    return ""


def failing_rank(message: str) -> dict[str, Any]:
    """``{role, rank, host}`` of the first rank named in the launcher's failure line, the keys
    found (role is absent for SPMD jobs); ``{}`` when the line names no rank."""
    match = _FAILING_RANK.search(message or "")
    if match is None:
        return {}
    found: dict[str, Any] = {"rank": int(match["rank"]), "host": match["host"]}
    if match["role"] and match["role"] not in ("failed", "the", "on"):
        found["role"] = match["role"]
    return found


def output_tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    """The last ``lines`` non-empty lines of ``text``, each at most ``OUTPUT_LINE_CHARS``."""
    kept = [line.rstrip() for line in (text or "").splitlines() if line.strip()]
    return [line[:OUTPUT_LINE_CHARS] for line in kept[-lines:]]


def shorten(message: str, limit: int = MESSAGE_CHARS) -> str:
    """``message`` with its middle left out beyond ``limit`` characters."""
    if len(message) <= limit:
        return message
    marker = " ... "
    head = (limit - len(marker)) // 2
    return message[:head] + marker + message[-(limit - len(marker) - head):]


def recreated_workers(status: dict[str, Any]) -> dict[tuple[str, str], int]:
    """``{(pod name, uid): attempt}``: the worker pods that ended attempts marked to be
    recreated (``recreatedWorkers``: a lost node, an Unhealthy device), each with the number
    of the attempt that lost it."""
    return {(str(entry.get("name")), str(entry.get("uid"))): int(record.get("number") or 0)
            for record in status.get("attempts") or []
            for entry in record.get("recreatedWorkers") or []}


def current(status: dict[str, Any]) -> dict[str, Any] | None:
    """The record of the attempt in progress (``status.attempt``), or None."""
    attempts = status.get("attempts") or []
    if attempts and attempts[-1].get("number") == status.get("attempt"):
        return dict(attempts[-1])
    return None


def begin(status: dict[str, Any], number: int, now: str, restart: bool = True) -> dict[str, Any]:
    """A copy of ``status`` with attempt ``number`` started at ``now`` (its gate begins).

    ``restart``: whether this attempt is a restart after a failure, counted in
    ``status.restartCount`` (the RESTARTS column). The first attempt and the attempt that
    follows a suspend are not restarts: users read RESTARTS as "something went wrong".
    """
    new_status = dict(status)
    new_status["attempt"] = number
    new_status["restartCount"] = (int(status.get("restartCount") or 0) + 1
                                  if restart and number > 1 else
                                  int(status.get("restartCount") or 0))
    records = [dict(record) for record in status.get("attempts") or []]
    records.append({"number": number, "startTime": now})
    new_status["attempts"] = records[-MAX_ATTEMPTS_KEPT:]
    return new_status


def update_current(status: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A copy of ``status`` whose current attempt record has ``fields`` set (None removes)."""
    new_status = dict(status)
    records = [dict(record) for record in status.get("attempts") or []]
    if records and records[-1].get("number") == status.get("attempt"):
        for key, value in fields.items():
            if value is None:
                records[-1].pop(key, None)
            else:
                records[-1][key] = value
    new_status["attempts"] = records
    return new_status
