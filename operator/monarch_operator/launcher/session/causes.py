"""Observed causes in words: one place that turns what ssh or Monarch showed into a sentence.

Every warning and failure reason of a session names the host, what was being done, and the
cause that was observed: an exit status, a signal, a time limit with no answer, a host that
stopped answering, or ssh's own last words. Never the remote program (the launcher's commands
are whole Python programs given with ``-c``) and never a bare ``None`` (issue 32).

- :func:`command_failure`: a one-shot ssh command (sweep, exit records, env-file removal)
  that gave no usable answer;
- :func:`not_reached`: the one summary line naming every host such a command could not reach;
- :func:`session_end`: a worker's ssh session that ended mid-run (a host that stopped
  answering ssh's keepalives is said to have stopped answering, with how long, not to have
  "exited with code 1");
- :func:`monarch_loss`: Monarch's supervision text for a host that went silent.

Pure: tested with real-looking ssh and Monarch messages (tests/unit/test_causes.py).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence

from monarch_operator.launcher.session.fanout import (
    SSH_ERROR,
    CommandResult,
    is_transient_refusal,
)

# The longest piece of ssh's or the remote side's own words quoted in a cause, characters.
QUOTE_CHARS = 200
# Exit status of a shell that did not find the command (the worker Python missing).
NOT_FOUND = 127

# ssh's words when ServerAliveCountMax keepalives went unanswered (OpenSSH 7-9,
# ssh_config(5) "ServerAliveCountMax"): "Timeout, server 192.0.2.7 not responding."
_KEEPALIVE_TIMEOUT = re.compile(r"Timeout, server \S+ not responding")
# ssh's words for a connection cut under it: sshd dropped it, a reset, a broken pipe.
_CONNECTION_CUT = re.compile(
    r"Connection to \S+ closed by remote host|Connection reset|Broken pipe"
    r"|client_loop: send disconnect|packet_write_wait"
)

# Monarch's supervision wording for a host that stopped answering (torchmonarch 0.7.0,
# hyperactor_mesh): "Supervision event: the process <proc> owned by actor <actor> became
# unresponsive and is assumed dead, check the log on the host for details", "delivery
# progress to monitored actor <actor> from <actor> stalled for <duration>", "failed to deliver
# message within timeout".
_UNRESPONSIVE = re.compile(r"became unresponsive and is assumed dead")
_STALLED = re.compile(
    r"delivery progress to monitored actor \S+ from \S+ stalled for (\S+?)[.,;]?(?:\s|$)"
)
_UNDELIVERED = re.compile(r"failed to deliver message within timeout")


def quote(text: str) -> str:
    """The last non-empty line of ``text``, stripped and cut to :data:`QUOTE_CHARS`; ``""``
    when there is none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= QUOTE_CHARS else line[: QUOTE_CHARS - 3] + "..."


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} ({number})"
    except ValueError:
        return str(number)


def command_failure(result: CommandResult, limit_s: float) -> str:
    """Why a one-shot ssh command gave no usable answer, in words (no host, no command).

    Args:
        result: the command's last attempt (after its retries).
        limit_s: the time limit of one attempt, seconds.

    Returns:
        E.g. ``no answer within 15s``, ``refused at login 7 times (ssh: kex_exchange_
        identification: read: Connection reset by peer)``, ``ssh: connect to host 192.0.2.7 port
        22: Connection refused``, ``exit status 127 (sh: 1: python3: not found)`` or ``exit
        status 0 but no report``.
    """
    status, said = result.exit_status, quote(result.stderr)
    if status is None:
        return f"no answer within {limit_s:g}s"
    if status < 0:
        return f"the ssh client was killed by signal {_signal_name(-status)}"
    if is_transient_refusal(status, result.stderr):
        times = f" {result.tries} times" if result.tries > 1 else ""
        return f"refused at login{times} ({said})"
    if status == SSH_ERROR:
        return said or "ssh failed (exit status 255) and said nothing"
    if status == NOT_FOUND:
        return f"command not found, exit status {NOT_FOUND}" + (f" ({said})" if said else "")
    if status == 0:
        return "exit status 0 but no report"
    return f"exit status {status}" + (f" ({said})" if said else "")


def not_reached(what: str, causes: Mapping[str, str], total: int, then: str = "") -> str | None:
    """The one line that names every host a step could not reach, or None when none.

    Args:
        what: the step, e.g. ``sweep``.
        causes: ``{host: cause in words}`` of the hosts not reached, in host order.
        total: hosts the step was for.
        then: what follows for those hosts, e.g. ``the next run's pre-flight stops what this
            run left there``; appended after ``; ``.

    Returns:
        E.g. ``sweep: 2 of 64 hosts not reached: h1 (no answer within 15s), h2 (refused at
        login 7 times (...)); the next run's pre-flight ...``.
    """
    if not causes:
        return None
    listing = ", ".join(f"{host} ({cause})" for host, cause in causes.items())
    tail = f"; {then}" if then else ""
    return f"{what}: {len(causes)} of {total} hosts not reached: {listing}{tail}"


def session_end(
    host: str,
    exit_status: int,
    last_lines: Sequence[str],
    alive_interval_s: float,
    alive_count_max: int,
) -> str:
    """Why a worker's ssh session ended mid-run, naming the host.

    Args:
        host: the host's name.
        exit_status: the ssh client's exit status (``-N``: killed by signal N).
        last_lines: the session's last output lines (ssh writes its own reason there).
        alive_interval_s: ``--ssh-alive-interval``, seconds.
        alive_count_max: ``--ssh-alive-count``.

    Returns:
        E.g. ``127.0.0.3 stopped answering: no reply to 4 ssh keepalives sent 15s apart (60s
        of silence)``, ``the ssh connection to b was cut (Connection to b closed by remote
        host.)``, ``the ssh session to b ended (ssh exit status 255, no reason given)``, ``the
        Monarch worker on b exited with status 3`` or ``... was killed by signal SIGKILL (9)``.
    """
    text = "\n".join(last_lines)
    if exit_status == SSH_ERROR and _KEEPALIVE_TIMEOUT.search(text):
        silence = alive_interval_s * alive_count_max
        return (
            f"{host} stopped answering: no reply to {alive_count_max} ssh keepalives sent "
            f"{alive_interval_s:g}s apart ({silence:g}s of silence)"
        )
    if exit_status == SSH_ERROR:
        # Only ssh's own words are quoted: the tail also holds the ranks' output.
        cut = [line for line in last_lines if _CONNECTION_CUT.search(line)]
        if cut:
            return f"the ssh connection to {host} was cut ({quote(cut[-1])})"
        return f"the ssh session to {host} ended (ssh exit status 255, no reason given)"
    if exit_status < 0:
        return f"the ssh client for {host} was killed by signal {_signal_name(-exit_status)}"
    # The session guard exits with the worker's status (128 + N for signal N).
    if exit_status > 128:
        number = exit_status - 128
        return f"the Monarch worker on {host} was killed by signal {_signal_name(number)}"
    return f"the Monarch worker on {host} exited with status {exit_status}"


def monarch_loss(message: str, host: str) -> str | None:
    """Say that ``host`` stopped answering when Monarch's ``message`` means so, else None.

    Args:
        message: a Monarch supervision or fault text.
        host: the host the failing actor ran on.

    Returns:
        E.g. ``host b stopped answering: Monarch found its process unresponsive and assumed it
        dead``, with how long when Monarch said (``... made no progress for 30s``).
    """
    stalled = _STALLED.search(message)
    if stalled:
        return f"host {host} stopped answering: messages to it made no progress for {stalled[1]}"
    if _UNRESPONSIVE.search(message):
        return (
            f"host {host} stopped answering: Monarch found its process unresponsive and assumed "
            "it dead"
        )
    if _UNDELIVERED.search(message):
        return f"host {host} stopped answering: a message to it was not delivered in time"
    return None
