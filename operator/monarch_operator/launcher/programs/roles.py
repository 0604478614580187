"""Role mode, the built-in example: a user of the public job API like any other program.

:func:`launch` plans, enters a :class:`launcher.programs.job.Job` (pre-flight, workers, role procs,
ranks),
runs the example workload (:mod:`launcher.programs.workload`) and leaves the job (teardown). It
never raises for
an expected failure; it reports ``failed: <reason>`` and returns the exit status from
:mod:`launcher.exitcodes`. A trainer rank that exits with code 3 gives 3, read from the rank's own
exit record, not from Monarch's supervision text.
"""

from __future__ import annotations

from dataclasses import dataclass

from monarch_operator.launcher import exitcodes, progress
from monarch_operator.launcher.hosts.placement import REF, TRAINER, PlacementError, Plan
from monarch_operator.launcher.programs.failures import report_failure
from monarch_operator.launcher.programs.job import JOB_MODULES, Job, JobConfig, parse_failed_actor
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.causes import monarch_loss

# Label of the per-host proc dimension; Monarch's SPMD helpers treat the last label as local rank.
PROCS_LABEL = "gpus"
# Modules the worker Python must import in role mode (the actor classes live there).
ROLE_MODULES = (*JOB_MODULES, "monarch_operator.launcher.programs.workload")


@dataclass(frozen=True)
class LaunchConfig(JobConfig):
    """A :class:`launcher.programs.job.JobConfig` plus the built-in workload's settings."""

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
        0 on success, else the status defined in :mod:`launcher.exitcodes`.
    """
    reporter = reporter or Reporter()
    try:
        job = Job(config, reporter, modules=ROLE_MODULES)
    except PlacementError as error:
        return reporter.result(exitcodes.USAGE, str(error))
    missing = [role for role in (TRAINER, REF) if role not in job.plan.role_names]
    if missing:
        return reporter.result(exitcodes.USAGE, (
            f"the built-in example (monarch-launch without a program) needs roles 'trainer' "
            f"and 'ref'; {config.roles_source or 'the layout'} has no {' or '.join(missing)} "
            f"(its roles: {', '.join(job.plan.role_names)}): add them, or run your own program "
            "with 'monarch-launch run TARGET'"))
    if config.dry_run:
        job.report_plan(essential=True)
        return reporter.result(exitcodes.SUCCESS, None, dry_run=True)
    try:
        with job:
            _run_workload(job, config, reporter)
    except BaseException as error:  # noqa: BLE001 - every failure is reported with its status
        return report_failure(error, job.recorder, reporter)
    return reporter.result(exitcodes.SUCCESS)


def _run_workload(job: Job, config: LaunchConfig, reporter: Reporter) -> None:
    """Spawn the example's actors, form the trainer's gloo group and train ``steps`` steps."""
    from monarch_operator.launcher.programs import workload

    trainer = job.trainer.spawn(
        TRAINER, workload.Trainer, config.fail_at_step, config.fail_exit_code
    )
    ref = job.ref.spawn(REF, workload.Reference)
    trainer_hosts = job.plan.mesh(job.plan.trainer.mesh).hosts
    workload.prepare(
        trainer, ref, [job.addresses[host] for host in trainer_hosts], config.call_timeout_s
    )
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
        progress.report(result.step, total_steps=config.steps,
                        metrics={"loss": round(result.loss, 6), "kl": round(result.kl, 8)})


def describe_failure(plan: Plan, message: str) -> str | None:
    """Turn a Monarch supervision message into ``<role> rank R (host H, local rank L): <what>``.

    Args:
        plan: the placement, to map Monarch's host index to the host name.
        message: the error text.

    Returns:
        The readable reason, or None when the message names no actor of a planned role.
    """
    parsed = parse_failed_actor(message)
    if parsed is None:
        return None
    name, host_index, local, what = parsed
    roles = {role.role: role for role in plan.roles}
    role = roles.get(name)
    if role is None:
        return None
    hosts = plan.mesh(role.mesh).hosts
    if host_index >= len(hosts):
        return None
    rank = host_index * role.procs_per_host + local
    what = monarch_loss(what, hosts[host_index]) or what
    return f"{role.role} rank {rank} (host {hosts[host_index]}, local rank {local}): {what}"

