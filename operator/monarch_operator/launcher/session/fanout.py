"""ssh at scale: how many connections at once, which refusals are retried, and how long to wait.

Many hosts often sit behind few sshd daemons (containers on a node sharing the node's sshd, a
bastion, a login node; field case C28, charm #704). OpenSSH's ``MaxStartups`` (default
``10:30:100``, sshd_config(5)) then drops connections at random once 10 are not yet
authenticated at one daemon: the client sees ``Exceeded MaxStartups``, or the connection reset
or closed by the remote host during the key exchange. The launcher therefore

- opens at most :data:`DEFAULT_CONCURRENCY` ssh connections at once (``--ssh-concurrency``), in
  the pre-flight and when it starts the workers: 10 stays within one daemon's ``MaxStartups``
  even when every connection goes to the same daemon;
- retries a refusal of that kind (:func:`is_transient_refusal`) up to
  :data:`DEFAULT_RETRIES` times (``--ssh-retries``) with exponential backoff and full jitter
  (:meth:`RetryPolicy.delay`, 0.5 s doubling up to 8 s: at most about 24 s in all), so that
  refused clients do not all come back at once;
- starts the workers with :class:`SessionFanout`: a new session is opened only when fewer than
  the limit are still logging in; a session counts as logged in once its guard says so (see
  :mod:`launcher.session.guard`);
- runs every one-shot command on many hosts (the end-of-run sweep, the exit records, the
  removal of private env files) with :func:`run_on_hosts`: the same limit, the same retries.
  Before it, the end-of-run sweep opened an ssh to every host at once and skipped 1 to 18 of 24
  or 64 hosts behind few daemons in 13 of 13 runs (issue 32).

Everything here is pure or takes its clock, sleep and randomness as arguments, so it is tested
without ssh.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

# At most this many ssh connections are being opened at once (see the module doc).
DEFAULT_CONCURRENCY = 10
# A transient refusal is retried this many times (so up to 7 attempts per connection).
DEFAULT_RETRIES = 6
# Backoff before the first retry, and its cap, seconds; the delay doubles in between.
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 8.0
# How long a worker session may take from ssh's start to its guard's "up" line, seconds; one
# still logging in after that stops holding a slot (the attach limit judges it).
SESSION_UP_LIMIT_S = 30.0
# ssh's own exit status for a connection it could not make or lost.
SSH_ERROR = 255

# ssh client messages (OpenSSH 8-9) for a connection the server dropped before authentication:
# MaxStartups, a daemon restarting, a listen backlog overflowing. They say nothing about the
# host being down, which "Connection refused" or "No route to host" do.
_TRANSIENT = re.compile(
    r"Exceeded MaxStartups"
    r"|kex_exchange_identification: (read: Connection reset by peer"
    r"|Connection closed by remote host|banner line contains invalid characters)"
    r"|ssh_exchange_identification: (read: Connection reset by peer"
    r"|Connection closed by remote host)"
    r"|Connection (reset|closed) by \S+ port \d+\s*$",
    re.MULTILINE,
)


def is_transient_refusal(exit_status: int | None, stderr: str) -> bool:
    """Whether an ssh failure is a refusal worth retrying (see the module doc).

    Args:
        exit_status: ssh's exit status; only :data:`SSH_ERROR` (255) can be a refusal.
        stderr: ssh's error output.

    Returns:
        True for ``Exceeded MaxStartups`` and a connection reset or closed by the remote host
        during the key exchange; False for anything else (refused, unreachable, denied).
    """
    return exit_status == SSH_ERROR and _TRANSIENT.search(stderr) is not None


@dataclass(frozen=True)
class RetryPolicy:
    """How transient ssh refusals are retried.

    Attributes:
        retries: retries after the first attempt, 0 or more.
        first_delay_s: the backoff cap before the first retry, seconds.
        max_delay_s: the largest backoff cap, seconds.
    """

    retries: int = DEFAULT_RETRIES
    first_delay_s: float = FIRST_RETRY_S
    max_delay_s: float = MAX_RETRY_S

    def delay(self, retry: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first): uniformly random
        between 0 and ``min(max_delay_s, first_delay_s * 2 ** (retry - 1))`` ("full jitter").

        Args:
            retry: 1-based retry number.
            rng: returns a float in [0, 1); ``random.random`` by default.
        """
        cap = min(self.max_delay_s, self.first_delay_s * 2 ** max(0, retry - 1))
        return cap * rng()


def run_with_retries(
    attempt: Callable[[], tuple[int | None, str]],
    policy: RetryPolicy,
    on_retry: Callable[[int, str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int | None, str]:
    """Call ``attempt`` until it does not end in a transient refusal, or the retries are spent.

    Args:
        attempt: runs one ssh command; returns ``(exit status or None, stderr)``.
        policy: the retry limits.
        on_retry: called with ``(retry number, stderr)`` before each retry.
        sleep: the pause function (tests pass a fake).

    Returns:
        The last attempt's ``(exit status, stderr)``.
    """
    result = attempt()
    for retry in range(1, policy.retries + 1):
        if not is_transient_refusal(*result):
            break
        if on_retry is not None:
            on_retry(retry, result[1])
        sleep(policy.delay(retry))
        result = attempt()
    return result


@dataclass(frozen=True)
class CommandResult:
    """What one command run over ssh on one host gave, after its retries.

    Attributes:
        exit_status: ssh's exit status: the remote command's, or 255 for ssh's own failure;
            ``-N`` when the ssh client was killed by signal N; None when it did not end within
            its time limit (no answer).
        stdout: what it printed.
        stderr: ssh's and the remote command's error output.
        tries: attempts made, 1 or more.
    """

    exit_status: int | None
    stdout: str
    stderr: str
    tries: int = 1


def run_on_hosts(
    targets: Mapping[str, str],
    run_once: Callable[[str, str], CommandResult],
    concurrency: int = DEFAULT_CONCURRENCY,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[str, int, str], None] | None = None,
) -> dict[str, CommandResult]:
    """Run one command on every host: at most ``concurrency`` at once, refusals retried.

    Each host's command is retried as the start's connections are (:func:`run_with_retries`:
    only a transient refusal such as ``Exceeded MaxStartups``, with backoff and jitter); a host
    waiting for its retry holds its place, so no more than ``concurrency`` connections are
    being made at any time.

    Args:
        targets: ``{address: host name}``, each address once (the name checks the host key and
            names the host in results).
        run_once: ``(address, host) -> CommandResult`` for one attempt; it never raises for a
            failing host (a timeout is ``exit_status=None``).
        concurrency: commands running at once, 1 or more (``--ssh-concurrency``).
        policy: retries of transient refusals (``--ssh-retries``); None for the defaults.
        sleep: the pause between retries (tests pass a fake).
        on_retry: called with ``(host, retry number, ssh's stderr)`` before a retry.

    Returns:
        ``{host name: its last attempt's result}`` in the order of ``targets``, with ``tries``
        counting every attempt.

    Raises:
        ValueError: ``concurrency`` below 1.
    """
    if concurrency < 1:
        raise ValueError(f"ssh concurrency must be at least 1, got {concurrency}")
    retry_policy = policy or RetryPolicy()

    def on_host(address: str, host: str) -> CommandResult:
        attempts: list[CommandResult] = []

        def attempt() -> tuple[int | None, str]:
            attempts.append(run_once(address, host))
            return attempts[-1].exit_status, attempts[-1].stderr

        def retrying(retry: int, stderr: str) -> None:
            if on_retry is not None:
                on_retry(host, retry, stderr)

        run_with_retries(attempt, retry_policy, retrying, sleep)
        last = attempts[-1]
        return CommandResult(last.exit_status, last.stdout, last.stderr, len(attempts))

    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(concurrency, len(targets))) as pool:
        results = list(pool.map(on_host, targets.keys(), targets.values()))
    return dict(zip(targets.values(), results, strict=True))


class Session(Protocol):
    """One ssh session being opened (see :class:`SessionFanout`)."""

    def is_up(self) -> bool:
        """Whether the remote side said it is logged in and running."""

    def exit_status(self) -> int | None:
        """ssh's exit status, or None while it runs."""

    def error_text(self) -> str:
        """What ssh wrote to stderr before the session came up."""


class SessionFanout:
    """Opens one long-lived ssh session per host, at most ``concurrency`` logging in at once.

    Runs in the calling thread (ssh clients are started from it: their death signal is tied to
    the thread that started them, see :mod:`launcher.session.sshjob`).

    Args:
        start: ``host -> Session``: starts ssh for ``host`` (again, on a retry).
        concurrency: sessions allowed to be logging in at once, 1 or more.
        policy: retries of transient refusals.
        up_limit_s: after this many seconds a session still logging in frees its slot.
        clock, sleep, rng: time and randomness (tests pass fakes).
        on_retry: called with ``(host, retry number, stderr)`` before a retry.
    """

    def __init__(
        self,
        start: Callable[[str], Session],
        concurrency: int = DEFAULT_CONCURRENCY,
        policy: RetryPolicy | None = None,
        up_limit_s: float = SESSION_UP_LIMIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        on_retry: Callable[[str, int, str], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"ssh concurrency must be at least 1, got {concurrency}")
        self._start = start
        self._concurrency = concurrency
        self._policy = policy or RetryPolicy()
        self._up_limit_s = up_limit_s
        self._clock, self._sleep, self._rng = clock, sleep, rng
        self._on_retry = on_retry

    def open_all(self, hosts: Sequence[str], poll_s: float = 0.02) -> dict[str, Session]:
        """Open a session to every host; return ``{host: its last session}`` in host order.

        Returns once every session is up, has ended for good (a non-transient failure, or the
        retries spent), or has been logging in for ``up_limit_s``. Never raises for a host;
        the caller judges the sessions that ended.
        """
        waiting = list(hosts)  # (host) not started yet, or due for a retry
        due: dict[str, float] = {}
        retries: dict[str, int] = {}
        opening: dict[str, tuple[Session, float]] = {}
        last: dict[str, Session] = {}
        while waiting or opening:
            now = self._clock()
            for host, (session, started) in list(opening.items()):
                status = session.exit_status()
                if session.is_up() or now - started >= self._up_limit_s:
                    del opening[host]
                elif status is not None:
                    del opening[host]
                    count = retries.get(host, 0) + 1
                    if count <= self._policy.retries and is_transient_refusal(
                        status, session.error_text()
                    ):
                        retries[host] = count
                        if self._on_retry is not None:
                            self._on_retry(host, count, session.error_text())
                        due[host] = now + self._policy.delay(count, self._rng)
                        waiting.append(host)
            for host in [h for h in waiting if due.get(h, 0.0) <= now]:
                if len(opening) >= self._concurrency:
                    break
                waiting.remove(host)
                last[host] = opening_session = self._start(host)
                opening[host] = (opening_session, self._clock())
            if waiting or opening:
                self._sleep(poll_s)
        return {host: last[host] for host in hosts}
