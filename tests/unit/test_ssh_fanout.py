"""ssh at scale, without ssh: which refusals are retried, the backoff, the bounded fan-out, and
``--host-wait`` counted from the last progress (field case C28)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from monarch_operator.launcher.session import preflight
from monarch_operator.launcher.session.fanout import (
    RetryPolicy,
    SessionFanout,
    is_transient_refusal,
    run_with_retries,
)
from monarch_operator.launcher.session.preflight import (
    SSH_UNREACHABLE,
    HostCheck,
    PreflightError,
    PreflightSettings,
    run_preflight,
)
from monarch_operator.launcher.session.ssh import SshSettings, ssh_args

# What OpenSSH 9.2's client printed when a daemon dropped it past MaxStartups (seen here).
REFUSALS = [
    "kex_exchange_identification: read: Connection reset by peer\r\n",
    "kex_exchange_identification: Connection closed by remote host\r\n",
    "Connection closed by 127.0.0.9 port 40999\r\n",
    "Exceeded MaxStartups\r\n",
]
FINAL = [
    "ssh: connect to host 127.0.0.9 port 22: Connection refused\r\n",
    "root@127.0.0.9: Permission denied (publickey).\r\n",
    "Host key verification failed.\r\n",
]


@pytest.mark.parametrize("stderr", REFUSALS)
def test_refusals_before_login_are_transient(stderr: str) -> None:
    assert is_transient_refusal(255, stderr)
    assert not is_transient_refusal(1, stderr), "only ssh's own failures (255) are refusals"


@pytest.mark.parametrize("stderr", FINAL)
def test_other_failures_are_not_retried(stderr: str) -> None:
    assert not is_transient_refusal(255, stderr)


def test_backoff_doubles_to_its_cap_with_full_jitter() -> None:
    policy = RetryPolicy(retries=6, first_delay_s=0.5, max_delay_s=8.0)
    assert [policy.delay(n, lambda: 0.999999) for n in range(1, 8)] == pytest.approx(
        [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0], rel=1e-5
    )
    assert policy.delay(3, lambda: 0.0) == 0.0


def test_run_with_retries_stops_at_the_first_non_refusal_or_the_limit() -> None:
    results = iter([(255, REFUSALS[0]), (255, REFUSALS[1]), (0, "")])
    pauses: list[float] = []
    assert run_with_retries(lambda: next(results), RetryPolicy(), sleep=pauses.append) == (0, "")
    assert len(pauses) == 2

    calls = Counter[str]()

    def always_refused() -> tuple[int, str]:
        calls["ssh"] += 1
        return 255, REFUSALS[0]

    run_with_retries(always_refused, RetryPolicy(retries=3), sleep=lambda _: None)
    assert calls["ssh"] == 4, "the first attempt and 3 retries"


class FakeSession:
    """An ssh session on a fake clock: up ``delay`` seconds after its start, or (with
    ``status``) ended then with that exit status and ``stderr``."""

    def __init__(self, now: list[float], delay: float, status: int | None = None,
                 stderr: str = "") -> None:
        self.clock = now
        self.resolves_at = now[0] + delay
        self.status = status
        self.stderr = stderr

    def resolved(self) -> bool:
        return self.clock[0] >= self.resolves_at

    def is_up(self) -> bool:
        return self.status is None and self.resolved()

    def exit_status(self) -> int | None:
        return self.status if self.resolved() else None

    def error_text(self) -> str:
        return self.stderr


def test_fanout_never_has_more_than_the_limit_logging_in_and_retries_refusals() -> None:
    now = [0.0]
    started = Counter[str]()
    sessions: list[FakeSession] = []
    most = [0]

    def start(host: str) -> FakeSession:
        started[host] += 1
        most[0] = max(most[0], sum(not s.resolved() for s in sessions) + 1)
        if host == "h3" and started[host] <= 2:
            session = FakeSession(now, 0.1, 255, REFUSALS[0])
        else:
            session = FakeSession(now, 0.3)
        sessions.append(session)
        return session

    def sleep(seconds: float) -> None:
        now[0] += seconds

    hosts = [f"h{i}" for i in range(12)]
    fanout = SessionFanout(start, concurrency=4, clock=lambda: now[0], sleep=sleep,
                           rng=lambda: 0.5)
    result = fanout.open_all(hosts)

    assert list(result) == hosts
    assert all(result[h].is_up() for h in hosts)
    assert started["h3"] == 3, "refused twice, then up"
    assert all(started[h] == 1 for h in hosts if h != "h3")
    assert most[0] == 4, "4 at once, never more"


def test_fanout_gives_up_on_a_final_failure_at_once() -> None:
    now = [0.0]
    started = Counter[str]()

    def start(host: str) -> FakeSession:
        started[host] += 1
        return FakeSession(now, 0.1, 255, FINAL[1])

    def sleep(seconds: float) -> None:
        now[0] += seconds

    SessionFanout(start, concurrency=2, clock=lambda: now[0], sleep=sleep).open_all(["a", "b"])
    assert started == {"a": 1, "b": 1}


def test_every_connection_has_keepalives() -> None:
    options = ssh_args(SshSettings(port=22, user="u"), "h", tty=False)
    assert "ServerAliveInterval=15" in options and "ServerAliveCountMax=4" in options
    custom = ssh_args(
        SshSettings(port=22, user="u", alive_interval_s=2, alive_count_max=3), "h", tty=False
    )
    assert "ServerAliveInterval=2" in custom and "ServerAliveCountMax=3" in custom


FAKE_SETTINGS = PreflightSettings(ssh=SshSettings(port=22, user="u"), python_exe="python3",
                                  monarch_port=1)


def test_host_wait_counts_from_the_last_progress_not_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A first round slower than the wait (many hosts, a busy sshd): b is refused in it and must
    # still be tried again. Today the wait is used up by the first round and b is never retried.
    calls = Counter[str]()

    def check_host(host: str, settings: PreflightSettings) -> HostCheck:
        calls[host] += 1
        if calls[host] == 1:
            time.sleep(0.6)
        if host == "b" and calls[host] == 1:
            return HostCheck(host, None, SSH_UNREACHABLE, "refused")
        return HostCheck(host, "127.0.0.3")

    monkeypatch.setattr(preflight, "check_host", check_host)

    addresses = run_preflight(["a", "b"], FAKE_SETTINGS, wait_s=0.5)

    assert addresses == {"a": "127.0.0.3", "b": "127.0.0.3"}
    assert calls == {"a": 1, "b": 2}


def test_a_host_still_down_after_the_wait_is_named_with_the_flag_to_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        preflight,
        "check_host",
        lambda host, settings: HostCheck(host, None, "DNSNotResolvable", "no such name"),
    )
    with pytest.raises(PreflightError) as caught:
        run_preflight(["late-host"], FAKE_SETTINGS, wait_s=0.2)
    assert "late-host" in str(caught.value) and "--host-wait" in str(caught.value)


def test_the_worker_images_sshd_sends_the_launchers_keepalives() -> None:
    from pathlib import Path

    from monarch_operator.launcher.session.ssh import ALIVE_COUNT_MAX, ALIVE_INTERVAL_S

    entrypoint = Path(__file__).parents[2] / "images" / "worker" / "entrypoint.sh"
    config = entrypoint.read_text()
    assert f"\nClientAliveInterval {ALIVE_INTERVAL_S}\n" in config
    assert f"\nClientAliveCountMax {ALIVE_COUNT_MAX}\n" in config
