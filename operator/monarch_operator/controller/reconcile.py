"""One idempotent, level-based reconcile pass of a MonarchJob.

Reads like a checklist: key Secret, Service, StatefulSet, wait for Ready workers (or time out),
hostfile, launcher, outcome, release GPUs when finished, one status patch when it changed.
Safe to run any number of times from any trigger (a watch event on the job or a child, the
operator starting, a deadline); it writes nothing when nothing changed.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller import k8s, observe
from monarch_operator.controller import status as st
from monarch_operator.controller.builders.hostfile import build_hostfile_configmap
from monarch_operator.controller.builders.launcher import build_launcher_job
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.settings import Settings
from monarch_operator.controller.spec import JobSpec
from monarch_operator.controller.sshkeys import generate_ssh_keypair

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


@dataclass
class Outcome:
    """What one pass did: events to post, the status it left, and when to look again.

    ``retry_after`` (seconds) is set when the pass could not finish its checklist (a child name
    taken by a foreign object) and should run again even if no watch event comes.
    """

    events: list[Event]
    status: dict[str, Any]
    retry_after: float | None = None


@dataclass
class Pass:
    """State carried through one reconcile pass."""

    job: JobSpec
    status: dict[str, Any]
    now: dt.datetime
    events: list[Event] = field(default_factory=list)

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
    if not st.is_finished(state.status):
        try:
            _ensure_workers(state, settings)
            _start_or_follow_launcher(state, settings)
        except k8s.NotOwnedError as error:
            # Never adopted, never overwritten (field case C6): say so once, look again later.
            state.condition(st.WORKERS_READY, False, st.REASON_CHILD_NOT_OWNED, str(error))
            retry_after = NOT_OWNED_RETRY_SECONDS
    if st.is_finished(state.status):
        _release_workers(state)
    _write_status(state, previous)
    return Outcome(state.events, state.status, retry_after)


def _ensure_workers(state: Pass, settings: Settings) -> None:
    job = state.job
    secret = k8s.read("v1", "Secret", job.namespace, names.ssh_secret(job.name))
    if secret is None:
        private_key, public_key = generate_ssh_keypair(f"monarch-job {job.namespace}/{job.name}")
        k8s.ensure(build_ssh_secret(job, private_key, public_key), job.uid)
    else:  # exists: keep its key bytes (retries must not rotate keys), but check the owner
        k8s.check_owner(secret, job.uid)
    k8s.ensure(build_worker_service(job), job.uid)
    k8s.ensure(build_worker_statefulset(job, settings), job.uid)
    pods = k8s.list_pods(job.namespace, {constants.LABEL_JOB: job.name,
                                         constants.LABEL_ROLE: constants.ROLE_WORKER})
    ready = observe.ready_worker_ordinals(job.name, job.replicas, pods)
    state.status["readyWorkers"] = f"{len(ready)}/{job.replicas}"
    if len(ready) == job.replicas:
        state.condition(st.WORKERS_READY, True, st.REASON_ALL_WORKERS_READY,
                        f"{job.replicas} of {job.replicas} workers accept SSH")
        return
    not_ready = [names.worker_pod(job.name, i) for i in range(job.replicas) if i not in ready]
    if st.is_true(state.status, st.RUNNING):
        return  # already launched: mid-run worker loss is the launcher's to report
    state.condition(st.WORKERS_READY, False, st.REASON_WAITING_FOR_WORKERS,
                    f"{len(ready)}/{job.replicas} workers ready; waiting for {_short(not_ready)}")
    started = dt.datetime.strptime(state.status["startTime"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=dt.UTC)
    if (state.now - started).total_seconds() > job.startup_timeout_seconds:
        by_name = {pod["metadata"]["name"]: pod for pod in pods}
        reasons = [f"{name} ({observe.why_not_ready(by_name.get(name))})" for name in not_ready]
        message = (f"workers not ready after {job.startup_timeout_seconds}s "
                   f"(spec.startupTimeoutSeconds): {_short(reasons)}")
        state.condition(st.FAILED, True, st.REASON_STARTUP_TIMEOUT, message)
        state.events.append(Event("Warning", st.REASON_STARTUP_TIMEOUT, message))


def _start_or_follow_launcher(state: Pass, settings: Settings) -> None:
    job = state.job
    if st.is_finished(state.status):
        return
    launcher = k8s.read("batch/v1", "Job", job.namespace, names.launcher_job(job.name))
    if launcher is None:
        if not st.is_true(state.status, st.WORKERS_READY):
            return
        # The hostfile is written once, from Ready workers, and never rewritten mid-run.
        k8s.ensure(build_hostfile_configmap(job, settings), job.uid)
        launcher, created = k8s.ensure(build_launcher_job(job, settings), job.uid)
        if created:
            state.events.append(Event("Normal", st.REASON_LAUNCHER_STARTED,
                                      f"all {job.replicas} workers ready; launcher started"))
    state.condition(st.RUNNING, True, st.REASON_LAUNCHER_STARTED,
                    f"launcher {names.launcher_job(job.name)} running")
    pods = k8s.list_pods(job.namespace, {constants.LABEL_JOB: job.name,
                                         constants.LABEL_ROLE: constants.ROLE_LAUNCHER})
    outcome = observe.launcher_outcome(launcher, pods)
    if not outcome.finished:
        return
    state.status["launcher"] = {"exitCode": outcome.exit_code if outcome.exit_code is not None
                                else -1, "reason": observe.launcher_reason(outcome)}
    state.status["completionTime"] = state.now_text
    state.condition(st.RUNNING, False, st.REASON_LAUNCHER_SUCCEEDED if outcome.succeeded
                    else st.REASON_LAUNCHER_FAILED, "launcher finished")
    if outcome.succeeded:
        state.condition(st.SUCCEEDED, True, st.REASON_LAUNCHER_SUCCEEDED, "launcher exited 0")
        state.events.append(Event("Normal", st.REASON_LAUNCHER_SUCCEEDED, "job succeeded"))
    else:
        # The launcher's own final failure line (its termination message) when it wrote one.
        message = observe.launcher_failure_message(outcome)
        state.condition(st.FAILED, True, st.REASON_LAUNCHER_FAILED, message)
        state.events.append(Event("Warning", st.REASON_LAUNCHER_FAILED, message))


def _release_workers(state: Pass) -> None:
    """Finished jobs hold no GPUs: delete the worker StatefulSet (its pods follow)."""
    job = state.job
    if _delete_if_present("apps/v1", "StatefulSet", job.namespace, names.worker_set(job.name)):
        state.events.append(Event("Normal", "WorkersReleased", "worker pods deleted"))


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
    state.status["observedGeneration"] = state.job.generation
    if state.status != previous:
        k8s.patch_job_status(state.job.namespace, state.job.name, state.status)


def _short(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
