"""The end-of-run sweep within the start's ssh limits (issue 32), with a fake ssh runner. Pure.

The sweep used to open an ssh to every host at once and skip, in silence but for one line per
host, 1 to 18 of 24 or 64 hosts behind few sshd daemons. Now: at most ``--ssh-concurrency`` at
once, a refused login retried ``--ssh-retries`` times with backoff, and every host that still
gave no report named once, with its cause, in one summary line.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from monarch_operator.launcher.session.fanout import CommandResult, run_on_hosts
from monarch_operator.launcher.session.ssh import SshSettings
from monarch_operator.launcher.session.stragglers import RunMark
from monarch_operator.launcher.session.sweep import SweepResult, sweep_lines, sweep_run

MARK = RunMark("-", 0, "abc123")
REFUSED = "kex_exchange_identification: read: Connection reset by peer\r\n"
EMPTY_REPORT = 'monarch-stragglers {"found": [], "left": [], "scanned": 90, "scan_ms": 1.0}\n'


def _report(found: list[dict[str, object]], left: list[int]) -> str:
    data = {"found": found, "left": left, "scanned": 90, "scan_ms": 1.0}
    return "monarch-stragglers " + json.dumps(data) + "\n"


class FakeSsh:
    """Answers like the scan over ssh; counts attempts and the most run at once."""

    def __init__(self, refusals: dict[str, int] | None = None,
                 failures: dict[str, CommandResult] | None = None) -> None:
        self.refusals = dict(refusals or {})  # host -> attempts refused before it answers
        self.failures = failures or {}
        self.attempts: Counter[str] = Counter()
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, address: str, host: str) -> CommandResult:
        with self._lock:
            self.attempts[host] += 1
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.005)
            if host in self.failures:
                return self.failures[host]
            if self.attempts[host] <= self.refusals.get(host, 0):
                return CommandResult(255, "", REFUSED)
            return CommandResult(0, EMPTY_REPORT, "")
        finally:
            with self._lock:
                self.running -= 1


def _addresses(count: int) -> dict[str, str]:
    return {f"h{i}": f"10.0.0.{i}" for i in range(count)}


def test_64_hosts_are_swept_at_most_concurrency_at_once_and_refusals_retried() -> None:
    ssh = FakeSsh(refusals={f"h{i}": 1 + i % 3 for i in range(0, 64, 2)})
    pauses: list[float] = []

    result = sweep_run(_addresses(64), SshSettings(22, "root", concurrency=4, retries=3),
                       "python3", MARK, run_once=ssh, sleep=pauses.append)

    assert sorted(result.reports) == sorted(_addresses(64)) and result.unreached == {}
    assert ssh.most <= 4
    assert ssh.attempts["h0"] == 2 and ssh.attempts["h2"] == 4 and ssh.attempts["h4"] == 3
    assert ssh.attempts["h1"] == 1
    assert len(pauses) == sum(1 + i % 3 for i in range(0, 64, 2))
    assert all(0 <= pause <= 8.0 for pause in pauses)
    assert sweep_lines(result) == []


def test_a_host_refused_past_the_retries_is_named_once_in_one_summary_line() -> None:
    ssh = FakeSsh(refusals={"h3": 99}, failures={
        "h5": CommandResult(None, "", ""),
        "h6": CommandResult(
            255, "", "ssh: connect to host 192.0.2.6 port 22: Connection refused\n"),
    })

    result = sweep_run(_addresses(8), SshSettings(22, "root", concurrency=2, retries=2),
                       "python3", MARK, timeout_s=15, run_once=ssh, sleep=lambda _: None)

    assert ssh.attempts["h3"] == 3 and ssh.attempts["h5"] == 1 and ssh.attempts["h6"] == 1
    lines = sweep_lines(result)
    assert lines == [
        "sweep of this run's leftover processes: 3 of 8 hosts not reached: h3 (refused at login "
        "3 times (kex_exchange_identification: read: Connection reset by peer)), h5 (no answer "
        "within 15s), h6 (ssh: connect to host 192.0.2.6 port 22: Connection refused); the next "
        "run's pre-flight on those hosts stops whatever this run left there"
    ]
    assert "None" not in lines[0] and "-c" not in lines[0]


def test_hosts_sharing_an_address_are_swept_once() -> None:
    ssh = FakeSsh()

    result = sweep_run({"a": "192.0.2.1", "b": "192.0.2.1", "c": "192.0.2.2"},
                       SshSettings(22, "root"), "python3", MARK, run_once=ssh)

    assert sorted(result.reports) == ["a", "c"] and result.total == 2
    assert sum(ssh.attempts.values()) == 2


def test_processes_found_come_first_then_the_summary() -> None:
    found = [{"pid": 41, "command": "sleep 1000", "mark": "-/0/abc123", "stopped": "SIGKILL"},
             {"pid": 42, "command": "python3 -c <program of 3 lines>", "mark": "-/0/abc123",
              "stopped": None}]
    ssh = FakeSsh(failures={
        "h0": CommandResult(0, _report(found, []), ""),
        "h1": CommandResult(0, "", ""),
    })

    lines = sweep_lines(sweep_run(_addresses(2), SshSettings(22, "root"), "python3", MARK,
                                  run_once=ssh))

    assert lines == [
        "process left by this run on h0, pid 41 (run abc123): sleep 1000: stopped (SIGKILL)",
        "process left by this run on h0, pid 42 (run abc123): python3 -c <program of 3 lines>: "
        "ended by itself before it was signalled",
        "sweep of this run's leftover processes: 1 of 2 hosts not reached: h1 (exit status 0 "
        "but no report); the next run's pre-flight on those hosts stops whatever this run left "
        "there",
    ]


def test_run_on_hosts_refuses_no_concurrency_and_handles_no_hosts() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        run_on_hosts({"192.0.2.1": "a"}, FakeSsh(), concurrency=0)
    assert run_on_hosts({}, FakeSsh()) == {}
    assert sweep_lines(SweepResult()) == []
