"""The soak's invariants, judged from what was observed (pure: no I/O, no clock).

Each function takes a job's status (as the API returned it), pods or processes, and returns
problems as ``(expected, seen)`` text pairs; :class:`Ledger` counts every check and keeps each
violation once, with the job and attempt it is about.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from monarch_operator.testing.chaos.plan import (
    APPLICATION,
    FATAL,
    INFRASTRUCTURE,
    SUCCEEDED,
    SUSPENDED,
    Verdict,
)
from monarch_operator.testing.chaos.procs import JobProcess

# Invariants, in the order the table prints them.
ATTEMPT_CLASS = "attempt class matches the fault"
BUDGETS = "budgets exact"
ONE_LAUNCHER = "one live launcher per job"
NO_SURVIVOR = "no survivor of an ended attempt"
NO_PHANTOM = "no phantom attempt or pod (suspend)"
FINAL_STATE = "truthful final state in time"
NOTHING_LEFT = "nothing left after deletion"
OPERATOR_STOP = "operator exits 0 on SIGTERM"
LEADER_ALONE = "one replica acts (Lease, audit)"
LEADER_EXIT = "partitioned exits 3, new replica ready"
INVARIANTS = (ATTEMPT_CLASS, BUDGETS, ONE_LAUNCHER, NO_SURVIVOR, NO_PHANTOM, FINAL_STATE,
              NOTHING_LEFT, OPERATOR_STOP, LEADER_ALONE, LEADER_EXIT)
# The invariants only a replicated operator (leader faults) is checked for.
LEADER_INVARIANTS = frozenset({LEADER_ALONE, LEADER_EXIT})
# A deposed leader's exit status (controller/leader/run.py EXIT_LOST).
EXIT_LOST = 3
# Classes only an attempt whose launcher started can end with.
LAUNCHED_CLASSES = frozenset({SUCCEEDED, APPLICATION, INFRASTRUCTURE, SUSPENDED})
FINAL_PHASES = ("Succeeded", "Failed")
# status.attempts keeps this many records; budgets are not recounted past it.
ATTEMPTS_KEPT = 10

Problem = tuple[str, str]


@dataclass(frozen=True)
class Violation:
    """One broken invariant: where, what was expected and what was seen, and when (seconds
    into the soak)."""

    invariant: str
    job: str
    attempt: int | None
    expected: str
    seen: str
    at: float


@dataclass
class Ledger:
    """Every check made and every violation found (each distinct one once)."""

    checks: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    _seen: set[tuple[str, str, int | None, str]] = field(default_factory=set)

    def judge(self, invariant: str, job: str, attempt: int | None,
              problems: Iterable[Problem], at: float) -> bool:
        """Count one check of ``invariant``; record each problem not recorded before.
        Returns True when there was none."""
        self.checks[invariant] += 1
        clean = True
        for expected, seen in problems:
            clean = False
            key = (invariant, job, attempt, expected)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.failed[invariant] += 1
            self.violations.append(Violation(invariant, job, attempt, expected, seen, at))
        return clean


def seen_verdict(record: dict[str, Any]) -> str:
    """An ended attempt record as ``Class exit N (Reason)``."""
    code = record.get("exitCode")
    return Verdict(str(record.get("class")), code, frozenset(
        {str(record["reason"])} if record.get("reason") else set())).describe()


def verdict_problems(record: dict[str, Any], accepted: set[Verdict]) -> list[Problem]:
    """Whether ended attempt ``record`` (class, exitCode, reason) is one of ``accepted``."""
    cls, code, reason = record.get("class"), record.get("exitCode"), record.get("reason")
    for verdict in accepted:
        if (verdict.cls == cls and (verdict.exit_code is None or verdict.exit_code == code)
                and (not verdict.reasons or reason in verdict.reasons)):
            return []
    expected = " or ".join(sorted(v.describe() for v in accepted)) or "no ending (it hangs)"
    message = str(record.get("message") or "")[:160]
    return [(expected, f"{seen_verdict(record)}: {message}")]


def budget_problems(status: dict[str, Any], backoff_limit: int,
                    infra_limit: int) -> list[Problem]:
    """``failureCounts`` equals the failures that were followed by a restart and spent budget
    (``budgetSpent`` not false), ``restartCount`` every restart, within ``runPolicy``; a
    Failed job failed because its budget ran out."""
    records = [r for r in status.get("attempts") or [] if r.get("class")]
    if not status.get("attempts") or len(status["attempts"]) >= ATTEMPTS_KEPT:
        return []
    failed = status.get("phase") == "Failed"
    last = records[-1]["class"] if failed and records else None
    # The failure that ended the job restarted nothing.
    restarted = records[:-1] if last in (APPLICATION, INFRASTRUCTURE) else records
    # A failure after a new highest step spends nothing (runPolicy.progressResetsBackoff).
    spent = Counter(str(r["class"]) for r in restarted if r.get("budgetSpent", True))
    expected = {"application": spent[APPLICATION], "infrastructure": spent[INFRASTRUCTURE]}
    expected_restarts = sum(1 for r in restarted if r["class"] in (APPLICATION, INFRASTRUCTURE))
    counts = status.get("failureCounts") or {}
    seen = {"application": int(counts.get("application") or 0),
            "infrastructure": int(counts.get("infrastructure") or 0)}
    problems = []
    if seen != expected:
        problems.append((f"failureCounts {expected} (from the attempts' classes)",
                         f"failureCounts {seen}"))
    restarts = int(status.get("restartCount") or 0)
    if restarts != expected_restarts:
        problems.append((f"restartCount {expected_restarts}", f"restartCount {restarts}"))
    if seen["application"] > backoff_limit or seen["infrastructure"] > infra_limit:
        problems.append((f"at most {backoff_limit} application / {infra_limit} infrastructure "
                         "restarts", f"failureCounts {seen}"))
    if last == APPLICATION and seen["application"] < backoff_limit:
        problems.append((f"no Failed while application restarts are left "
                         f"({seen['application']}/{backoff_limit})", "Failed"))
    if last == INFRASTRUCTURE and seen["infrastructure"] < infra_limit:
        problems.append((f"no Failed while infrastructure restarts are left "
                         f"({seen['infrastructure']}/{infra_limit})", "Failed"))
    return problems


def record_problems(status: dict[str, Any]) -> list[Problem]:
    """Attempt records that cannot be: numbers not consecutive, an attempt that ended without
    its launcher starting in a class that needs one (a phantom), an earlier attempt still open,
    or a running job whose current attempt already has a class."""
    records = status.get("attempts") or []
    problems = []
    numbers = [int(r.get("number") or 0) for r in records]
    if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        problems.append(("attempt numbers consecutive", f"{numbers}"))
    if records and status.get("attempt") != records[-1].get("number"):
        problems.append((f"status.attempt = the last record ({records[-1].get('number')})",
                         f"status.attempt {status.get('attempt')}"))
    final = status.get("phase") in FINAL_PHASES
    for index, record in enumerate(records):
        last = index == len(records) - 1
        if record.get("class") in LAUNCHED_CLASSES and not record.get("launchTime"):
            problems.append((f"attempt {record.get('number')} ended as {record.get('class')} "
                             "only after its launcher started", "no launchTime (phantom)"))
        if not record.get("class") and (not last or final):
            problems.append((f"attempt {record.get('number')} has a class once it is over",
                             "no class"))
        if last and not final and record.get("class"):
            problems.append(("the running job's current attempt is open",
                             f"attempt {record.get('number')} {record.get('class')}"))
    return problems


def suspended_span_problems(status: dict[str, Any],
                            spans: list[tuple[float, float]]) -> list[Problem]:
    """No attempt's launcher started while the job was suspended: for each span ``(from,
    to)`` (epoch seconds: the suspend and resume patches), no ``launchTime`` in
    ``[from + 3, to - 1]`` (whole-second stamps of a pass that may have read the job just
    before)."""
    problems = []
    for record in status.get("attempts") or []:
        launched = epoch(record.get("launchTime"))
        for start, end in spans:
            if launched is not None and start + 3 <= launched <= end - 1:
                problems.append((f"no launcher started while suspended ({_clock(start)} to "
                                 f"{_clock(end)})",
                                 f"attempt {record.get('number')} launched {_clock(launched)}"))
    return problems


def final_problems(status: dict[str, Any]) -> list[Problem]:
    """A finished job's status tells how it ended: the last attempt's class decides the phase,
    the Failed reason and the launcher's exit code are that attempt's."""
    records = status.get("attempts") or []
    if not records:
        return [("attempt records", "none")]
    last, phase = records[-1], status.get("phase")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    launcher_code = (status.get("launcher") or {}).get("exitCode")
    problems = []
    if not status.get("completionTime"):
        problems.append(("completionTime set", "none"))
    if phase == "Succeeded":
        if last.get("class") != SUCCEEDED or last.get("exitCode") != 0 or launcher_code != 0:
            problems.append(("Succeeded: the last attempt Succeeded, exit 0",
                             f"{seen_verdict(last)}, launcher exit {launcher_code}"))
        if (conditions.get("Failed") or {}).get("status") == "True":
            problems.append(("Succeeded and not Failed", "Failed condition True"))
        return problems
    if last.get("class") not in (APPLICATION, INFRASTRUCTURE, FATAL, "Startup"):
        problems.append(("Failed: the last attempt failed", seen_verdict(last)))
    failed = conditions.get("Failed") or {}
    if failed.get("status") != "True" or failed.get("reason") != last.get("reason"):
        problems.append((f"Failed condition with the last attempt's reason {last.get('reason')}",
                         f"{failed.get('status')} {failed.get('reason')}"))
    if last.get("exitCode") is not None and launcher_code != last.get("exitCode"):
        problems.append((f"status.launcher.exitCode {last.get('exitCode')} (the last attempt's)",
                         f"{launcher_code}"))
    return problems


def live_launcher_problems(pods: list[dict[str, Any]], down_nodes: set[str]) -> list[Problem]:
    """At most one launcher pod of a job not in a final phase (pods on a crashed node, whose
    processes are gone, do not count)."""
    live = sorted(pod["metadata"]["name"] for pod in pods
                  if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                  and (pod.get("spec") or {}).get("nodeName") not in down_nodes)
    if len(live) > 1:
        return [("one launcher pod not ended", f"{len(live)}: {', '.join(live)}")]
    return []


def process_problems(processes: list[JobProcess]) -> tuple[list[Problem], list[Problem]]:
    """One job's processes: ``(survivors, launchers)``. Survivors: run-marked processes of an
    attempt while a later attempt's processes run on the workers (the later pre-flight must
    have stopped them first). Launchers: launcher-pod processes of two attempts at once."""
    marked = [p for p in processes if not p.launcher]
    survivors: list[Problem] = []
    if len({p.attempt for p in marked}) > 1:
        newest = max(p.attempt for p in marked)
        older = [p.describe() for p in marked if p.attempt < newest]
        survivors.append((f"no process of an earlier attempt once attempt {newest}'s run",
                          "; ".join(older)[:300]))
    launchers = [p for p in processes if p.launcher]
    found: list[Problem] = []
    if len({p.attempt for p in launchers}) > 1:
        found.append(("launcher processes of one attempt at a time",
                      "; ".join(p.describe() for p in launchers)[:300]))
    return survivors, found


def epoch(text: Any) -> float | None:
    """An RFC 3339 ``...Z`` stamp as epoch seconds, None when absent."""
    if not text:
        return None
    return dt.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=dt.UTC).timestamp()


def _clock(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%H:%M:%S")
