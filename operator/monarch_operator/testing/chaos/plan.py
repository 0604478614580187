"""What each chaos job runs and what each of its attempts must end as (pure: no I/O, no clock).

A job is one *scenario*: a launcher whose behaviour per attempt (``MONARCH_ATTEMPT``) is fixed
when the job is made, a run policy, and at most one fault aimed at it. An attempt's *natural*
verdict follows from its behaviour and the run policy alone (exit 0: Succeeded; exit N: the
first matching exit-code rule, else Application; a hang ends only by a fault or the job's
deadline). A fault aimed at a hanging, running attempt replaces that with the fault's verdict
(a worker deleted: Infrastructure, ...); a fault that may or may not reach an attempt (a node
lost under it, a suspend flipped back at once) only widens what is accepted.
"""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, field
from typing import Any

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
# Short grace periods keep pods on a lost node short-lived (force-deleted 15 s after it).
GRACE_SECONDS = 5

# Attempt classes (status.attempts[].class).
SUCCEEDED = "Succeeded"
APPLICATION = "Application"
INFRASTRUCTURE = "Infrastructure"
FATAL = "Fatal"
SUSPENDED = "Suspended"

# Targeted faults: aimed at one job's running attempt (or, for the flip, at any moment).
WORKER_DELETED = "worker_deleted"
WORKER_KILLED = "worker_killed"
LAUNCHER_DELETED = "launcher_deleted"
NODE_LOST = "node_lost"
SUSPEND = "suspend"
SUSPEND_FLIP = "suspend_flip"
JOB_DELETED = "job_deleted"
# What a targeted fault makes of the hanging attempt it hits: class, accepted reasons.
FAULT_VERDICTS: dict[str, tuple[str, frozenset[str]]] = {
    WORKER_DELETED: (INFRASTRUCTURE, frozenset({"WorkerEvicted"})),
    WORKER_KILLED: (INFRASTRUCTURE, frozenset({"WorkerRestarted", "WorkerEvicted"})),
    LAUNCHER_DELETED: (INFRASTRUCTURE, frozenset({"LauncherLost"})),
    NODE_LOST: (INFRASTRUCTURE, frozenset({"WorkerEvicted", "LauncherLost", "WorkerRestarted"})),
    SUSPEND: (SUSPENDED, frozenset({"JobSuspended"})),
}


@dataclass(frozen=True)
class Action:
    """What one attempt's launcher (or, with ``torchrun``, every rank) does.

    ``kind``: ``exit`` (sleep ``seconds``, exit ``code``), ``hang`` (sleep until stopped),
    ``straggle`` (leave a ``setsid sleep`` behind, then exit ``code``), ``straggle_hang`` (leave
    one, then hang), ``raise`` (a rank raises: exit 1; torchrun only).
    """

    kind: str
    code: int = 0
    seconds: float = 0.0

    @property
    def hangs(self) -> bool:
        return self.kind in ("hang", "straggle_hang")


@dataclass(frozen=True)
class Verdict:
    """An accepted ending of one attempt: its class, its exit code (None: not checked) and its
    reasons (empty: not checked)."""

    cls: str
    exit_code: int | None = None
    reasons: frozenset[str] = frozenset()

    def describe(self) -> str:
        code = "" if self.exit_code is None else f" exit {self.exit_code}"
        why = f" ({'|'.join(sorted(self.reasons))})" if self.reasons else ""
        return f"{self.cls}{code}{why}"


@dataclass
class JobPlan:
    """One chaos job: what it runs per attempt, its run policy and the fault aimed at it."""

    name: str
    scenario: str
    actions: list[Action]  # attempts 1..len; later attempts run ``default``
    default: Action = field(default_factory=lambda: Action("exit", 0, 1.0))
    backoff_limit: int = 0
    infra_limit: int = 3
    rules: list[dict[str, Any]] = field(default_factory=list)
    deadline: int | None = None
    fault: str | None = None
    torchrun: bool = False
    cleanup: str = "DeleteWorkers"

    def action(self, attempt: int) -> Action:
        """The behaviour of attempt ``attempt`` (1-based)."""
        return self.actions[attempt - 1] if attempt <= len(self.actions) else self.default

    def natural(self, attempt: int) -> set[Verdict]:
        """How attempt ``attempt`` ends when nothing from outside reaches it."""
        action = self.action(attempt)
        if action.hangs:
            # Only the job's deadline ends a hang by itself (class Fatal, DeadlineExceeded).
            return ({Verdict(FATAL, None, frozenset({"DeadlineExceeded"}))}
                    if self.deadline is not None else set())
        code = 1 if action.kind == "raise" else action.code
        if code == 0:
            return {Verdict(SUCCEEDED, 0)}
        return {Verdict(self.classify(code), code)}

    def classify(self, code: int) -> str:
        """The class of a launcher exit code ``code`` != 0 under the exit-code rules."""
        for rule in self.rules:
            values = rule["onExitCodes"]["values"]
            listed = code in values
            if listed == (rule["onExitCodes"].get("operator", "In") == "In"):
                return {"FailJob": FATAL, "Ignore": INFRASTRUCTURE}.get(rule["action"],
                                                                        APPLICATION)
        return APPLICATION

    def manifest(self, torchrun: str, python: str, pythonpath: str) -> dict[str, Any]:
        """The MonarchJob (2 one-GPU workers). ``torchrun``, ``python``: paths of
        ``monarch-torchrun`` and the Python the ranks run; ``pythonpath``: the tree whose code
        the launcher and its workers run."""
        grace = {"terminationGracePeriodSeconds": GRACE_SECONDS}
        launcher: dict[str, Any] = {
            "command": ["sh", "-c", self.script(torchrun, python)],
            "template": {"spec": dict(grace)},
        }
        if self.torchrun:
            launcher["env"] = [{"name": "PYTHONPATH", "value": pythonpath}]
        policy: dict[str, Any] = {"backoffLimit": self.backoff_limit,
                                  "infrastructureBackoffLimit": self.infra_limit}
        if self.rules:
            policy["podFailurePolicy"] = {"rules": self.rules}
        spec: dict[str, Any] = {
            "image": IMAGE,
            "workers": {"replicas": 2, "gpusPerWorker": 1, "template": {"spec": dict(grace)}},
            "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
            "launcher": launcher, "runPolicy": policy, "cleanupPolicy": self.cleanup,
        }
        if self.deadline is not None:
            spec["activeDeadlineSeconds"] = self.deadline
        return {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
                "metadata": {"name": self.name, "labels": {"chaos/scenario": self.scenario}},
                "spec": spec}

    def script(self, torchrun: str, python: str) -> str:
        """The launcher's shell script: one branch per planned attempt."""
        branches = [f"{index}) {self._command(action, torchrun, python)} ;;"
                    for index, action in enumerate(self.actions, start=1)]
        branches.append(f"*) {self._command(self.default, torchrun, python)} ;;")
        return ('echo "chaos: attempt $MONARCH_ATTEMPT"\ncase "$MONARCH_ATTEMPT" in\n'
                + "\n".join(branches) + "\nesac\n")

    def _command(self, action: Action, torchrun: str, python: str) -> str:
        body = _shell(action, python)
        if not self.torchrun:
            return body
        return (f"exec {shlex.quote(torchrun)} --nproc-per-node 1 --attach-timeout 60 "
                f"--no-python sh -c {shlex.quote(body)}")


def _shell(action: Action, python: str) -> str:
    """The shell for one action (run by the launcher itself, or by every rank)."""
    leave = "setsid sleep 1000 </dev/null >/dev/null 2>&1 &"
    match action.kind:
        case "exit":
            return f"sleep {action.seconds:g}; exit {action.code}"
        case "hang":
            return "exec sleep 100000"
        case "straggle":
            return f"{leave} sleep {max(action.seconds, 1.0):g}; exit {action.code}"
        case "straggle_hang":
            return f"{leave} exec sleep 100000"
        case "raise":
            return f"{shlex.quote(python)} -c 'raise ValueError(\"chaos\")'"
    raise ValueError(f"unknown action kind {action.kind!r}")


HANG = Action("hang")


def _ok(rng: random.Random) -> Action:
    return Action("exit", 0, round(rng.uniform(1, 6), 1))


# Scenario name -> relative weight. Torchrun scenarios (a real monarch-torchrun over the
# workers) cost most, so they are fewer.
SCENARIOS: dict[str, int] = {
    "succeed": 3, "exit": 3, "exhaust": 1, "fatal": 1, "ignore": 1, "deadline": 1,
    "launcher_straggler": 1,
    WORKER_DELETED: 3, WORKER_KILLED: 2, LAUNCHER_DELETED: 3, NODE_LOST: 1, SUSPEND: 2,
    SUSPEND_FLIP: 2, JOB_DELETED: 1,
    "rank_exit": 1, "rank_raise": 1, "rank_straggler": 1, "rank_straggler_lost": 1,
    "rank_hang_deadline": 1,
}


def make_plan(name: str, scenario: str, rng: random.Random) -> JobPlan:
    """The job of ``scenario`` named ``name``, its random choices drawn from ``rng``.

    Raises:
        ValueError: an unknown scenario.
    """
    plan = JobPlan(name, scenario, [], default=_ok(rng))
    match scenario:
        case "succeed":
            plan.actions = [_ok(rng)]
        case "exit":
            plan.backoff_limit = rng.choice([0, 1, 2])
            plan.actions = [Action("exit", rng.choice([1, 3, 7, 137]), rng.uniform(1, 4))]
        case "exhaust":
            plan.backoff_limit = 1
            plan.actions = [Action("exit", 7, 1.0), Action("exit", 8, 1.0)]
        case "fatal":
            plan.backoff_limit = 3
            plan.rules = [{"action": "FailJob", "onExitCodes": {"values": [42]}}]
            plan.actions = [Action("exit", 42, 1.0)]
        case "ignore":
            plan.rules = [{"action": "Ignore", "onExitCodes": {"values": [134]}}]
            plan.actions = [Action("exit", 134, 1.0)]
        case "deadline":
            plan.deadline = rng.randint(20, 35)
            plan.actions, plan.default = [HANG], HANG
        case "launcher_straggler":
            plan.backoff_limit = 1
            plan.actions = [Action("straggle", 3, 1.0)]
        case "worker_deleted" | "worker_killed" | "launcher_deleted" | "node_lost" | "suspend":
            plan.fault = scenario
            plan.infra_limit = rng.choice([0, 1, 3]) if scenario != SUSPEND else 3
            plan.actions = [HANG]
        case "suspend_flip":
            plan.fault = scenario
            plan.actions = [Action("exit", 0, 15.0)]
        case "job_deleted":
            plan.fault = scenario
            plan.actions = [HANG]
        case "rank_exit" | "rank_raise":
            plan.torchrun, plan.backoff_limit = True, 1
            plan.actions = [Action("exit", rng.choice([2, 3, 9])) if scenario == "rank_exit"
                            else Action("raise")]
        case "rank_straggler":
            plan.torchrun, plan.backoff_limit = True, 1
            plan.actions = [Action("straggle", 3, 1.0)]
        case "rank_straggler_lost":
            plan.torchrun, plan.fault = True, LAUNCHER_DELETED
            plan.actions = [Action("straggle_hang")]
        case "rank_hang_deadline":
            plan.torchrun, plan.deadline = True, rng.randint(30, 45)
            plan.actions, plan.default = [Action("straggle_hang")], Action("straggle_hang")
        case _:
            raise ValueError(f"unknown chaos scenario {scenario!r}")
    if plan.torchrun and not plan.actions[0].hangs:
        plan.default = Action("exit", 0, 0.0)
    plan.cleanup = rng.choice(["DeleteWorkers", "DeleteWorkers", "DeleteAll"])
    return plan


def pick_scenario(rng: random.Random, allowed: tuple[str, ...] | None = None) -> str:
    """A scenario drawn by weight (from ``allowed`` only, when given)."""
    names = [name for name in SCENARIOS if allowed is None or name in allowed]
    return rng.choices(names, weights=[SCENARIOS[name] for name in names])[0]
