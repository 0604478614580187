"""The end-of-run sweep: every process of the run still alive on any host, stopped and named.

After the meshes are shut down, the launcher removes the run's stack files
(:mod:`launcher.session.procstacks`) and runs the straggler scan in ``run`` mode on every
host (:mod:`launcher.session.stragglers`, :mod:`launcher.session.straggler_scan`), over ssh,
within the same limits as the start (issue 32): at most ``--ssh-concurrency`` connections at
once and a refused login retried up to ``--ssh-retries`` times with backoff
(:func:`launcher.session.fanout.run_on_hosts`). Many hosts behind few sshd daemons used to lose
1 to 18 hosts to ``MaxStartups`` here when every host was asked at once.

A host that still gives no report is never skipped in silence: :func:`sweep_lines` names every
such host once, with the cause seen (:mod:`launcher.session.causes`), in one summary line;
the next run's pre-flight stops whatever this run left there.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from monarch_operator.launcher.session import causes
from monarch_operator.launcher.session.fanout import CommandResult, RetryPolicy, run_on_hosts
from monarch_operator.launcher.session.rankstacks import stacks_dir
from monarch_operator.launcher.session.ssh import SshSettings, ssh_runner
from monarch_operator.launcher.session.stragglers import (
    SWEEP_TIMEOUT_S,
    RunMark,
    ScanReport,
    parse_report,
    scan_command,
    survivor_lines,
)

# What the summary line calls the step, and what follows for the hosts it could not reach.
SWEEP = "sweep of this run's leftover processes"
AFTER_SWEEP = "the next run's pre-flight on those hosts stops whatever this run left there"


@dataclass(frozen=True)
class SweepResult:
    """What the end-of-run sweep found and could not do.

    Attributes:
        reports: ``{host: scan report}`` of every host that answered, in host order.
        unreached: ``{host: cause in words}`` of every host that gave no report.
        total: hosts swept (each address once).
    """

    reports: dict[str, ScanReport] = field(default_factory=dict)
    unreached: dict[str, str] = field(default_factory=dict)
    total: int = 0


def sweep_run(
    addresses: Mapping[str, str],
    ssh: SshSettings,
    python_exe: str,
    mark: RunMark,
    timeout_s: float = SWEEP_TIMEOUT_S,
    run_once: Callable[[str, str], CommandResult] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> SweepResult:
    """End every process of ``mark``'s run on every host (the end-of-run sweep).

    Args:
        addresses: ``{host name: address}``; each address is visited once, under the first
            name given for it.
        ssh: how to log in, and the limits: ``ssh.concurrency`` connections at once,
            ``ssh.retries`` retries of a refused login.
        python_exe: the worker Python.
        mark: the run that ended.
        timeout_s: limit of one attempt on one host, seconds.
        run_once: one attempt on one host (tests pass a fake); None for real ssh.
        sleep: the pause between retries (tests pass a fake); None for ``time.sleep``.

    Returns:
        The reports of the hosts that answered and the cause for each one that did not.
    """
    targets: dict[str, str] = {}  # address -> the first host name given for it
    for host, address in addresses.items():
        targets.setdefault(address, host)
    # The run's stack files go too (role procs cannot remove theirs: teardown kills them).
    command = (f"rm -rf {shlex.quote(stacks_dir(mark.run))} 2>/dev/null; "
               + scan_command(python_exe, mark, "run", stop=True))
    results = run_on_hosts(
        targets,
        run_once or ssh_runner(ssh, lambda _: command, timeout_s),
        ssh.concurrency,
        RetryPolicy(retries=ssh.retries),
        sleep or time.sleep,
    )
    outcome = SweepResult(total=len(targets))
    for host, result in results.items():
        report = parse_report(result.stdout)
        if report is None:
            outcome.unreached[host] = causes.command_failure(result, timeout_s)
        else:
            outcome.reports[host] = report
    return outcome


def sweep_lines(result: SweepResult) -> list[str]:
    """Warning lines of a sweep: each process found (host, pid, command, what became of it),
    then at most one line naming every host not reached and why (see the module doc)."""
    lines = [
        line
        for host, report in result.reports.items()
        for line in survivor_lines(host, report, at_end=True)
    ]
    summary = causes.not_reached(SWEEP, result.unreached, result.total, AFTER_SWEEP)
    return lines + ([summary] if summary else [])
