"""Every short command the launcher runs over ssh gets the same wall limit as a pre-flight
check (launcher.session.ssh.COMMAND_LIMIT_S): the removal of private env files had 5 s and the
exit records 10 s, and in CI 4 of 64 hosts behind 4 sshd gave no answer within 5 s at the end
of a run whose pre-flight they had just passed (a login under load takes longer than ssh's
ConnectTimeout, which covers only connect and banner)."""

from __future__ import annotations

from typing import Any

import pytest

from monarch_operator.launcher.session import exitrecords, preflight
from monarch_operator.launcher.session.fanout import CommandResult
from monarch_operator.launcher.session.ssh import COMMAND_LIMIT_S, SshSettings

SSH = SshSettings(port=22, user="root")
HOSTS = {"host-a": "10.244.0.5", "host-b": "10.244.0.6"}  # pod range, never dialed


def _capture(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[float]:
    """Replace ``module``'s ssh runner and fan-out: record each runner's limit, answer 0."""
    limits: list[float] = []

    def ssh_runner(ssh: SshSettings, command: Any, timeout_s: float) -> object:
        limits.append(timeout_s)
        return object()

    def run_on_hosts(targets: dict[str, str], run_once: object, *args: Any,
                     **kwargs: Any) -> dict[str, CommandResult]:
        return {host: CommandResult(exit_status=0, stdout="", stderr="")
                for host in targets.values()}

    monkeypatch.setattr(module, "ssh_runner", ssh_runner)
    monkeypatch.setattr(module, "run_on_hosts", run_on_hosts)
    return limits


def test_the_limit_covers_more_than_ssh_s_connect_timeout() -> None:
    assert COMMAND_LIMIT_S >= 15.0
    assert preflight.PreflightSettings(ssh=SSH, python_exe="python3",
                                       monarch_port=26600).ssh_timeout_s == COMMAND_LIMIT_S


def test_removing_private_env_files_has_the_pre_flight_s_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    limits = _capture(monkeypatch, preflight)
    settings = preflight.PreflightSettings(ssh=SSH, python_exe="python3", monarch_port=26600,
                                           private_environment={"TOKEN": "x"}, run_id="ab12")
    assert preflight.remove_private_env_files(HOSTS, settings) is None
    assert limits == [COMMAND_LIMIT_S]
    # A run that set its own pre-flight limit gets that one here too.
    longer = preflight.PreflightSettings(ssh=SSH, python_exe="python3", monarch_port=26600,
                                         private_environment={"TOKEN": "x"}, run_id="ab12",
                                         ssh_timeout_s=45.0)
    preflight.remove_private_env_files(HOSTS, longer)
    assert limits[-1] == 45.0


def test_reading_exit_records_has_the_same_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = _capture(monkeypatch, exitrecords)
    assert exitrecords.collect(HOSTS, SSH, "ab12") == []
    assert limits == [COMMAND_LIMIT_S]
