"""One Monarch session over ssh, shared by role mode and SPMD mode: check hosts, start, tear down.

- :func:`check_hosts` runs the pre-flight (:mod:`launcher.session.preflight`) with progress output.
- :func:`started_job` starts one worker per host with
  :class:`launcher.session.sshjob.LauncherSSHJob`, waits
  until every host mesh is attached (failing at once, naming the host, when a worker dies
  first) and, whatever happens inside, shuts the meshes down and kills the ssh clients.

Monarch is imported only inside these functions, after the plan and the pre-flight passed.
Monarch's client state is process-global (one transport per process), so one process runs one
session at a time.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch_operator import hwerrors
from monarch_operator.launcher import exitcodes, progress, stoprequest, stopsignal
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.attaching import attach_all, wait_workers_up
from monarch_operator.launcher.session.diagnose import SSH_SESSION_FAILED
from monarch_operator.launcher.session.dnswait import DEFAULT_STABLE_S, wait_for_addresses
from monarch_operator.launcher.session.environment import (
    bound_monarch_log,
    private_env_path,
    split_environment,
)
from monarch_operator.launcher.session.fanout import RetryPolicy
from monarch_operator.launcher.session.limits import memlock_lines
from monarch_operator.launcher.session.network import client_address
from monarch_operator.launcher.session.preflight import (
    DNS_NOT_RESOLVABLE,
    PYTHON_NOT_FOUND,
    SSH_AUTH_FAILED,
    SSH_UNREACHABLE,
    HostCheck,
    PreflightError,
    PreflightSettings,
    remove_private_env_files,
    run_preflight,
)
from monarch_operator.launcher.session.ssh import (
    HOST_KEY_CHANGED,
    HOST_KEY_UNKNOWN,
    SshSettings,
    ssh_args,
)
from monarch_operator.launcher.session.stragglers import (
    mark_env,
    run_mark,
    survivor_lines,
)
from monarch_operator.launcher.session.sweep import sweep_lines, sweep_run
from monarch_operator.launcher.session.workerloss import WorkerLost as WorkerLost
from monarch_operator.launcher.session.workerloss import _WorkerWatch

if TYPE_CHECKING:
    from monarch.actor import HostMesh, MeshFailure

    from monarch_operator.launcher.session.sshjob import LauncherSSHJob

# Wall limit for each HostMesh.shutdown() during teardown, seconds.
SHUTDOWN_TIMEOUT_S = 15.0
# How often Monarch checks that procs are alive: a worker dying mid-run is then seen within
# about a second instead of at a call timeout (measured: 8.4 s -> 0.35 s for an exiting proc).
SUPERVISION_POLL = "500ms"
_SUPERVISION_POLL_ENV = "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"
# Monarch's own limit for a worker to answer the attach config push is set this much beyond the
# launcher's attach limit (``attach_timeout_s`` + 5 s, counted after the meshes were created), so
# that the launcher's message, which names the mesh and ``--attach-timeout``, is the one users
# see. Seconds.
MONARCH_ATTACH_MARGIN_S = 15


@dataclass(frozen=True)
class SessionConfig:
    """How to reach the hosts and start workers; shared by both modes.

    Attributes:
        ssh: login settings.
        python_exe: worker interpreter, the same path on every host.
        monarch_port: the port every worker listens on.
        environment: variables set for every worker (see :mod:`launcher.session.environment`).
        client_address: the launcher's Monarch listen address, or None to derive it.
        attach_timeout_s: limit for workers to start and attach, seconds.
        host_wait_s: how long hosts still coming up are retried in pre-flight, seconds.
        clean_stale: stop workers of an earlier run that still hold the worker port.
        modules: modules the worker Python must import (pre-flight ``ImportFailed``).
        run_id: names this session's private env files on the hosts.
        host_addresses: ``{host name: IPv4 address it has now}``; each such name must resolve
            to it for ``dns_stable_s`` seconds before the pre-flight (:mod:`.dnswait`).
        dns_stable_s: see ``host_addresses``, seconds.
        hardware_patterns: output lines that mean a hardware fault
            (:mod:`monarch_operator.hwerrors`).
    """

    ssh: SshSettings
    python_exe: str
    monarch_port: int = 22222
    environment: Mapping[str, str] = field(default_factory=dict)
    client_address: str | None = None
    attach_timeout_s: float = 30.0
    host_wait_s: float = 5.0
    clean_stale: bool = True
    modules: tuple[str, ...] = ("monarch",)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    host_addresses: Mapping[str, str] = field(default_factory=dict)
    dns_stable_s: float = DEFAULT_STABLE_S
    hardware_patterns: tuple[hwerrors.Pattern, ...] = hwerrors.DEFAULT_PATTERNS


class Terminated(BaseException):
    """Raised in the main thread by a signal handler (SIGTERM) so that teardown still runs.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way (ours in
    teardown, or Monarch's) swallows it and lets the launch report success.
    """

    def __init__(self, signal_number: int) -> None:
        super().__init__(stopsignal.describe(signal_number))
        self.exit_code = exitcodes.SIGNAL_BASE + signal_number


def _raise_terminated(signum: int, _frame: Any) -> None:
    # Raise instead of dying so that teardown stops the remote workers (a pod being deleted, or
    # a test's wall timeout, sends SIGTERM). Further signals are only recorded so that they
    # cannot cut the teardown short; SIGKILL remains the hard stop. The first one decides the
    # exit status, whatever the program does with the exception (launcher.stopsignal).
    stopsignal.record(signum)
    if stoprequest.defer(signum):  # the program asked for time to checkpoint first
        return
    signal.signal(signum, _record_only)
    raise Terminated(signum)


def _record_only(signum: int, _frame: Any) -> None:
    stopsignal.record(signum)


def install_termination_handlers() -> Callable[[], None]:
    """Turn SIGTERM, SIGINT and SIGHUP into :class:`Terminated` in the main thread, so teardown
    runs and the exit status is ``128 + signal`` (:mod:`launcher.stopsignal`).

    SIGHUP and SIGINT stay ignored when they already are (``nohup``, a background job of a
    script): a launch started that way must survive the terminal closing. Outside the main
    thread nothing is installed (Python delivers signals to the main thread only).

    Returns:
        A function that puts the previous handlers back.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {number: signal.getsignal(number) for number in stopsignal.STOP_SIGNALS}
    for number, handler in previous.items():
        if handler in (_raise_terminated, _record_only):
            continue
        if number != signal.SIGTERM and handler == signal.SIG_IGN:
            continue
        signal.signal(number, _raise_terminated)

    def restore() -> None:
        for number, handler in previous.items():
            if handler is not None:
                signal.signal(number, handler)

    return restore


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Only record SIGINT, SIGTERM and SIGHUP for the block (teardown): a second Ctrl-C, or a
    SIGTERM after the first, must not cut the teardown short, and one that arrives now still
    decides the exit status (:mod:`launcher.stopsignal`). Ignored signals stay ignored. Main
    thread only; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in stopsignal.STOP_SIGNALS}
    for number, handler in previous.items():
        if handler != signal.SIG_IGN:
            signal.signal(number, _record_only)
    try:
        yield
    finally:
        for number, handler in previous.items():
            if handler is not None:
                signal.signal(number, handler)


class FaultRecorder:
    """Monarch's unhandled-fault hook: records each report instead of exiting the client.

    Monarch's default hook calls ``sys.exit(1)``, which reaches the main thread as a
    KeyboardInterrupt. Returning normally drops the fault, and the call that was waiting on the
    failed mesh raises SupervisionError instead, which the launcher turns into an exit status.
    """

    def __init__(self, reporter: Reporter) -> None:
        self.reports: list[str] = []
        self._reporter = reporter
        # The last lines a host's worker printed (by host name), once its session started: a
        # rank's last words before it failed (:mod:`launcher.programs.failures`).
        self.output_of: Callable[[str], list[str]] | None = None
        self.hardware_patterns: tuple[hwerrors.Pattern, ...] = hwerrors.DEFAULT_PATTERNS

    def __call__(self, failure: MeshFailure) -> None:
        report = failure.report()
        self.reports.append(report)
        if not self._reporter.quiet:  # the final result carries the reason anyway
            self._reporter.warning(f"monarch fault: {one_line(report) or repr(failure)}")


def one_line(text: str, limit: int = 400) -> str:
    """Collapse ``text`` to one line of at most ``limit`` characters (Monarch errors span many)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def preflight_settings(config: SessionConfig) -> PreflightSettings:
    """The pre-flight settings of a session (environment split as in
    :mod:`launcher.session.environment`)."""
    public, private = split_environment(config.environment)
    return PreflightSettings(
        ssh=config.ssh,
        python_exe=config.python_exe,
        monarch_port=config.monarch_port,
        environment=public,
        private_environment=private,
        run_id=config.run_id,
        modules=config.modules,
        clean_stale=config.clean_stale,
        run_mark=run_mark(config.run_id, os.environ),
    )


def check_hosts(config: SessionConfig, hosts: Sequence[str], reporter: Reporter) -> dict[str, str]:
    """Run the pre-flight on ``hosts``, printing ``hosts ready k/n`` and cleaned stale workers.

    Returns:
        ``{host: IPv4 address}`` in the order given.

    Raises:
        monarch_operator.launcher.session.preflight.PreflightError: naming each failing host and
        reason.
    """
    settings = preflight_settings(config)

    checked: list[HostCheck] = []

    def report_cleaned(check: HostCheck) -> None:
        checked.append(check)
        for line in survivor_lines(check.host, check.survivors, stopping=config.clean_stale):
            reporter.warning(line)
        if check.cleaned:
            pids = ", ".join(str(pid) for pid in check.cleaned)
            reporter.warning(
                f"stopped stale Monarch worker(s) of an earlier run on {check.host} "
                f"port {config.monarch_port}: pid {pids}"
            )

    if config.host_addresses:
        reporter.progress(
            f"checking that {len(config.host_addresses)} host name(s) resolve to their "
            "current address"
        )
        patience = max(config.host_wait_s, config.dns_stable_s)

        def report_mismatch(name: str, seen: str | None, expected: str) -> None:
            answer = f"resolves to {seen}" if seen else "does not resolve"
            reporter.progress(
                f"{name} {answer}, not to {expected} yet (a resolver's cached record): waiting "
                f"up to {patience:g}s for it, then {config.dns_stable_s:g}s of the right answer")

        wait_for_addresses(config.host_addresses, config.dns_stable_s, config.host_wait_s,
                           on_mismatch=report_mismatch)
    try:
        addresses = run_preflight(
            hosts, settings, config.host_wait_s, reporter.hosts_ready, on_check=report_cleaned
        )
        summary, warning = memlock_lines(checked, config.environment)
        if summary is not None:
            reporter.progress(summary)
        if warning is not None:
            reporter.warning(warning)
        return addresses
    except PreflightError as error:
        # Hosts that got as far as the remote check hold this run's private env file.
        unreached = {DNS_NOT_RESOLVABLE, SSH_UNREACHABLE, SSH_AUTH_FAILED, PYTHON_NOT_FOUND,
                     HOST_KEY_UNKNOWN, HOST_KEY_CHANGED, SSH_SESSION_FAILED}
        reached = dict(error.ready) | {
            check.host: check.address
            for check in error.failures
            if check.address and check.reason not in unreached
        }
        left = remove_private_env_files(reached, settings)
        if left is not None:
            reporter.warning(left)
        raise


def install_fault_hook(recorder: FaultRecorder) -> None:
    """Make Monarch report faults to ``recorder`` and poll proc liveness every 500 ms.

    Also bounds Monarch's log file (:func:`launcher.session.environment.bound_monarch_log`); this
    is the launcher's first Monarch import, and Monarch reads its log settings then.
    """
    os.environ.setdefault(_SUPERVISION_POLL_ENV, SUPERVISION_POLL)
    bound_monarch_log(os.environ)
    import monarch.actor

    monarch.actor.unhandled_fault_hook = recorder


@contextmanager
def started_job(
    config: SessionConfig,
    meshes: Sequence[tuple[str, Sequence[str]]],
    addresses: Mapping[str, str],
    reporter: Reporter,
    recorder: FaultRecorder | None = None,
) -> Iterator[dict[str, HostMesh]]:
    """Start one worker per host over ssh; yield ``{mesh name: HostMesh}`` once all attached.

    Args:
        config: the session settings.
        meshes: ``(mesh name, host names)`` pairs; no host in two meshes.
        addresses: ``{host name: IPv4 address}`` from :func:`check_hosts`.
        reporter: for progress lines and teardown warnings.
        recorder: gets the workers' output tails and ``config.hardware_patterns`` (a failed
            rank's last words are checked for a hardware fault).

    Raises:
        Whatever Monarch raises while attaching (e.g. TimeoutError); teardown has run by then.
    """
    from monarch.config import configure

    from monarch_operator.launcher.session.sshjob import LauncherSSHJob

    # SSHJob logs "Applying current job" and the like at INFO; the launcher reports its own.
    logging.getLogger("monarch._src.job.job").setLevel(logging.WARNING)

    public, private = split_environment(config.environment)
    names = {address: host for host, address in addresses.items()}
    job = LauncherSSHJob(
        python_exe=config.python_exe,
        ssh_args=lambda address: ssh_args(config.ssh, names.get(address, address), tty=False),
        monarch_port=config.monarch_port,
        # The run's mark: every process the worker starts inherits it (launcher.session.stragglers).
        environment={**public, **mark_env(run_mark(config.run_id, os.environ))},
        stdout=reporter.worker_stream,
        private_env_file=(functools.partial(private_env_path, config.run_id) if private else None),
        concurrency=config.ssh.concurrency,
        retry_policy=RetryPolicy(retries=config.ssh.retries),
        on_retry=lambda address, retry, _: reporter.progress(
            f"ssh to {names.get(address, address)} refused at login, retry {retry}"
        ),
    )
    # Must follow SSHJob(), which enables the hostname-based tcp transport; that transport panics
    # when the hostname resolves only to loopback, and enabling another one before SSHJob() is
    # refused ("Only one transport type may be enabled").
    if recorder is not None:
        recorder.hardware_patterns = config.hardware_patterns
        recorder.output_of = lambda host: job.output_tail(addresses.get(host, host))
    host_meshes: dict[str, HostMesh] = {}
    watch = _WorkerWatch(job, names, config.ssh)
    try:
        listen = config.client_address or client_address(addresses.values())
        configure(default_transport=listen)
        push_limit = max(1, round(config.attach_timeout_s + MONARCH_ATTACH_MARGIN_S))
        configure(mesh_attach_config_timeout=f"{push_limit}s")
        for name, hosts in meshes:
            job.add_mesh(name, [addresses[host] for host in hosts])
        job.apply()  # one worker per host, over ssh
        wait_workers_up(job, meshes, addresses, config.attach_timeout_s, names)
        reporter.progress(f"workers up on {len(addresses)} hosts")
        seen = len(recorder.reports) if recorder is not None else 0

        def faults() -> list[str]:  # Monarch's fault reports since the attach began
            return recorder.reports[seen:] if recorder is not None else []

        # cached_path=None: do not pickle the job into ./.monarch, where a later launch in the
        # same directory would silently re-attach to these workers.
        state = job.state(cached_path=None)
        for name, _ in meshes:
            host_meshes[name] = getattr(state, name)
        attach_all(job, host_meshes, config.attach_timeout_s, names, faults, reporter)
        watch.start()
        yield host_meshes
    finally:
        watch.stop()
        if stopsignal.received() is not None:
            # Stopped from outside because the MonarchJob is being deleted? Its workers go
            # with it: shutting their meshes down would only wait out SHUTDOWN_TIMEOUT_S each,
            # past the pod's grace period (issue 32). Then the launcher ends here.
            progress.end_if_job_gone()
        # Workers lost mid-run or dead before they attached: their meshes cannot shut down.
        lost = set(job.exited_ssh())
        reachable = {
            name: mesh
            for name, mesh in host_meshes.items()
            if not lost & {addresses[host] for host in dict(meshes)[name]}
        }
        teardown(job, reachable, reporter)
        # Workers delete their env file when they start; one that never started left it.
        left = remove_private_env_files(addresses, preflight_settings(config))
        if left is not None:
            reporter.warning(left)
        stop_leftovers(config, addresses, reporter)
        reporter.progress("torn down")


def stop_leftovers(
    config: SessionConfig, addresses: Mapping[str, str], reporter: Reporter
) -> None:
    """End every process of this run still alive on any host (those that left the worker's
    session or ignored its signals), naming each one, and in one line every host that could
    not be swept and why; see :mod:`launcher.session.sweep`."""
    mark = run_mark(config.run_id, os.environ)
    with signals_deferred():
        result = sweep_run(addresses, config.ssh, config.python_exe, mark)
    for line in sweep_lines(result):
        reporter.warning(line)


def teardown(job: LauncherSSHJob, host_meshes: Mapping[str, HostMesh], reporter: Reporter) -> None:
    """Shut down each distinct host mesh (ends the remote workers), then kill the ssh clients.

    Meshes with a lost worker are left out by the caller: their shutdown could only time out.

    ``job.kill()`` runs even if a shutdown is interrupted: killing the ssh client closes the
    session, and the session guard then stops the remote worker and its processes, so it is
    the backstop for a worker shutdown missed.
    """
    stoprequest.finish()  # a checkpoint deadline still pending has nothing left to stop
    with signals_deferred():
        try:
            for name, host_mesh in host_meshes.items():
                try:
                    host_mesh.shutdown().get(timeout=SHUTDOWN_TIMEOUT_S)
                except Exception as error:  # noqa: BLE001 - go on with the other meshes
                    reporter.warning(f"shutdown of mesh {name} failed: {one_line(str(error))}")
        finally:
            job.kill()
            sys.stdout.flush()
