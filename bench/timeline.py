"""Where the seconds from ``kubectl apply`` to the first training step go (issue 36, item 1).

:func:`job_timeline` reads, once a job has stepped, when each phase of its start ended, from
what the API server and the container runtime recorded, for our MonarchJob and for the MPI
Operator's MPIJob alike; :func:`table` prints the phases of several operators side by side
(p50 over a batch's jobs, seconds after ``kubectl apply``).

Where each time comes from, and its resolution:

- objects' ``creationTimestamp``, pod conditions' ``lastTransitionTime`` and containers'
  ``startedAt`` are RFC 3339 with whole seconds (truncated by the API server), so a phase can
  read up to 1 s early, and two phases within a second of each other may swap;
- launcher log lines carry the runtime's nanosecond timestamps (``kubectl logs --timestamps``),
  on the same clock as the apply (this machine's).

A phase a job does not have (the MPI Operator prints no pre-flight line) is left empty.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# (phase, what it means); the order of a job's start. Rows are printed in this order.
PHASES: tuple[tuple[str, str], ...] = (
    ("workers created", "the last worker pod's creationTimestamp"),
    ("workers scheduled", "the last worker's PodScheduled condition"),
    ("workers started", "the last worker container's startedAt"),
    ("workers Ready", "the last worker's Ready condition (sshd answers)"),
    ("hostfile written", "the hostfile ConfigMap's creationTimestamp"),
    ("launcher created", "the launcher pod's creationTimestamp"),
    ("launcher scheduled", "the launcher's PodScheduled condition"),
    ("launcher started", "the launcher container's startedAt"),
    ("launcher's first line", "its first log line (imports done)"),
    ("pre-flight done", "launcher line 'pre-flight ok'"),
    ("Monarch workers up", "launcher line 'mesh ... attached'"),
    ("ranks spawned", "launcher line '... ranks ready'"),
    ("first step", "launcher line 'step 1/'"),
)
# Launcher log lines that end a phase: (phase, text the line contains).
LOG_MARKS: tuple[tuple[str, str], ...] = (
    ("pre-flight done", "pre-flight ok"),
    ("Monarch workers up", " attached"),
    ("ranks spawned", " ranks ready"),
    ("first step", "step 1/"),
)


def api_time(stamp: str | None) -> float | None:
    """Unix seconds of an RFC 3339 timestamp as the API server writes it (``...Z``); None for
    None or an empty string."""
    if not stamp:
        return None
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _condition(pod: Mapping[str, Any], kind: str) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return api_time(condition.get("lastTransitionTime"))
    return None


def _started(pod: Mapping[str, Any]) -> float | None:
    """When the pod's last container started (None while one has not)."""
    times = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        running = state.get("running") or state.get("terminated") or {}
        times.append(api_time(running.get("startedAt")))
    if not times or None in times:
        return None
    return max(t for t in times if t is not None)


def _last(values: Iterable[float | None]) -> float | None:
    """The latest of ``values``; None when there is none or one is missing (not yet)."""
    collected = list(values)
    if not collected or None in collected:
        return None
    return max(v for v in collected if v is not None)


def pod_phases(workers: list[Mapping[str, Any]],
               launcher: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The phases the pods say: ``workers ...`` over all ``workers`` (the last one counts: the
    job waits for it) and ``launcher ...`` of ``launcher``; Unix seconds or None."""
    phases: dict[str, float | None] = {
        "workers created": _last(api_time(p["metadata"].get("creationTimestamp"))
                                 for p in workers),
        "workers scheduled": _last(_condition(p, "PodScheduled") for p in workers),
        "workers started": _last(_started(p) for p in workers),
        "workers Ready": _last(_condition(p, "Ready") for p in workers),
    }
    if launcher is not None:
        phases["launcher created"] = api_time(launcher["metadata"].get("creationTimestamp"))
        phases["launcher scheduled"] = _condition(launcher, "PodScheduled")
        phases["launcher started"] = _started(launcher)
    return phases


def log_phases(log: str) -> dict[str, float]:
    """The phases the launcher's ``kubectl logs --timestamps`` output says: its first line and
    the first line of each of :data:`LOG_MARKS`; Unix seconds (nanoseconds kept)."""
    found: dict[str, float] = {}
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            when = _log_time(stamp)
        except ValueError:
            continue
        found.setdefault("launcher's first line", when)
        for phase, mark in LOG_MARKS:
            if mark in text:
                found.setdefault(phase, when)
    return found


def _log_time(stamp: str) -> float:
    """Unix seconds of the runtime's RFC 3339 stamp with up to nanoseconds (``fromisoformat``
    takes at most microseconds)."""
    head, _, rest = stamp.rstrip("Z").partition(".")
    fraction = "0." + "".join(ch for ch in rest if ch.isdigit()) if rest else "0"
    whole = dt.datetime.fromisoformat(head).replace(tzinfo=dt.timezone.utc).timestamp()
    return whole + float(fraction)


def job_timeline(get: Callable[..., dict[str, Any]], logs: Callable[[str, str], str],
                 ours: bool, namespace: str, name: str) -> dict[str, float | None]:
    """Every phase of :data:`PHASES` of one job, in Unix seconds (None: not seen).

    ``get(kind, *args)`` returns ``kubectl get -o json`` of ``kind`` (with ``-n``, ``-l``, a
    name as args); ``logs(namespace, pod)`` the pod's ``kubectl logs --timestamps``. ``ours``:
    a MonarchJob (labels ``monarch-operator.dev/*``, hostfile ``<name>-hostfile``), else an
    MPIJob (``training.kubeflow.org/*``, hostfile ``<name>-config``). Call it before the job
    is deleted; a launcher replaced by a later attempt counts by its newest pod.
    """
    if ours:
        job_label, role_label = "monarch-operator.dev/job", "monarch-operator.dev/role"
        hostfile = f"{name}-hostfile"
    else:
        job_label, role_label = "training.kubeflow.org/job-name", "training.kubeflow.org/job-role"
        hostfile = f"{name}-config"
    pods = get("pods", "-n", namespace, "-l", f"{job_label}={name}")["items"]
    workers = [p for p in pods if p["metadata"]["labels"].get(role_label) == "worker"]
    launchers = sorted((p for p in pods if p["metadata"]["labels"].get(role_label) == "launcher"),
                       key=lambda p: p["metadata"]["creationTimestamp"])
    launcher = launchers[-1] if launchers else None
    phases = pod_phases(workers, launcher)
    configmaps = get("configmaps", "-n", namespace)["items"]
    phases["hostfile written"] = next(
        (api_time(c["metadata"]["creationTimestamp"]) for c in configmaps
         if c["metadata"]["name"] == hostfile), None)
    if launcher is not None:
        phases.update(log_phases(logs(namespace, launcher["metadata"]["name"])))
    return {phase: phases.get(phase) for phase, _ in PHASES}


class Seen:
    """What a poll loop saw of a namespace's pods and ConfigMaps, kept after they are gone.

    Jobs delete their pods when they end (ours and the MPI Operator's), and a terminating pod's
    Ready condition turns False; so the timeline is read from the last body of each object seen
    before its deletion began. :meth:`poll` takes one listing of each kind; :meth:`get` answers
    as :func:`job_timeline` asks (``kind``, ``-n``, namespace, optionally ``-l key=value``)."""

    def __init__(self, list_kind: Callable[..., dict[str, Any]]) -> None:
        self._list = list_kind
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    def poll(self, namespace: str) -> None:
        """List pods and ConfigMaps of ``namespace`` once and keep each live body."""
        for kind in ("pods", "configmaps"):
            for item in self._list(kind, "-n", namespace)["items"]:
                key = (kind, namespace, item["metadata"]["name"])
                if not item["metadata"].get("deletionTimestamp") or key not in self._objects:
                    self._objects[key] = item

    def get(self, kind: str, *args: str) -> dict[str, Any]:
        """Every kept ``kind`` body of the namespace after ``-n``, filtered by ``-l k=v``."""
        namespace = args[args.index("-n") + 1]
        key, _, value = (args[args.index("-l") + 1] if "-l" in args else "").partition("=")
        items = [body for (k, ns, _), body in self._objects.items() if k == kind and ns == namespace
                 and (not key or (body["metadata"].get("labels") or {}).get(key) == value)]
        return {"items": items}


def relative(timeline: Mapping[str, float | None], applied: float) -> dict[str, float | None]:
    """``timeline`` as seconds after ``applied`` (Unix seconds of the ``kubectl apply``)."""
    return {phase: (None if when is None else round(when - applied, 2))
            for phase, when in timeline.items()}


def table(batches: Mapping[str, list[Mapping[str, float | None]]]) -> str:
    """The phases side by side: one column per operator (its p50 over the batch's jobs, in
    seconds after the apply; ``-`` where no job had the phase), one row per phase."""
    names = list(batches)
    width = max(12, *(len(n) for n in names))
    lines = [f"{'phase (s after apply, p50)':<28}" + "".join(f"{n:>{width + 2}}" for n in names)]
    for phase, _ in PHASES:
        cells = []
        for who in names:
            values = [t[phase] for t in batches[who] if t.get(phase) is not None]
            cells.append(f"{statistics.median(values):.1f}" if values else "-")
        lines.append(f"{phase:<28}" + "".join(f"{c:>{width + 2}}" for c in cells))
    return "\n".join(lines)
