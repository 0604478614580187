"""Letting go of pods and children: pods stuck terminating (force-deleted in time,
:mod:`.stuckpods`), a finished job's children as ``spec.cleanupPolicy`` says, and READY counted
from the workers Ready now."""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.k8s import deletes, nodes, reads
from monarch_operator.controller.release import stuckpods
from monarch_operator.controller.spec.spec import CLEANUP_DELETE_ALL, JobSpec
from monarch_operator.controller.state import attempts, observe, timestamps
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Event, Pass


def launcher_pod(namespace: str, job_name: str, attempt: int) -> dict[str, Any] | None:
    """The launcher pod of ``attempt``: the one named :func:`names.launcher_pod`, else (a job
    started by an operator version that ran the launcher as a batch Job, whose pod has a
    generated name) the pod carrying the attempt's launcher labels; None when there is none."""
    pods = reads.list_pods(namespace, {constants.LABEL_JOB: job_name,
                                     constants.LABEL_ROLE: constants.ROLE_LAUNCHER,
                                     constants.LABEL_ATTEMPT: str(attempt)})
    name = names.launcher_pod(job_name, attempt)
    named = [pod for pod in pods if pod["metadata"]["name"] == name]
    return (named or pods or [None])[0]


REASON_CHECKPOINT_REQUESTED = "CheckpointRequested"


def running_launcher(namespace: str, job_name: str, attempt: int) -> dict[str, Any] | None:
    """The launcher pod to stop for a suspend or an eviction: attempt ``attempt``'s, else the
    previous attempt's while it still runs (the stop ended that attempt and began this one, and
    a launcher given a grace period runs on for it)."""
    launcher = launcher_pod(namespace, job_name, attempt)
    if launcher is None and attempt > 1:
        previous = launcher_pod(namespace, job_name, attempt - 1)
        if previous is not None and not observe.launcher_outcome(previous).finished:
            return previous
    return launcher


def stop_launcher_first(state: Pass, launcher: dict[str, Any] | None) -> tuple[bool, bool]:
    """Stop the running launcher before a suspend or an eviction takes the workers (issue 21
    item 4, checkpoint before a stop).

    With ``runPolicy.checkpointGracePeriodSeconds`` above 0 and a launcher still running, the
    launcher pod is deleted with that grace period (the kubelet's SIGTERM is the program's
    request to stop, ``launcher/stoprequest.py``) and the workers must stay, so that its ranks
    can save their state, until the launcher has ended or the period has passed (a pass is
    asked for then). Otherwise the launcher is deleted as any pod, and the workers may go.

    Returns:
        ``(sent, workers_may_go)``: whether a delete was sent for the launcher this pass, and
        whether the caller may delete the workers now.
    """
    grace = state.job.run_policy.checkpoint_grace_seconds
    if grace <= 0 or launcher is None or observe.launcher_outcome(launcher).finished:
        return deletes.stop_pod(launcher), True
    metadata = launcher["metadata"]
    if not metadata.get("deletionTimestamp"):
        sent = deletes.stop_pod(launcher, grace_seconds=grace)
        state.events.append(Event("Normal", REASON_CHECKPOINT_REQUESTED, (
            f"launcher {metadata['name']} asked to stop: its program has {grace}s to save its "
            f"state (runPolicy.checkpointGracePeriodSeconds); the workers go after")))
        state.wake_in(float(grace))
        return sent, False
    ends = timestamps.parse(metadata["deletionTimestamp"])
    left = (ends - state.now).total_seconds() if ends is not None else 0.0
    if left > 0:
        state.wake_in(left)
        return False, False
    return False, True


def let_go_of_stuck(state: Pass, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Force-delete those of ``pods`` stuck terminating long past their grace period
    (:mod:`.stuckpods`: node lost, finalizers), each with a Warning event and in the current
    attempt's ``forceDeletedPods``; ask for a pass when the next one becomes due.

    Returns ``pods`` without the ones force-deleted here.
    """
    job = state.job
    kept = []
    for pod in pods:
        if not stuckpods.is_overdue(pod, state.now, state.force_delete_after):
            kept.append(pod)
            continue
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        described = stuckpods.describe_stuck(pod, state.now,
                                             nodes.node_is_ready(node) if node else None)
        if not deletes.delete_pod(job.namespace, name, pod["metadata"]["uid"], force=True):
            continue  # gone meanwhile (404, or 409: a namesake replaced it): nothing stuck
        state.events.append(Event("Warning", st.REASON_POD_FORCE_DELETED,
                                  f"pod {described}: force-deleted (nothing else would end it); "
                                  "the job goes on without it"))
        record = attempts.current(state.status) or {}
        state.status = attempts.update_current(
            state.status, forceDeletedPods=[*record.get("forceDeletedPods", []), name])
    state.wake_in(stuckpods.seconds_until_overdue(kept, state.now, state.force_delete_after))
    return kept


def recreate_lost_workers(state: Pass, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Delete the worker pods that an ended attempt marked to be recreated
    (``recreatedWorkers``: on a lost node, or holding a device reported Unhealthy), each by
    its uid, once the stored status holds that mark: the pass that judged the attempt keeps
    them, since they are what its verdict rests on (a leader cut off before the write left the
    next one a pod replaced, judged ``deleted`` instead of ``GPUUnhealthy``). A pod on a lost
    node then stays terminating until :func:`let_go_of_stuck` force-deletes it.

    Returns ``pods`` without the marked ones, stored or not: the gate never counts them, even
    while the view has not seen their deletion yet, and waits for their replacements.
    """
    marked = attempts.recreated_workers(state.status)
    if not marked:
        return pods
    stored = attempts.recreated_workers(state.stored)
    kept = []
    for pod in pods:
        metadata = pod["metadata"]
        key = (metadata["name"], str(metadata.get("uid")))
        if key not in marked:
            kept.append(pod)
        elif key in stored and not metadata.get("deletionTimestamp"):
            deletes.delete_pod(state.job.namespace, key[0], key[1])
        elif key not in stored:
            state.after_status_write()
    return kept


def _launcher_to_stop(state: Pass) -> dict[str, Any] | None:
    """The finished job's launcher pod that :func:`clean_up` deletes: one that still runs (the
    job failed around it, e.g. its deadline), or any with ``cleanupPolicy: DeleteAll``; None
    when there is none to delete (or it is being deleted already)."""
    job = state.job
    launcher = launcher_pod(job.namespace, job.name, int(state.status.get("attempt") or 1))
    if launcher is None or launcher["metadata"].get("deletionTimestamp"):
        return None
    running = not observe.launcher_outcome(launcher).finished
    return launcher if running or job.cleanup_policy == CLEANUP_DELETE_ALL else None


def _releases_workers(state: Pass) -> bool:
    """Whether :func:`clean_up` deletes a worker StatefulSet that is there now."""
    job = state.job
    deadline = st.reason_of(state.status, st.FAILED) == st.REASON_DEADLINE_EXCEEDED
    return job.releases_workers(deadline) and worker_sets_standing(job)


def announce_clean_up(state: Pass) -> bool:
    """In the pass that judged the job finished: say in the Event of its ending what
    :func:`clean_up` deletes once that ending is stored (``job succeeded; worker pods
    deleted``), deleting nothing yet. Returns whether its workers go."""
    if _launcher_to_stop(state) is not None:
        _tell(state, Event("Normal", "LauncherDeleted", "launcher pod deleted"))
    releasing = _releases_workers(state)
    if releasing:
        _tell(state, Event("Normal", "WorkersReleased", "worker pods deleted"))
    return releasing


def clean_up(state: Pass) -> None:
    """Let go of a finished job's children as ``spec.cleanupPolicy`` says; called once the
    stored status says finished (the pass that judged the ending announced it,
    :func:`announce_clean_up`, so nothing is said here).

    A launcher that still runs (the job failed around it, e.g. its deadline) is always
    stopped; workers hold GPUs and go unless the policy is KeepAll, and also then when the
    job exceeded its ``activeDeadlineSeconds`` (a deadline releases everything).
    """
    job = state.job
    namespace = job.namespace
    deadline = st.reason_of(state.status, st.FAILED) == st.REASON_DEADLINE_EXCEEDED
    deletes.stop_pod(_launcher_to_stop(state))
    if job.releases_workers(deadline):
        delete_worker_sets(job)
    if job.cleanup_policy == CLEANUP_DELETE_ALL:  # literal kinds: the chart's RBAC test reads them
        deletes.delete_if_present("v1", "ConfigMap", namespace, names.hostfile_configmap(job.name))
        for group in job.groups:
            deletes.delete_if_present("v1", "Service", namespace,
                                  names.group_set(job.name, group.name))
        deletes.delete_if_present("v1", "Secret", namespace, names.ssh_secret(job.name))
        # The progress ConfigMap (its report is in status.progress by now) and what let the
        # launcher write it; the uncached three only once, with the ConfigMap.
        if deletes.delete_if_present("v1", "ConfigMap", namespace,
                                 names.progress_configmap(job.name)):
            deletes.delete_if_present("rbac.authorization.k8s.io/v1", "RoleBinding", namespace,
                                  names.progress_configmap(job.name))
            deletes.delete_if_present("rbac.authorization.k8s.io/v1", "Role", namespace,
                                  names.progress_configmap(job.name))
            deletes.delete_if_present("v1", "ServiceAccount", namespace,
                                  names.launcher_account(job.name))


def has_something_to_stop(job: JobSpec, launcher: dict[str, Any] | None) -> bool:
    """Whether a stop (a suspension, an eviction) would delete anything now: ``launcher``
    (as :func:`running_launcher` found it) or a worker group's StatefulSet, either there and
    not yet being deleted. Read from the pass's view; sends nothing."""
    if launcher is not None and not launcher["metadata"].get("deletionTimestamp"):
        return True
    return worker_sets_standing(job)


def worker_sets_standing(job: JobSpec) -> bool:
    """Whether a worker group's StatefulSet is there and not being deleted (from the pass's
    view; sends nothing)."""
    for group in job.groups:
        found = reads.read("apps/v1", "StatefulSet", job.namespace,
                           names.group_set(job.name, group.name))
        if found is not None and not found["metadata"].get("deletionTimestamp"):
            return True
    return False


def delete_worker_sets(job: JobSpec) -> bool:
    """Delete every worker group's StatefulSet (its pods go with it); whether one was there."""
    deleted = [deletes.delete_if_present("apps/v1", "StatefulSet", job.namespace,
                                     names.group_set(job.name, group.name))
               for group in job.groups]
    return any(deleted)


def _tell(state: Pass, event: Event) -> None:
    """Post ``event``, or, when the job ended in this pass, say it in the Event of that ending
    (``job succeeded; worker pods deleted``): one Event per job ending, not three."""
    ending = {st.reason_of(state.status, st.SUCCEEDED), st.reason_of(state.status, st.FAILED)}
    for posted in state.events:
        if posted.reason in ending:
            posted.message = f"{posted.message}; {event.message}"
            return
    state.events.append(event)


def count_ready_workers(state: Pass, releasing: bool = False) -> None:
    """READY of a finished job: its workers Ready now, counting only pods of a worker
    StatefulSet that is not being deleted. Once the StatefulSet is deleted (released) its pods
    are on their way out and count as none, as a ReplicaSet does not count pods being deleted:
    ``0/N`` is written with the ending, not once more per pod as each one goes; ``releasing``:
    the ending's pass, whose StatefulSets go right after its status write, counts none."""
    job = state.job
    pods = let_go_of_stuck(state, reads.list_pods(job.namespace, {
       constants.LABEL_JOB: job.name, constants.LABEL_ROLE: constants.ROLE_WORKER}))
    live_uids = set()
    for group in job.groups:
        worker_set = reads.read("apps/v1", "StatefulSet", job.namespace,
                              names.group_set(job.name, group.name))
        if (worker_set is not None and not releasing
                and not worker_set["metadata"].get("deletionTimestamp")):
            live_uids.add(worker_set["metadata"].get("uid"))
    show_ready_workers(state, [pod for pod in pods if reads.controller_uid(pod) in live_uids])


def show_ready_workers(state: Pass, pods: list[dict[str, Any]]) -> None:
    """READY (``status.readyWorkers``): the job's worker pods among ``pods`` that exist and are
    Ready now, not being deleted (:func:`.observe.pod_is_ready`), of the workers wanted. A job
    stopped by a suspend or by Kueue shows its workers as long as they hold their GPUs (while
    the launcher saves its state, say), not ``0/N`` from the moment the stop was asked for."""
    job = state.job
    ready = observe.ready_worker_names(job.worker_pod_names(), pods)
    state.status["readyWorkers"] = f"{len(ready)}/{job.worker_count}"
