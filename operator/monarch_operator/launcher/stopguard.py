"""A stop from outside decides the exit status even when the user's code takes the signal.

``monarch-launch`` and ``monarch-torchrun`` record the first SIGTERM, SIGINT or SIGHUP in their
own handlers (:mod:`.stopsignal`), and a run stopped that way exits ``128 + signal``. A user's
program can take those handlers away: ``signal.signal(SIGTERM, lambda *a: sys.exit(0))``
(before or inside ``with Job.from_env():``), ``SIG_IGN``, asyncio's ``add_signal_handler``, or a
thread that calls ``os._exit(0)``. Then no handler of ours runs and a run stopped from outside
would end ``succeeded`` with status 0 (issue 32 item 1).

So the console scripts start as a small guard (:func:`guard`): the process forks at once, before
any host is touched; the parent keeps the process id the user (or the kubelet, as the
container's first process) signals, takes the stop signals itself with ``sigwaitinfo``,
records the first one, passes it on to the child (the launcher proper) and, when the child
ends, decides the exit status:

- no stop recorded: the child's own status (``128 + S`` when the child was killed by S, and
  the guard then prints the final failure line, which the killed child could not: the OOM
  killer picks the launcher proper, the bigger process);
- a stop signal S recorded (or a stop the launcher decided itself, :func:`note_stop`, e.g. a
  stalled run): ``128 + S`` whatever the child exited with. The launcher reads the same record
  (:func:`signal_received`, :func:`noted_stop`) before its final line, so normally it already
  says so itself; when the child ended without saying it (its program called ``os._exit``, or
  it exited with another status than it reported), the guard prints the final failure line
  and writes the container's termination message.

The guard also reaps orphaned processes (it is PID 1 in a launcher pod) and, if it is killed
itself, the child gets SIGTERM (``PR_SET_PDEATHSIG``). ``MONARCH_STOPGUARD=0`` turns it off
(the launcher then runs in the first process, as before).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# The signals that mean "stop the run" (launcher.stopsignal.STOP_SIGNALS, kept in step by a
# unit test; not imported: the guard stays light).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Passed on to the child as they come, without deciding anything (stack dumps, user signals).
PASSED_SIGNALS = (signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH)
SIGNAL_BASE = 128
# A stop note's reason is cut here (the termination message holds 4 KiB).
MAX_NOTE_CHARS = 3800
ENV_STOPGUARD = "MONARCH_STOPGUARD"
# siginfo si_code of a signal the kernel generated for a terminal's key (Ctrl-C, Ctrl-\):
# every process of the foreground group got it already, the child included.
_SI_KERNEL = 0x80
_PR_SET_PDEATHSIG = 1

# In the child: the guard's end of the record (signals it got, read here) and ours (what the
# launcher decided, written here). None when no guard runs.
_from_guard: int | None = None
_to_guard: int | None = None
_received: int | None = None


def guard(prog: str, json_mode: bool = False) -> None:
    """Fork the launcher under a guard (see the module doc); returns in the child only.

    In the parent this never returns: it exits with the status the module doc gives. Does
    nothing when ``MONARCH_STOPGUARD=0``, when a guard already runs for this process, or where
    ``fork`` or ``sigwaitinfo`` do not exist.

    Args:
        prog: the name that starts the guard's own final line, e.g. ``monarch-launch``.
        json_mode: the launcher prints JSON lines (``--json``): so does the guard.
    """
    if (os.environ.get(ENV_STOPGUARD) == "0" or _to_guard is not None
            or not hasattr(signal, "sigwaitinfo") or not hasattr(os, "fork")):
        return
    # SIGINT/SIGHUP already ignored (nohup, a background job of a script) stay ignored: the
    # child inherits that, and the launcher keeps it (session/lifecycle.py).
    stops = [number for number in STOP_SIGNALS
             if number == signal.SIGTERM or signal.getsignal(number) != signal.SIG_IGN]
    waited = {*stops, *PASSED_SIGNALS, signal.SIGCHLD}
    # Blocked before the fork: a signal that comes in between waits for sigwaitinfo.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    signals_r, signals_w = os.pipe()
    notes_r, notes_w = os.pipe()
    child = os.fork()
    if child == 0:
        _become_child(old_mask, signals_r, notes_w, (signals_w, notes_r))
        return
    os.close(signals_r)
    os.close(notes_w)
    status, first_signal = _supervise(child, set(stops), waited, signals_w)
    code = _decide(status, first_signal, _read_all(notes_r), prog, json_mode)
    sys.stdout.flush()
    os._exit(code)


def _become_child(old_mask: set[int], signals_r: int, notes_w: int,
                  guard_ends: tuple[int, int]) -> None:
    global _from_guard, _to_guard
    for fd in guard_ends:
        os.close(fd)
    os.set_blocking(signals_r, False)
    os.set_blocking(notes_w, False)  # a note never blocks the launcher (they are a few lines)
    _from_guard, _to_guard = signals_r, notes_w
    os.environ[ENV_STOPGUARD] = "0"  # programs this launcher starts are not guarded again
    try:  # the guard killed (SIGKILL): stop as if the pod were deleted
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _supervise(child: int, stops: set[int], waited: set[int],
               signals_w: int) -> tuple[int, int | None]:
    """Pass signals on until the child ends; returns its wait status and the first stop
    signal received."""
    first = None
    while True:
        info = signal.sigwaitinfo(waited)
        number = info.si_signo
        if number == signal.SIGCHLD:
            status = _reap(child)
            if status is not None:
                return status, first
            continue
        if number in stops:
            first = number if first is None else first
            try:
                os.write(signals_w, bytes([number]))
            except OSError:
                pass
        typed_by_terminal = (info.si_code == _SI_KERNEL
                             and number in (signal.SIGINT, signal.SIGQUIT))
        if not typed_by_terminal:
            try:
                os.kill(child, number)
            except ProcessLookupError:
                pass


def _reap(child: int) -> int | None:
    """Reap every ended child (orphans too, as a container's first process must); the wait
    status of ``child`` once it ended, else None."""
    ended = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        if pid == child:
            ended = status


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks).decode("utf-8", "replace")
        chunks.append(chunk)


def parse_notes(text: str) -> tuple[str | None, int | None]:
    """``(stop reason, reported exit status)`` from the child's notes: the first ``stop``
    note's reason and the last ``final`` note's status (None when absent). Each note is one
    line, ``stop <reason>`` or ``final <status>``."""
    stop, final = None, None
    for line in text.splitlines():
        kind, _, value = line.partition(" ")
        if kind == "stop" and stop is None:
            stop = value
        elif kind == "final" and value.lstrip("-").isdigit():
            final = int(value)
    return stop, final


def decide(status: int, first_signal: int | None, stop: str | None,
           final: int | None) -> tuple[int, str | None]:
    """The guard's exit status, and the failure line it must print itself (None: the child
    already told the truth).

    Args:
        status: the child's wait status (``os.waitpid``).
        first_signal: the first stop signal the guard received, or None.
        stop: the reason of a stop the launcher decided itself (``ProgressStalled: ...``).
        final: the exit status the launcher reported in its final line, or None.

    Returns:
        ``(exit status, reason or None)``; exit status ``128 + S`` after a stop signal S
        (SIGTERM's for a stop the launcher decided), else the child's own status, or the one
        its final line reported when it was killed after that line (an abort at the
        interpreter's exit, see :mod:`.processexit`: the run ended before it).
    """
    own = os.waitstatus_to_exitcode(status)
    own = SIGNAL_BASE - own if own < 0 else own  # killed by S: 128 + S, as a shell says
    if first_signal is None and stop is None:
        if final is None and os.WIFSIGNALED(status):  # killed before it could say anything
            return own, killed_reason(os.WTERMSIG(status))
        if final is not None and os.WIFSIGNALED(status):
            # Killed after its final line (after the teardown): the run's outcome stands.
            return final, None
        return own, None
    expected = SIGNAL_BASE + (first_signal or signal.SIGTERM)
    if final == expected and own == expected:
        return expected, None
    if final is not None and final == own and first_signal is None and stop is None:
        return own, None
    reason = stop or _describe(first_signal or signal.SIGTERM)
    if final is None:
        how = (f"exited {own}" if own < SIGNAL_BASE
               else f"was killed by signal {own - SIGNAL_BASE}")
        reason += (f"; the program then ended the launcher (it {how}) before the launcher's "
                   "teardown: processes of this run may be left on its hosts")
    return expected, reason


def killed_reason(number: int) -> str:
    """The guard's failure line for a launcher killed by signal ``number`` with no stop
    received (the OOM killer picks the launcher proper, the bigger process): what happened and
    what became of the hosts' processes."""
    hint = " (the kernel's OOM killer sends it when memory runs out)" if (
        number == signal.SIGKILL) else ""
    return (f"the launcher was {_describe(number, 'killed')}{hint} before its teardown; its "
            "ssh sessions closed with it, so each host's session guard ends the run's processes "
            "there")


def _decide(status: int, first_signal: int | None, notes: str, prog: str,
            json_mode: bool) -> int:
    stop, final = parse_notes(notes)
    code, reason = decide(status, first_signal, stop, final)
    if reason is None and os.WIFSIGNALED(status) and code == final:
        print(f"{prog}: warning: the launcher was {_describe(os.WTERMSIG(status), 'killed')} "
              f"after its final line; the run's exit status {code} stands", file=sys.stderr,
              flush=True)
    if reason is not None:
        from monarch_operator.launcher.termination import write_termination_message

        write_termination_message(reason)
        if json_mode:
            import json

            print(json.dumps({"event": "result", "status": "failed", "exit_code": code,
                              "reason": reason}), flush=True)
        else:
            print(f"{prog}: failed: {reason}", file=sys.stderr, flush=True)
    return code


def _describe(number: int, verb: str = "terminated") -> str:
    try:
        return f"{verb} by signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"{verb} by signal {number}"


def signal_received() -> int | None:
    """In the launcher under a guard: the first stop signal the guard received (whether or not
    the signal reached a handler of ours), else None."""
    global _received
    if _received is None and _from_guard is not None:
        try:
            data = os.read(_from_guard, 64)
        except (BlockingIOError, OSError):
            data = b""
        if data:
            _received = data[0]
    return _received


def note_stop(reason: str) -> None:
    """Tell the guard the launcher stops the run itself for ``reason`` (one line): the exit
    status is then ``128 + 15`` with that reason, whatever the program does next."""
    _note(f"stop {' '.join(reason.split())[:MAX_NOTE_CHARS]}")


def note_final(exit_code: int) -> None:
    """Tell the guard the exit status the launcher's final line reported."""
    _note(f"final {exit_code}")


def _note(line: str) -> None:
    if _to_guard is None:
        return
    try:
        os.write(_to_guard, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass
