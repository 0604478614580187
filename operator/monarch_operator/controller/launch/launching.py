"""The current attempt's launcher: started once the gate passed (after any earlier launcher
pod ended), then followed to its outcome, to a lost worker or to its own pod lost with its
node, which :mod:`..judge.judging` judges (and :mod:`.endings` records)."""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.hostfile import build_hostfile_configmap
from monarch_operator.controller.builders.launcher import LAUNCHER_CONTAINER, build_launcher_pod
from monarch_operator.controller.builders.statefulset import WORKER_CONTAINER
from monarch_operator.controller.judge import judging
from monarch_operator.controller.k8s import deletes, reads, writes
from monarch_operator.controller.launch import checkpoints
from monarch_operator.controller.release import release, stuckpods
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import (
    attempts,
    deadlines,
    lastseen,
    observe,
)
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Event, Pass


def start_or_follow_launcher(state: Pass, settings: Settings,
                             worker_pods: list[dict[str, Any]]) -> str | None:
    """Start the current attempt's launcher once the gate passed, then follow it.

    Returns the class of the failure that restarted the job in this call, else None.
    """
    job = state.job
    attempt = int(state.status["attempt"])
    launcher_name = names.launcher_pod(job.name, attempt)
    if attempt > 1:
        _let_go_of_previous_launcher(state, attempt)
    record = attempts.current(state.status) or {}
    launcher = release.launcher_pod(job.namespace, job.name, attempt)
    if launcher is None and record.get("launchTime"):
        launcher = _last_seen_ended(state, attempt)
        if launcher is None:
            return judging.end_launcher_gone(state, launcher_name, worker_pods)
    if launcher is None:
        if (not st.is_true(state.status, st.WORKERS_READY) or _waiting_for_earlier_launcher(state)
                or _backing_off(state, record)):
            return None
        launcher = _launch(state, settings, worker_pods, launcher_name)
    elif not record.get("launchTime"):
        record = _adopt(state, launcher, worker_pods)
    launcher_name = launcher["metadata"]["name"]
    state.condition(st.RUNNING, True, st.REASON_LAUNCHER_STARTED,
                    f"launcher {launcher_name} running (attempt {attempt})")
    outcome = observe.launcher_outcome(launcher)
    _record_launcher_image(state, launcher, record)
    if not outcome.finished and not launcher["metadata"].get("deletionTimestamp"):
        # Its hostfile, whose create may have failed while the pod's went through (they are
        # sent together); found in the cache (or just created), it costs no request.
        writes.ensure(build_hostfile_configmap(job, settings, worker_pods), job.uid)
    return judging.judge_launcher(state, launcher, outcome, worker_pods, record)


def _let_go_of_previous_launcher(state: Pass, attempt: int) -> None:
    """Delete the previous attempt's launcher pod, kept for its logs until now, once the
    stored status holds attempt ``attempt`` (a pass right after the write that began it does
    it). Its ended pod is the evidence of how that attempt ended: deleted by the pass that
    judged it, before its status write, a leader cut off in between left the next one an
    attempt with no launcher, judged lost (an Infrastructure failure instead of its own
    verdict). The new attempt does not wait for it: an ended launcher holds no port."""
    if int(state.stored.get("attempt") or 0) != attempt:
        state.after_status_write()
        return
    job = state.job
    deletes.stop_pod(release.launcher_pod(job.namespace, job.name, attempt - 1))


def _adopt(state: Pass, launcher: dict[str, Any],
           worker_pods: list[dict[str, Any]]) -> dict[str, Any]:
    """Record the launch of the attempt's launcher pod that a pass created but whose status
    write never happened (the operator stopped in between): its launch time is the pod's
    creation and its workers those the pods show as of then
    (:func:`.attempts.snapshot_as_of`), so that a worker replaced before the launcher started
    is not taken for one lost mid-run. Returns the attempt's record."""
    job = state.job
    created = str(launcher["metadata"].get("creationTimestamp") or state.now_text)
    state.status["attemptWorkers"] = attempts.snapshot_as_of(job.worker_pod_names(),
                                                             worker_pods, created)
    state.status = attempts.update_current(state.status, launchTime=created,
                                           launcherPod=launcher["metadata"]["name"])
    return attempts.current(state.status) or {}


def _last_seen_ended(state: Pass, attempt: int) -> dict[str, Any] | None:
    """The last state the pod watch delivered of attempt ``attempt``'s launcher pod, now gone
    from the view, when that state shows it ended (:mod:`.lastseen`): it is judged like a pod
    still there, so a launcher that exited before a node loss or a deletion removed its pod
    keeps its own verdict (a deletion at or before its end still makes it ``LauncherLost``,
    :func:`.verdicts.judge`). None when its end was never seen: the pod was deleted while it
    ran, as far as this operator knows."""
    last = lastseen.launcher(state.job.namespace, state.job.name, attempt, state.job.uid)
    if last is None or not observe.launcher_outcome(last).finished:
        return None
    return last


def _record_launcher_image(state: Pass, launcher: dict[str, Any],
                           record: dict[str, Any]) -> None:
    """The attempt's ``launcherImage``, once its pod reports the digest its container runs."""
    if record.get("launcherImage"):
        return
    found = attempts.image_ids([launcher], LAUNCHER_CONTAINER)
    if found:
        state.status = attempts.update_current(state.status, launcherImage=found[0])


def _backing_off(state: Pass, record: dict[str, Any]) -> bool:
    """Whether the current attempt (a restart) waits out its back-off
    (:func:`.policy.restart_delay_seconds`, ``notBefore`` in its record); a pass is asked for
    when it ends."""
    not_before = record.get("notBefore")
    if not not_before:
        return False
    left = (deadlines.parse_time(str(not_before)) - state.now).total_seconds()
    if left <= 0:
        return False
    state.wake_in(left)
    reason = (st.get_condition(state.status, st.RUNNING) or {}).get("reason")
    state.condition(st.RUNNING, False, str(reason or st.REASON_RESTARTING),
                    f"attempt {state.status['attempt']} starts at {not_before} (back-off after "
                    f"{state.status.get('restartCount', 0)} restarts)")
    return True


def _waiting_for_earlier_launcher(state: Pass) -> bool:
    """Whether the next attempt still waits for a launcher pod of an earlier attempt to end
    (stopping after it was deleted): its Monarch workers may still hold the workers' port.

    Its pod's deletion wakes the job. A pod that can never end (its node lost, a finalizer
    nobody removes) is waited for only until :mod:`.stuckpods` says, then force-deleted with a
    Warning event, and the attempt goes on; one still running and not being deleted (an
    operator stopped between the attempt's end and its deletion) is deleted.
    """
    job = state.job
    attempt = str(state.status["attempt"])
    pods = [pod for pod in reads.list_pods(job.namespace, {
                constants.LABEL_JOB: job.name, constants.LABEL_ROLE: constants.ROLE_LAUNCHER})
            if pod["metadata"].get("labels", {}).get(constants.LABEL_ATTEMPT) != attempt
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    for pod in pods:
        deletes.stop_pod(pod)
    waiting = [pod for pod in release.let_go_of_stuck(state, pods)
               if not stuckpods.is_force_deleted(pod)]
    if waiting:
        metadata = waiting[0]["metadata"]
        deadline = stuckpods.deletion_deadline(waiting[0])
        until = ("" if deadline is None else ", force-deleted "
                 f"{state.force_delete_after:g}s after its grace period ends "
                 f"({deadline.strftime('%H:%M:%SZ')}) if it has not")
        earlier = metadata.get("labels", {}).get(constants.LABEL_ATTEMPT)
        # Same reason as before (Restarting, or JobSuspended after a resume): only the words.
        reason = (st.get_condition(state.status, st.RUNNING) or {}).get("reason")
        state.condition(st.RUNNING, False, str(reason or st.REASON_RESTARTING),
                        f"attempt {attempt} waits for launcher pod {metadata['name']} of "
                        f"attempt {earlier} to end{until}")
    return bool(waiting)


def _launch(state: Pass, settings: Settings, worker_pods: list[dict[str, Any]],
            launcher_name: str) -> dict[str, Any]:
    """Hostfile (from the Ready workers, never rewritten mid-run) and the launcher pod, created
    at once (its kubelet waits for the hostfile volume should the pod come first); the worker
    pods it starts on are recorded so that losing one is noticed."""
    job = state.job
    attempt = int(state.status["attempt"])
    # An earlier attempt's checkpoint, else the one the job's annotation names (a MultiKueue
    # copy dispatched again after its previous copy saved one: controller/kueue/manager.py).
    resume = checkpoints.location(state.status) or job.resume_checkpoint
    _, (launcher, created) = writes.ensure_together(
        build_hostfile_configmap(job, settings, worker_pods),
        build_launcher_pod(job, settings, attempt, int(state.status.get("restartCount") or 0),
                           resume),
        owner_uid=job.uid)
    state.status["attemptWorkers"] = attempts.snapshot_of(job.worker_pod_names(), worker_pods)
    images = attempts.image_ids(worker_pods, WORKER_CONTAINER)
    state.status = attempts.update_current(state.status, launchTime=state.now_text,
                                           launcherPod=launcher_name, resumedFrom=resume,
                                           **({"workerImages": images} if images else {}))
    if created:
        state.events.append(Event("Normal", st.REASON_LAUNCHER_STARTED,
                                  f"all {job.worker_count} workers ready; launcher {launcher_name} "
                                  f"started (attempt {attempt})"))
    return launcher
