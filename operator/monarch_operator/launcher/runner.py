"""Role mode, as a checklist: plan, check hosts, start the SSHJob, run the workload, tear down.

:func:`launch` never raises for an expected failure; it reports ``failed: <reason>`` and returns
the exit status from :mod:`.exitcodes`. Monarch is imported only once the plan and host checks
have passed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from monarch_operator.hostfile import Host
from monarch_operator.launcher import exitcodes
from monarch_operator.launcher.placement import (
    REF,
    TRAINER,
    PlacementError,
    Plan,
    RolePlan,
    format_plan,
    plan_placement,
    plan_to_dict,
)
from monarch_operator.launcher.procenv import set_environment
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session import (
    FaultRecorder,
    SessionConfig,
    Terminated,
    WorkerLost,
    check_hosts,
    install_fault_hook,
    report_failure,
    started_job,
)

# Label of the per-host proc dimension; Monarch's SPMD helpers treat the last label as local rank.
PROCS_LABEL = "gpus"
# Modules the worker Python must import in role mode (the actor classes live there).
ROLE_MODULES = ("monarch", "monarch_operator.launcher.workload")


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one role-mode launch needs; built by the CLI from flags and environment."""

    hosts: list[Host]
    session: SessionConfig
    source: str = "hostfile"
    trainer_hosts: int | None = None
    ref_hosts: int | None = None
    colocate: bool = False
    trainer_gpus: int | None = None
    ref_gpus: int | None = None
    steps: int = 3
    call_timeout_s: float = 120.0
    fail_at_step: int = 0
    fail_exit_code: int = 1
    dry_run: bool = False


def launch(config: LaunchConfig, reporter: Reporter | None = None) -> int:
    """Run one role-mode launch end to end and return the process exit status.

    Args:
        config: the launch settings.
        reporter: output sink (default: human text on stdout/stderr).

    Returns:
        0 on success, else the status defined in :mod:`.exitcodes`.
    """
    reporter = reporter or Reporter()
    try:
        plan = plan_placement(
            config.hosts,
            config.trainer_hosts,
            config.ref_hosts,
            config.colocate,
            config.trainer_gpus,
            config.ref_gpus,
        )
    except PlacementError as error:
        return reporter.result(exitcodes.USAGE, str(error))
    reporter.plan(
        [f"hosts: {config.source}", *format_plan(plan)], plan_to_dict(plan), config.dry_run
    )
    if config.dry_run:
        return reporter.result(exitcodes.SUCCESS, None, dry_run=True)
    recorder = FaultRecorder(reporter)
    try:
        addresses = check_hosts(
            config.session, [host for mesh in plan.meshes for host in mesh.hosts], reporter
        )
        reporter.progress(f"pre-flight ok on {len(addresses)} hosts")
        install_fault_hook(recorder)
        _run_on_monarch(config, plan, addresses, reporter)
    except (Exception, Terminated, WorkerLost, KeyboardInterrupt) as error:  # noqa: BLE001 - reported
        return report_failure(error, recorder, reporter, functools.partial(describe_failure, plan))
    return reporter.result(exitcodes.SUCCESS)


def _run_on_monarch(
    config: LaunchConfig, plan: Plan, addresses: dict[str, str], reporter: Reporter
) -> None:
    """Start the job, attach the host meshes, spawn both roles and run the workload."""
    from monarch_operator.launcher import workload

    meshes = [(mesh.name, mesh.hosts) for mesh in plan.meshes]
    with started_job(config.session, meshes, addresses, reporter) as host_meshes:
        trainer_procs = _spawn_procs(host_meshes, plan.trainer)
        ref_procs = _spawn_procs(host_meshes, plan.ref)
        trainer = trainer_procs.spawn(
            TRAINER, workload.Trainer, config.fail_at_step, config.fail_exit_code
        )
        ref = ref_procs.spawn(REF, workload.Reference)
        _report_ranks(TRAINER, trainer, config.call_timeout_s, reporter)
        _report_ranks(REF, ref, config.call_timeout_s, reporter)
        _prepare_workload(trainer, ref, plan, addresses, config.call_timeout_s)
        reporter.progress("workload ready")
        for result in workload.run_steps(trainer, ref, config.steps, config.call_timeout_s):
            reporter.event(
                "step",
                f"step {result.step}/{config.steps} loss={result.loss:.4f} kl={result.kl:.6f}",
                essential=True,
                step=result.step,
                steps=config.steps,
                loss=result.loss,
                kl=result.kl,
            )


def _spawn_procs(host_meshes: dict[str, Any], role: RolePlan) -> Any:
    """Spawn the role's procs; each sees only the role's GPUs (disjoint when colocated)."""
    return host_meshes[role.mesh].spawn_procs(
        per_host={PROCS_LABEL: role.procs_per_host},
        name=role.role,
        bootstrap=functools.partial(
            set_environment, {"CUDA_VISIBLE_DEVICES": role.cuda_visible_devices}
        ),
    )


def _report_ranks(role: str, actors: Any, timeout_s: float, reporter: Reporter) -> None:
    infos = sorted(actors.whoami.call().get(timeout=timeout_s).values(), key=lambda i: i.rank)
    for info in infos:
        reporter.event(
            "rank",
            f"{role} rank {info.rank}/{info.world_size} host={info.host} pid={info.pid} "
            f"ssh={info.ssh_address} worker={info.worker_pid} gpus={info.cuda_visible_devices}",
            role=role,
            rank=info.rank,
            world_size=info.world_size,
            host=info.host,
            pid=info.pid,
            ssh=info.ssh_address,
            worker_pid=info.worker_pid,
            cuda_visible_devices=info.cuda_visible_devices,
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


# How Monarch names a failed actor in supervision errors (torchmonarch 0.7.0), e.g.
# "The actor <root>.<monarch_operator.launcher.workload.Trainer trainer{'hosts': 1/2,
# 'gpus': 0/1}> and all its descendants have failed: the process ... exited with non-zero code 3"
_FAILED_ACTOR = re.compile(
    r"<(?:[\w.]+\.)?\w+ (?P<role>\w+)\{'hosts': (?P<host>\d+)/\d+, '"
    + PROCS_LABEL
    + r"': (?P<local>\d+)/\d+\}> and all its descendants have failed: (?P<what>[^\n]+)"
)


def describe_failure(plan: Plan, message: str) -> str | None:
    """Turn a Monarch supervision message into ``<role> rank R (host H, local rank L): <what>``.

    Args:
        plan: the placement, to map Monarch's host index to the host name.
        message: the error text.

    Returns:
        The readable reason, or None when the message names no actor of a planned role.
    """
    match = _FAILED_ACTOR.search(message)
    if match is None:
        return None
    roles = {role.role: role for role in plan.roles}
    role = roles.get(match["role"])
    if role is None:
        return None
    host_index, local = int(match["host"]), int(match["local"])
    hosts = plan.mesh(role.mesh).hosts
    if host_index >= len(hosts):
        return None
    rank = host_index * role.procs_per_host + local
    what = match["what"].strip().rstrip(".")
    return f"{role.role} rank {rank} (host {hosts[host_index]}, local rank {local}): {what}"
