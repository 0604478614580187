"""The launcher's pre-flight against real sshd on 127.0.0.2-4: one test per failure reason, the
stale-worker cleanup, the loopback rule (field case C3) and the retry of hosts still coming up.

Only the loopback rule (which needs a remote host) and the retry timing (which needs a host that
comes up late) replace the per-host check with a fake; everything else logs in for real.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.launcher.session import preflight
from monarch_operator.launcher.session.preflight import (
    DNS_NOT_RESOLVABLE,
    IMPORT_FAILED,
    LOOPBACK_ADDRESS,
    PORT_IN_USE,
    PYTHON_NOT_FOUND,
    SSH_AUTH_FAILED,
    SSH_UNREACHABLE,
    HostCheck,
    PreflightError,
    PreflightSettings,
    loopback_failures,
    run_preflight,
)
from monarch_operator.launcher.session.ssh import SshSettings, ssh_args
from monarch_operator.testing.loopback_sshd import SshCluster

pytestmark = pytest.mark.ssh

# A loopback address with no sshd (the cluster uses 127.0.0.2-4).
NO_SSHD = "127.0.0.9"
# The address the fake stale worker binds: one of the cluster's hosts.
STALE_HOST = "127.0.0.3"
# How long the fake stale worker may take to listen, or to exit once stopped, seconds.
DUMMY_TIMEOUT_S = 10.0
# For tests that replace the per-host check: never used to log in.
FAKE_SETTINGS = PreflightSettings(
    ssh=SshSettings(port=22, user="root"), python_exe="python3", monarch_port=1
)


def settings_for(
    cluster: SshCluster,
    monarch_port: int,
    key: Path | None = None,
    python_exe: str = sys.executable,
    modules: tuple[str, ...] = ("monarch",),
    clean_stale: bool = True,
) -> PreflightSettings:
    """Pre-flight settings for root on ``cluster``, with this test's Python as the worker's."""
    return PreflightSettings(
        ssh=SshSettings(port=cluster.port, user="root", key=str(key or cluster.key),
                        known_hosts=str(cluster.known_hosts)),
        python_exe=python_exe,
        monarch_port=monarch_port,
        modules=modules,
        clean_stale=clean_stale,
    )


def reasons(error: PreflightError) -> dict[str, str | None]:
    """``{host: reason}`` of every failure, in the order the error lists them."""
    return {check.host: check.reason for check in error.failures}


def only_failure(error: PreflightError) -> HostCheck:
    assert len(error.failures) == 1, error.failures
    return error.failures[0]


# -- real sshd --------------------------------------------------------------------------------
def test_every_host_ready_gives_addresses_in_order(
    ssh_cluster: SshCluster, monarch_port: int
) -> None:
    hosts = list(reversed(ssh_cluster.hosts))
    progress: list[tuple[int, int]] = []

    addresses = run_preflight(
        hosts,
        settings_for(ssh_cluster, monarch_port),
        on_progress=lambda ready, total: progress.append((ready, total)),
    )

    assert list(addresses.items()) == [(host, host) for host in hosts]
    assert progress == [(3, 3)]


def test_wrong_key_is_an_auth_failure_on_every_host(
    ssh_cluster: SshCluster, monarch_port: int, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)

    with pytest.raises(PreflightError) as caught:
        run_preflight(ssh_cluster.hosts, settings_for(ssh_cluster, monarch_port, key=stranger))

    assert reasons(caught.value) == {host: SSH_AUTH_FAILED for host in ssh_cluster.hosts}
    assert all("Permission denied" in check.detail for check in caught.value.failures)


def test_host_without_sshd_is_named_quickly(ssh_cluster: SshCluster, monarch_port: int) -> None:
    good = ssh_cluster.hosts[0]

    with pytest.raises(PreflightError) as caught:
        run_preflight([good, NO_SSHD], settings_for(ssh_cluster, monarch_port), wait_s=0)

    failure = only_failure(caught.value)
    assert (failure.host, failure.address, failure.reason) == (NO_SSHD, NO_SSHD, SSH_UNREACHABLE)
    assert failure.detail.startswith(f"port {ssh_cluster.port}: ")
    assert "1 of 2 hosts" in str(caught.value) and NO_SSHD in str(caught.value)


def test_unresolvable_name_is_reported(ssh_cluster: SshCluster, monarch_port: int) -> None:
    with pytest.raises(PreflightError) as caught:
        run_preflight(
            [ssh_cluster.hosts[0], "no-such-host.invalid"], settings_for(ssh_cluster, monarch_port)
        )

    failure = only_failure(caught.value)
    assert (failure.host, failure.address) == ("no-such-host.invalid", None)
    assert failure.reason == DNS_NOT_RESOLVABLE


def test_missing_worker_python_is_reported(ssh_cluster: SshCluster, monarch_port: int) -> None:
    settings = settings_for(ssh_cluster, monarch_port, python_exe="/nonexistent/bin/python")

    with pytest.raises(PreflightError) as caught:
        run_preflight(ssh_cluster.hosts, settings)

    assert reasons(caught.value) == {host: PYTHON_NOT_FOUND for host in ssh_cluster.hosts}
    assert all(
        check.detail.startswith("/nonexistent/bin/python: ") for check in caught.value.failures
    )


def test_missing_module_is_named(ssh_cluster: SshCluster, monarch_port: int) -> None:
    settings = settings_for(
        ssh_cluster, monarch_port, modules=("monarch", "no_such_module_for_preflight")
    )

    with pytest.raises(PreflightError) as caught:
        run_preflight(ssh_cluster.hosts[:1], settings)

    failure = only_failure(caught.value)
    assert failure.reason == IMPORT_FAILED
    assert failure.detail == f"{sys.executable} cannot import no_such_module_for_preflight"


def test_port_held_by_another_process_is_reported_on_that_host_only(
    ssh_cluster: SshCluster, monarch_port: int
) -> None:
    busy = ssh_cluster.hosts[0]
    with socket.create_server((busy, monarch_port)):
        with pytest.raises(PreflightError) as caught:
            run_preflight(ssh_cluster.hosts, settings_for(ssh_cluster, monarch_port))

    failure = only_failure(caught.value)
    assert (failure.host, failure.reason) == (busy, PORT_IN_USE)
    assert f"port {monarch_port} on {busy} is in use by another process" in failure.detail


def fake_worker_code(monarch_port: int) -> str:
    """Python code that looks like a Monarch worker on STALE_HOST:monarch_port.

    Its command line carries what SSHJob's worker command has (``run_worker_loop_forever`` and
    ``tcp://<address>:<port>``); it listens on the port and prints ``listening`` once it does.
    """
    return (
        f"# run_worker_loop_forever(address='tcp://{STALE_HOST}:{monarch_port}')\n"
        "import socket, time\n"
        f"server = socket.create_server(({STALE_HOST!r}, {monarch_port}))\n"
        "print('listening', flush=True)\n"
        "time.sleep(120)\n"
    )


@pytest.fixture
def stale_worker(monarch_port: int) -> Iterator[subprocess.Popen[str]]:
    """A fake worker of an earlier run: started here, so no sshd among its ancestors (orphan)."""
    dummy = subprocess.Popen(
        [sys.executable, "-c", fake_worker_code(monarch_port)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert dummy.stdout is not None
        assert dummy.stdout.readline() == "listening\n", "the fake stale worker did not start"
        yield dummy
    finally:
        dummy.kill()
        dummy.wait(timeout=DUMMY_TIMEOUT_S)
        if dummy.stdout is not None:
            dummy.stdout.close()


def test_stale_worker_is_stopped_and_its_port_freed(
    ssh_cluster: SshCluster, monarch_port: int, stale_worker: subprocess.Popen[str]
) -> None:
    checks: list[HostCheck] = []

    addresses = run_preflight(
        [STALE_HOST], settings_for(ssh_cluster, monarch_port), on_check=checks.append
    )

    assert addresses == {STALE_HOST: STALE_HOST}
    assert [check.cleaned for check in checks] == [(stale_worker.pid,)]
    assert stale_worker.wait(timeout=DUMMY_TIMEOUT_S) is not None
    with socket.socket() as probe:
        probe.bind((STALE_HOST, monarch_port))  # no SO_REUSEADDR: the port must really be free


def test_stale_worker_is_named_when_cleanup_is_off(
    ssh_cluster: SshCluster, monarch_port: int, stale_worker: subprocess.Popen[str]
) -> None:
    settings = settings_for(ssh_cluster, monarch_port, clean_stale=False)

    with pytest.raises(PreflightError) as caught:
        run_preflight([STALE_HOST], settings)

    failure = only_failure(caught.value)
    assert failure.reason == PORT_IN_USE
    assert (
        f"a Monarch worker of an earlier run (pid {stale_worker.pid}; pre-flight cleanup is off)"
        in (failure.detail)
    )
    assert failure.cleaned == ()
    assert stale_worker.poll() is None


def test_worker_of_a_live_ssh_session_is_never_killed(
    ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # Another launcher's run in progress (another terminal, another user): its worker is still
    # attached to its ssh session. Pre-flight must refuse the port, not kill that run.
    settings = settings_for(ssh_cluster, monarch_port)
    live = subprocess.Popen(
        [
            "ssh",
            *ssh_args(settings.ssh, STALE_HOST),  # -tt: killing it hangs up the remote worker
            STALE_HOST,
            f"{sys.executable} -c {shlex.quote(fake_worker_code(monarch_port))}",
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert live.stdout is not None
        assert live.stdout.readline().strip() == "listening", "the live fake worker did not start"

        with pytest.raises(PreflightError) as caught:
            run_preflight([STALE_HOST], settings)

        failure = only_failure(caught.value)
        assert failure.reason == PORT_IN_USE
        assert "a Monarch worker of a run still attached over ssh" in failure.detail
        assert failure.cleaned == ()
        assert live.poll() is None, "the live run was left alone"
    finally:
        live.kill()
        live.wait(timeout=DUMMY_TIMEOUT_S)
        if live.stdout is not None:
            live.stdout.close()


# -- the loopback rule (field case C3) ---------------------------------------------------------
def test_loopback_host_next_to_a_remote_one_is_flagged() -> None:
    checks = {"a": HostCheck("a", "127.0.1.1"), "b": HostCheck("b", "192.0.2.10")}

    flagged = loopback_failures(checks)

    assert list(flagged) == ["a"]
    assert (flagged["a"].address, flagged["a"].reason) == ("127.0.1.1", LOOPBACK_ADDRESS)


def test_all_loopback_hosts_are_fine() -> None:
    checks = {"a": HostCheck("a", "127.0.0.2"), "b": HostCheck("b", "127.0.1.1")}

    assert loopback_failures(checks) == {}


def test_unresolved_hosts_do_not_count_as_remote() -> None:
    checks = {
        "a": HostCheck("a", "127.0.1.1"),
        "b": HostCheck("b", None, DNS_NOT_RESOLVABLE, "no such name"),
    }

    assert loopback_failures(checks) == {}


def test_preflight_applies_the_loopback_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"a": "127.0.1.1", "b": "192.0.2.10", "c": "192.0.2.11"}
    monkeypatch.setattr(
        preflight, "check_host", lambda host, settings: HostCheck(host, table[host])
    )

    with pytest.raises(PreflightError) as caught:
        run_preflight(list(table), FAKE_SETTINGS)

    assert reasons(caught.value) == {"a": LOOPBACK_ADDRESS}


# -- retries, with a fake per-host check -------------------------------------------------------
def fake_check(
    monkeypatch: pytest.MonkeyPatch, failing: str, reason: str, failures: int
) -> Counter[str]:
    """Make host ``failing`` fail with ``reason`` on its first ``failures`` checks.

    Returns:
        The number of checks per host, updated as run_preflight calls the fake.
    """
    calls: Counter[str] = Counter()

    def check_host(host: str, settings: PreflightSettings) -> HostCheck:
        calls[host] += 1
        if host == failing and calls[host] <= failures:
            return HostCheck(host, None, reason, "fake failure")
        return HostCheck(host, "127.0.0.3")

    monkeypatch.setattr(preflight, "check_host", check_host)
    return calls


def test_host_coming_up_late_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_check(monkeypatch, "b", SSH_UNREACHABLE, failures=2)
    progress: list[tuple[int, int]] = []

    addresses = run_preflight(
        ["a", "b"],
        FAKE_SETTINGS,
        wait_s=10,
        on_progress=lambda ready, total: progress.append((ready, total)),
    )

    assert addresses == {"a": "127.0.0.3", "b": "127.0.0.3"}
    assert progress == [(1, 2), (2, 2)]
    assert calls == {"a": 1, "b": 3}


def test_final_reason_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_check(monkeypatch, "b", SSH_AUTH_FAILED, failures=1_000)

    with pytest.raises(PreflightError) as caught:
        run_preflight(["a", "b"], FAKE_SETTINGS, wait_s=10)

    assert reasons(caught.value) == {"b": SSH_AUTH_FAILED}
    assert calls == {"a": 1, "b": 1}


def test_retrying_stops_once_the_wait_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_check(monkeypatch, "b", SSH_UNREACHABLE, failures=1_000)
    started = time.monotonic()

    with pytest.raises(PreflightError) as caught:
        run_preflight(["a", "b"], FAKE_SETTINGS, wait_s=1)

    waited = time.monotonic() - started
    assert 0.95 <= waited < 5
    assert reasons(caught.value) == {"b": SSH_UNREACHABLE}
    assert calls["a"] == 1 and calls["b"] >= 2
