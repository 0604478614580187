"""The run policy: how a failed attempt is classified and whether the job restarts.

Pure: no I/O, no clock. Follows the Kubernetes Job's ``backoffLimit`` and ``podFailurePolicy``
(https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy) for the
application budget and exit-code rules, with a second, separate budget for infrastructure
failures (a worker pod deleted, evicted, preempted, its container restarted in place) so that
losing a machine never spends the budget meant for bugs in the program.

Failure classes:

- ``Application``: the launcher exited non-zero (a rank exited non-zero, an actor raised).
  Restarted while ``runPolicy.backoffLimit`` allows, keeping the worker pods.
- ``Infrastructure``: the attempt lost a worker pod or the launcher pod, or a rule with action
  ``Ignore`` matched the exit code. Restarted while ``runPolicy.infrastructureBackoffLimit``
  allows; lost worker pods are recreated.
- ``Startup``: workers never became Ready within ``startupTimeoutSeconds``. Never restarted.
- ``Fatal``: a ``FailJob`` rule matched the exit code. Never restarted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monarch_operator import hwerrors

# Failure classes (status.attempts[].class).
APPLICATION = "Application"
INFRASTRUCTURE = "Infrastructure"
STARTUP = "Startup"
FATAL = "Fatal"
# Not a failure: the attempt ended because the job was suspended (spends no budget).
SUSPENDED = "Suspended"
# Not a failure either: Kueue evicted the job's Workload (kueue/admission.py; no budget spent,
# but a restart all the same).
EVICTED = "Evicted"
# The attempts stopped on request: their launcher is asked to stop once the attempt's end is
# recorded, and the record gets its end when it ended (endings.record_late_ends).
STOPPED_ON_REQUEST = frozenset({SUSPENDED, EVICTED})

# podFailurePolicy rule actions, as in the Kubernetes Job.
ACTION_FAIL_JOB = "FailJob"
ACTION_IGNORE = "Ignore"
ACTION_COUNT = "Count"

# Defaults mirror the CRD (a unit test compares them).
DEFAULT_BACKOFF_LIMIT = 0
DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT = 3


@dataclass(frozen=True)
class ExitCodeRule:
    """One ``runPolicy.podFailurePolicy.rules[]`` entry: ``action`` when the launcher's exit
    code is ``In`` (or ``NotIn``) ``values``."""

    action: str
    operator: str
    values: tuple[int, ...]

    def matches(self, exit_code: int) -> bool:
        """Whether this rule applies to ``exit_code``."""
        listed = exit_code in self.values
        return listed if self.operator == "In" else not listed


@dataclass(frozen=True)
class RunPolicy:
    """``spec.runPolicy`` with its defaults applied."""

    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    infrastructure_backoff_limit: int = DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT
    rules: tuple[ExitCodeRule, ...] = field(default_factory=tuple)
    # Seconds a running launcher is given to checkpoint before a suspend or an eviction stops
    # the job (0: stopped at once); see controller/release/release.py stop_launcher_first.
    checkpoint_grace_seconds: int = 0
    # An attempt that reported progress and then none for this long is stalled (None: never);
    # controller/judge/stalls.py.
    progress_deadline_seconds: int | None = None
    # An application failure after progress since the previous failure spends no budget.
    progress_resets_backoff: bool = False
    # Output lines that make a failure Infrastructure (GPUHardwareError): the defaults plus
    # spec.runPolicy.hardwareErrors (monarch_operator/hwerrors.py); ``hardware_errors_env``
    # that field for the launcher's environment ("" when unset).
    hardware_patterns: tuple[hwerrors.Pattern, ...] = hwerrors.DEFAULT_PATTERNS
    hardware_errors_env: str = ""

    @classmethod
    def from_spec(cls, run_policy: dict[str, Any] | None) -> RunPolicy:
        """Build from ``spec.runPolicy`` (``None`` or ``{}``: all defaults).

        Raises:
            ValueError: ``spec.runPolicy.hardwareErrors`` is not valid (the message names the
                field: :func:`monarch_operator.hwerrors.from_spec`).
        """
        run_policy = run_policy or {}
        hardware_errors = dict(run_policy.get("hardwareErrors") or {})
        rules = []
        for rule in (run_policy.get("podFailurePolicy") or {}).get("rules") or []:
            on_exit = rule.get("onExitCodes") or {}
            rules.append(ExitCodeRule(
                action=str(rule.get("action", ACTION_COUNT)),
                operator=str(on_exit.get("operator", "In")),
                values=tuple(int(value) for value in on_exit.get("values") or []),
            ))
        return cls(
            backoff_limit=int(run_policy.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)),
            infrastructure_backoff_limit=int(run_policy.get(
                "infrastructureBackoffLimit", DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT)),
            rules=tuple(rules),
            checkpoint_grace_seconds=int(run_policy.get("checkpointGracePeriodSeconds", 0)),
            progress_deadline_seconds=(None if run_policy.get("progressDeadlineSeconds") is None
                                       else int(run_policy["progressDeadlineSeconds"])),
            progress_resets_backoff=bool(run_policy.get("progressResetsBackoff", False)),
            hardware_patterns=hwerrors.from_spec(hardware_errors),
            hardware_errors_env=hwerrors.to_env(hardware_errors),
        )


@dataclass(frozen=True)
class ExitClass:
    """How a launcher exit code is judged: its class and the rule that decided it (if any)."""

    failure_class: str
    rule_index: int | None = None  # 0-based index in podFailurePolicy.rules

    def describe(self, exit_code: int) -> str:
        """E.g. ``exit code 42 matches runPolicy.podFailurePolicy.rules[0] (FailJob)``."""
        if self.rule_index is None:
            return f"exit code {exit_code}"
        action = {FATAL: ACTION_FAIL_JOB, INFRASTRUCTURE: ACTION_IGNORE}.get(
            self.failure_class, ACTION_COUNT)
        return (f"exit code {exit_code} matches runPolicy.podFailurePolicy.rules"
                f"[{self.rule_index}] ({action})")


def classify_exit_code(policy: RunPolicy, exit_code: int) -> ExitClass:
    """Class of a launcher that exited with ``exit_code`` (non-zero): the first matching rule
    decides (``FailJob`` -> Fatal, ``Ignore`` -> Infrastructure, ``Count`` -> Application);
    no match -> Application."""
    for index, rule in enumerate(policy.rules):
        if rule.matches(exit_code):
            if rule.action == ACTION_FAIL_JOB:
                return ExitClass(FATAL, index)
            if rule.action == ACTION_IGNORE:
                return ExitClass(INFRASTRUCTURE, index)
            return ExitClass(APPLICATION, index)
    return ExitClass(APPLICATION)


@dataclass(frozen=True)
class Decision:
    """Whether to start another attempt after a failure, and the budget line for messages."""

    restart: bool
    budget: str  # e.g. "application restarts 1/2 (runPolicy.backoffLimit)"


def decide(policy: RunPolicy, failure_class: str, spent: dict[str, int]) -> Decision:
    """Decide on a failure of ``failure_class`` given the restarts ``spent`` so far.

    Args:
        spent: ``{"application": n, "infrastructure": m}`` restarts already made (missing
            keys count as 0); this failure is not in it yet.

    Returns:
        ``restart`` True when the class's budget has a restart left. Startup and Fatal
        failures never restart; Suspended is not a failure and is not decided here.
    """
    if failure_class == APPLICATION:
        used, limit, field_name = (spent.get("application", 0), policy.backoff_limit,
                                   "runPolicy.backoffLimit")
    elif failure_class == INFRASTRUCTURE:
        used, limit, field_name = (spent.get("infrastructure", 0),
                                   policy.infrastructure_backoff_limit,
                                   "runPolicy.infrastructureBackoffLimit")
    else:
        return Decision(restart=False, budget=f"{failure_class} failures are not restarted")
    if used < limit:
        return Decision(restart=True, budget=(
            f"{failure_class.lower()} restart {used + 1}/{limit} ({field_name})"))
    return Decision(restart=False, budget=(
        f"{failure_class.lower()} restarts exhausted: {used}/{limit} ({field_name})"))


# Back-off between restarts after failures (Kubernetes Jobs: 10 s doubling, at most 6 min; see
# https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-backoff-failure-policy).
# The first restart is immediate: one failure is the common case and its ~2 s fast path (pods
# kept) is the point of restarting in place; from the second on, a launcher that fails at once
# can no longer restart every 1-2 s and flood the API server with writes and Events.
RESTART_BACKOFF_BASE_SECONDS = 10.0
RESTART_BACKOFF_MAX_SECONDS = 360.0


def restart_delay_seconds(restarts: int) -> float:
    """Seconds to wait before the launcher of restart number ``restarts`` (1 = the first
    restart after a failure) starts: 0 for the first, then 10, 20, 40, ... at most 360."""
    if restarts <= 1:
        return 0.0
    return min(RESTART_BACKOFF_BASE_SECONDS * 2.0 ** (restarts - 2), RESTART_BACKOFF_MAX_SECONDS)
