"""One launch, as a checklist: plan, check hosts, start the SSHJob, run the workload, tear down.

:func:`launch` never raises for an expected failure; it prints ``monarch-launch: failed:
<reason>`` on stderr and returns the exit status from :mod:`.exitcodes`. Monarch is imported
only here and in :mod:`.workload`, and only once the plan and host checks have passed.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monarch_operator.hostfile import HostfileError, read_hostfile
from monarch_operator.launcher import exitcodes
from monarch_operator.launcher.network import (
    check_ssh_reachable,
    client_address,
    resolve_hosts,
)
from monarch_operator.launcher.placement import (
    REF,
    TRAINER,
    PlacementError,
    Plan,
    RolePlan,
    format_plan,
    plan_placement,
)
from monarch_operator.launcher.ssh import SshSettings, preflight, ssh_args

if TYPE_CHECKING:
    from monarch._src.job.job import SSHJob
    from monarch.actor import HostMesh, MeshFailure

# Wall limit for each HostMesh.shutdown() during teardown, seconds.
SHUTDOWN_TIMEOUT_S = 15.0
# Label of the per-host proc dimension; Monarch's SPMD helpers treat the last label as local rank.
PROCS_LABEL = "gpus"


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one launch needs; built by the CLI from flags and environment."""

    hostfile: str
    ssh: SshSettings
    python_exe: str
    trainer_hosts: int | None = None
    ref_hosts: int | None = None
    colocate: bool = False
    monarch_port: int = 22222
    client_address: str | None = None
    steps: int = 3
    attach_timeout_s: float = 30.0
    call_timeout_s: float = 120.0
    fail_at_step: int = 0
    fail_exit_code: int = 1


class Terminated(BaseException):
    """Raised in the main thread by a signal handler (SIGTERM) so that teardown still runs.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way (ours in
    teardown, or Monarch's) swallows it and lets the launch report success.
    """

    def __init__(self, signal_number: int) -> None:
        super().__init__(f"terminated by signal {signal_number}")
        self.exit_code = exitcodes.SIGNAL_BASE + signal_number


class _FaultRecorder:
    """Monarch's unhandled-fault hook: records each report instead of exiting the client.

    Monarch's default hook calls ``sys.exit(1)``, which reaches the main thread as a
    KeyboardInterrupt. Returning normally drops the fault, and the call that was waiting on the
    failed mesh raises SupervisionError instead, which the launcher turns into an exit status.
    """

    def __init__(self) -> None:
        self.reports: list[str] = []

    def __call__(self, failure: MeshFailure) -> None:
        report = failure.report()
        self.reports.append(report)
        summary = _one_line(report) or repr(failure)
        print(f"monarch-launch: monarch fault: {summary}", file=sys.stderr, flush=True)


def _emit(line: str) -> None:
    print(line, flush=True)


class _Progress:
    """Prints ``monarch-launch: <phase> (+<seconds since start>s)`` lines: where the time goes."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def __call__(self, phase: str) -> None:
        _emit(f"monarch-launch: {phase} (+{time.monotonic() - self._start:.1f}s)")


def _one_line(text: str, limit: int = 400) -> str:
    """Collapse ``text`` to one line of at most ``limit`` characters (Monarch errors span many)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _fail(reason: str, code: int) -> int:
    print(f"monarch-launch: failed: {reason}", file=sys.stderr, flush=True)
    return code


def launch(config: LaunchConfig) -> int:
    """Run one launch end to end and return the process exit status.

    Args:
        config: the launch settings.

    Returns:
        0 on success, else the status defined in :mod:`.exitcodes`.
    """
    try:
        plan = plan_placement(
            read_hostfile(config.hostfile), config.trainer_hosts, config.ref_hosts, config.colocate
        )
    except (HostfileError, PlacementError, OSError) as error:
        return _fail(str(error), exitcodes.USAGE)
    progress = _Progress()
    for line in format_plan(plan):
        _emit(line)
    recorder = _FaultRecorder()
    try:
        addresses = resolve_hosts(host for mesh in plan.meshes for host in mesh.hosts)
        check_ssh_reachable(addresses, config.ssh.port)
        preflight(addresses, config.ssh, config.python_exe)
        progress(f"ssh and {config.python_exe} ok on {len(addresses)} hosts")
        _run_on_monarch(config, plan, addresses, recorder, progress)
    except Terminated as error:
        return _fail(str(error), error.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", exitcodes.SIGNAL_BASE + signal.SIGINT)
    except Exception as error:  # noqa: BLE001 - every failure becomes a reported exit status
        reason = _one_line(f"{type(error).__name__}: {error}")
        return _fail(reason, exitcodes.exit_code_for_failure([*recorder.reports, str(error)]))
    _emit("monarch-launch: succeeded")
    return exitcodes.SUCCESS


def _run_on_monarch(
    config: LaunchConfig,
    plan: Plan,
    addresses: dict[str, str],
    recorder: _FaultRecorder,
    progress: _Progress,
) -> None:
    """Start the job, attach the host meshes, spawn both roles and run the workload."""
    import monarch.actor

    from monarch_operator.launcher import workload

    monarch.actor.unhandled_fault_hook = recorder
    with _started_job(config, plan, addresses, progress) as host_meshes:
        trainer_procs = _spawn_procs(host_meshes, plan.trainer)
        ref_procs = _spawn_procs(host_meshes, plan.ref)
        trainer = trainer_procs.spawn(
            TRAINER, workload.Trainer, config.fail_at_step, config.fail_exit_code
        )
        ref = ref_procs.spawn(REF, workload.Reference)
        _print_ranks(TRAINER, trainer, config.call_timeout_s)
        _print_ranks(REF, ref, config.call_timeout_s)
        _prepare_workload(trainer, ref, plan, addresses, config.call_timeout_s)
        progress("workload ready")
        for result in workload.run_steps(trainer, ref, config.steps, config.call_timeout_s):
            _emit(f"step {result.step}/{config.steps} loss={result.loss:.4f} kl={result.kl:.6f}")


@contextmanager
def _started_job(
    config: LaunchConfig, plan: Plan, addresses: dict[str, str], progress: _Progress
) -> Iterator[dict[str, HostMesh]]:
    """Start workers over ssh, yield ``{mesh name: HostMesh}`` once attached; always tear down."""
    from monarch._src.job.job import SSHJob
    from monarch.config import configure

    job = SSHJob(
        python_exe=config.python_exe,
        ssh_args=ssh_args(config.ssh),
        monarch_port=config.monarch_port,
    )
    # Must follow SSHJob(), which enables the hostname-based tcp transport; that transport panics
    # when the hostname resolves only to loopback, and enabling another one before SSHJob() is
    # refused ("Only one transport type may be enabled").
    listen = config.client_address or client_address(addresses.values())
    configure(default_transport=listen)
    configure(mesh_attach_config_timeout=f"{max(1, round(config.attach_timeout_s))}s")
    for mesh in plan.meshes:
        job.add_mesh(mesh.name, [addresses[host] for host in mesh.hosts])
    host_meshes: dict[str, HostMesh] = {}
    try:
        # cached_path=None: do not pickle the job into ./.monarch, where a later launch in the
        # same directory would silently re-attach to these workers.
        state = job.state(cached_path=None)
        for mesh in plan.meshes:
            host_meshes[mesh.name] = getattr(state, mesh.name)
        for name, host_mesh in host_meshes.items():
            host_mesh.initialized.get(timeout=config.attach_timeout_s + 5)
            progress(f"mesh {name} attached")
        yield host_meshes
    finally:
        _teardown(job, host_meshes)
        progress("torn down")


def _teardown(job: SSHJob, host_meshes: dict[str, HostMesh]) -> None:
    """Shut down each distinct host mesh (ends the remote workers), then kill the ssh clients.

    ``job.kill()`` runs even if a shutdown is interrupted: with ``ssh -tt`` killing the ssh
    client hangs up the remote worker, so it is the backstop for a worker shutdown missed.
    """
    try:
        for name, host_mesh in host_meshes.items():
            try:
                host_mesh.shutdown().get(timeout=SHUTDOWN_TIMEOUT_S)
            except Exception as error:  # noqa: BLE001 - go on with the other meshes
                summary = _one_line(str(error))
                print(
                    f"monarch-launch: warning: shutdown of mesh {name} failed: {summary}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        job.kill()


def _spawn_procs(host_meshes: dict[str, HostMesh], role: RolePlan) -> Any:
    return host_meshes[role.mesh].spawn_procs(
        per_host={PROCS_LABEL: role.procs_per_host}, name=role.role
    )


def _print_ranks(role: str, actors: Any, timeout_s: float) -> None:
    infos = sorted(actors.whoami.call().get(timeout=timeout_s).values(), key=lambda i: i.rank)
    for info in infos:
        _emit(
            f"{role} rank {info.rank}/{info.world_size} host={info.host} pid={info.pid} "
            f"ssh={info.ssh_address}"
        )


def _prepare_workload(
    trainer: Any, ref: Any, plan: Plan, addresses: dict[str, str], timeout_s: float
) -> None:
    """Form the trainer's gloo group and give the reference model the trainer's initial weights."""
    trainer_addresses = [addresses[host] for host in plan.mesh(plan.trainer.mesh).hosts]
    rank0 = trainer.slice(**{"hosts": 0, PROCS_LABEL: 0})
    port = rank0.free_port.call_one(trainer_addresses[0]).get(timeout=timeout_s)
    trainer.init_group.call(trainer_addresses, port).get(timeout=timeout_s)
    ref.load.call(rank0.state_dict.call_one().get(timeout=timeout_s)).get(timeout=timeout_s)
