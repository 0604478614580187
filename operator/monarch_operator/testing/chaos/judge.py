"""One step's judgement of every job the soak follows (the I/O side of :mod:`.checks`): the
attempts that ended since the last step, budgets, records, suspended spans, live launchers,
processes, the final state and its bound, the deletion of finished jobs and what they left."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from monarch_operator.testing.chaos import checks

if TYPE_CHECKING:
    from monarch_operator.testing.chaos.soak import Soak, Track

LABEL_JOB, LABEL_ROLE = "monarch-operator.dev/job", "monarch-operator.dev/role"
LABEL_ATTEMPT = "monarch-operator.dev/attempt"
# Seconds a job may take from creation to a final state (time suspended not counted).
JOB_BOUND_S = 420.0
# Seconds after deletion by which nothing of a job may be left.
LEFTOVER_BOUND_S = 120.0
# A launcher pod's process may outlive its pod's end this long (the agent reports, then reaps).
LAUNCHER_REAP_S = 10.0
# Run-marked processes of a finished job may outlive its end this long (workers released).
FINISHED_REAP_S = 60.0
# Leftovers are looked for at most this often (seconds): one list per kind per look.
LEFTOVER_LOOK_S = 5.0
# What a job may leave besides pods (Workloads only with Kueue's CRDs; the ServiceAccount,
# Role and RoleBinding let its launcher report progress).
CHILD_KINDS = ("ConfigMap", "Secret", "Service", "StatefulSet", "NetworkPolicy", "Workload",
               "ServiceAccount", "Role", "RoleBinding")


def role_of(pod: dict[str, Any]) -> str:
    """The pod's role label (``worker``, ``launcher``)."""
    return str((pod["metadata"].get("labels") or {}).get(LABEL_ROLE, ""))


def attempt_of(pod: dict[str, Any]) -> int | None:
    """The attempt label of a launcher pod, None without one."""
    value = (pod["metadata"].get("labels") or {}).get(LABEL_ATTEMPT)
    return int(value) if value and str(value).isdigit() else None


def judge_all(soak: Soak) -> None:
    """Judge every job not done yet; delete finished jobs when due."""
    leftovers: dict[str, list[dict[str, Any]]] | None = None
    now = time.monotonic()
    for track in soak.tracks:
        if track.done:
            continue
        if track.deleted_at is None:
            _judge_live(soak, track, now)
            continue
        if now - soak.last_leftover_look < LEFTOVER_LOOK_S and now - track.deleted_at < \
                LEFTOVER_BOUND_S:
            continue
        if leftovers is None:
            leftovers = {kind: soak.list_children(kind) for kind in CHILD_KINDS}
        _judge_deleted(soak, track, leftovers, now)
    if leftovers is not None:
        soak.last_leftover_look = now


def _judge_live(soak: Soak, track: Track, now: float) -> None:
    ledger, name, at = soak.report.ledger, track.plan.name, soak.elapsed()
    status = track.status
    if status:
        for record in status.get("attempts") or []:
            number = int(record.get("number") or 0)
            if record.get("class") and number not in track.judged:
                track.judged.add(number)
                ok = ledger.judge(checks.ATTEMPT_CLASS, name, number,
                                  checks.verdict_problems(record, track.accepted(number)), at)
                soak.say(f"{name} attempt {number}: {checks.seen_verdict(record)}"
                         + ("" if ok else "  <-- VIOLATION"))
        ledger.judge(checks.BUDGETS, name, None, checks.budget_problems(
            status, track.plan.backoff_limit, track.plan.infra_limit), at)
        ledger.judge(checks.NO_PHANTOM, name, track.attempt,
                     checks.record_problems(status)
                     + checks.suspended_span_problems(status, [s for s in track.spans if s[1]]),
                     at)
    launchers = [pod for pod in track.pods if role_of(pod) == "launcher"]
    ledger.judge(checks.ONE_LAUNCHER, name, track.attempt,
                 checks.live_launcher_problems(launchers, set(soak.down)), at)
    processes = soak.processes(track)
    survivors, two_launchers = checks.process_problems(processes)
    ledger.judge(checks.ONE_LAUNCHER, name, track.attempt, two_launchers, at)
    ledger.judge(checks.NO_SURVIVOR, name, track.attempt,
                 survivors + _reaped_late(track, launchers, processes, now), at)
    final = status.get("phase") in checks.FINAL_PHASES
    if final and track.final_at is None:
        track.final_at = now
        track.delete_at = now + soak.rng.uniform(2, 8)
        ledger.judge(checks.FINAL_STATE, name, track.attempt, checks.final_problems(status), at)
        soak.say(f"{name} {status.get('phase')}: {str(status.get('message'))[:100]}")
    elif not final:
        suspended = sum(time.time() - s[0] for s in track.spans if not s[1])
        if now - track.created - track.excluded_s - suspended > JOB_BOUND_S:
            ledger.judge(checks.FINAL_STATE, name, track.attempt, [
                (f"final within {JOB_BOUND_S:.0f}s", f"phase {status.get('phase')}: "
                 f"{str(status.get('message'))[:160]}")], at)
            soak.delete_job(track)
            return
    if track.delete_at is not None and now >= track.delete_at:
        soak.delete_job(track)


def _reaped_late(track: Track, launchers: list[dict[str, Any]], processes: list[Any],
                 now: float) -> list[checks.Problem]:
    """Processes that outlived what they belonged to: a launcher pod's after the pod ended
    (:data:`LAUNCHER_REAP_S`), a finished job's after it finished (:data:`FINISHED_REAP_S`)."""
    problems: list[checks.Problem] = []
    pods = {attempt_of(pod): pod for pod in launchers}
    for attempt in sorted({p.attempt for p in processes if p.launcher}):
        pod = pods.get(attempt)
        if pod is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded",
                                                                                "Failed"):
            track.ended_launchers.pop(attempt, None)
            continue
        since = track.ended_launchers.setdefault(attempt, now)
        if now - since >= LAUNCHER_REAP_S:
            left = [p.describe() for p in processes if p.launcher and p.attempt == attempt]
            state = "gone" if pod is None else str(pod["status"].get("phase"))
            problems.append((f"no process of launcher attempt {attempt} {LAUNCHER_REAP_S:.0f}s "
                             "after its pod ended", f"pod {state}; " + "; ".join(left)[:240]))
    if track.final_at is not None and now - track.final_at >= FINISHED_REAP_S:
        left = [p.describe() for p in processes if not p.launcher]
        if left:
            problems.append((f"no process of the finished job {FINISHED_REAP_S:.0f}s after it "
                             "finished", "; ".join(left)[:240]))
    return problems


def _judge_deleted(soak: Soak, track: Track, leftovers: dict[str, list[dict[str, Any]]],
                   now: float) -> None:
    assert track.deleted_at is not None
    left = [f"Pod {pod['metadata']['name']}" for pod in track.pods]
    if track.exists:
        left.append(f"MonarchJob {track.plan.name}")
    for kind, items in leftovers.items():
        for item in items:
            metadata = item["metadata"]
            owners = {ref.get("uid") for ref in metadata.get("ownerReferences") or []}
            if ((metadata.get("labels") or {}).get(LABEL_JOB) == track.plan.name
                    or track.uid in owners):
                left.append(f"{kind} {metadata['name']}")
    left += [f"process {p.describe()}" for p in soak.processes(track)]
    if not left:
        soak.report.ledger.judge(checks.NOTHING_LEFT, track.plan.name, None, [], soak.elapsed())
        track.done = True
    elif now - track.deleted_at >= LEFTOVER_BOUND_S:
        soak.report.ledger.judge(checks.NOTHING_LEFT, track.plan.name, None, [
            (f"nothing left {LEFTOVER_BOUND_S:.0f}s after deletion", "; ".join(left)[:300])],
            soak.elapsed())
        track.done = True
