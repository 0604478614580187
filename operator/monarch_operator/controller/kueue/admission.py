"""The Kueue step of a reconcile pass: nothing of a queued job runs until Kueue admits its
Workload; an evicted job stops, then gives its quota back; a running one reports
``PodsReady``; a finished one marks its Workload ``Finished``.

A job is under Kueue when it has the label ``kueue.x-k8s.io/queue-name``, or when its namespace
has a LocalQueue named ``default`` as the job first appears (Kueue's LocalQueue defaulting;
its webhooks cannot default a kind they do not serve). The queue is recorded in
``status.queue`` and the job stays there.

While not admitted the job has the condition ``Queued`` (STATUS ``Queued``, MESSAGE the queue
and Kueue's reason); the startup timeout does not run (:mod:`..deadlines`), and the time spent
queued is added to ``status.queue.queuedSeconds`` and observed in the histogram
``monarch_operator_queue_wait_seconds`` at each admission. An eviction (preemption, a
``waitForPodsReady`` timeout, a stopped queue, deactivation) ends a running attempt with the
class ``Evicted``: it counts in RESTARTS and ``status.attempts`` and spends no restart budget.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException
from prometheus_client import Histogram

from monarch_operator import constants, names
from monarch_operator.controller.judge import endings
from monarch_operator.controller.k8s import deletes, errors, reads
from monarch_operator.controller.kueue import client, multikueue, topology
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.release import release
from monarch_operator.controller.spec import policy
from monarch_operator.controller.spec.groups import WorkerGroup
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts, causes, deadlines
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Event, Pass

# Attempt class of an attempt stopped by Kueue (status.attempts[].class): not a failure of
# the job, no budget spent, but a restart (RESTARTS) all the same.
EVICTED = policy.EVICTED
# Reasons of the Queued condition (and Events).
REASON_QUEUED = "Queued"
REASON_ADMITTED = "Admitted"
REASON_EVICTED = "Evicted"

QUEUE_WAIT = Histogram(
    "monarch_operator_queue_wait_seconds",
    "Time a MonarchJob waited in its Kueue LocalQueue before each admission.",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600))


@dataclass(frozen=True)
class Queue:
    """A job under Kueue in this pass: its Workload as read, and whether it may run (then
    ``job`` is the spec with admission's node selectors and tolerations in its templates)."""

    workload: dict[str, Any]
    admitted: bool
    job: JobSpec


def queue_of(state: Pass, settings: Settings) -> str | None:
    """The job's LocalQueue: the recorded one, its label, or (with ``settings.kueue``)
    ``default`` when that LocalQueue exists as the job first appears (one read, on the job's
    first pass); None otherwise."""
    recorded = (state.status.get("queue") or {}).get("name")
    if recorded:
        return str(recorded)
    if state.job.queue_name:
        return state.job.queue_name
    first_pass = (state.status.get("attempt") == 1 and not state.status.get("conditions"))
    if settings.kueue and first_pass and client.local_queue_exists(state.job.namespace,
                                                                   wl.DEFAULT_LOCAL_QUEUE):
        return wl.DEFAULT_LOCAL_QUEUE
    return None


def gate(state: Pass, settings: Settings) -> Queue | None:
    """Ensure the job's Workload and act on Kueue's verdict; None for a job not under Kueue.

    Not admitted: the job's pods are stopped (an eviction ends the running attempt first), and
    once none is left an evicted Workload's quota reservation is released.

    Raises:
        errors.NotOwnedError, errors.RefusedError: the Workload's name is taken, or it was refused.
    """
    queue = queue_of(state, settings)
    if queue is None:
        return None
    job = state.job
    record = dict(state.status.get("queue") or {})
    if job.queue_name != queue:  # the namespace's default LocalQueue: say so on the job too
        client.label_job_queue(job.namespace, job.name, queue)
    record.update(name=queue,
                  workload=job.prebuilt_workload or names.workload(job.name, job.uid))
    state.status["queue"] = record
    if job.prebuilt_workload:  # a MultiKueue worker's copy: MultiKueue made its Workload
        workload, missing = multikueue.adopt(state, lambda: _desired(state, settings, queue))
        if workload is None:
            left = _stop(state, wl.Admission(wl.STATE_PENDING))
            _queued(state, queue, wl.Admission(
                wl.STATE_PENDING, multikueue.REASON_AWAITING_WORKLOAD, missing), left)
            return Queue({}, False, job)
    else:
        workload = client.read_workload(job.namespace, record["workload"])
    if workload is not None and not job.prebuilt_workload and _replaced(state, settings, queue,
                                                                         workload):
        return Queue({}, False, job)
    if workload is None:
        try:
            workload = client.create_workload(_desired(state, settings, queue), job.uid)
        except ApiException as error:
            if error.status != 404:
                raise
            _not_served(state, queue)  # never run a labelled job past its admission
            return Queue({}, False, job)
    verdict = wl.admission(workload)
    if verdict.state == wl.STATE_ADMITTED:
        _admitted(state, verdict)
        updates = wl.pod_set_updates(workload, client.flavor_specs(
            {flavor for flavors in verdict.flavors.values() for flavor in flavors.values()}))
        conflict = _flavor_conflict(job, updates)
        if conflict:  # never resolved by whichever label is written last (C31)
            endings.fail(state, st.REASON_TEMPLATE_REFUSED, conflict)
            return Queue(workload, False, job)
        return Queue(workload, True, _with_admission(job, updates))
    left = _stop(state, verdict)
    if verdict.state == wl.STATE_EVICTED and not left and multikueue.may_release(state):
        client.write_workload_status(workload, wl.released_status(workload, state.now_text))
    _queued(state, queue, verdict, left)
    return Queue(workload, False, job)


def _with_admission(job: JobSpec, updates: dict[str, wl.PodSetUpdate]) -> JobSpec:
    """``job`` with what admission put into each pod set applied to that pod set's template
    only: the launcher's, and each worker group's own (``spec.workers.template`` for a job
    without groups), so each group keeps its own flavor (C31)."""
    launcher_template = wl.with_updates(job.launcher_template, updates.get(wl.PODSET_LAUNCHER))
    if not job.worker_groups:
        return dataclasses.replace(
            job, worker_template=wl.with_updates(job.worker_template,
                                                 updates.get(wl.PODSET_WORKERS)),
            launcher_template=launcher_template)
    groups = tuple(dataclasses.replace(group, template=wl.with_updates(
                       group.template, updates.get(wl.pod_set_name(group))))
                   for group in job.worker_groups)
    return dataclasses.replace(job, worker_groups=groups, launcher_template=launcher_template)


def _flavor_conflict(job: JobSpec, updates: dict[str, wl.PodSetUpdate]) -> str | None:
    """Why a worker group cannot run where Kueue admitted it: its own node selector
    (``spec.workers.template``'s, then its template's) gives a key another value than its
    flavor's node labels; None when none does. Only for jobs with ``spec.workerGroups``."""
    for group in job.worker_groups:
        update = updates.get(wl.pod_set_name(group))
        if update is not None:
            clash = _contradiction(job, group, update.node_selector, "the flavor Kueue "
                                   "admitted it to")
            if clash:
                return f"{clash}; remove the key or point the group at a queue with that flavor"
    return None


def _contradiction(job: JobSpec, group: WorkerGroup, node_labels: dict[str, str],
                   flavor: str) -> str | None:
    """``spec.workerGroups 'g': its nodeSelector k=v contradicts k=w of <flavor>`` for the
    first key where the group's own selector and ``node_labels`` differ, else None."""
    own = {**((job.worker_template.get("spec") or {}).get("nodeSelector") or {}),
           **((group.template.get("spec") or {}).get("nodeSelector") or {})}
    for key, value in sorted(node_labels.items()):
        if key in own and own[key] != value:
            return (f"spec.workerGroups {group.name!r}: its nodeSelector {key}={own[key]} "
                    f"contradicts {key}={value} of {flavor}")
    return None


# Kueue's words when a pod set's node selector rules out a flavor (flavorassigner).
_NO_MATCH = re.compile(r"couldn't assign flavors to pod set (?P<podset>[a-z0-9-]+): flavor "
                       r"(?P<flavor>\S+) doesn't match node affinity")


def _selector_hint(job: JobSpec, message: str) -> str:
    """For a worker group that Kueue cannot place because its own node selector rules its
    flavor out (C31): which key, with both values (one ResourceFlavor read); else ""."""
    found = _NO_MATCH.search(message)
    group = next((g for g in job.worker_groups
                  if found and wl.pod_set_name(g) == found["podset"]), None)
    if found is None or group is None:
        return ""
    labels = (client.flavor_specs({found["flavor"]}).get(found["flavor"]) or {}).get(
        "nodeLabels") or {}
    clash = _contradiction(job, group, dict(labels), f"flavor {found['flavor']}")
    return f"; {clash}" if clash else ""


REASON_WORKLOAD_REPLACED = "WorkloadReplaced"
# How soon a pass looks again after the job's outdated Workload was deleted.
REPLACE_RECHECK_SECONDS = 1.0


def _replaced(state: Pass, settings: Settings, queue: str, workload: dict[str, Any]) -> bool:
    """Whether the job's Workload is going (or was just deleted) because the job's spec
    changed while it was queued (:func:`.workload.outdated`); a pass comes back soon to make
    the new one. Kueue's quota is unaffected: an outdated Workload holds none."""
    if workload["metadata"].get("deletionTimestamp"):
        state.wake_in(REPLACE_RECHECK_SECONDS)
        return True
    if wl.admission(workload).state != wl.STATE_PENDING:
        return False
    if not wl.outdated(workload, _desired(state, settings, queue)):
        return False
    client.delete_workload(workload)
    state.events.append(Event("Normal", REASON_WORKLOAD_REPLACED, (
        f"the job's spec changed while it was queued: Workload {workload['metadata']['name']} "
        "is replaced so that Kueue sees the new request")))
    state.wake_in(REPLACE_RECHECK_SECONDS)
    return True


def _desired(state: Pass, settings: Settings, queue: str) -> dict[str, Any]:
    """The job's Workload as it should be now.

    Raises:
        errors.RefusedError: a template's topology annotation is malformed, or the priority
            class does not exist (the job says so and waits for a fix).
    """
    try:
        return wl.build_workload(state.job, settings, queue, _priority(state.job))
    except topology.TopologyRequestError as error:
        raise errors.RefusedError(wl.KIND, names.workload(state.job.name, state.job.uid),
                               str(error)) from None


def _priority(job: JobSpec) -> tuple[str, int] | None:
    if not job.priority_class:
        return None
    value = client.priority_value(job.priority_class)
    if value is None:
        raise errors.RefusedError(wl.KIND, job.name, f"metadata.labels[{wl.LABEL_PRIORITY_CLASS}]: "
                               f"no WorkloadPriorityClass {job.priority_class!r}")
    return job.priority_class, value


def _admitted(state: Pass, verdict: wl.Admission) -> None:
    """Leaving the queue: the wait is counted, and the attempt's gate (and its startup
    timeout) starts now."""
    record = state.status["queue"]
    record["clusterQueue"] = verdict.cluster_queue
    since = record.get("queuedSince")
    if since is None:
        return
    record["queuedSince"] = None  # the status is merge-patched: None removes the key
    waited = max(0.0, (state.now - deadlines.parse_time(since)).total_seconds())
    record["queuedSeconds"] = int(record.get("queuedSeconds") or 0) + int(waited)
    record["admissions"] = int(record.get("admissions") or 0) + 1
    QUEUE_WAIT.observe(waited)
    state.status = attempts.update_current(state.status, startTime=state.now_text)
    message = (f"admitted by ClusterQueue {verdict.cluster_queue} after {int(waited)}s in "
               f"LocalQueue {record['name']}")
    state.condition(st.QUEUED, False, REASON_ADMITTED, message)
    state.events.append(Event("Normal", REASON_ADMITTED, message))


def _stop(state: Pass, verdict: wl.Admission) -> int:
    """Delete the launcher, the workers and the hostfile (as a suspension does, the launcher
    first with a checkpoint grace period); a running or starting attempt ends as
    :data:`EVICTED`. Returns how many pods are still there.

    An attempt that ends here ends first: the pass that records it deletes nothing and asks
    for a pass right after its status write, which deletes (as :func:`.suspension.suspend`
    does, for the same reason: a leader cut off between its deletes and its status write left
    the next one, once Kueue had admitted the job again, a running attempt with its pods gone,
    judged an Infrastructure failure)."""
    job = state.job
    attempt = int(state.status["attempt"])
    record = attempts.current(state.status) or {}
    launcher = release.running_launcher(job.namespace, job.name, attempt)
    # Only an attempt admitted and not yet stopped ends here: with a checkpoint grace period
    # the workers go passes after the launcher, when the next attempt (begun by this eviction,
    # not admitted: no ClusterQueue in the record) is current.
    admitted = bool((state.status.get("queue") or {}).get("clusterQueue"))
    if admitted and not record.get("endTime") and release.has_something_to_stop(job, launcher):
        why = causes.of_kueue(verdict.reason, verdict.message).words()
        state.status.pop("attemptWorkers", None)
        state.status = attempts.update_current(
            state.status, endTime=state.now_text, reason=f"Evicted{verdict.reason}",
            message=why, **{"class": EVICTED})
        state.status = attempts.begin(state.status, attempt + 1, state.now_text, restart=True)
        state.events.append(Event("Warning", REASON_EVICTED, why))
        state.after_status_write()
    else:
        _, workers_may_go = release.stop_launcher_first(state, launcher)
        if workers_may_go:
            release.delete_worker_sets(job)
            deletes.delete_if_present("v1", "ConfigMap", job.namespace,
                                      names.hostfile_configmap(job.name))
    pods = release.let_go_of_stuck(state, reads.list_pods(job.namespace,
                                                        {constants.LABEL_JOB: job.name}))
    release.show_ready_workers(state, pods)  # those still there hold their GPUs
    return len(pods)


# How often a job labelled for Kueue looks again while the API server serves no Workloads.
NOT_SERVED_RETRY_SECONDS = 60.0
REASON_KUEUE_NOT_INSTALLED = "KueueNotInstalled"


def _not_served(state: Pass, queue: str) -> None:
    """The job has the queue label but the API server does not serve Kueue's Workloads (Kueue
    is not installed, or its CRDs are gone): it waits, saying so, and looks again every
    :data:`NOT_SERVED_RETRY_SECONDS`; running it unadmitted would pass by the quota the label
    asks for."""
    record = state.status["queue"]
    record.setdefault("queuedSince", state.now_text)
    message = (f"waiting for LocalQueue {queue}: the API server serves no "
               f"{wl.API_VERSION} Workloads (is Kueue installed?); remove the label "
               f"{wl.LABEL_QUEUE_NAME} to run without Kueue")
    if (st.get_condition(state.status, st.QUEUED) or {}).get("reason") != \
            REASON_KUEUE_NOT_INSTALLED:
        state.events.append(Event("Warning", REASON_KUEUE_NOT_INSTALLED, message))
    state.condition(st.QUEUED, True, REASON_KUEUE_NOT_INSTALLED, message)
    state.condition(st.WORKERS_READY, False, REASON_QUEUED, "queued: no workers until admitted")
    state.wake_in(NOT_SERVED_RETRY_SECONDS)


def _queued(state: Pass, queue: str, verdict: wl.Admission, pods_left: int) -> None:
    record = state.status["queue"]
    record.setdefault("queuedSince", state.now_text)
    if record.get("clusterQueue"):
        record["clusterQueue"] = None  # merge patch: None removes it
    if verdict.state == wl.STATE_EVICTED:  # what happened first, Kueue's words last
        cause = causes.of_kueue(verdict.reason, verdict.message)
        message = (f"{cause.headline}; {pods_left} pod(s) still terminating, then requeued in "
                   f"LocalQueue {queue}" + (f" ({cause.detail})" if cause.detail else ""))
        reason = REASON_EVICTED
    else:
        kueue_words = causes.without_uids(verdict.message)
        detail = f"{verdict.reason}: {kueue_words}" if kueue_words else verdict.reason
        message = (f"{_requeued_after(state)}waiting in LocalQueue {queue} for admission: "
                   f"{detail}{_hint(verdict.message)}"
                   f"{_selector_hint(state.job, verdict.message)}")
        reason = REASON_QUEUED
    if not st.is_true(state.status, st.QUEUED) and reason == REASON_QUEUED:
        state.events.append(Event("Normal", REASON_QUEUED, message))
    state.condition(st.QUEUED, True, reason, message)
    if st.get_condition(state.status, st.RUNNING) is not None:
        state.condition(st.RUNNING, False, REASON_QUEUED, "queued")
    state.condition(st.WORKERS_READY, False, REASON_QUEUED, "queued: no workers until admitted")


# Kueue's words when a pod set that requests no resource the ClusterQueue covers meets a
# ClusterQueue whose flavors all have a topology (flavorassigner: every pod set is then placed
# by topology, and one without a flavor cannot be).
_NO_TAS_FLAVOR = "no TAS flavor assigned"


def _hint(message: str) -> str:
    """What the user can do about Kueue's ``message``, when we know (else "")."""
    if _NO_TAS_FLAVOR in message and f"pod set {wl.PODSET_LAUNCHER}" in message:
        return ("; the launcher requests no resource this ClusterQueue covers, and every pod "
                "set of a ClusterQueue whose flavors all have a topology needs one: give "
                "spec.launcher.template a request of a covered resource (e.g. cpu), or add a "
                "flavor without a topology")
    return ""


def _requeued_after(state: Pass) -> str:
    """What ended the job's last attempt, when Kueue evicted it and the job has not been
    admitted since (``requeued after attempt 1 was preempted by Kueue; ``), else "": once
    requeued, Kueue's own message says only what the job waits for, and the user still needs
    to know why it stopped running (the attempt's record and Event keep Kueue's words)."""
    ended = [record for record in state.status.get("attempts") or [] if record.get("class")]
    if not ended or ended[-1].get("class") != EVICTED:
        return ""
    last = ended[-1]
    cause = causes.of_kueue(causes.kueue_reason(str(last.get("reason") or "")))
    return f"requeued after attempt {last.get('number')} was {cause.words()}; "


def report(state: Pass, queue: Queue) -> None:
    """After an admitted job's pass: ``PodsReady`` on its Workload (True while the launcher
    runs, which it starts only once every worker is Ready)."""
    status = wl.pods_ready_status(queue.workload, st.is_true(state.status, st.RUNNING),
                                  state.now_text)
    if status is not None:
        client.write_workload_status(queue.workload, status)


def finish(state: Pass, finished_written: bool = True) -> None:
    """A finished job under Kueue marks its Workload ``Finished`` (Kueue then frees the
    quota), once: ``status.queue.finished`` remembers it. A MultiKueue worker's copy only
    once its finished status is written (``finished_written``, :func:`.multikueue.may_finish`)."""
    record = dict(state.status.get("queue") or {})
    if not record.get("workload") or record.get("finished"):
        return
    if not multikueue.may_finish(state, finished_written):
        return
    workload = client.read_workload(state.job.namespace, record["workload"])
    if workload is not None:
        succeeded = st.is_true(state.status, st.SUCCEEDED)
        condition = st.get_condition(state.status, st.SUCCEEDED if succeeded else st.FAILED)
        status = wl.finished_status(workload, succeeded, str((condition or {}).get("message")
                                                             or ""), state.now_text)
        if status is not None and not client.write_workload_status(workload, status):
            return  # changed meanwhile: the next pass tries again
    record["finished"] = True
    if record.get("queuedSince"):
        record["queuedSince"] = None
    state.status["queue"] = record
    if st.is_true(state.status, st.QUEUED):
        state.condition(st.QUEUED, False, "Finished", "the job finished")
