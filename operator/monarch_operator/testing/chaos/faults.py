"""How the soak injects faults on the local cluster: the operator restarted (SIGTERM or SIGKILL),
the API server paused (SIGSTOP, then SIGCONT), a worker container killed in place, a node lost
(``LocalCluster.node_down``, crash mode) and back; pods and jobs are deleted and suspended
through the API (:mod:`.soak`)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

from monarch_operator import constants
from monarch_operator.localcluster import nodestate
from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import start_operator

# Global faults (not aimed at a job) and their relative weights.
OPERATOR_SIGTERM = "operator_sigterm"
OPERATOR_SIGKILL = "operator_sigkill"
APISERVER_PAUSED = "apiserver_paused"
NODE_LOST_ANY = "node_lost_any"
GLOBAL_FAULTS = {OPERATOR_SIGTERM: 2, OPERATOR_SIGKILL: 2, APISERVER_PAUSED: 2, NODE_LOST_ANY: 1}
# Leader faults (replicated operator, :mod:`.leaders`), global too, and their weights.
LEADER_SIGKILL = "leader_sigkill"
LEADER_SIGTERM = "leader_sigterm"
LEADER_PARTITION = "leader_partition"
STANDBY_SIGKILL = "standby_sigkill"
ROLLING_UPDATE = "rolling_update"
LEADER_FAULTS = {LEADER_SIGKILL: 2, LEADER_SIGTERM: 2, LEADER_PARTITION: 2, STANDBY_SIGKILL: 1,
                 ROLLING_UPDATE: 1}


def pick_global(rng: random.Random, weights: dict[str, int], first: tuple[str, ...],
                injected: int) -> str:
    """The next global fault: ``first[injected]`` while the soak has injected fewer than
    ``len(first)`` (a short soak that must see each of them), then one drawn by ``weights``.

    Raises:
        ValueError: ``weights`` is empty, or a name in ``first`` is not in it.
    """
    if not weights:
        raise ValueError("global faults: none to pick from")
    unknown = [name for name in first if name not in weights]
    if unknown:
        raise ValueError(f"global faults: first {unknown} not among {sorted(weights)}")
    if injected < len(first):
        return first[injected]
    return rng.choices(list(weights), weights=list(weights.values()))[0]


class OperatorControl:
    """The operator under test as a process the soak stops and starts again.

    Args:
        cluster: the running local cluster.
        namespaces: the operator's ``--namespace`` patterns (none: every namespace).
    """

    def __init__(self, cluster: LocalCluster, namespaces: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.namespaces = namespaces
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path = cluster.state_dir / "logs" / "operator.log"

    def start(self) -> None:
        """Start it (its output appended to ``logs/operator.log`` of the cluster)."""
        self.process = start_operator(self.cluster.state_dir, self.cluster.env(),
                                      namespaces=self.namespaces, stop_with_owner=True)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        """Send ``signum``, wait up to ``timeout`` seconds (then SIGKILL); returns its exit
        status, None when it was not running."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tick(self, judge: object) -> None:
        """One soak step (nothing to do for a single operator)."""

    def finish(self, judge: object) -> None:
        """The soak's end (nothing to judge for a single operator)."""


def pause_apiserver(cluster: LocalCluster, seconds: float) -> None:
    """Freeze the API server for ``seconds`` (SIGSTOP; SIGCONT even when interrupted).

    Raises:
        RuntimeError: the cluster records no running API server.
    """
    pid = cluster.pid("kube-apiserver")
    if pid is None:
        raise RuntimeError("no kube-apiserver recorded for this cluster")
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


# Kills the worker container's main process (its sshd) from inside, as a crash would; the
# pid file is in the entrypoint's sshd state directory, in the pod's runtime emptyDir.
KILL_SSHD = f'kill -9 "$(cat {constants.SSHD_STATE_DIR}/sshd.pid)"'


def kill_worker_container(env: dict[str, str], namespace: str, pod: str) -> str:
    """Kill the worker container of ``pod`` in place (its pod stays); returns "" or kubectl's
    error."""
    done = subprocess.run(["kubectl", "exec", pod, "-n", namespace, "--", "sh", "-c", KILL_SSHD],
                          capture_output=True, text=True, env={**os.environ, **env},
                          timeout=30, check=False)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def lose_node(cluster: LocalCluster, node: str) -> None:
    """The node crashes: its kubelet goes silent and its pods' processes are killed."""
    cluster.node_down(node, nodestate.CRASH)


def restore_node(cluster: LocalCluster, node: str) -> None:
    """The node comes back (its containers that were running count as ended, 137)."""
    cluster.node_up(node)
