"""A worker lost mid-run or before its mesh attached: noticed at once, said in words.

- :class:`_WorkerWatch` polls the ssh clients of a started job; when one exits, it raises
  :class:`WorkerLost` in the main thread, with why each session ended in words
  (:func:`launcher.session.causes.session_end`: a host that stopped answering is said to);
- :class:`WorkerStartFailed`: workers that ended before their mesh attached.

Kept apart from :mod:`launcher.session.lifecycle`, which raises and re-exports them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from monarch_operator.launcher.session.causes import session_end
from monarch_operator.launcher.session.ssh import SshSettings

if TYPE_CHECKING:
    from monarch_operator.launcher.session.sshjob import LauncherSSHJob

# How often the ssh clients are checked for a worker that ended mid-run, seconds.
WATCH_INTERVAL_S = 0.5


class WorkerLost(BaseException):
    """A host's Monarch worker ended mid-run (its ssh session closed); raised in the main thread.

    A BaseException for the same reason as :class:`Terminated`.

    Attributes:
        hosts: ``{host name: ssh exit status}`` of the lost workers.
        reasons: ``{host name: what was seen, in words}`` (:func:`launcher.session.causes.
            session_end`): a host that stopped answering is said to, with how long, never to
            have exited with a code it never had.
    """

    def __init__(self, hosts: Mapping[str, int], reasons: Mapping[str, str] | None = None) -> None:
        self.hosts = dict(hosts)
        self.reasons = {
            host: (reasons or {}).get(host) or f"its ssh session ended with status {code}"
            for host, code in self.hosts.items()
        }
        listing = "; ".join(self.reasons.values())
        super().__init__(f"Monarch worker lost mid-run: {listing}")


class WorkerStartFailed(RuntimeError):
    """Monarch workers ended before their mesh attached (port taken, import error, crash).

    Attributes:
        mesh: the mesh that was attaching.
        exits: ``{host name: (ssh exit status, the worker's last output lines)}``.
    """

    def __init__(self, mesh: str, exits: Mapping[str, tuple[int, Sequence[str]]]) -> None:
        self.mesh = mesh
        self.exits = {host: (code, list(tail)) for host, (code, tail) in exits.items()}
        reasons = []
        for host, (code, tail) in self.exits.items():
            said = [line.strip() for line in tail if line.strip()]
            last_words = f": {said[-1]}" if said else " (no output)"
            reasons.append(f"the worker on {host} exited (ssh exit status {code}){last_words}")
        super().__init__(f"mesh {mesh} did not attach: {'; '.join(reasons)}")


class _WorkerWatch:
    """Polls the ssh clients of a started job; when one exits, raises WorkerLost in the main thread.

    The ssh client ends when its remote worker ends (the session guard exits with it), or when
    the host goes silent past the keepalives, so a worker killed by the OOM killer, a node
    reboot or a cable pull is seen within ``WATCH_INTERVAL_S`` (plus the keepalive limit)
    instead of at the next call's timeout. Only works when the session runs in the main thread
    (signals); elsewhere it stays off and Monarch's own supervision reports the loss.
    """

    def __init__(
        self, job: LauncherSSHJob, names: Mapping[str, str], ssh: SshSettings | None = None
    ) -> None:
        self._job = job
        self.names = names  # address -> host name
        self._ssh = ssh
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: Any = None
        self.lost: dict[str, int] = {}
        self.reasons: dict[str, str] = {}

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGUSR1, self._raise)
        self._thread = threading.Thread(target=self._run, name="worker-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            signal.signal(signal.SIGUSR1, self._previous)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            exited = self._job.exited_ssh()
            if exited:
                self.reasons = self._why(exited)
                self.lost = {self.names.get(addr, addr): code for addr, code in exited.items()}
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
                return

    def _why(self, exited: Mapping[str, int]) -> dict[str, str]:
        """``{host: why its session ended}`` from ssh's status and its last words."""
        ssh = self._ssh or SshSettings(port=22, user="")
        reasons = {}
        for address, code in exited.items():
            host = self.names.get(address, address)
            reasons[host] = session_end(
                host, code, self._job.output_tail(address), ssh.alive_interval_s,
                ssh.alive_count_max,
            )
        return reasons

    def _raise(self, _signum: int, _frame: Any) -> None:
        if self.lost and not self._stop.is_set():
            raise WorkerLost(self.lost, self.reasons)
