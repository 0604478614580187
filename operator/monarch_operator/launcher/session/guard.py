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
  own), waits up to ``grace`` seconds and sends SIGKILL to whichever is left. Each process
  found at the hangup is pinned (a pidfd where Python and the kernel have them, its start time
  otherwise), and its group is signalled only while one of its members is still there: the
  SIGKILL never reaches a process that took the pid of one that ended meanwhile. (Until
  2026-12-05 it was sent by pid: in CI, where the loopback hosts start ~160 processes a second
  and ``pid_max`` 32768 wraps every few minutes, a session closing at the end of one run killed
  a worker of the next run that had taken a pid of its ended rank: "the worker on 127.0.0.7
  exited (ssh exit status 137)");
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
def stat_of(pid):
    with open("/proc/%d/stat" % pid) as stat:
        return stat.read().rsplit(")", 1)[1].split()
def scan():
    starts, children, group = {}, {}, []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = stat_of(int(entry))
                starts[int(entry)] = fields[19]
                children.setdefault(int(fields[1]), []).append(int(entry))
                if int(fields[2]) == worker:
                    group.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return starts, children, group
def pin(pid, start):
    handle = None
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pass
    entry = (pid, start, handle)
    if not alive(entry):
        if handle is not None:
            os.close(handle)
        return None
    return entry
def pinned_tree():
    starts, children, group = scan()
    found, todo = {}, [worker] + group
    while todo:
        pid = todo.pop()
        if pid not in found and pid in starts:
            found[pid] = pin(pid, starts[pid])
            todo.extend(children.get(pid, ()))
    return [entry for entry in found.values() if entry is not None]
def alive(entry, in_group=False):
    try:
        fields = stat_of(entry[0])
        return (fields[19] == entry[1] and fields[0] not in ("Z", "X")
                and (not in_group or int(fields[2]) == worker))
    except (OSError, ValueError, IndexError):
        return False
def send(entries, number):
    for entry in entries:
        try:
            if entry[2] is not None:
                signal.pidfd_send_signal(entry[2], number)
            elif alive(entry):
                os.kill(entry[0], number)
        except OSError:
            pass
def signal_group(entries, number):
    if any(alive(entry, in_group=True) for entry in entries):
        try:
            os.killpg(worker, number)
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
    entries = pinned_tree()
    signal_group(entries, signal.SIGTERM)
    send(entries, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(entry) for entry in entries):
        time.sleep(0.05)
    left = [entry for entry in entries if alive(entry)]
    signal_group(left, signal.SIGKILL)
    send(left, signal.SIGKILL)
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
