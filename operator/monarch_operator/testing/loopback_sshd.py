"""An SSH "cluster" on one machine: real sshd daemons on loopback addresses, all on one port.

Linux routes all of 127.0.0.0/8 to ``lo``, so 127.0.0.2, 127.0.0.3, ... are distinct hosts to
ssh and to Monarch without any interface setup. :class:`LoopbackSshd` starts sshd daemons on
``count`` of them with a generated host key and client key and key-only root login: one daemon
per address, or ``daemons`` daemons sharing the addresses (many hosts behind few sshd, field case
C28; one sshd listens on at most 16 addresses). The daemons keep OpenSSH's defaults, such as
``MaxStartups 10:30:100``, unless told otherwise, and send the worker image's keepalives. It
needs root (sshd must switch to the login user), ``/usr/sbin/sshd`` and ``ssh-keygen``, and
raises :class:`SshdUnavailable` naming what is missing.

Also here: :func:`free_port` (one port free on every address, as SSHJob's workers all use the
same ``monarch_port``) and :func:`reap_processes_mentioning`, the leak check that kills any ssh
client or Monarch worker still holding a port after a job.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from monarch_operator.localcluster import ports
from monarch_operator.localcluster.orphans import stop_with_parent

SSHD = "/usr/sbin/sshd"
# 127.0.0.1 is left alone: the machine's own services and hostname live there.
FIRST_HOST_OCTET = 2
MAX_HOSTS = 64
# How long one sshd may take to accept connections after it is started, seconds.
_LISTEN_TIMEOUT_S = 10.0
# How long a terminated sshd may take to exit before it is killed, seconds.
_STOP_GRACE_S = 5.0

# sshd's limit on listen addresses (MAX_LISTEN_SOCKS in OpenSSH's sshd.c).
MAX_ADDRESSES_PER_DAEMON = 16

_SSHD_CONFIG = """\
{listen}
HostKey {dir}/host_key
PidFile {dir}/sshd-{address}.pid
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# The Debian default is PAM; without a PAM session config here it would refuse logins.
UsePAM no
# The keys live under a tmp dir; StrictModes rejects world-writable parents like /tmp.
StrictModes no
UseDNS no
X11Forwarding no
PrintMotd no
# As the worker image (images/worker/entrypoint.sh): a silent client is dropped after 60 s.
ClientAliveInterval 15
ClientAliveCountMax 4
# A session's shell skips the login user's ~/.bashrc, as on the worker image, whose user has
# none: bash reads it when started by sshd only as a top-level shell (SHLVL below 2). This
# machine's root ~/.bashrc runs `pyenv init` and `pyenv rehash`, about 50 processes and 0.16 s
# of CPU per session; a launch opens 8-12 sessions. A Match block's own SetEnv replaces this.
SetEnv SHLVL=1
{extra}"""


class SshdUnavailable(RuntimeError):
    """This machine cannot run the loopback cluster; the message says what is missing."""


class SshdStartError(RuntimeError):
    """An sshd exited or did not listen in time; the message quotes its log."""


@dataclass(frozen=True)
class SshCluster:
    """The running loopback sshd daemons: their addresses, the shared port and client key.

    Attributes:
        hosts: the sshd addresses, ``("127.0.0.2", ...)``.
        port: the sshd port, the same on every address.
        key: the client's private key file; log in as root with it.
        state_dir: configs, keys, pid files and one log per daemon.
        known_hosts: pins the daemons' host key (one for all) for every address, as ssh looks
            them up (``[127.0.0.2]:<port>``); give it to ``--known-hosts``.
    """

    hosts: tuple[str, ...]
    port: int
    key: Path
    state_dir: Path
    known_hosts: Path


def loopback_hosts(count: int) -> tuple[str, ...]:
    """Return the first ``count`` (1 to :data:`MAX_HOSTS`) addresses from 127.0.0.2 on."""
    if not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"host count must be 1 to {MAX_HOSTS}, got {count}")
    return tuple(f"127.0.0.{FIRST_HOST_OCTET + index}" for index in range(count))


def free_port(hosts: tuple[str, ...]) -> int:
    """Return a TCP port from :data:`~monarch_operator.localcluster.ports.TEST_PORTS` (below the
    kernel's ephemeral range, apart from the local clusters' ports) that is free on every
    address right now, so on ``hosts`` too (:func:`monarch_operator.localcluster.ports.free_port`).

    Raises:
        RuntimeError: no such port was found.
    """
    return ports.free_port(hosts, ports.TEST_PORTS)


def check_prerequisites() -> None:
    """Raise :class:`SshdUnavailable` unless sshd, ssh, ssh-keygen and root are all here."""
    if not Path(SSHD).is_file():
        raise SshdUnavailable(f"{SSHD} not found (apt-get install openssh-server)")
    if os.geteuid() != 0:
        raise SshdUnavailable("needs root: sshd must switch to the login user")
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        raise SshdUnavailable("ssh or ssh-keygen not on PATH (apt-get install openssh-client)")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _wait_listening(host: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _LISTEN_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SshdStartError(
                f"sshd on {host}:{port} exited {process.returncode}: {log.read_text()}"
            )
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SshdStartError(
        f"sshd on {host}:{port} not listening after {_LISTEN_TIMEOUT_S:g} s: {log.read_text()}"
    )


class LoopbackSshd:
    """sshd daemons serving ``count`` hosts on 127.0.0.2 onwards, sharing one free port.

    Use as a context manager (``with LoopbackSshd(3, tmp) as cluster:``) or call :meth:`start`
    and :meth:`stop` yourself; :meth:`stop` is safe to call more than once. The daemons also
    end (SIGTERM) when the thread that started them does, teardown or not
    (:func:`monarch_operator.localcluster.orphans.stop_with_parent`), so start them from one
    that lives as long as they should.
    """

    def __init__(
        self,
        count: int,
        state_dir: Path,
        daemons: int | None = None,
        extra_config: str = "",
        memlock_bytes: int | None = None,
    ) -> None:
        """Args:
        count: number of hosts, 1 to :data:`MAX_HOSTS`.
        state_dir: an existing directory for keys, configs, pid files and sshd logs.
        daemons: how many sshd serve the hosts, each a contiguous share of at most
            :data:`MAX_ADDRESSES_PER_DAEMON`; None = one per host.
        extra_config: sshd_config lines added to every daemon's config.
        memlock_bytes: the daemons' locked-memory limit (soft and hard), as a service manager's
            ``LimitMEMLOCK=`` sets it; sessions inherit it. None = this process's.
        """
        self.hosts = loopback_hosts(count)
        self.state_dir = Path(state_dir)
        groups = count if daemons is None else daemons
        if not 1 <= groups <= count:
            raise ValueError(f"daemons must be 1 to {count}, got {groups}")
        share = -(-count // groups)
        if share > MAX_ADDRESSES_PER_DAEMON:
            raise ValueError(
                f"{count} hosts on {groups} daemons is {share} addresses per sshd; "
                f"sshd listens on at most {MAX_ADDRESSES_PER_DAEMON}"
            )
        self.groups = [self.hosts[i : i + share] for i in range(0, count, share)]
        self._extra_config = extra_config
        self._memlock_bytes = memlock_bytes
        self._daemons: list[subprocess.Popen[bytes]] = []

    def start(self) -> SshCluster:
        """Generate keys, start every sshd and wait until each accepts connections.

        Returns:
            The running cluster.

        Raises:
            SshdUnavailable: a prerequisite is missing (see :func:`check_prerequisites`).
            SshdStartError: a daemon exited or did not listen within 10 s; the daemons already
                started are stopped again.
        """
        check_prerequisites()
        # Debian's sshd refuses to start without its privilege separation directory.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        _keygen(self.state_dir / "host_key")
        _keygen(self.state_dir / "id")
        shutil.copy(self.state_dir / "id.pub", self.state_dir / "authorized_keys")
        port = free_port(self.hosts)
        known_hosts = self.state_dir / "known_hosts"
        names = ",".join(f"[{address}]:{port}" for address in self.hosts)
        known_hosts.write_text(f"{names} {(self.state_dir / 'host_key.pub').read_text()}")
        try:
            for group in self.groups:
                self._daemons.append(self._start_daemon(group, port))
            for group, daemon in zip(self.groups, self._daemons, strict=True):
                for address in group:
                    _wait_listening(address, port, daemon, self._log(group[0]))
        except BaseException:
            self.stop()
            raise
        return SshCluster(
            hosts=self.hosts,
            port=port,
            key=self.state_dir / "id",
            state_dir=self.state_dir,
            known_hosts=known_hosts,
        )

    def _log(self, address: str) -> Path:
        return self.state_dir / f"sshd-{address}.log"

    def _start_daemon(self, addresses: tuple[str, ...], port: int) -> subprocess.Popen[bytes]:
        first = addresses[0]
        config = self.state_dir / f"sshd-{first}.conf"
        listen = "\n".join(f"ListenAddress {address}:{port}" for address in addresses)
        config.write_text(
            _SSHD_CONFIG.format(
                listen=listen, address=first, dir=self.state_dir, extra=self._extra_config
            )
        )
        memlock = self._memlock_bytes
        # A test run stopped without its teardown (SIGINT to pytest-xdist's main process, which
        # ends its workers, or SIGKILL) used to leave these daemons running.
        die_with_owner = stop_with_parent(signal.SIGTERM)

        def prepare() -> None:
            die_with_owner()
            if memlock is not None:
                resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, memlock))

        with self._log(first).open("wb") as log_file:
            return subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=prepare,
            )

    @property
    def daemon_pids(self) -> dict[str, int]:
        """``{host address: pid of the sshd daemon serving it}`` while running."""
        return {
            address: daemon.pid
            for group, daemon in zip(self.groups, self._daemons, strict=False)
            for address in group
        }

    def stop(self) -> None:
        """Terminate every daemon this instance started, wait, and kill any that lingers."""
        daemons, self._daemons = self._daemons, []
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=_STOP_GRACE_S)

    def __enter__(self) -> SshCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def processes_mentioning(needle: str) -> list[tuple[int, str]]:
    """Return ``(pid, command line)`` of every process whose arguments contain ``needle``.

    The calling process is left out. Reads ``/proc/<pid>/cmdline`` in full: ``ps`` cuts long
    command lines (an ssh client's remote command with its ``env K=V ...`` prefix is long), and
    a needle past the cut would go unseen.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        args = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if needle in args:
            found.append((int(entry.name), args))
    return found


def reap_processes_mentioning(needle: str, grace_s: float = 5.0) -> list[tuple[int, str]]:
    """Wait up to ``grace_s`` seconds for processes mentioning ``needle`` to go, then kill them.

    Use it with ``needle=f":{monarch_port}"`` after a job: remote teardown is asynchronous (sshd
    hangs up the worker), but anything left after the grace is a leaked ssh client or an
    orphaned worker that would hold the port and break the next job on it.

    Returns:
        The ``(pid, command line + process facts)`` of each process still there after the grace
        and therefore sent SIGKILL; empty when nothing leaked. The facts (:func:`process_facts`)
        are read before the SIGKILL: they tell a leak from a process that is slow to die.
    """
    deadline = time.monotonic() + grace_s
    strays = processes_mentioning(needle)
    while strays and time.monotonic() < deadline:
        time.sleep(0.25)
        strays = processes_mentioning(needle)
    described = [(pid, f"{args} [{process_facts(pid)}]") for pid, args in strays]
    for pid, _ in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return described


def process_facts(pid: int) -> str:
    """What ``/proc`` says of ``pid`` for a leak report: its state, parent, age in seconds,
    and its pending, blocked and ignored signal masks (hex, proc(5)); ``gone`` if it ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return "gone"
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    state, ppid, start_ticks = fields[0], fields[1], int(fields[19])
    age_s = uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    masks = {
        key: value.strip()
        for key, _, value in (line.partition(":") for line in status)
        if key in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn")
    }
    listed = " ".join(f"{key}={value}" for key, value in masks.items())
    return f"state={state} ppid={ppid} age={age_s:.1f}s {listed}"
