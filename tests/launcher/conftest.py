"""Fixtures for launcher tests: an SSH "cluster" on loopback and a leak check per test.

``ssh_cluster`` starts one real sshd per address 127.0.0.2, .3 and .4 (Linux routes all of
127.0.0.0/8 to ``lo``, so no interface setup is needed), all on one free port, with a generated
host key and client key. It needs root (sshd must switch to the login user) and
``/usr/sbin/sshd``: without them the fixture fails when ``CI`` is set and skips otherwise.

``monarch_port`` hands each test a fresh free port for the Monarch workers and afterwards kills,
and fails the test on, any process whose command line still mentions ``:<port>``: a leaked ssh
client or an orphaned worker would break the next job on that port.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSH_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SSHD = "/usr/sbin/sshd"

_SSHD_CONFIG = """\
ListenAddress {address}:{port}
HostKey {dir}/host_key
PidFile {dir}/sshd-{address}.pid
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# The Debian default is PAM; without a PAM session config here it would refuse logins.
UsePAM no
# The keys live under pytest's tmp dir; StrictModes rejects world-writable parents like /tmp.
StrictModes no
UseDNS no
X11Forwarding no
PrintMotd no
"""


@dataclass(frozen=True)
class SshCluster:
    """The running loopback sshd daemons: their addresses, the shared port and client key."""

    hosts: tuple[str, ...]
    port: int
    key: Path
    state_dir: Path


def _unavailable(reason: str) -> None:
    message = f"ssh cluster unavailable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(message)


def free_port(hosts: tuple[str, ...]) -> int:
    """Return a TCP port that is free on every address in ``hosts`` right now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        if all(_can_bind(host, port) for host in hosts[1:]):
            return port
    raise RuntimeError(f"no common free port on {hosts}")


def _can_bind(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _wait_listening(host: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"sshd on {host}:{port} exited {process.returncode}: {log.read_text()}")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"sshd on {host}:{port} not listening after 10 s: {log.read_text()}")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """Three sshd daemons on 127.0.0.2-4, one shared free port, key-only root login."""
    if not Path(SSHD).is_file():
        _unavailable(f"{SSHD} not found (apt-get install openssh-server)")
    if os.geteuid() != 0:
        _unavailable("needs root: sshd must switch to the login user")
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        _unavailable("ssh or ssh-keygen not on PATH (apt-get install openssh-client)")
    state_dir = tmp_path_factory.mktemp("ssh")
    # Debian's sshd refuses to start without its privilege separation directory.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    _keygen(state_dir / "host_key")
    _keygen(state_dir / "id")
    shutil.copy(state_dir / "id.pub", state_dir / "authorized_keys")
    port = free_port(SSH_HOSTS)
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for address in SSH_HOSTS:
            config = state_dir / f"sshd-{address}.conf"
            config.write_text(_SSHD_CONFIG.format(address=address, port=port, dir=state_dir))
            log = state_dir / f"sshd-{address}.log"
            with log.open("wb") as log_file:
                daemon = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            daemons.append(daemon)
            _wait_listening(address, port, daemon, log)
        yield SshCluster(hosts=SSH_HOSTS, port=port, key=state_dir / "id", state_dir=state_dir)
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=5)


def _processes_mentioning(needle: str) -> list[tuple[int, str]]:
    listing = subprocess.run(
        ["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in listing.splitlines():
        pid_text, _, args = line.strip().partition(" ")
        if needle in args and int(pid_text) != os.getpid():
            found.append((int(pid_text), args))
    return found


@pytest.fixture
def monarch_port(ssh_cluster: SshCluster) -> Iterator[int]:
    """A fresh free Monarch worker port; after the test, no process may still use it."""
    port = free_port(ssh_cluster.hosts)
    yield port
    # Teardown is asynchronous on the remote side (sshd hangs up the worker); give it a moment.
    deadline = time.monotonic() + 5
    strays = _processes_mentioning(f":{port}")
    while strays and time.monotonic() < deadline:
        time.sleep(0.25)
        strays = _processes_mentioning(f":{port}")
    for pid, _ in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if strays:
        listing = "\n".join(f"  {pid} {args}" for pid, args in strays)
        pytest.fail(f"processes left on monarch port {port} (killed):\n{listing}", pytrace=False)
