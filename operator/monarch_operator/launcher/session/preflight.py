"""Pre-flight: before SSHJob starts anything, check every host and say exactly what is wrong.

For every host, in parallel:

1. its name resolves to an IPv4 address (``DNSNotResolvable`` otherwise);
2. the address is not loopback while other hosts are remote (``LoopbackAddress``, field case
   C3: a worker elsewhere could never reach it);
3. sshd answers on the port with an SSH banner (``SSHUnreachable``);
4. ssh checks the host's key (``HostKeyUnknown``, ``HostKeyChanged``: see
   :mod:`launcher.session.ssh`), logs in with our key (``SSHAuthFailed``) and runs the worker
   Python (``PythonNotFound``; ``SSHSessionFailed`` when sshd accepted the key but could not
   start the session, see :mod:`launcher.session.diagnose`), which imports Monarch and the actor
   module (``ImportFailed``), stops Monarch workers of an earlier run still bound to this host's
   worker port, and checks that the port is then free (``PortInUse``, naming the process holding
   it); its torchmonarch, torch, monarch-operator and Python versions must be the launcher's
   (``VersionSkew``, naming each component and both versions: :mod:`.versions`, C27). Only orphaned workers are stopped, those with no sshd process among their ancestors:
   their launcher is gone. A worker still attached to an ssh session may belong to a run in
   progress (another user's, or the same user's in another terminal) and is reported, never
   killed.

Hosts that are still coming up (``DNSNotResolvable``, ``SSHUnreachable``) are retried with
backoff until ``wait_s`` (``--host-wait``) has passed since the last progress (a host became
ready), so a slow first round over many hosts never uses the wait up; the other reasons are
final at once. Monarch itself would only report an attach timeout without naming the host.

At most ``ssh.concurrency`` hosts are checked at once, and an sshd that drops the connection
before login (``MaxStartups``) is asked again with backoff and jitter, up to ``ssh.retries``
times, within the same round (see :mod:`launcher.session.fanout`, field case C28).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from monarch_operator.launcher.session.diagnose import SSH_SESSION_FAILED, session_refused
from monarch_operator.launcher.session.environment import env_prefix, private_env_path
from monarch_operator.launcher.session.fanout import (
    RetryPolicy,
    is_transient_refusal,
    run_on_hosts,
    run_with_retries,
)
from monarch_operator.launcher.session.network import NetworkCheckError, probe_sshd, resolve_host
from monarch_operator.launcher.session import causes, versions
from monarch_operator.launcher.session.ssh import (
    COMMAND_LIMIT_S,
    SshSettings,
    host_key_failure,
    ssh_args,
    ssh_runner,
)
from monarch_operator.launcher.session.stragglers import (
    RunMark,
    ScanReport,
    parse_report,
    preflight_prefix,
)

DNS_NOT_RESOLVABLE = "DNSNotResolvable"
LOOPBACK_ADDRESS = "LoopbackAddress"
SSH_UNREACHABLE = "SSHUnreachable"
SSH_AUTH_FAILED = "SSHAuthFailed"
PYTHON_NOT_FOUND = "PythonNotFound"
IMPORT_FAILED = "ImportFailed"
PORT_IN_USE = "PortInUse"
# The name resolves, but not to the address the host is known to have now (launcher.session.
# dnswait).
DNS_STALE = "DNSStale"
# A host failing for one of these may still be booting: try it again until the wait is over.
RETRYABLE = frozenset({DNS_NOT_RESOLVABLE, SSH_UNREACHABLE, DNS_STALE})

# ssh's own exit status for connection and authentication errors; a shell's for "not found".
_SSH_ERROR = 255
_NOT_FOUND = 127
# Seconds between attempts for hosts still coming up: doubles from the first to the last.
_FIRST_RETRY_S = 0.5
_MAX_RETRY_S = 4.0

# Runs on each host with the worker Python. argv: address, port, clean ("1"/"0"), env file path
# ("-" for none), modules... With an env file path, stdin holds the private variables as JSON.
# Prints one JSON line. Stale workers are found by their command line, which SSHJob writes as
# "...run_worker_loop_forever(address='...tcp://<address>:<port>'...".
_REMOTE_CHECK = r"""
import importlib.util, json, os, re, signal, socket, sys, time
address, port, clean = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
env_file, modules = sys.argv[4], sys.argv[5:]
if env_file != "-":
    path = os.path.expanduser(env_file)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    # Sweep files that a launcher killed between pre-flight and worker start left behind.
    for name in os.listdir(os.path.dirname(path)):
        old = os.path.join(os.path.dirname(path), name)
        try:
            if name.startswith("env-") and time.time() - os.stat(old).st_mtime > 600:
                os.unlink(old)
        except OSError:
            pass
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(sys.stdin.read())
def done(reason=None, detail="", cleaned=()):
    import resource
    # What a worker started in this login inherits (field case C26): locked memory, RDMA.
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    print(json.dumps({"reason": reason, "detail": detail, "cleaned": list(cleaned),
                      "memlock": list(memlock), "infiniband": os.path.isdir("/dev/infiniband"),
                      "versions": fingerprint()}))
    sys.exit(0)
missing = []
for name in modules:
    try:
        found = importlib.util.find_spec(name) is not None
    except ImportError:
        found = False
    if not found:
        missing.append(name)
if missing:
    done("ImportFailed", f"{sys.executable} cannot import {', '.join(missing)}")
bound = re.compile(r"tcp://" + re.escape(address) + ":" + str(port) + r"(?!\d)")
def attached(pid):
    # Whether an sshd process is among the ancestors: the worker's ssh session is still open, so
    # its launcher may be running. An orphan (reparented to init) lost its launcher for good.
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            pid = int(fields[1])
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip().startswith("sshd"):
                    return True
        except (OSError, ValueError, IndexError):
            return False
    return False
def workers():
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        # The worker itself is "<python> -c <code>"; an ssh client carries the same text inside
        # one remote-command argument and must never match.
        code = argv[argv.index("-c") + 1] if "-c" in argv[:-1] else ""
        if "run_worker_loop_forever" in code and bound.search(code):
            found[int(pid)] = attached(int(pid))
    return found
def orphans():
    return [pid for pid, live in workers().items() if not live]
cleaned = []
if clean:
    for pid in orphans():
        try:
            os.kill(pid, signal.SIGTERM)
            cleaned.append(pid)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while orphans() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in orphans():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.2 if cleaned else 0)
probe = socket.socket()
probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    probe.bind((address, port))
except OSError as error:
    holders = workers()
    live = sorted(pid for pid, attached_ in holders.items() if attached_)
    stale = sorted(pid for pid, attached_ in holders.items() if not attached_)
    if live:
        who = ("a Monarch worker of a run still attached over ssh (pid %s); it may be another "
               "launcher's live job: stop that run, or kill the pid if it is abandoned"
               % ", ".join(map(str, live)))
    elif stale:
        who = ("a Monarch worker of an earlier run (pid %s; pre-flight cleanup is off)"
               % ", ".join(map(str, stale)))
    else:
        who = "another process"
    done("PortInUse", f"port {port} on {address} is in use by {who}: {error.strerror}", cleaned)
finally:
    probe.close()
done(None, "", cleaned)
"""


@dataclass(frozen=True)
class HostCheck:
    """The outcome of one host's pre-flight.

    Attributes:
        host: the name as given (hostfile, ``--hosts`` or Slurm).
        address: the IPv4 address it resolved to, or None.
        reason: None when the host is ready, else one of the reason constants of this module.
        detail: a human-readable explanation (ssh's or the OS's own words).
        cleaned: pids of stale Monarch workers stopped on this host.
        survivors: what the scan for processes of earlier runs found and stopped on this host
            (:mod:`launcher.session.stragglers`), or None when it did not run.
        memlock: the login's locked-memory limit ``(soft, hard)`` in bytes, -1 = unlimited
            (what every rank on the host inherits; see :mod:`launcher.session.limits`), or
            None when the remote check did not run.
        infiniband: whether the host has ``/dev/infiniband``.
    """

    host: str
    address: str | None
    reason: str | None = None
    detail: str = ""
    cleaned: tuple[int, ...] = field(default=())
    survivors: ScanReport | None = None
    memlock: tuple[int, int] | None = None
    infiniband: bool = False

    @property
    def ready(self) -> bool:
        """True when every check passed."""
        return self.reason is None

    def describe(self) -> str:
        """One line for reports, e.g. ``b (192.0.2.2): SSHAuthFailed: Permission denied``."""
        shown = self.address and self.address != self.host
        where = f"{self.host} ({self.address})" if shown else self.host
        return f"{where}: {self.reason}: {self.detail}" if self.reason else f"{where}: ready"


class PreflightError(RuntimeError):
    """One or more hosts failed pre-flight; ``failures`` holds each, in host order, and
    ``ready`` the ``{host: address}`` of the hosts that passed. With ``wait_s`` (the host wait,
    seconds) the message says to raise ``--host-wait`` when a host may still be coming up."""

    def __init__(
        self,
        failures: Sequence[HostCheck],
        total: int,
        waited_s: float,
        ready: Mapping[str, str] | None = None,
        wait_s: float | None = None,
    ) -> None:
        self.failures = list(failures)
        self.ready = dict(ready or {})
        listing = "; ".join(check.describe() for check in self.failures)
        hint = ""
        if wait_s is not None and any(check.reason in RETRYABLE for check in self.failures):
            hint = (
                f" (hosts still coming up were retried until {wait_s:g}s passed without "
                "progress; raise --host-wait SECONDS if they need longer)"
            )
        super().__init__(
            f"pre-flight failed on {len(self.failures)} of {total} hosts after "
            f"{waited_s:.1f}s: {listing}{hint}"
        )


@dataclass(frozen=True)
class PreflightSettings:
    """What the remote check needs besides the host list.

    Attributes:
        ssh: login settings.
        python_exe: worker interpreter, the same path on every host.
        monarch_port: the worker port that must be free on every host.
        environment: variables the workers will get (prefix of the remote command).
        private_environment: variables written to each host's private env file (see
            :mod:`launcher.session.environment`), never on a command line.
        run_id: names the private env files of this run.
        modules: modules the worker Python must be able to import.
        clean_stale: stop Monarch workers of an earlier run bound to the worker port.
        ssh_timeout_s: wall limit of one ssh check, seconds.
        tcp_timeout_s: connect and banner limit of the sshd probe, seconds.
        run_mark: this launch's mark; with it, processes that earlier runs left are found (and
            with ``clean_stale`` stopped) before the remote check (see
            :mod:`launcher.session.stragglers`). None: no such scan.
    """

    ssh: SshSettings
    python_exe: str
    monarch_port: int
    environment: Mapping[str, str] = field(default_factory=dict)
    private_environment: Mapping[str, str] = field(default_factory=dict)
    run_id: str = "run"
    modules: tuple[str, ...] = ("monarch",)
    clean_stale: bool = True
    ssh_timeout_s: float = COMMAND_LIMIT_S
    tcp_timeout_s: float = 3.0
    run_mark: RunMark | None = None


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _ssh_failure_reason(stderr: str) -> str:
    lowered = stderr.lower()
    if "could not resolve hostname" in lowered:
        return DNS_NOT_RESOLVABLE
    if "permission denied" in lowered or "too many authentication failures" in lowered:
        return SSH_AUTH_FAILED
    return SSH_UNREACHABLE


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def check_login(host: str, address: str, settings: PreflightSettings) -> HostCheck:
    """Log in to ``address`` over ssh and run the remote check (steps 4 of the module doc).

    Returns:
        The :class:`HostCheck`; never raises for a failing host.
    """
    private = settings.private_environment
    script_args = [
        address,
        str(settings.monarch_port),
        "1" if settings.clean_stale else "0",
        private_env_path(settings.run_id, address) if private else "-",
        *settings.modules,
    ]
    command = preflight_prefix(settings.python_exe, settings.run_mark, settings.clean_stale) + (
        f"{env_prefix(settings.environment)}{shlex.quote(settings.python_exe)} -c "
        f"{shlex.quote(versions.REMOTE_FINGERPRINT + _REMOTE_CHECK)} {shlex.join(script_args)}"
    )
    def attempt() -> tuple[int | None, str]:
        nonlocal result
        result = subprocess.run(
            ["ssh", *ssh_args(settings.ssh, host, tty=False), address, command],
            input=json.dumps(dict(private)) if private else "",
            capture_output=True,
            text=True,
            timeout=settings.ssh_timeout_s,
            check=False,
        )
        return result.returncode, result.stderr

    result: subprocess.CompletedProcess[str] | None = None
    try:
        run_with_retries(attempt, RetryPolicy(retries=settings.ssh.retries))
    except subprocess.TimeoutExpired:
        return HostCheck(
            host, address, SSH_UNREACHABLE, f"no answer within {settings.ssh_timeout_s:g}s"
        )
    assert result is not None
    if result.returncode == _SSH_ERROR:
        refused = host_key_failure(result.stderr, host, settings.ssh)
        if refused is not None:
            return HostCheck(host, address, *refused)
        stderr = _last_line(result.stderr)
        reason = _ssh_failure_reason(stderr)
        if reason == SSH_UNREACHABLE and not is_transient_refusal(_SSH_ERROR, result.stderr):
            # sshd answered the probe; did it accept the key and fail to start the session?
            refused_session = session_refused(host, address, settings.ssh)
            if refused_session is not None:
                return HostCheck(host, address, SSH_SESSION_FAILED, refused_session)
        return HostCheck(host, address, reason, stderr)
    if result.returncode == _NOT_FOUND:
        return HostCheck(
            host, address, PYTHON_NOT_FOUND, f"{settings.python_exe}: {_last_line(result.stderr)}"
        )
    try:
        report = json.loads(_last_line(result.stdout))
    except json.JSONDecodeError:
        return HostCheck(
            host,
            address,
            IMPORT_FAILED,
            f"{settings.python_exe} exited {result.returncode}: {_last_line(result.stderr)}",
        )
    memlock = report.get("memlock")
    reason, detail = report["reason"], report["detail"]
    differences = versions.skew(versions.fingerprint(), report.get("versions") or {})
    if reason is None and differences:
        reason, detail = versions.VERSION_SKEW, versions.describe_skew(differences)
    return HostCheck(
        host,
        address,
        reason,
        detail,
        tuple(report.get("cleaned", ())),
        survivors=parse_report(result.stdout),
        memlock=(int(memlock[0]), int(memlock[1])) if memlock else None,
        infiniband=bool(report.get("infiniband", False)),
    )


def check_host(host: str, settings: PreflightSettings) -> HostCheck:
    """Resolve ``host``, probe its sshd and log in: every per-host check but the loopback rule.

    Returns:
        The :class:`HostCheck`; never raises for a failing host.
    """
    try:
        address = resolve_host(host)
    except NetworkCheckError as error:
        return HostCheck(host, None, DNS_NOT_RESOLVABLE, str(error))
    policy = RetryPolicy(retries=settings.ssh.retries)
    problem = probe_sshd(address, settings.ssh.port, settings.tcp_timeout_s)
    for retry in range(1, policy.retries + 1):
        if problem is None or not _dropped_before_banner(problem):
            break
        time.sleep(policy.delay(retry))
        problem = probe_sshd(address, settings.ssh.port, settings.tcp_timeout_s)
    if problem is not None:
        return HostCheck(host, address, SSH_UNREACHABLE, f"port {settings.ssh.port}: {problem}")
    return check_login(host, address, settings)


def _dropped_before_banner(problem: str) -> bool:
    # What probe_sshd says when sshd accepted and then dropped the connection (MaxStartups):
    # reset, closed without a banner, or "Exceeded MaxStartups" instead of one.
    return "reset by peer" in problem or "b''" in problem or "MaxStartups" in problem


def loopback_failures(checks: Mapping[str, HostCheck]) -> dict[str, HostCheck]:
    """Return hosts that resolved to loopback while others resolved to remote addresses (C3).

    Args:
        checks: ``{host: check}`` for hosts whose address is known.

    Returns:
        ``{host: LoopbackAddress check}``; empty when all or none are loopback.
    """
    resolved = {host: check for host, check in checks.items() if check.address}
    loopback = {host for host, check in resolved.items() if _is_loopback(str(check.address))}
    if not loopback or len(loopback) == len(resolved):
        return {}
    return {
        host: HostCheck(
            host,
            resolved[host].address,
            LOOPBACK_ADDRESS,
            "resolves to a loopback address while other hosts are remote; a worker on another "
            "machine cannot reach it (fix /etc/hosts or DNS, or list a routable address)",
        )
        for host in loopback
    }


def run_preflight(
    hosts: Sequence[str],
    settings: PreflightSettings,
    wait_s: float = 0.0,
    on_progress: Callable[[int, int], None] | None = None,
    on_check: Callable[[HostCheck], None] | None = None,
) -> dict[str, str]:
    """Check every host in parallel, retrying hosts still coming up for up to ``wait_s``.

    Args:
        hosts: host names in plan order (no duplicates).
        settings: see :class:`PreflightSettings`.
        wait_s: how long hosts failing with a retryable reason (``DNSNotResolvable``,
            ``SSHUnreachable``) are retried after the last progress (the end of the first
            round, or of the last round in which a host became ready), seconds; 0 = one
            attempt.
        on_progress: called with ``(ready, total)`` after each round in which the count changed.
        on_check: called with every final :class:`HostCheck` of a ready host (e.g. to report
            cleaned stale workers).

    Returns:
        ``{host: IPv4 address}`` in the order given, once every host is ready.

    Raises:
        PreflightError: listing every host that is not ready, with its reason.
    """
    start = progressed = time.monotonic()
    ready: dict[str, HostCheck] = {}
    pending = list(hosts)
    failures: dict[str, HostCheck] = {}
    delay = _FIRST_RETRY_S
    reported = -1
    workers = min(settings.ssh.concurrency, max(1, len(hosts)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while pending:
            checked = pool.map(lambda h: check_host(h, settings), pending)
            results = dict(zip(pending, checked, strict=True))
            failures = {host: check for host, check in results.items() if not check.ready}
            ready.update({host: check for host, check in results.items() if check.ready})
            if len(ready) != reported:
                progressed = time.monotonic()
                if on_progress is not None:
                    on_progress(len(ready), len(hosts))
            reported = len(ready)
            retryable = [host for host, check in failures.items() if check.reason in RETRYABLE]
            final = len(retryable) < len(failures)
            elapsed = time.monotonic() - progressed
            if not failures or final or elapsed >= wait_s:
                break
            # The last pause is cut short so that one more attempt falls on the deadline itself:
            # a host that comes up just before it must not be reported as down.
            time.sleep(min(delay, wait_s - elapsed))
            delay = min(delay * 2, _MAX_RETRY_S)
            pending = retryable
    known = {**ready, **failures}
    failures.update(loopback_failures(known))
    if failures:
        ordered = [failures[host] for host in hosts if host in failures]
        passed = {host: str(check.address) for host, check in ready.items() if host not in failures}
        raise PreflightError(ordered, len(hosts), time.monotonic() - start, passed, wait_s)
    for host in hosts:
        if on_check is not None:
            on_check(ready[host])
    return {host: str(ready[host].address) for host in hosts}


def remove_private_env_files(
    addresses: Mapping[str, str], settings: PreflightSettings, timeout_s: float | None = None
) -> str | None:
    """Delete this run's private env files on ``addresses`` (``{host: address}``), within the
    ssh limits (:func:`launcher.session.fanout.run_on_hosts`).

    A worker deletes its file when it starts; this covers hosts whose worker never started
    (another host failed pre-flight, attach failed), so no token is left on disk.

    Args:
        addresses: ``{host name: address}``.
        settings: the run's pre-flight settings (login, run id, private variables).
        timeout_s: limit of one attempt on one host, seconds; None: the pre-flight's own
            ``settings.ssh_timeout_s`` (:data:`launcher.session.ssh.COMMAND_LIMIT_S`).

    Returns:
        None when every file is gone (or there were none), else one warning line naming each
        host not reached, why, and the file left there.
    """
    if not settings.private_environment or not addresses:
        return None
    if timeout_s is None:  # the pre-flight's own limit per ssh command
        timeout_s = settings.ssh_timeout_s
    targets = {address: host for host, address in addresses.items()}

    def command(address: str) -> str:
        # run_id is hex and address an IPv4 literal: no quoting issue; "$HOME" instead of "~"
        # because the tilde does not expand inside quotes.
        return f'rm -f -- "{private_env_path(settings.run_id, address).replace("~", "$HOME", 1)}"'

    results = run_on_hosts(
        targets,
        ssh_runner(settings.ssh, command, timeout_s),
        settings.ssh.concurrency,
        RetryPolicy(retries=settings.ssh.retries),
    )
    unreached = {
        host: causes.command_failure(result, timeout_s)
        for host, result in results.items()
        if result.exit_status != 0
    }
    return causes.not_reached(
        "removal of this run's private env files", unreached, len(targets),
        f"delete {private_env_path(settings.run_id, '<address>')} there by hand",
    )
