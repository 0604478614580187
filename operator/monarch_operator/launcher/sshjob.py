"""Monarch's SSHJob with the launcher's environment and output routing.

Imports Monarch at module level: import this module only once the plan and the pre-flight have
passed (the launcher keeps ``--help`` and bad-input errors fast).

Upstream ``SSHJob._start_host`` (torchmonarch 0.7.0, ``monarch/_src/job/job.py``) runs
``ssh <args> <host> -n '<python> -c <worker loop>'`` with the launcher's stdout. This subclass
changes two things and keeps the rest (the worker address, ``-n``, a new session per ssh):

- the remote command is prefixed with ``env K=V ...`` (see :mod:`.environment`), because sshd
  starts sessions with a clean environment, and the worker loads the pod's own environment
  when the host is a MonarchJob worker pod (``MONARCH_POD_ENV_FILE``, field case C16);
- the ssh client's stdout can go to another stream (``--json`` keeps stdout for JSON lines);
- the ssh client dies with the launcher (``PR_SET_PDEATHSIG``), so a launcher killed with
  SIGKILL leaves no ssh client, and so (``-tt``) no remote worker, behind.
"""

from __future__ import annotations

import ctypes
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from monarch_operator import constants
from monarch_operator.launcher.monarch_compat import ProcessState, SSHJob, service_proc_addr

from monarch_operator.launcher.environment import env_prefix

# prctl(2) option: deliver a signal to the child when the thread that forked it exits.
_PR_SET_PDEATHSIG = 1


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


class LauncherSSHJob(SSHJob):
    """An SSHJob whose workers get ``environment`` and whose ssh output goes to ``stdout``."""

    def __init__(
        self,
        python_exe: str,
        ssh_args: Sequence[str],
        monarch_port: int,
        environment: Mapping[str, str],
        stdout: IO[Any] | None = None,
        private_env_file: Callable[[str], str] | None = None,
    ) -> None:
        """Build the job; nothing starts until ``state()``.

        Args:
            python_exe: worker interpreter path, the same on every host.
            ssh_args: ssh options before the host (see :func:`.ssh.ssh_args`).
            monarch_port: the port every worker listens on.
            environment: variables set in every worker (and so in every proc it spawns).
            stdout: where the ssh clients (and so the workers) write; None = inherit.
            private_env_file: ``address -> remote file`` holding the worker's private variables
                (written by the pre-flight); the worker loads it, deletes it, and refuses to
                start without it. None: no private variables.
        """
        super().__init__(python_exe=python_exe, ssh_args=list(ssh_args), monarch_port=monarch_port)
        self._worker_env = dict(environment)
        self._ssh_stdout = stdout
        self._private_env_file = private_env_file
        self.ssh_processes: dict[str, subprocess.Popen[bytes]] = {}

    def _start_host(self, host: str) -> ProcessState:
        address = service_proc_addr(
            f"{self._scheme}://{host}:{self._port}", self._service_proc_ids_by_host[host]
        )
        loop = (
            "from monarch.actor import run_worker_loop_forever\n"
            f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')"
        )
        loop = _LOAD_POD_ENV.format(variable=constants.ENV_POD_ENV_FILE) + loop
        if self._private_env_file is not None:
            loop = _LOAD_PRIVATE_ENV.format(path=self._private_env_file(host)) + loop
        command = (
            f"{env_prefix(self._worker_env)}{shlex.quote(self._python_exe)} -c {shlex.quote(loop)}"
        )
        process = subprocess.Popen(
            ["ssh", *self._ssh_args, host, "-n", command],
            # Own session: a Ctrl-C meant for the launcher must not cut the ssh sessions before
            # the launcher has shut the meshes down.
            start_new_session=True,
            # But never outlive the launcher: if it is killed (SIGKILL, OOM), the kernel kills
            # ssh, and with ``-tt`` sshd then hangs up the remote worker.
            preexec_fn=_die_with_parent,
            stdout=self._ssh_stdout,
        )
        self.ssh_processes[host] = process
        return ProcessState(process.pid, address)

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

    def _kill(self) -> None:
        super()._kill()
        for process in self.ssh_processes.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
