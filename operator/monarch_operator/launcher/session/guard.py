"""The remote session guard: ends a host's Monarch worker when its ssh session closes (no tty).

Each worker runs over ``ssh`` without ``-tt`` (field case C30: a remote pseudo-terminal turns
every ``\\n`` of the ranks' output into ``\\r\\n``, ``stty onlcr``). What the terminal did, a
hangup for the worker when the launcher's ssh client goes away, the guard does instead:

- it runs on the host as the ssh session's command, with the worker Python, and starts the
  worker as its child in a process group of its own, stdin ``/dev/null``, stdout and stderr the
  session's own pipes (the worker's output is not copied: it reaches ssh byte for byte);
- it reads its stdin, the ssh channel, which the launcher never writes to. The read ends
  (end of file or error) when the channel closes: the launcher ended the session, the launcher
  died (its ssh clients die with it, ``PR_SET_PDEATHSIG``), or sshd dropped the client after its
  keepalives went unanswered (``ClientAliveInterval``; see :mod:`launcher.session.ssh`);
- it then sends SIGTERM to the worker, its process group and every descendant it has at that
  moment (Monarch's procs and the processes they started, the ranks, each in a group of its
  own), waits up to ``grace`` seconds and sends SIGKILL to whichever is left;
- when the worker ends first, the guard exits with the worker's status (``128 + N`` when it was
  killed by signal N), so ssh reports it.

Before it starts the worker it writes :data:`SESSION_UP` to stderr: the launcher reads it as
"logged in and running", which frees the slot the session held in the ssh fan-out (see
:mod:`launcher.session.fanout`) and drops the line from what it shows.

Processes that left the worker's tree before the hangup (daemonized by a rank) are not found
here; the straggler scan of the pre-flight deals with those.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

# The guard's first line on stderr; the launcher strips it from what it forwards.
SESSION_UP = b"monarch-session-guard: up\n"
# Seconds between the SIGTERM of the hangup and the SIGKILL for whatever is left.
HANGUP_GRACE_S = 5.0

# argv: grace seconds, then the worker's argv. Standard library only, any Python 3.8+.
GUARD_CODE = r"""
import os, signal, sys, threading, time
grace, argv = float(sys.argv[1]), sys.argv[2:]
os.write(2, __SESSION_UP__)
worker = os.fork()
if worker == 0:
    try:
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.execvp(argv[0], argv)
    except BaseException as error:
        os.write(2, ("monarch-session-guard: cannot start %s: %s\n" % (argv[0], error)).encode())
    os._exit(127)
ended = threading.Event()
hung_up = threading.Event()
def children():
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                found.setdefault(int(fields[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found
def tree(root):
    by_parent, found, todo = children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(by_parent.get(pid, ()))
    return found
def alive(pid):
    if pid == worker:
        return not ended.is_set()
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
def send(pids, number):
    for pid in pids:
        try:
            os.kill(pid, number)
        except OSError:
            pass
def hang_up():
    while True:
        try:
            if not os.read(0, 65536):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    hung_up.set()
    pids = tree(worker)
    try:
        os.killpg(worker, signal.SIGTERM)
    except OSError:
        pass
    send(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    try:
        os.killpg(worker, signal.SIGKILL)
    except OSError:
        pass
    send([pid for pid in pids if alive(pid)], signal.SIGKILL)
    os._exit(129)
watcher = threading.Thread(target=hang_up, daemon=True)
watcher.start()
while True:
    try:
        status = os.waitpid(worker, 0)[1]
        break
    except InterruptedError:
        continue
ended.set()
if hung_up.is_set():
    watcher.join()
code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
os._exit(code)
""".replace("__SESSION_UP__", repr(SESSION_UP))


def guarded_command(
    python_exe: str, worker_argv: Sequence[str], grace_s: float = HANGUP_GRACE_S
) -> str:
    """Return the remote shell command that runs ``worker_argv`` under the session guard.

    Args:
        python_exe: the Python that runs the guard on the host (the worker's own).
        worker_argv: the worker's argv; ``worker_argv[0]`` is looked up on the host's PATH
            unless it holds a ``/``.
        grace_s: seconds between SIGTERM and SIGKILL at hangup.

    Returns:
        ``<python> -c <guard> <grace> <worker argv...>``, each word quoted for the remote shell;
        prefix it with the environment (``env K=V ...``) as for any remote command.
    """
    words = [python_exe, "-c", GUARD_CODE, f"{grace_s:g}", *worker_argv]
    return shlex.join(words)
