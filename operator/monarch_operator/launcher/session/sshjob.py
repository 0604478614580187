"""Monarch's SSHJob with the launcher's environment and output routing.

Imports Monarch at module level: import this module only once the plan and the pre-flight have
passed (the launcher keeps ``--help`` and bad-input errors fast).

Upstream ``SSHJob._start_host`` (torchmonarch 0.7.0, ``monarch/_src/job/job.py``) runs
``ssh <args> <host> -n '<python> -c <worker loop>'`` with the launcher's stdout. This subclass
changes the following and keeps the rest (the worker address, ``-n``, a new session per ssh):

- the remote command is prefixed with ``env K=V ...`` (see :mod:`launcher.session.environment`),
  because sshd
  starts sessions with a clean environment, and the worker loads the pod's own environment
  when the host is a MonarchJob worker pod (``MONARCH_POD_ENV_FILE``, field case C16);
- the ssh client's stdout goes through a pipe: a reader thread forwards every byte unchanged to
  the launcher's stdout or another stream (``--json`` keeps stdout for JSON lines) and keeps
  each worker's last lines, so a worker that dies is reported with its own last words;
- the worker bounds Monarch's log file before Monarch starts (see
  :mod:`launcher.session.environment`);
- the ssh client dies with the launcher (``PR_SET_PDEATHSIG``), so a launcher killed with
  SIGKILL leaves no ssh client, and so no remote worker, behind: the worker runs under the
  session guard (:mod:`launcher.session.guard`), which ends it when the ssh channel closes.
  There is no remote tty (``-tt``), so output arrives as the ranks wrote it (field case C30);
- the sessions are opened at most ``concurrency`` at a time and transient refusals
  (``MaxStartups``) are retried (:mod:`launcher.session.fanout`, field case C28); ssh's own
  stderr before the guard's "up" line is kept for the failure report instead of shown.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from monarch.actor import HostMesh, attach_to_workers

from monarch_operator import constants
from monarch_operator.launcher import progress
from monarch_operator.launcher.session.environment import (
    MONARCH_FILE_LOG_DEFAULT,
    MONARCH_LOG_ROTATE_BYTES,
    env_prefix,
)
from monarch_operator.launcher.session.fanout import (
    DEFAULT_CONCURRENCY,
    RetryPolicy,
    SessionFanout,
)
from monarch_operator.launcher.session.guard import SESSION_UP, guarded_command
from monarch_operator.launcher.session.monarch_compat import ProcessState, SSHJob, service_proc_addr

# prctl(2) option: deliver a signal to the child when the thread that forked it exits.
_PR_SET_PDEATHSIG = 1
# Lines of each worker's output kept for failure reports.
OUTPUT_TAIL_LINES = 20
_PROGRESS_MARKER = constants.PROGRESS_LINE_MARKER.encode()
# What a worker prints on stderr once its host agent is bound and can take messages: Monarch's
# ``HostAgent::init`` prints it right after ``this.bind()`` (hyperactor_mesh/src/host_agent.rs,
# torchmonarch 0.7.0, process hosts only). The worker's port opens before that, and a message
# that arrives in between can come back undeliverable; the attach config push is sent only once,
# so its mesh then times out (see :mod:`launcher.session.attaching`).
HOST_AGENT_UP = b"Monarch internal logs are being written to"


def _die_with_parent() -> None:
    # Between fork and exec in the ssh child. The "parent" is the forking thread, so the
    # session must be started from a thread that lives as long as the launch (the main thread).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# Prepended to the worker's code when it has private variables: load them, delete the file.
_LOAD_PRIVATE_ENV = """import json, os, sys
path = os.path.expanduser({path!r})
try:
    with open(path) as env_file:
        os.environ.update(json.load(env_file))
    os.unlink(path)
except OSError as error:
    sys.exit(f"monarch worker: cannot load its environment from {{path}}: {{error}}")
"""


# Prepended to every worker's code: the pod's own environment (field case C16). sshd starts each
# session with a clean environment, so what a MonarchJob's worker template or image sets would
# never reach the ranks; the worker image's entrypoint saves it as JSON and points sshd's
# SetEnv MONARCH_POD_ENV_FILE at it. Loaded last: the pod's values win over the launcher's
# copies (node-specific settings such as NCCL_SOCKET_IFNAME belong to the node).
_LOAD_POD_ENV = """import json, os, sys
pod_env_path = os.environ.get({variable!r})
if pod_env_path:
    try:
        with open(pod_env_path) as env_file:
            os.environ.update({{str(k): str(v) for k, v in json.load(env_file).items()}})
    except (OSError, ValueError, AttributeError) as error:
        print(f"monarch worker: cannot load the pod environment {{pod_env_path}}: {{error}}",
              file=sys.stderr)
"""


# Prepended to every worker's code, after its environment is loaded and before Monarch starts
# (Monarch reads its log settings when its extension loads): environment.bound_monarch_log, for
# the worker's host. A value the user or the pod sets wins.
_BOUND_MONARCH_LOG = """import os, pwd
os.environ.setdefault("MONARCH_FILE_LOG", {level!r})
try:
    log_suffix = os.environ.get("MONARCH_LOG_SUFFIX", "")
    log_path = "/tmp/%s/monarch_log%s.log" % (
        pwd.getpwuid(os.geteuid()).pw_name or "monarch", "_" + log_suffix if log_suffix else "")
    if os.path.getsize(log_path) > {limit}:
        os.replace(log_path, log_path + ".1")
except (OSError, KeyError):
    pass
"""


class _OutputTail:
    """Copies one ssh client's output unchanged to a file descriptor; keeps its last lines.

    With ``up_line`` (stderr): what comes before that line is ssh's own (or the remote shell's)
    and is held back in :attr:`before_up` instead of copied; the line itself is dropped and
    sets :attr:`up`. ``lines`` may be shared by the stdout and stderr tails of one session, and
    so may ``agent_up``, set once a forwarded line holds :data:`HOST_AGENT_UP`.
    """

    def __init__(
        self,
        source: IO[bytes],
        target_fd: int,
        lines: deque[str] | None = None,
        up_line: bytes | None = None,
        agent_up: threading.Event | None = None,
    ) -> None:
        self._lines: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES) if lines is None else lines
        self._partial = b""
        self._up_line = up_line
        self.up = threading.Event()
        self.agent_up = threading.Event() if agent_up is None else agent_up
        self.before_up = b""
        self._thread = threading.Thread(
            target=self._pump, args=(source, target_fd), name="ssh-output", daemon=True
        )
        self._thread.start()

    def _pump(self, source: IO[bytes], target_fd: int) -> None:
        with source:
            # read1: forward what arrived at once, partial lines (progress bars) included.
            while chunk := source.read1(65536):  # type: ignore[attr-defined]
                if self._up_line is not None and not self.up.is_set():
                    chunk = self._hold_until_up(chunk)
                    if not chunk:
                        continue
                _write_all(target_fd, chunk)
                *complete, self._partial = (self._partial + chunk).split(b"\n")
                self._lines.extend(_text(line) for line in complete)
                for line in complete:
                    if _PROGRESS_MARKER in line:  # a program's report (launcher/progress.py)
                        progress.feed_line(_text(line))
                    elif HOST_AGENT_UP in line:
                        self.agent_up.set()
        if self._partial:
            self._lines.append(_text(self._partial))
        if not self.up.is_set() and self.before_up:
            self._lines.extend(_text(line) for line in self.before_up.splitlines())

    def _hold_until_up(self, chunk: bytes) -> bytes:
        assert self._up_line is not None
        self.before_up += chunk
        before, found, after = self.before_up.partition(self._up_line)
        if not found:
            return b""
        self.before_up = before
        self.up.set()
        return after

    def last_lines(self, wait_s: float) -> list[str]:
        """The last lines written, once the output ended or after ``wait_s`` seconds."""
        self._thread.join(wait_s)
        return list(self._lines)


class _StartingSession:
    """One worker's ssh client while it logs in (a :class:`launcher.session.fanout.Session`)."""

    def __init__(self, process: subprocess.Popen[bytes], errors: _OutputTail) -> None:
        self.process = process
        self._errors = errors

    def is_up(self) -> bool:
        return self._errors.up.is_set()

    def exit_status(self) -> int | None:
        return self.process.poll()

    def error_text(self) -> str:
        if self.process.poll() is not None:
            self._errors.last_lines(wait_s=1.0)  # stderr fully read
        return self._errors.before_up.decode(errors="replace")


def _text(line: bytes) -> str:
    return line.decode(errors="replace").rstrip("\r")


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the launcher's output is gone (closed pipe): keep draining ssh all the same


class LauncherSSHJob(SSHJob):
    """An SSHJob whose workers get ``environment`` and whose ssh output goes to ``stdout``."""

    def __init__(
        self,
        python_exe: str,
        ssh_args: Callable[[str], Sequence[str]],
        monarch_port: int,
        environment: Mapping[str, str],
        stdout: IO[Any] | None = None,
        private_env_file: Callable[[str], str] | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        retry_policy: RetryPolicy | None = None,
        on_retry: Callable[[str, int, str], None] | None = None,
    ) -> None:
        """Build the job; nothing starts until ``state()``.

        Args:
            python_exe: worker interpreter path, the same on every host.
            ssh_args: ``address -> ssh options`` for the host at that address (see
                :func:`launcher.session.ssh.ssh_args`: its host key is checked under its name).
            monarch_port: the port every worker listens on.
            environment: variables set in every worker (and so in every proc it spawns).
            stdout: where the ssh clients' (and so the workers') output is copied to; None = the
                launcher's stdout (file descriptor 1). Their stderr goes to the launcher's.
            private_env_file: ``address -> remote file`` holding the worker's private variables
                (written by the pre-flight); the worker loads it, deletes it, and refuses to
                start without it. None: no private variables.
            concurrency: ssh sessions logging in at once (see :mod:`launcher.session.fanout`).
            retry_policy: retries of transient ssh refusals; None for the defaults.
            on_retry: called with ``(address, retry number, ssh's stderr)`` before a retry.
        """
        # Upstream keeps one option list for every host; ours differ per host (HostKeyAlias).
        super().__init__(python_exe=python_exe, ssh_args=(), monarch_port=monarch_port)
        self._ssh_args_for = ssh_args
        self._worker_env = dict(environment)
        self._ssh_stdout = stdout
        self._private_env_file = private_env_file
        self._concurrency = concurrency
        self._retry_policy = retry_policy
        self._on_retry = on_retry
        self.ssh_processes: dict[str, subprocess.Popen[bytes]] = {}
        self._output_tails: dict[str, list[_OutputTail]] = {}
        self._agents_up: dict[str, threading.Event] = {}
        progress.mark_launcher()  # the program's reports go to the job, never into the output
        progress.install()  # in a MonarchJob's launcher pod: forward them from the start

    def _create(self, client_script: str | None) -> None:
        # Upstream starts every host at once; this opens them through the fan-out. It runs in
        # the calling (main) thread, as _die_with_parent requires.
        if client_script is not None:
            raise RuntimeError("LauncherSSHJob cannot run batch-mode scripts")
        self._service_proc_ids_by_host = {}  # as upstream SSHJob._create (torchmonarch 0.7)
        for mesh_hosts in self._meshes.values():
            self._service_proc_ids_by_host.update(
                zip(mesh_hosts, self._allocate_service_proc_ids(len(mesh_hosts)), strict=True)
            )
        hosts = list(dict.fromkeys(host for hosts in self._meshes.values() for host in hosts))
        fanout = SessionFanout(
            self._start_session,
            concurrency=self._concurrency,
            policy=self._retry_policy,
            on_retry=self._on_retry,
        )
        for host, session in fanout.open_all(hosts).items():
            assert isinstance(session, _StartingSession)
            self._host_to_pid[host] = ProcessState(session.process.pid, self._worker_address(host))

    def _worker_address(self, host: str) -> str:
        return service_proc_addr(
            f"{self._scheme}://{host}:{self._port}", self._service_proc_ids_by_host[host]
        )

    def _start_host(self, host: str) -> ProcessState:
        session = self._start_session(host)
        return ProcessState(session.process.pid, self._worker_address(host))

    def _start_session(self, host: str) -> _StartingSession:
        address = self._worker_address(host)
        loop = (
            "from monarch.actor import run_worker_loop_forever\n"
            f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')"
        )
        loop = (
            _LOAD_POD_ENV.format(variable=constants.ENV_POD_ENV_FILE)
            + _BOUND_MONARCH_LOG.format(
                level=MONARCH_FILE_LOG_DEFAULT, limit=MONARCH_LOG_ROTATE_BYTES
            )
            + loop
        )
        if self._private_env_file is not None:
            loop = _LOAD_PRIVATE_ENV.format(path=self._private_env_file(host)) + loop
        command = env_prefix(self._worker_env) + guarded_command(
            self._python_exe, [self._python_exe, "-c", loop]
        )
        process = subprocess.Popen(
            # No -n: the guard reads the channel to learn when it closes. LogLevel=INFO (ssh
            # takes the first value given, so it wins over ssh_args' ERROR): ssh says "Timeout,
            # server ... not responding." only at INFO, and that line is how a host that stopped
            # answering is told from a cut connection (launcher.session.causes.session_end).
            ["ssh", "-o", "LogLevel=INFO", *self._ssh_args_for(host), host, command],
            # Own session: a Ctrl-C meant for the launcher must not cut the ssh sessions before
            # the launcher has shut the meshes down.
            start_new_session=True,
            # But never outlive the launcher: if it is killed (SIGKILL, OOM), the kernel kills
            # ssh, the channel closes, and the guard ends the remote worker.
            preexec_fn=_die_with_parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.ssh_processes[host] = process
        assert process.stdout is not None and process.stderr is not None
        target = self._ssh_stdout.fileno() if self._ssh_stdout is not None else 1
        lines: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
        agent_up = self._agents_up[host] = threading.Event()
        errors = _OutputTail(process.stderr, 2, lines, up_line=SESSION_UP, agent_up=agent_up)
        self._output_tails.setdefault(host, []).extend(
            [_OutputTail(process.stdout, target, lines, agent_up=agent_up), errors]
        )
        return _StartingSession(process, errors)

    def exited_ssh(self) -> dict[str, int]:
        """Return ``{host: ssh exit status}`` for ssh clients that have already exited.

        Upstream liveness (``os.kill(pid, 0)``) counts an unreaped ssh as alive; this polls the
        Popen objects, so a worker whose ssh died is seen at once.
        """
        return {
            host: code
            for host, process in self.ssh_processes.items()
            if (code := process.poll()) is not None
        }

    def workers_not_up(self, hosts: Sequence[str]) -> list[str]:
        """Those of ``hosts`` (addresses, as given to the job) whose worker has not yet said that
        its host agent is up (:data:`HOST_AGENT_UP`), in the order given; a host with no
        session started yet counts as not up."""
        up = self._agents_up
        return [host for host in hosts if not (host in up and up[host].is_set())]

    def worker_locations(self, mesh: str) -> dict[str, str]:
        """``{host: its worker's location}`` for the hosts of ``mesh`` (addresses, as given to the
        job), such as ``{"10.244.1.3": "tcp://10.244.1.3:22222"}``: where Monarch reaches them."""
        return {host: f"{self._scheme}://{host}:{self._port}" for host in self._meshes[mesh]}

    def attach_again(self, mesh: str) -> HostMesh:
        """Attach to the workers of ``mesh`` once more (their host meshes are already serving);
        returns the new HostMesh, to wait on as the first (``initialized``)."""
        workers = [self._host_to_pid[host].channel for host in self._meshes[mesh]]
        return attach_to_workers(name=mesh, ca="trust_all_connections", workers=workers)

    def output_tail(self, host: str, wait_s: float = 1.0) -> list[str]:
        """The last lines (at most :data:`OUTPUT_TAIL_LINES`) the worker on ``host`` printed.

        Args:
            host: the host as given to the job (its address).
            wait_s: how long to wait for the rest of the output of an ssh client that exited.
        """
        tails = self._output_tails.get(host, [])
        for tail in tails[:-1]:
            tail.last_lines(wait_s)
        return tails[-1].last_lines(wait_s) if tails else []

    def _kill(self) -> None:
        super()._kill()
        for process in self.ssh_processes.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
        for tails in self._output_tails.values():
            for tail in tails:
                tail.last_lines(wait_s=1.0)  # the workers' last words come before the launcher's

