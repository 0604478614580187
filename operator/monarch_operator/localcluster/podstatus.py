"""The kubelet's bookkeeping for one pod, without the processes: container states, restarts
with crash-loop back-off, what to start next, and the pod status it reports.

Pure (times are passed in as seconds since the epoch), so that the rules are tested without a
cluster. The node agent (``agent.py``) runs the processes and feeds their events in here:
``PodRecord.due()`` says which container to start now, ``ContainerRecord.started()`` and
``ContainerRecord.exited()`` record what happened, ``PodRecord.api_status()`` is the status
document that the agent hands to kwok (pod annotation -> kwok Stage -> ``status``).

The rules follow the kubelet (pkg/kubelet/kubelet_pods.go ``getPhase``,
kuberuntime_manager.go ``computePodActions``/``doBackOff``):
- init containers run one at a time, in order, each to completion; one that fails is restarted
  unless ``restartPolicy`` is ``Never``, in which case the pod fails;
- the containers start once every init container succeeded; one that ends is restarted under
  ``Always``, under ``OnFailure`` only after a non-zero exit, never under ``Never``;
- restarts back off: the first at once, then 10 s, 20 s, 40 s ... capped at 5 minutes, with
  the ``CrashLoopBackOff`` waiting reason meanwhile; a back-off is forgotten after twice the cap
  without a restart (a container that ran 10 minutes restarts at once again).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

ALWAYS, ON_FAILURE, NEVER = "Always", "OnFailure", "Never"
# kubelet.go initialCrashLoopBackOff and MaxContainerBackOff (Kubernetes 1.36 defaults).
DEFAULT_BACKOFF_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 300.0
# How long a container that could not be configured (missing Secret key, ...) waits before the
# next try; the kubelet retries such containers on its own sync period.
CONFIG_RETRY_SECONDS = 5.0
START_ERROR_EXIT_CODE = 128  # what the kubelet reports for a container that could not start
REASON_AGENT_ERROR = "NodeAgentError"


def timestamp(seconds: float) -> str:
    """RFC 3339 time in UTC, to the second, as the API server stores it."""
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def go_duration(seconds: float) -> str:
    """A duration the way Go prints it in kubelet messages: ``10s``, ``1m20s``, ``500ms``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:g}s"
    return f"{int(minutes)}m{text}" if minutes else text


def restarts_after(policy: str, exit_code: int, init: bool) -> bool:
    """Whether the kubelet starts the container again after it ended with ``exit_code``.

    Init containers run to completion: one that succeeded never runs again, one that failed is
    retried unless the pod's ``restartPolicy`` is ``Never``.
    """
    if init:
        return exit_code != 0 and policy != NEVER
    return policy == ALWAYS or (policy == ON_FAILURE and exit_code != 0)


@dataclass
class Backoff:
    """The kubelet's crash-loop back-off for one container (client-go flowcontrol.Backoff).

    The first restart is immediate; each next one waits twice as long, from ``base`` up to
    ``cap``; an entry last used more than ``2 * cap`` before an exit is forgotten.
    """

    base: float = DEFAULT_BACKOFF_SECONDS
    cap: float = MAX_BACKOFF_SECONDS
    current: float = 0.0  # 0: no entry yet
    last_update: float = 0.0

    def _expired(self, finished_at: float) -> bool:
        return not self.current or finished_at - self.last_update > 2 * self.cap

    def delay(self, finished_at: float) -> float:
        """Seconds to wait after an exit at ``finished_at`` before the restart."""
        return 0.0 if self._expired(finished_at) else self.current

    def restarted(self, finished_at: float, now: float) -> None:
        """Record a restart (after the exit at ``finished_at``) made at ``now``."""
        self.current = self.base if self._expired(finished_at) else min(self.current * 2, self.cap)
        self.last_update = now


@dataclass
class ContainerRecord:
    """What the kubelet knows about one container: one entry of ``containerStatuses`` or
    ``initContainerStatuses`` plus when it should be (re)started (``due_at``)."""

    name: str
    image: str
    init: bool = False
    state: dict[str, Any] = field(default_factory=dict)  # {"waiting"|"running"|"terminated": ..}
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    # When to start it next (seconds since the epoch); None: running, or finished for good.
    due_at: float | None = 0.0
    finished_at: float = 0.0
    backoff: Backoff = field(default_factory=Backoff)
    runs: int = 0  # instances started so far

    def __post_init__(self) -> None:
        if not self.state:
            self.state = {"waiting": {"reason": "PodInitializing" if self.init
                                      else "ContainerCreating"}}

    def waiting_for_init(self) -> None:
        """Before its pod's init containers are done the container waits as PodInitializing."""
        if not self.runs:
            self.state = {"waiting": {"reason": "PodInitializing"}}

    @property
    def running(self) -> bool:
        """Whether an instance runs now."""
        return "running" in self.state

    @property
    def succeeded(self) -> bool:
        """Whether it ended with exit code 0 and will not run again."""
        terminated = self.state.get("terminated")
        return self.due_at is None and terminated is not None and terminated["exitCode"] == 0

    @property
    def failed_for_good(self) -> bool:
        """Whether it ended with a non-zero exit code and will not run again."""
        terminated = self.state.get("terminated")
        return self.due_at is None and terminated is not None and terminated["exitCode"] != 0

    def started(self, now: float) -> None:
        """A new instance runs from ``now``."""
        if self.runs:
            self.backoff.restarted(self.finished_at, now)
            self.restart_count += 1
            if "terminated" in self.state:
                self.last_state = self.state
        self.runs += 1
        self.state = {"running": {"startedAt": timestamp(now)}}
        self.due_at = None
        self.ready = False

    def exited(self, exit_code: int, reason: str, message: str, now: float, policy: str,
               pod_ref: str) -> None:
        """The running instance ended; schedule the restart that ``policy`` asks for.

        Args:
            reason: ``Completed``, ``Error`` or ``StartError`` (the sandbox failed).
            message: the termination message ("" for none).
            pod_ref: ``name_namespace(uid)`` for the back-off message, as the kubelet writes it.
        """
        started_at = self.state.get("running", {}).get("startedAt", timestamp(now))
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason,
                                      "startedAt": started_at, "finishedAt": timestamp(now)}
        if message:
            terminated["message"] = message
        self.ready = False
        self.finished_at = now
        self.state = {"terminated": terminated}
        if not restarts_after(policy, exit_code, self.init):
            self.due_at = None
            return
        delay = self.backoff.delay(now)
        self.due_at = now + delay
        if delay > 0:
            self.last_state = self.state
            self.state = {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {go_duration(delay)} restarting failed "
                           f"container={self.name} pod={pod_ref}"}}

    def config_failed(self, reason: str, message: str, now: float) -> None:
        """The container could not be set up (e.g. ``CreateContainerConfigError``); retried."""
        if "terminated" in self.state:
            self.last_state = self.state
        self.state = {"waiting": {"reason": reason, "message": message}}
        self.due_at = now + CONFIG_RETRY_SECONDS

    def api_status(self) -> dict[str, Any]:
        """This container's entry of ``containerStatuses``/``initContainerStatuses``."""
        return {"name": self.name, "image": self.image, "imageID": "",
                "ready": self.ready, "started": self.running,
                "restartCount": self.restart_count, "state": self.state,
                "lastState": self.last_state}


@dataclass
class PodRecord:
    """One pod's containers as the kubelet tracks them, and its conditions' transition times."""

    name: str
    namespace: str
    uid: str
    restart_policy: str
    init_containers: list[ContainerRecord]
    containers: list[ContainerRecord]
    # type -> condition, as last reported (kept for lastTransitionTime)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    agent_error: str = ""
    terminating: bool = False  # the pod is being deleted: nothing starts any more

    @classmethod
    def from_pod(cls, pod: dict[str, Any], backoff_base: float = DEFAULT_BACKOFF_SECONDS
                 ) -> PodRecord:
        """A fresh record for the pod's spec, keeping the conditions it already has."""
        meta, spec = pod["metadata"], pod["spec"]

        def record(container: dict[str, Any], init: bool) -> ContainerRecord:
            return ContainerRecord(name=container["name"], image=container.get("image", ""),
                                   init=init, backoff=Backoff(base=backoff_base))

        init_containers = [record(c, True) for c in spec.get("initContainers") or []]
        containers = [record(c, False) for c in spec["containers"]]
        if init_containers:
            for container in containers:
                container.waiting_for_init()
        return cls(
            name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""),
            restart_policy=spec.get("restartPolicy") or ALWAYS,
            init_containers=init_containers, containers=containers,
            conditions={c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []})

    @property
    def ref(self) -> str:
        """``name_namespace(uid)``, how kubelet messages name a pod."""
        return f"{self.name}_{self.namespace}({self.uid})"

    def container(self, name: str, init: bool) -> ContainerRecord:
        """The record of the (init) container called ``name``."""
        records = self.init_containers if init else self.containers
        return next(record for record in records if record.name == name)

    @property
    def initialized(self) -> bool:
        """Whether every init container succeeded."""
        return all(record.succeeded for record in self.init_containers)

    def init_failed(self) -> bool:
        """Whether an init container failed and will not be retried (``restartPolicy: Never``)."""
        return any(record.failed_for_good for record in self.init_containers)

    def terminate(self) -> None:
        """The pod is being deleted: no container starts or restarts from now on; once none
        runs the phase is terminal (kubelet ``getPhase`` with ``podIsTerminal``)."""
        self.terminating = True
        for record in self.init_containers + self.containers:
            record.due_at = None

    @property
    def restart_policy_now(self) -> str:
        """The restart policy for a container that ends now (``Never`` while terminating)."""
        return NEVER if self.terminating else self.restart_policy

    def phase(self) -> str:
        """``Pending``, ``Running``, ``Succeeded`` or ``Failed`` (kubelet ``getPhase``)."""
        if self.agent_error or self.init_failed():
            return "Failed"
        if self.terminating and not any(r.running for r in self.init_containers + self.containers):
            return "Succeeded" if all(r.succeeded for r in self.containers) else "Failed"
        if not self.initialized:
            return "Pending"
        if any(record.running for record in self.containers):
            return "Running"
        if any(record.due_at is not None for record in self.containers):
            ever_ran = any(record.runs for record in self.containers)
            return "Running" if ever_ran else "Pending"
        if all(record.succeeded for record in self.containers):
            return "Succeeded"
        return "Failed"

    @property
    def finished(self) -> bool:
        """Whether the pod reached ``Succeeded`` or ``Failed`` (nothing more will run)."""
        return self.phase() in ("Succeeded", "Failed")

    def due(self, now: float) -> list[ContainerRecord]:
        """The containers to start at ``now``: the next init container, else every container
        whose (re)start is due."""
        if self.finished:
            return []
        for record in self.init_containers:
            if record.succeeded:
                continue
            if record.due_at is not None and record.due_at <= now:
                return [record]
            return []  # running, or backing off
        return [record for record in self.containers
                if record.due_at is not None and record.due_at <= now]

    def next_due(self) -> float | None:
        """The earliest time a start is scheduled (for the agent's wake-up), or ``None``."""
        times = [record.due_at for record in self.init_containers + self.containers
                 if record.due_at is not None]
        return min(times) if times else None

    def api_status(self, now: float) -> dict[str, Any]:
        """The pod status the kubelet would report: phase, conditions, container statuses.

        Lists are complete, so the document is applied as a JSON merge patch (each list
        replaced as a whole); ``podIP``, ``hostIP`` and ``startTime`` are left to kwok.
        """
        phase = self.phase()
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": self._conditions(phase, now),
            "containerStatuses": [record.api_status() for record in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [r.api_status() for r in self.init_containers]
        if self.agent_error:
            status["reason"] = REASON_AGENT_ERROR
            status["message"] = self.agent_error
        return status

    def _conditions(self, phase: str, now: float) -> list[dict[str, Any]]:
        incomplete = [r.name for r in self.init_containers if not r.succeeded]
        unready = [r.name for r in self.containers if not r.ready]
        finished = phase in ("Succeeded", "Failed")
        not_ready = ("PodCompleted", "") if finished else (
            "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]")
        wanted = [
            ("Initialized", not incomplete,
             ("ContainersNotInitialized",
              f"containers with incomplete status: [{' '.join(incomplete)}]")),
            ("Ready", not unready and not finished, not_ready),
            ("ContainersReady", not unready and not finished, not_ready),
        ]
        result = [self.conditions.get("PodScheduled")
                  or {"type": "PodScheduled", "status": "True",
                      "lastTransitionTime": timestamp(now)}]
        for kind, is_true, (reason, message) in wanted:
            status = "True" if is_true else "False"
            previous = self.conditions.get(kind) or {}
            since = (previous.get("lastTransitionTime")
                     if previous.get("status") == status else None) or timestamp(now)
            condition = {"type": kind, "status": status, "lastTransitionTime": since}
            if not is_true and reason:
                condition["reason"] = reason
            if not is_true and message:
                condition["message"] = message
            result.append(condition)
        self.conditions = {c["type"]: c for c in result}
        return result
