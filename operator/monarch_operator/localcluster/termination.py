"""Graceful termination of a pod's containers as the kubelet does it, one step per agent pass
(the node agent's loop never waits for a slow container): the grace period, the ``preStop``
exec hook, SIGTERM to the container's main process, SIGKILL to all of its processes once the
grace period is over.

The rules follow Kubernetes 1.36 (pkg/kubelet/pod_workers.go ``calculateEffectiveGracePeriod``,
pkg/kubelet/kuberuntime/kuberuntime_container.go ``killContainer``, ``executePreStopHook``):
- the pod's grace period is ``metadata.deletionGracePeriodSeconds`` once the API server set it
  (``kubectl delete --grace-period=N``; 0 with ``--force --grace-period=0``), else
  ``spec.terminationGracePeriodSeconds`` (default 30), at least 1 s; while the pod terminates
  it only ever gets shorter;
- a container with a ``preStop`` exec hook runs it first, inside the container, for up to the
  grace period; what is left of the grace period, but at least 2 s (the runtime manager's
  ``minimumGracePeriodInSeconds``), separates SIGTERM from SIGKILL. As with a container
  runtime's stop, SIGTERM goes to the main process only; its other processes end with it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monarch_operator.localcluster import sandbox

DEFAULT_GRACE_SECONDS = 30.0  # spec.terminationGracePeriodSeconds' default
MIN_GRACE_SECONDS = 1.0  # pod_workers: "we always supply a grace period of 1"
MIN_STOP_SECONDS = 2.0  # kuberuntime minimumGracePeriodInSeconds: SIGTERM -> SIGKILL at least

log = logging.getLogger("localcluster.agent")


def grace_period(pod: dict[str, Any], current: float | None = None,
                 vanished: bool = False) -> float:
    """The pod's termination grace period in seconds.

    Args:
        pod: the pod as last seen (``metadata.deletionGracePeriodSeconds``,
            ``spec.terminationGracePeriodSeconds``).
        current: the grace period the pod's termination already runs with, if it started;
            the result is never longer.
        vanished: the pod object is gone from the API without this node confirming its end
            (a force deletion sets ``deletionGracePeriodSeconds: 0`` first).
    """
    deletion = 0 if vanished else (pod.get("metadata") or {}).get("deletionGracePeriodSeconds")
    if deletion is not None:
        grace = float(deletion)
    elif current is not None:
        grace = current
    else:
        spec_grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        grace = DEFAULT_GRACE_SECONDS if spec_grace is None else float(spec_grace)
    if current is not None:
        grace = min(grace, current)
    return max(grace, MIN_GRACE_SECONDS)


def prestop_command(container: dict[str, Any]) -> list[str] | None:
    """The container's ``lifecycle.preStop.exec.command``, or ``None`` (no hook, or a kind of
    hook that is not run here: ``httpGet``, ``tcpSocket``, ``sleep``)."""
    hook = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
    command = hook.get("command")
    return [str(part) for part in command] if command else None


@dataclass
class ContainerStop:
    """The termination of one running container: preStop hook, SIGTERM, SIGKILL.

    ``advance()`` does what is due at ``now`` and returns at once; the agent calls it on every
    pass until the container's main process has exited (which the agent collects as usual).
    """

    name: str
    process: sandbox.ContainerProcess
    grace: float  # the pod's grace period when this container's stop began
    started: float  # when it began (seconds since the epoch)
    hook: subprocess.Popen[bytes] | None = None
    term_sent: bool = False
    kill_at: float = 0.0
    killed: bool = False
    events: list[str] = field(default_factory=list)  # what happened, for the agent's log

    def begin(self, hook_command: list[str] | None, env: dict[str, str],
              log_path: Path) -> None:
        """Start the preStop hook (if any, and the main process still runs), else SIGTERM."""
        if hook_command and self.process.poll() is None:
            try:
                self.hook = _start_in_container(self.process.pid, hook_command, env,
                                                log_path)
                self.events.append(f"preStop hook started: {' '.join(hook_command)}")
                return
            except OSError as error:  # the kubelet records a failed hook and goes on
                self.events.append(f"preStop hook failed to start: {error}")
        self._terminate(self.started)

    def shorten(self, grace: float) -> None:
        """The pod's grace period got shorter (a second deletion with a smaller one)."""
        if grace < self.grace:
            self.grace = grace
            if self.term_sent:
                self.kill_at = min(self.kill_at, self.started + max(grace, MIN_STOP_SECONDS))

    def advance(self, now: float) -> None:
        """Move on: end of the hook (done, or out of grace time) -> SIGTERM; the SIGTERM's
        deadline passed -> SIGKILL every process of the container."""
        if self.hook is not None and not self.term_sent:
            code = self.hook.poll()
            if code is None and now < self.started + self.grace:
                return
            self.events.append("preStop hook " + (f"exited with {code}" if code is not None
                                                  else "still running at the grace period's end"))
            self._terminate(now)
        if self.hook is not None:
            self.hook.poll()  # reap it once it ends (it dies with the container at the latest)
        if self.term_sent and not self.killed and now >= self.kill_at \
                and self.process.poll() is None:
            self.process.signal_all(signal.SIGKILL)
            self.killed = True
            self.events.append(f"grace period over: SIGKILL (after {now - self.started:.1f}s)")

    def finish(self) -> None:
        """The container ended: reap the hook process (it ended with the container's
        namespace)."""
        if self.hook is not None and self.hook.poll() is None:
            self.hook.kill()
            self.hook.wait()

    def _terminate(self, now: float) -> None:
        left = self.started + self.grace - now
        self.kill_at = now + max(left, MIN_STOP_SECONDS)
        self.term_sent = True
        try:
            self.process.process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.events.append(f"SIGTERM to the main process (pid {self.process.pid}); SIGKILL in "
                           f"{self.kill_at - now:.1f}s")


def _start_in_container(pid: int, command: list[str], env: dict[str, str],
                        log_path: Path) -> subprocess.Popen[bytes]:
    """Run ``command`` inside the mount and UTS namespaces of process ``pid`` (the container's
    main process), in its working directory, as an exec into the container does; its output
    goes to ``log_path`` (a kubelet keeps a hook's output out of the container's log)."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            ["nsenter", f"--target={pid}", "--mount", "--uts", "--wd", "--", *command],
            env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True)
