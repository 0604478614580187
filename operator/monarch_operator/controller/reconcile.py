"""One idempotent, level-based reconcile pass of a MonarchJob.

Reads like a checklist: suspended -> delete workers and launcher; else key Secret, Service,
StatefulSet, wait for Ready workers (or time out), hostfile, the current attempt's launcher,
its outcome or a lost worker -> the run policy restarts or fails the job; release GPUs when
finished; one status patch when it changed. Safe to run any number of times from any trigger
(a watch event on the job or a child, the operator starting, a deadline); it writes nothing
when nothing changed.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller import attempts, deadlines, k8s, observe, policy, stuckpods
from monarch_operator.controller import status as st
from monarch_operator.controller.builders.hostfile import build_hostfile_configmap
from monarch_operator.controller.builders.launcher import LAUNCHER_CONTAINER, build_launcher_job
from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.settings import Settings
from monarch_operator.controller.spec import CLEANUP_DELETE_ALL, CLEANUP_KEEP_ALL, JobSpec
from monarch_operator.controller.sshkeys import generate_job_keys

logger = logging.getLogger(__name__)

# When a job blocked by a foreign child looks again first (the delay then doubles, see
# passes.py); nothing of the foreign object is watched, so this is how the job goes on.
NOT_OWNED_RETRY_SECONDS = 5.0


@dataclass
class Event:
    """A Kubernetes Event to post on the job (the handler posts it)."""

    type: str  # "Normal" or "Warning"
    reason: str
    message: str


# The spec field a refused child comes from, named in the Failed message.
_USER_FIELDS = {"StatefulSet": "spec.workers.template", "Job": "spec.launcher"}


@dataclass
class Outcome:
    """What one pass did: events to post, the status it left, and when to look again.

    ``retry_after`` (seconds) is set when the pass could not finish its checklist (a child name
    taken by a foreign object) and should run again even if no watch event comes; ``wake_after``
    (seconds) when it waits for something no watch event will announce (a pod stuck
    terminating becomes due for force deletion).
    """

    events: list[Event]
    status: dict[str, Any]
    retry_after: float | None = None
    deleted: bool = False  # the pass deleted the job itself (ttlSecondsAfterFinished)
    wake_after: float | None = None


@dataclass
class Pass:
    """State carried through one reconcile pass."""

    job: JobSpec
    status: dict[str, Any]
    now: dt.datetime
    events: list[Event] = field(default_factory=list)
    wake_after: float | None = None  # see Outcome

    def wake_in(self, seconds: float | None) -> None:
        """Ask for a pass ``seconds`` from now (the earliest asked for wins); None: nothing."""
        if seconds is not None:
            self.wake_after = seconds if self.wake_after is None else min(self.wake_after,
                                                                           seconds)

    @property
    def now_text(self) -> str:
        return self.now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def condition(self, condition_type: str, is_set: bool, reason: str, message: str) -> None:
        self.status = st.set_condition(
            self.status, condition_type, is_set, reason, message,
            self.job.generation, self.now_text,
        )


def reconcile(body: dict[str, Any], settings: Settings, now: dt.datetime) -> Outcome:
    """Bring the job's children and status one step closer to the spec.

    Args:
        body: the MonarchJob object as a dict.
        now: current time (UTC); used for the startup timeout and condition timestamps.

    Returns:
        The events to post, the status written (or kept), and whether to retry.

    Raises:
        InvalidSpecError: the spec is invalid (the caller marks the job Failed).
    """
    job = JobSpec.from_body(body)
    previous = dict(body.get("status") or {})
    state = Pass(job=job, status=dict(previous), now=now)
    state.status.setdefault("startTime", state.now_text)
    retry_after = None
    if not st.is_finished(state.status) and state.status.get("attempt") is None:
        state.status = attempts.begin(state.status, 1, state.now_text)
    if not st.is_finished(state.status):
        _check_active_deadline(state)
    if not st.is_finished(state.status):  # noqa: SIM102 (the deadline may have ended it)
        try:
            if job.suspend:
                _suspend(state)
            else:
                _resume(state)
                _run_attempt(state, settings)
        except k8s.NotOwnedError as error:
            # Never adopted, never overwritten (field case C6): say so once, look again later.
            state.condition(st.WORKERS_READY, False, st.REASON_CHILD_NOT_OWNED, str(error))
            retry_after = NOT_OWNED_RETRY_SECONDS
        except k8s.RefusedError as error:
            # Resending the same object cannot succeed: the job ends naming the field (C12).
            field_path = _USER_FIELDS.get(error.kind, "spec")
            _fail(state, st.REASON_TEMPLATE_REFUSED, f"{field_path}: {error}")
    if st.is_finished(state.status):
        # Finished is final: nothing is created again, only let go of (cleanupPolicy, TTL).
        state.status.setdefault("completionTime", state.now_text)
        if _ttl_expired(state, previous):
            return Outcome(state.events, state.status, deleted=True)
        _clean_up(state)
        _count_ready_workers(state)
    _write_status(state, previous)
    return Outcome(state.events, state.status, retry_after, wake_after=state.wake_after)


def _check_active_deadline(state: Pass) -> None:
    """``spec.activeDeadlineSeconds`` from ``status.startTime``: past it the job Failed
    (``DeadlineExceeded``) and :func:`_clean_up` releases every pod."""
    limit = state.job.active_deadline_seconds
    if limit is None:
        return
    started = deadlines.parse_time(state.status["startTime"])
    if (state.now - started).total_seconds() <= limit:
        return
    _fail(state, st.REASON_DEADLINE_EXCEEDED,
          f"the job ran longer than spec.activeDeadlineSeconds ({limit}s); "
          "workers and launcher deleted")


def _ttl_expired(state: Pass, previous: dict[str, Any]) -> bool:
    """``spec.ttlSecondsAfterFinished`` from ``status.completionTime``: past it, delete the
    MonarchJob (its children follow by garbage collection). Only once the finished status
    has been written, so that even a TTL of 0 shows how the job ended first."""
    ttl = state.job.ttl_seconds_after_finished
    if ttl is None or not st.is_finished(previous) or "completionTime" not in previous:
        return False
    finished = deadlines.parse_time(previous["completionTime"])
    if (state.now - finished).total_seconds() < ttl:
        return False
    job = state.job
    k8s.delete_monarchjob(job.namespace, job.name)
    state.events.append(Event("Normal", st.REASON_TTL_EXPIRED,
                              f"deleted {ttl}s after it finished (spec.ttlSecondsAfterFinished)"))
    return True


def _run_attempt(state: Pass, settings: Settings) -> None:
    """The gate, then the current attempt's launcher; once more at once when an application
    failure restarted on the same, still Ready workers (the fast path)."""
    for _ in range(2):
        attempt = state.status["attempt"]
        pods = _ensure_workers(state, settings)
        if st.is_finished(state.status):
            return
        restarted_class = _start_or_follow_launcher(state, settings, pods)
        if restarted_class != policy.APPLICATION or state.status["attempt"] == attempt:
            return


def _ensure_workers(state: Pass, settings: Settings) -> list[dict[str, Any]]:
    """Secret, Service, StatefulSet; the gate (every worker Ready) or the startup timeout.

    Returns the worker pods of the current StatefulSet (pods of a deleted one are left out).
    """
    job = state.job
    secret = k8s.read("v1", "Secret", job.namespace, names.ssh_secret(job.name))
    if secret is None:
        keys = generate_job_keys(job.namespace, job.name)
        k8s.ensure(build_ssh_secret(job, settings, keys), job.uid)
    else:  # exists: keep its key bytes (retries must not rotate keys), but check the owner
        k8s.check_owner(secret, job.uid)
    k8s.ensure(build_worker_service(job), job.uid)
    if settings.network_policy:  # before any pod exists, so no pod is ever open to others
        k8s.ensure(build_network_policy(job), job.uid)
    worker_set, _ = k8s.ensure(build_worker_statefulset(job, settings), job.uid)
    pods = _worker_pods(state, worker_set)
    ready = observe.ready_worker_ordinals(job.name, job.replicas, pods)
    state.status["readyWorkers"] = f"{len(ready)}/{job.replicas}"
    if len(ready) == job.replicas:
        state.condition(st.WORKERS_READY, True, st.REASON_ALL_WORKERS_READY,
                        f"{job.replicas} of {job.replicas} workers accept SSH")
        return pods
    not_ready = [names.worker_pod(job.name, i) for i in range(job.replicas) if i not in ready]
    if st.is_true(state.status, st.RUNNING):
        return pods  # launched: a lost worker is judged with the attempt (lost_workers)
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    reasons = {name: observe.why_not_ready(by_name.get(name)) for name in not_ready}
    if any(name not in by_name for name in not_ready):
        failure = observe.create_failure(k8s.list_events(
            job.namespace, "StatefulSet", worker_set["metadata"]["name"],
            worker_set["metadata"]["uid"]))
        if failure and observe.is_invalid_object_message(failure):
            _fail(state, st.REASON_TEMPLATE_REFUSED,
                  f"spec.workers.template: the StatefulSet cannot create worker pods: {failure}")
            return pods
        if failure:
            reasons.update({name: f"not created: FailedCreate: {failure}"
                            for name in not_ready if name not in by_name})
    for name in not_ready:
        problem = observe.unrecoverable_problem(by_name[name]) if name in by_name else None
        if problem:  # waiting out spec.startupTimeoutSeconds would not help
            _fail(state, st.REASON_WORKER_CANNOT_START,
                  f"{name} ({problem}) can never become Ready")
            return pods
    described = [f"{name} ({reasons[name]})" for name in not_ready]
    state.condition(st.WORKERS_READY, False, st.REASON_WAITING_FOR_WORKERS,
                    f"{len(ready)}/{job.replicas} workers ready; waiting for {_short(described)}")
    record = attempts.current(state.status) or {}
    started = deadlines.parse_time(record.get("startTime") or state.status["startTime"])
    if (state.now - started).total_seconds() > job.startup_timeout_seconds:
        message = (f"workers not ready after {job.startup_timeout_seconds}s "
                   f"(spec.startupTimeoutSeconds): {_short(described)}")
        _end_attempt(state, policy.STARTUP, st.REASON_STARTUP_TIMEOUT, message)
    return pods


def _fail(state: Pass, reason: str, message: str) -> None:
    """The job Failed for ``reason`` at once, whatever restart budget is left (class Fatal:
    nothing a restart could cure); the attempt records it, a Warning event follows."""
    _end_attempt(state, policy.FATAL, reason, message)
    if st.is_true(state.status, st.RUNNING):
        state.condition(st.RUNNING, False, reason, message)


def _worker_pods(state: Pass, worker_set: dict[str, Any]) -> list[dict[str, Any]]:
    """Worker pods controlled by ``worker_set``: after a suspend or a recreated StatefulSet, the
    old one's pods may linger until garbage collection and must not pass the gate. Any worker
    pod stuck terminating (its node lost) is force-deleted in time: the StatefulSet recreates a
    pod only once its namesake is gone."""
    job = state.job
    pods = _let_go_of_stuck(state, k8s.list_pods(job.namespace, {
        constants.LABEL_JOB: job.name, constants.LABEL_ROLE: constants.ROLE_WORKER}))
    set_uid = worker_set.get("metadata", {}).get("uid")
    return [pod for pod in pods if k8s.controller_uid(pod) in (set_uid, None)]


def _start_or_follow_launcher(state: Pass, settings: Settings,
                              worker_pods: list[dict[str, Any]]) -> str | None:
    """Start the current attempt's launcher once the gate passed, then follow it.

    Returns the class of the failure that restarted the job in this call, else None.
    """
    job = state.job
    attempt = int(state.status["attempt"])
    launcher_name = names.launcher_job(job.name, attempt)
    if attempt > 1:  # the previous attempt's Job (idempotent: 404 is done)
        _delete_if_present("batch/v1", "Job", job.namespace,
                           names.launcher_job(job.name, attempt - 1))
    record = attempts.current(state.status) or {}
    launcher = k8s.read("batch/v1", "Job", job.namespace, launcher_name)
    if launcher is None and record.get("launchTime"):
        return _end_attempt(state, policy.INFRASTRUCTURE, st.REASON_LAUNCHER_LOST,
                            f"launcher Job {launcher_name} was deleted while it ran")
    if launcher is None:
        if not st.is_true(state.status, st.WORKERS_READY) or _waiting_for_earlier_launcher(state):
            return None
        launcher = _launch(state, settings, worker_pods, launcher_name)
    state.condition(st.RUNNING, True, st.REASON_LAUNCHER_STARTED,
                    f"launcher {launcher_name} running (attempt {attempt})")
    pods = k8s.list_pods(job.namespace, {constants.LABEL_JOB: job.name,
                                         constants.LABEL_ROLE: constants.ROLE_LAUNCHER,
                                         constants.LABEL_ATTEMPT: str(attempt)})
    outcome = observe.launcher_outcome(launcher, pods)
    if outcome.finished and outcome.succeeded:  # final, whatever happened to a worker since
        _succeed(state, outcome)
        return None
    snapshot = state.status.get("attemptWorkers") or []
    unready_nodes = frozenset(node for node in attempts.nodes_to_check(snapshot, worker_pods)
                              if not k8s.node_is_ready(node))
    lost = attempts.lost_workers(snapshot, worker_pods, unready_nodes)
    if lost:
        restarted = all(worker.in_place for worker in lost)
        reason = st.REASON_WORKER_RESTARTED if restarted else st.REASON_WORKER_EVICTED
        message = f"worker {_short([worker.describe() for worker in lost])} lost mid-run"
        return _end_attempt(state, policy.INFRASTRUCTURE, reason, message, outcome, lost, pods)
    if not outcome.finished:
        return None
    if outcome.exit_code is None:  # no container ever ended: the pod itself was lost
        return _end_attempt(state, policy.INFRASTRUCTURE, st.REASON_LAUNCHER_LOST,
                            f"launcher pod lost: {outcome.message}", outcome, None, pods)
    judged = policy.classify_exit_code(job.run_policy, outcome.exit_code)
    reason = (st.REASON_FATAL_EXIT_CODE if judged.failure_class == policy.FATAL
              else st.REASON_LAUNCHER_FAILED)
    message = observe.launcher_failure_message(outcome)
    if judged.rule_index is not None:
        message += f" ({judged.describe(outcome.exit_code)})"
    return _end_attempt(state, judged.failure_class, reason, message, outcome, None, pods)


def _waiting_for_earlier_launcher(state: Pass) -> bool:
    """Whether the next attempt still waits for a launcher pod of an earlier attempt to end
    (stopping after its Job was deleted): its Monarch workers may still hold the workers' port.

    Its pod's deletion wakes the job. A pod that can never end (its node lost, a finalizer
    nobody removes) is waited for only until :mod:`.stuckpods` says, then force-deleted with a
    Warning event, and the attempt goes on; a pod left without its Job (orphaned) is deleted.
    """
    job = state.job
    attempt = str(state.status["attempt"])
    pods = [pod for pod in k8s.list_pods(job.namespace, {
                constants.LABEL_JOB: job.name, constants.LABEL_ROLE: constants.ROLE_LAUNCHER})
            if pod["metadata"].get("labels", {}).get(constants.LABEL_ATTEMPT) != attempt
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    for pod in pods:
        if not pod["metadata"].get("deletionTimestamp") and k8s.controller_uid(pod) is None:
            k8s.delete_pod(job.namespace, pod["metadata"]["name"])  # no Job, no GC to end it
    waiting = [pod for pod in _let_go_of_stuck(state, pods)
               if not stuckpods.is_force_deleted(pod)]
    if waiting:
        metadata = waiting[0]["metadata"]
        deadline = stuckpods.deletion_deadline(waiting[0])
        until = ("" if deadline is None else ", force-deleted "
                 f"{int(stuckpods.FORCE_DELETE_AFTER_SECONDS)}s after its grace period ends "
                 f"({deadline.strftime('%H:%M:%SZ')}) if it has not")
        earlier = metadata.get("labels", {}).get(constants.LABEL_ATTEMPT)
        # Same reason as before (Restarting, or JobSuspended after a resume): only the words.
        reason = (st.get_condition(state.status, st.RUNNING) or {}).get("reason")
        state.condition(st.RUNNING, False, str(reason or st.REASON_RESTARTING),
                        f"attempt {attempt} waits for launcher pod {metadata['name']} of "
                        f"attempt {earlier} to end{until}")
    return bool(waiting)


def _let_go_of_stuck(state: Pass, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Force-delete those of ``pods`` stuck terminating long past their grace period
    (:mod:`.stuckpods`: node lost, finalizers), each with a Warning event and in the current
    attempt's ``forceDeletedPods``; ask for a pass when the next one becomes due.

    Returns ``pods`` without the ones force-deleted here.
    """
    job = state.job
    kept = []
    for pod in pods:
        if not stuckpods.is_overdue(pod, state.now):
            kept.append(pod)
            continue
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        described = stuckpods.describe_stuck(pod, state.now,
                                             k8s.node_is_ready(node) if node else None)
        if not k8s.delete_pod(job.namespace, name, force=True):
            continue  # gone meanwhile (404): nothing was stuck
        state.events.append(Event("Warning", st.REASON_POD_FORCE_DELETED,
                                  f"pod {described}: force-deleted (nothing else would end it); "
                                  "the job goes on without it"))
        record = attempts.current(state.status) or {}
        state.status = attempts.update_current(
            state.status, forceDeletedPods=[*record.get("forceDeletedPods", []), name])
    state.wake_in(stuckpods.seconds_until_overdue(kept, state.now))
    return kept


def _launch(state: Pass, settings: Settings, worker_pods: list[dict[str, Any]],
            launcher_name: str) -> dict[str, Any]:
    """Hostfile (from the Ready workers, never rewritten mid-run), then the launcher Job; the
    worker pods it starts on are recorded so that losing one is noticed."""
    job = state.job
    attempt = int(state.status["attempt"])
    k8s.ensure(build_hostfile_configmap(job, settings), job.uid)
    launcher, created = k8s.ensure(build_launcher_job(job, settings, attempt), job.uid)
    state.status["attemptWorkers"] = attempts.worker_snapshot(job.name, job.replicas, worker_pods)
    state.status = attempts.update_current(state.status, launchTime=state.now_text,
                                           launcherJob=launcher_name)
    if created:
        state.events.append(Event("Normal", st.REASON_LAUNCHER_STARTED,
                                  f"all {job.replicas} workers ready; launcher {launcher_name} "
                                  f"started (attempt {attempt})"))
    return launcher


def _succeed(state: Pass, outcome: observe.LauncherOutcome) -> None:
    state.status["launcher"] = {"exitCode": outcome.exit_code or 0,
                                "reason": observe.launcher_reason(outcome)}
    state.status["completionTime"] = state.now_text
    state.status.pop("attemptWorkers", None)
    state.status = attempts.update_current(state.status, endTime=state.now_text,
                                           **{"class": "Succeeded"}, exitCode=0)
    state.condition(st.RUNNING, False, st.REASON_LAUNCHER_SUCCEEDED, "launcher finished")
    state.condition(st.SUCCEEDED, True, st.REASON_LAUNCHER_SUCCEEDED, "launcher exited 0")
    state.events.append(Event("Normal", st.REASON_LAUNCHER_SUCCEEDED, "job succeeded"))


def _end_attempt(state: Pass, failure_class: str, reason: str, message: str,
                 outcome: observe.LauncherOutcome | None = None,
                 lost: list[attempts.LostWorker] | None = None,
                 launcher_pods: list[dict[str, Any]] | None = None) -> str | None:
    """Record how the current attempt failed, then restart (a new attempt) or fail the job as
    ``spec.runPolicy`` says. Returns ``failure_class`` when the job restarts, else None."""
    job = state.job
    attempt = int(state.status["attempt"])
    _record_failure(state, failure_class, reason, message, outcome, lost, launcher_pods)
    spent = dict(state.status.get("failureCounts") or {})
    decision = policy.decide(job.run_policy, failure_class, spent)
    launcher_name = names.launcher_job(job.name, attempt)
    if failure_class == policy.INFRASTRUCTURE:
        # The launcher may still run: stop it, so that a recreated worker is never folded into
        # the old mesh and a failed job holds no pods. (An ended launcher's pod is kept for its
        # logs until the next attempt replaces it.)
        _delete_if_present("batch/v1", "Job", job.namespace, launcher_name)
        for worker in lost or []:
            if worker.node_lost:  # to be recreated elsewhere (force-deleted if it cannot end)
                k8s.delete_pod(job.namespace, worker.name)
    if not decision.restart:
        state.status["completionTime"] = state.now_text
        # The launcher's own line stays the whole message when no restart was asked for.
        single = (failure_class in (policy.STARTUP, policy.FATAL) or (
            failure_class == policy.APPLICATION and job.run_policy.backoff_limit == 0))
        text = message if single else f"{message}; attempt {attempt}, {decision.budget}"
        if failure_class in (policy.APPLICATION, policy.INFRASTRUCTURE):
            state.condition(st.RUNNING, False, reason, "attempt failed; no restart left")
        state.condition(st.FAILED, True, reason, text)
        state.events.append(Event("Warning", reason, text))
        return None
    key = "application" if failure_class == policy.APPLICATION else "infrastructure"
    state.status["failureCounts"] = {**spent, key: spent.get(key, 0) + 1}
    if failure_class == policy.INFRASTRUCTURE:
        # Rebuilt from the new pods once the gate passes again.
        _delete_if_present("v1", "ConfigMap", job.namespace, names.hostfile_configmap(job.name))
        state.condition(st.WORKERS_READY, False, st.REASON_RESTARTING,
                        f"re-checking every worker before attempt {attempt + 1}")
    state.status = attempts.begin(state.status, attempt + 1, state.now_text)
    text = (f"attempt {attempt} failed ({failure_class}: {message}); starting attempt "
            f"{attempt + 1}, {decision.budget}")
    state.condition(st.RUNNING, False, st.REASON_RESTARTING, text)
    state.events.append(Event("Warning", st.REASON_RESTARTING, text))
    return failure_class


def _record_failure(state: Pass, failure_class: str, reason: str, message: str,
                    outcome: observe.LauncherOutcome | None,
                    lost: list[attempts.LostWorker] | None,
                    launcher_pods: list[dict[str, Any]] | None) -> None:
    """End the current attempt's record: class, reason, exit code, failing rank, output tail
    (the launcher's log where the kubelet serves it, else its termination message)."""
    fields: dict[str, Any] = {"endTime": state.now_text, "class": failure_class,
                              "reason": reason, "message": attempts.shorten(message)}
    if outcome is not None and outcome.finished:
        if outcome.exit_code is not None:
            fields["exitCode"] = outcome.exit_code
            state.status["launcher"] = {"exitCode": outcome.exit_code,
                                        "reason": observe.launcher_reason(outcome)}
        fields.update(attempts.failing_rank(outcome.message))
        fields["outputTail"] = attempts.output_tail(
            _launcher_output(launcher_pods or []) or outcome.message) or None
    if lost:
        fields["lostWorkers"] = [worker.name for worker in lost]
    state.status.pop("attemptWorkers", None)
    state.status = attempts.update_current(state.status, **fields)


def _launcher_output(pods: list[dict[str, Any]]) -> str:
    """The tail of the attempt's launcher container log, "" when none can be read."""
    for pod in pods:
        text = k8s.pod_log_tail(pod["metadata"].get("namespace", ""), pod["metadata"]["name"],
                                LAUNCHER_CONTAINER, attempts.OUTPUT_TAIL_LINES)
        if text:
            return text
    return ""


def _suspend(state: Pass) -> None:
    """``spec.suspend``: delete the launcher and the workers (GPUs released) and the hostfile
    (stale once the pods go); keep the key, the Service and every counter. A running attempt
    ends as ``Suspended`` (no budget spent); resuming starts the next one."""
    job = state.job
    attempt = int(state.status["attempt"])
    record = attempts.current(state.status) or {}
    _delete_if_present("batch/v1", "Job", job.namespace, names.launcher_job(job.name, attempt))
    _delete_if_present("apps/v1", "StatefulSet", job.namespace, names.worker_set(job.name))
    _delete_if_present("v1", "ConfigMap", job.namespace, names.hostfile_configmap(job.name))
    if record.get("launchTime") and not record.get("endTime"):
        state.status.pop("attemptWorkers", None)
        state.status = attempts.update_current(
            state.status, endTime=state.now_text, reason=st.REASON_SUSPENDED,
            message="spec.suspend set while it ran", **{"class": policy.SUSPENDED})
        state.status = attempts.begin(state.status, attempt + 1, state.now_text, restart=False)
    pods = _let_go_of_stuck(state, k8s.list_pods(job.namespace,
                                                 {constants.LABEL_JOB: job.name}))
    ready = [pod for pod in pods if observe.pod_is_ready(pod)
             and pod["metadata"].get("labels", {}).get(constants.LABEL_ROLE)
             == constants.ROLE_WORKER]
    state.status["readyWorkers"] = f"{len(ready)}/{job.replicas}"
    message = ("spec.suspend is true: workers and launcher deleted, GPUs released"
               if not pods else f"spec.suspend is true: {len(pods)} pod(s) still terminating")
    if not st.is_true(state.status, st.SUSPENDED):
        state.events.append(Event("Normal", st.REASON_SUSPENDED, "spec.suspend is true: "
                                  "deleting workers and launcher"))
    state.condition(st.SUSPENDED, True, st.REASON_SUSPENDED, message)
    state.condition(st.RUNNING, False, st.REASON_SUSPENDED, "suspended")
    state.condition(st.WORKERS_READY, False, st.REASON_SUSPENDED, "suspended")


def _resume(state: Pass) -> None:
    """Back from ``spec.suspend``: the current attempt's gate starts now (workers are created
    again by the next steps, the hostfile and launcher only after every worker is Ready)."""
    if not st.is_true(state.status, st.SUSPENDED):
        return
    state.status = attempts.update_current(state.status, startTime=state.now_text)
    state.condition(st.SUSPENDED, False, st.REASON_RESUMED,
                    "spec.suspend is false: workers recreated, launcher starts once all are Ready")
    state.events.append(Event("Normal", st.REASON_RESUMED, "spec.suspend is false: resuming"))


def _clean_up(state: Pass) -> None:
    """Let go of a finished job's children as ``spec.cleanupPolicy`` says.

    A launcher that still runs (the job failed around it, e.g. its deadline) is always
    stopped; workers hold GPUs and go unless the policy is KeepAll, and also then when the
    job exceeded its ``activeDeadlineSeconds`` (a deadline releases everything).
    """
    job = state.job
    namespace = job.namespace
    cleanup = job.cleanup_policy
    deadline = st.reason_of(state.status, st.FAILED) == st.REASON_DEADLINE_EXCEEDED
    launcher_name = names.launcher_job(job.name, int(state.status.get("attempt") or 1))
    launcher = k8s.read("batch/v1", "Job", namespace, launcher_name)
    launcher_running = launcher is not None and not observe.launcher_outcome(launcher, []).finished
    if (launcher_running or cleanup == CLEANUP_DELETE_ALL) and _delete_if_present(
            "batch/v1", "Job", namespace, launcher_name):
        state.events.append(Event("Normal", "LauncherDeleted", "launcher Job deleted"))
    if (cleanup != CLEANUP_KEEP_ALL or deadline) and _delete_if_present(
            "apps/v1", "StatefulSet", namespace, names.worker_set(job.name)):
        state.events.append(Event("Normal", "WorkersReleased", "worker pods deleted"))
    if cleanup == CLEANUP_DELETE_ALL:  # literal kinds: the chart's RBAC test reads them
        _delete_if_present("v1", "ConfigMap", namespace, names.hostfile_configmap(job.name))
        _delete_if_present("v1", "Service", namespace, names.worker_service(job.name))
        _delete_if_present("v1", "Secret", namespace, names.ssh_secret(job.name))


def _count_ready_workers(state: Pass) -> None:
    """READY says how many workers are Ready now, also after the job finished."""
    job = state.job
    pods = _let_go_of_stuck(state, k8s.list_pods(job.namespace, {
        constants.LABEL_JOB: job.name, constants.LABEL_ROLE: constants.ROLE_WORKER}))
    ready = observe.ready_worker_ordinals(job.name, job.replicas, pods)
    state.status["readyWorkers"] = f"{len(ready)}/{job.replicas}"


def _delete_if_present(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete unless absent or already being deleted: a pass on a finished job sends no request
    (a DELETE answered 404 is still a write in the audit log, field case C5)."""
    observed = k8s.read(api_version, kind, namespace, name)
    if observed is None or observed.get("metadata", {}).get("deletionTimestamp"):
        return False
    return k8s.delete(api_version, kind, namespace, name)


def _write_status(state: Pass, previous: dict[str, Any]) -> None:
    posted = {event.reason for event in state.events}
    for transition in st.condition_transitions(previous, state.status):
        if transition.reason not in posted:  # every transition gets an Event, once
            state.events.append(Event(transition.type, transition.reason, transition.message))
            posted.add(transition.reason)
    state.status["phase"] = st.summarize_phase(state.status)
    state.status["message"] = st.summarize_message(state.status)
    state.status["observedGeneration"] = state.job.generation
    if state.status != previous:
        k8s.patch_job_status(state.job.namespace, state.job.name, state.status)


def _short(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
