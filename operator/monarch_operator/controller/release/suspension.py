"""``spec.suspend`` (field case C10): suspending deletes the workers and launcher and keeps the
job; resuming starts the current attempt's gate again."""

from __future__ import annotations

from monarch_operator import constants, names
from monarch_operator.controller.k8s import deletes, reads
from monarch_operator.controller.release import release
from monarch_operator.controller.spec import policy
from monarch_operator.controller.state import attempts
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Event, Pass


def suspend(state: Pass) -> None:
    """``spec.suspend``: delete the launcher and the workers (GPUs released) and the hostfile
    (stale once the pods go); keep the key, the Service and every counter. A running attempt
    ends as ``Suspended`` (no budget spent); resuming starts the next one. With a checkpoint
    grace period the launcher goes first (:func:`.release.stop_launcher_first`).

    The ending is recorded before anything is deleted: the pass that finds the attempt running
    only ends it (and asks for a pass right after its status write); the next pass, which reads
    that ending, deletes. Deleting in the recording pass left a leader cut off before its
    status write no evidence: with ``spec.suspend`` set back to false meanwhile, the next leader
    saw a running attempt whose pods were gone and judged it an Infrastructure failure
    (``WorkerEvicted``, a restart spent; found by the chaos soak).
    """
    job = state.job
    record = attempts.current(state.status) or {}
    launcher, workers_may_go = None, False
    running = bool(record.get("launchTime") and not record.get("endTime"))
    if running:
        _end_running_attempt(state)
    else:
        launcher = release.running_launcher(job.namespace, job.name, int(state.status["attempt"]))
        _, workers_may_go = release.stop_launcher_first(state, launcher)
        if workers_may_go:
            release.delete_worker_sets(job)
            deletes.delete_if_present("v1", "ConfigMap", job.namespace,
                                      names.hostfile_configmap(job.name))
    pods = release.let_go_of_stuck(state, reads.list_pods(job.namespace,
                                                        {constants.LABEL_JOB: job.name}))
    release.show_ready_workers(state, pods)
    # The gate's first step made the Service, which a suspension keeps: without it nothing of
    # the job ever started (created with spec.suspend: true).
    started = reads.read("v1", "Service", job.namespace,
                       names.group_set(job.name, job.groups[0].name)) is not None
    if launcher is not None and not workers_may_go:
        message = (f"spec.suspend is true: launcher {launcher['metadata']['name']} saving its "
                   f"state (up to {job.run_policy.checkpoint_grace_seconds}s), then the workers "
                   f"are deleted")  # type: ignore[index]
    elif running:
        message = (f"spec.suspend is true: attempt {record.get('number')} ended; its launcher "
                   f"and workers are deleted next")
    elif pods:
        message = f"spec.suspend is true: {len(pods)} pod(s) still terminating"
    elif started:
        message = "spec.suspend is true: workers and launcher deleted, GPUs released"
    else:
        message = "spec.suspend is true: nothing started; workers start when it is false"
    if not st.is_true(state.status, st.SUSPENDED):
        state.events.append(Event("Normal", st.REASON_SUSPENDED, "spec.suspend is true: " + (
            "deleting workers and launcher" if started else "not starting")))
    state.condition(st.SUSPENDED, True, st.REASON_SUSPENDED, message)
    state.condition(st.RUNNING, False, st.REASON_SUSPENDED, "suspended")
    state.condition(st.WORKERS_READY, False, st.REASON_SUSPENDED, "suspended")


def _end_running_attempt(state: Pass) -> None:
    """End the running attempt as ``Suspended`` and begin the next one; nothing is deleted
    until this is stored (a pass is asked for right after the status write)."""
    attempt = int(state.status["attempt"])
    state.status.pop("attemptWorkers", None)
    state.status = attempts.update_current(
        state.status, endTime=state.now_text, reason=st.REASON_SUSPENDED,
        message="spec.suspend set while it ran", **{"class": policy.SUSPENDED})
    state.status = attempts.begin(state.status, attempt + 1, state.now_text, restart=False)
    state.after_status_write()


def resume(state: Pass) -> None:
    """Back from ``spec.suspend``: the current attempt's gate starts now (workers are created
    again by the next steps, the hostfile and launcher only after every worker is Ready)."""
    if not st.is_true(state.status, st.SUSPENDED):
        return
    state.status = attempts.update_current(state.status, startTime=state.now_text)
    state.condition(st.SUSPENDED, False, st.REASON_RESUMED,
                    "spec.suspend is false: workers recreated, launcher starts once all are Ready")
    state.events.append(Event("Normal", st.REASON_RESUMED, "spec.suspend is false: resuming"))
