"""Apply generated MonarchJob manifests to a real API server in batches and check each outcome.

For every manifest (``kubectl apply``, as a user would): either it is refused at admission with
a message naming the field (``spec.…`` or ``metadata.…``, never ``<nil>``), or the job gets a
status within seconds and settles on one of: Running, Succeeded, Suspended, a reasoned wait
(every waiting worker named with why), Failed naming the field when the reason is about the
spec; or it was deleted by its ``ttlSecondsAfterFinished`` after a status was written. For
every batch: no traceback in the operator's log, every child carries a controller owner
reference (worker pods: their StatefulSet; the rest: a job of the batch), and the operator's
writes per job, counted from the API server's audit log, stay under a bound.

Used by ``tests/cluster/test_generated_specs.py`` (a few dozen specs) and
``bench/generated_specs.py`` (500).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monarch_operator.testing import apiaudit
from monarch_operator.testing.specgen import Expect, GeneratedSpec

# Writes of the operator (its client and kopf) to one job and its children, from creation to a
# settled state: children (5 creates), a few status patches, releasing workers, restarts.
MAX_WRITES_PER_JOB = 40
OPERATOR_AGENTS = ("monarch-operator/", "kopf/")
# A refusal names the field it is about: spec.x.y, spec.x[0].y, metadata.name, ...
FIELD_PATH = re.compile(r"\b(spec|metadata)(\.[A-Za-z0-9_-]+|\[\d+\])*")
# Failed reasons about the spec: their message must name the field.
FIELD_REASONS = frozenset({"InvalidSpec", "TemplateRefused"})
# Phases that need no further look.
SETTLED_PHASES = frozenset({"Running", "Succeeded", "Failed", "Suspended"})
# Why a worker waits that may change in a moment (not yet a reason to report).
TRANSIENT_WAITS = ("not created", "Pending", "ContainerCreating", "sshd not accepting",
                   "being deleted", "unknown", "PodInitializing")
CHILD_KINDS = ("secrets,services,configmaps,statefulsets.apps,pods,"
               "networkpolicies.networking.k8s.io,serviceaccounts,roles.rbac.authorization.k8s.io,"
               "rolebindings.rbac.authorization.k8s.io")
# What every namespace has that no job made.
NAMESPACE_OWN = {("ConfigMap", "kube-root-ca.crt"), ("ServiceAccount", "default")}
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Outcome:
    """What became of one generated spec."""

    ident: int
    name: str
    spec: GeneratedSpec
    manifest: dict[str, Any]
    refused: bool = False
    message: str = ""  # kubectl's error when refused
    uid: str = ""
    applied_at: float = 0.0
    first_status_seconds: float | None = None
    last: dict[str, Any] | None = None  # the job as last seen
    deleted: bool = False  # gone after it had a status (ttlSecondsAfterFinished)
    kind: str = ""  # the status kind it settled on (see status_kind)
    writes: int = 0
    update_refused: bool | None = None  # None: no update was applied
    update_message: str = ""


@dataclass
class Report:
    """Totals over every batch, and every broken property, each with the spec that broke it."""

    specs: int = 0
    refused: int = 0
    refused_lines_max: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    flaws: Counter[str] = field(default_factory=Counter)
    tracebacks: int = 0
    without_status: int = 0
    orphans: int = 0
    max_writes: int = 0
    writes_unattributed: int = 0  # Events (kopf names them itself)
    max_status_seconds: float = 0.0
    updates: Counter[str] = field(default_factory=Counter)  # "<change> admitted|refused"
    # Jobs with the most operator writes: (writes, name, restarts, status kind).
    top_writers: list[tuple[int, str, int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The numbers, one per line."""
        lines = [
            f"specs: {self.specs}",
            f"refused at admission: {self.refused} (longest message {self.refused_lines_max}"
            " lines)",
            f"admitted: {self.specs - self.refused}",
            "status kinds: " + ", ".join(f"{kind} {count}" for kind, count
                                         in sorted(self.kinds.items())),
            f"operator tracebacks: {self.tracebacks}",
            f"jobs without status: {self.without_status}",
            f"children without a controller owner: {self.orphans}",
            f"max operator writes per job: {self.max_writes} (bound {MAX_WRITES_PER_JOB}); "
            f"Events besides: {self.writes_unattributed}",
            "most writes: " + ", ".join(
                f"{name} {writes} ({restarts} restarts, {kind})"
                for writes, name, restarts, kind in sorted(self.top_writers, reverse=True)[:5]),
            f"slowest first status: {self.max_status_seconds:.1f} s",
            "spec changes of running or finished jobs: " + ", ".join(
                f"{change} {count}" for change, count in sorted(self.updates.items())),
            f"problems: {len(self.problems)}",
        ]
        return "\n".join(lines)


class Kubectl:
    """kubectl with one environment (``KUBECONFIG``)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl; never raises on its exit status."""
        return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True,
                              env=self.env, check=False, timeout=120)

    def json(self, *args: str) -> Any:
        """``kubectl get ARGS -o json``.

        Raises:
            RuntimeError: kubectl failed.
        """
        result = self.run("get", *args, "-o", "json")
        if result.returncode != 0:
            raise RuntimeError(f"kubectl get {' '.join(args)}: {result.stderr.strip()}")
        return json.loads(result.stdout)


def status_kind(job: dict[str, Any]) -> str:
    """A short name of the job's state: ``Running``, ``Failed/TemplateRefused``,
    ``Pending/Unschedulable``, ... ("no status" when it has none)."""
    status = job.get("status") or {}
    phase = status.get("phase")
    if not phase:
        return "no status"
    if phase == "Failed":
        return f"Failed/{_condition(status, 'Failed').get('reason')}"
    if phase in SETTLED_PHASES:
        return str(phase)
    if phase == "Queued":  # Kueue's wait (or the reason there is none to wait in)
        return f"Queued/{_condition(status, 'Queued').get('reason') or 'no reason'}"
    reasons = waiting_reasons(_condition(status, "WorkersReady").get("message") or "")
    return f"{phase}/{reasons[0].split(':')[0] if reasons else 'no reason'}"


def waiting_reasons(message: str) -> list[str]:
    """The reason given for each waiting worker in a ``WorkersReady`` message
    (``... waiting for a-worker-0 (Unschedulable: ...), a-worker-1 (...)``)."""
    return re.findall(r"-worker-\d+ \(([^()]*(?:\([^()]*\)[^()]*)*)\)", message)


def first_error(message: str) -> str:
    """The first error of kubectl's message: the API server lists several as ``* ...`` lines
    (often ending with its generic ``<nil>: ... some validation rules were not checked``)."""
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("* "):
            return line[2:]
    return message.split(" is invalid: ", 1)[-1].strip()


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def is_settled(job: dict[str, Any]) -> bool:
    """Whether the job's state needs no further look: a settled phase, or a wait in which
    every worker's reason is one that does not change by itself in a moment."""
    status = job.get("status") or {}
    if status.get("observedGeneration") != job["metadata"].get("generation"):
        return False
    phase = status.get("phase")
    if phase in SETTLED_PHASES:
        return True
    if phase == "Queued":  # waiting on Kueue, with the reason given: settled until it acts
        return bool(_condition(status, "Queued").get("reason"))
    if phase not in ("Pending", "Starting"):
        return False
    reasons = waiting_reasons(_condition(status, "WorkersReady").get("message") or "")
    return bool(reasons) and not any(reason.startswith(TRANSIENT_WAITS) and
                                     "FailedCreate" not in reason for reason in reasons)


def check_specs(kubectl: Kubectl, specs: list[GeneratedSpec], *, audit_log: Path,
                operator_log: Path, batch_size: int = 20, settle_seconds: float = 60.0,
                quiet_seconds: float = 6.0,
                progress: Callable[[str], None] = lambda _: None) -> Report:
    """Apply ``specs`` in batches of ``batch_size``, each in a fresh namespace, and check them.

    Args:
        audit_log: the API server's audit log (``LocalCluster.audit_log``).
        operator_log: the running operator's output (tracebacks are looked for there).
        settle_seconds: how long a batch may take until every job settled.
        quiet_seconds: how long to watch the settled batch further before judging it (its
            last state) and counting writes: a job that keeps writing (a retry storm) or leaves
            its settled state shows there.

    Returns:
        The totals and every problem found; namespaces are deleted afterwards.
    """
    report = Report()
    for start in range(0, len(specs), batch_size):
        batch = [(start + offset, spec)
                 for offset, spec in enumerate(specs[start:start + batch_size])]
        _check_batch(kubectl, batch, audit_log, operator_log, settle_seconds, quiet_seconds,
                     report)
        progress(f"{min(start + batch_size, len(specs))}/{len(specs)} specs: "
                 f"{report.refused} refused, {len(report.problems)} problems")
    return report


def _check_batch(kubectl: Kubectl, batch: list[tuple[int, GeneratedSpec]], audit_log: Path,
                 operator_log: Path, settle_seconds: float, quiet_seconds: float,
                 report: Report) -> None:
    namespace = f"gen-{uuid.uuid4().hex[:8]}"
    created = kubectl.run("create", "namespace", namespace)
    if created.returncode != 0:
        raise RuntimeError(f"kubectl create namespace: {created.stderr}")
    audit_offset = _size(audit_log)
    log_offset = _size(operator_log)
    outcomes = [Outcome(ident, "", spec, spec.manifest(ident)) for ident, spec in batch]
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda outcome: _apply(kubectl, namespace, outcome), outcomes))
        admitted = [outcome for outcome in outcomes if not outcome.refused]
        _wait_until_settled(kubectl, namespace, admitted, settle_seconds)
        time.sleep(quiet_seconds)
        _wait_until_settled(kubectl, namespace, admitted, 0)  # their state now
        if _apply_updates(kubectl, namespace, admitted):
            _wait_until_settled(kubectl, namespace, admitted, settle_seconds)
            time.sleep(quiet_seconds)
            _wait_until_settled(kubectl, namespace, admitted, 0)  # their last state
        _check_owners(kubectl, namespace, admitted, report)
        _count_writes(audit_log, audit_offset, namespace, admitted, report)
        _check_operator_log(operator_log, log_offset, namespace, report)
        for outcome in outcomes:
            _judge(outcome, report)
    finally:
        kubectl.run("delete", "namespace", namespace, "--wait=false")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _apply(kubectl: Kubectl, namespace: str, outcome: Outcome) -> None:
    outcome.name = str((outcome.manifest.get("metadata") or {}).get("name"))
    result = kubectl.run("apply", "-n", namespace, "-o", "json", "-f", "-",
                         stdin=json.dumps(outcome.manifest))
    outcome.applied_at = time.monotonic()
    if result.returncode != 0:
        outcome.refused = True
        outcome.message = result.stderr.strip()
        return
    outcome.uid = json.loads(result.stdout)["metadata"]["uid"]


def _apply_updates(kubectl: Kubectl, namespace: str, admitted: list[Outcome]) -> bool:
    """Apply each admitted job's :attr:`GeneratedSpec.update`; True if any was applied."""
    changing = [outcome for outcome in admitted
                if outcome.spec.update and not outcome.deleted and outcome.last is not None]
    for outcome in changing:
        result = kubectl.run("apply", "-n", namespace, "-f", "-",
                             stdin=json.dumps(outcome.spec.updated_manifest(outcome.ident)))
        outcome.update_refused = result.returncode != 0
        outcome.update_message = result.stderr.strip()
    return bool(changing)


def _wait_until_settled(kubectl: Kubectl, namespace: str, admitted: list[Outcome],
                        settle_seconds: float) -> None:
    deadline = time.monotonic() + settle_seconds
    while True:
        now = time.monotonic()
        jobs = {job["metadata"]["name"]: job
                for job in kubectl.json("monarchjobs", "-n", namespace)["items"]}
        for outcome in admitted:
            job = jobs.get(outcome.name)
            if job is None:
                outcome.deleted = outcome.last is not None or bool(
                    outcome.manifest["spec"].get("ttlSecondsAfterFinished") is not None)
                continue
            outcome.last = job
            if (job.get("status") or {}).get("phase") and outcome.first_status_seconds is None:
                outcome.first_status_seconds = now - outcome.applied_at
        if all(outcome.deleted or (outcome.last and is_settled(outcome.last))
               for outcome in admitted) or now > deadline:
            return
        time.sleep(1.0)


def _check_owners(kubectl: Kubectl, namespace: str, admitted: list[Outcome],
                  report: Report) -> None:
    uids = {outcome.uid for outcome in admitted}
    for child in kubectl.json(CHILD_KINDS, "-n", namespace)["items"]:
        metadata = child["metadata"]
        if (child["kind"], metadata["name"]) in NAMESPACE_OWN:
            continue
        owners = [ref for ref in metadata.get("ownerReferences") or [] if ref.get("controller")]
        # Workers belong to their StatefulSet, the launcher pod to its job.
        wanted = ("StatefulSet", "MonarchJob") if child["kind"] == "Pod" else ("MonarchJob",)
        if (len(owners) != 1 or owners[0].get("kind") not in wanted
                or (owners[0]["kind"] == "MonarchJob" and owners[0].get("uid") not in uids)):
            report.orphans += 1
            report.problems.append(f"{child['kind']} {namespace}/{metadata['name']} has no "
                                   f"controller owner of ours: {metadata.get('ownerReferences')}")


def _count_writes(audit_log: Path, offset: int, namespace: str, admitted: list[Outcome],
                  report: Report) -> None:
    requests, _ = apiaudit.read_log(audit_log, offset)
    by_name = {outcome.name: outcome for outcome in admitted}
    for request in requests:
        if (not request.is_write or request.namespace != namespace
                or not request.user_agent.startswith(OPERATOR_AGENTS)):
            continue
        owner = by_name.get(request.name) or next(
            (outcome for name, outcome in by_name.items()
             if request.name.startswith(f"{name}-")), None)
        if owner is None:
            report.writes_unattributed += 1
        else:
            owner.writes += 1


def _check_operator_log(operator_log: Path, offset: int, namespace: str,
                        report: Report) -> None:
    with open(operator_log, errors="replace") as log:
        log.seek(offset)
        text = log.read()
    count = text.count(TRACEBACK)
    if count:
        report.tracebacks += count
        first = text.index(TRACEBACK)
        report.problems.append(f"{count} traceback(s) in the operator's log during batch "
                               f"{namespace}; the first:\n{text[max(0, first - 300):first + 3000]}")


def _judge(outcome: Outcome, report: Report) -> None:
    """Count the outcome and add a problem for each property it breaks."""
    report.specs += 1
    report.flaws.update(outcome.spec.flaws or ("(valid)",))
    spec_text = json.dumps(outcome.manifest)[:4000]
    expected = outcome.spec.expected

    def problem(text: str) -> None:
        report.problems.append(f"{outcome.name} (flaws {list(outcome.spec.flaws)}): {text}\n"
                               f"  spec: {spec_text}")

    if outcome.refused:
        report.refused += 1
        report.kinds["refused"] += 1
        report.refused_lines_max = max(report.refused_lines_max,
                                       len(outcome.message.splitlines()))
        first = first_error(outcome.message)
        if first.startswith("<nil>") or not FIELD_PATH.search(first):
            problem(f"refused without naming the field: {outcome.message}")
        if expected in (None, Expect.FAILED, Expect.WAIT):
            problem(f"refused although the spec is meant to be admitted: {outcome.message}")
        return
    if expected is Expect.REFUSED:
        problem("admitted although the schema should refuse it")
    if outcome.deleted and outcome.last is None:
        outcome.kind = "deleted by TTL"
    elif outcome.deleted:
        outcome.kind = f"deleted by TTL after {status_kind(outcome.last)}"
    elif outcome.last is None:
        outcome.kind = "never seen"
    else:
        outcome.kind = status_kind(outcome.last)
    report.kinds[outcome.kind.split(" after ")[0]] += 1
    report.max_writes = max(report.max_writes, outcome.writes)
    restarts = int(((outcome.last or {}).get("status") or {}).get("restartCount") or 0)
    report.top_writers.append((outcome.writes, outcome.name, restarts, outcome.kind))
    if outcome.first_status_seconds is not None:
        report.max_status_seconds = max(report.max_status_seconds, outcome.first_status_seconds)
    if outcome.writes > MAX_WRITES_PER_JOB:
        problem(f"{outcome.writes} operator writes (bound {MAX_WRITES_PER_JOB})")
    _judge_update(outcome, report, problem)
    if outcome.kind in ("no status", "never seen"):
        report.without_status += 1
        problem("no status")
        return
    if outcome.deleted:
        return
    assert outcome.last is not None
    status = outcome.last.get("status") or {}
    if not is_settled(outcome.last):
        problem(f"not settled: {outcome.kind}: {json.dumps(status)[:1500]}")
    failed = _condition(status, "Failed")
    if status.get("phase") == "Failed" and failed.get("reason") in FIELD_REASONS and (
            not FIELD_PATH.search(failed.get("message") or "")):
        problem(f"Failed without naming the field: {failed.get('message')}")
    if expected is None and status.get("phase") == "Failed" and (
            failed.get("reason") in FIELD_REASONS):
        problem(f"a valid spec Failed: {failed.get('message')}")


# Changes that the transition rules refuse while the job is not suspended, and changes that may
# always be made (issue 9 item 8; docs/monarchjob.md, "Life cycle and spec changes").
REFUSED_CHANGES = frozenset({"image", "replicas", "launcher-env"})
ALLOWED_CHANGES = frozenset({"suspend", "resume", "image-suspended", "deadline",
                             "deadline-short", "ttl", "cleanup", "run-policy",
                             "startup-timeout", "labels"})


def _judge_update(outcome: Outcome, report: Report, problem: Callable[[str], None]) -> None:
    change = outcome.spec.update
    if outcome.update_refused is None or change is None:
        return
    report.updates[f"{change} {'refused' if outcome.update_refused else 'admitted'}"] += 1
    was_suspended = bool(outcome.manifest["spec"].get("suspend"))
    if outcome.update_refused:
        first = first_error(outcome.update_message)
        if first.startswith("<nil>") or not FIELD_PATH.search(first):
            problem(f"change {change} refused without naming the field: "
                    f"{outcome.update_message}")
        if change in ALLOWED_CHANGES:
            problem(f"change {change} refused although it may be made: "
                    f"{outcome.update_message}")
    elif change in REFUSED_CHANGES and not was_suspended:
        problem(f"change {change} of a job that is not suspended was admitted")
