"""How an attempt ends: Succeeded, or failed with a class, recorded in ``status.attempts[]``;
then the run policy restarts the job (a new attempt) or fails it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.launcher import LAUNCHER_CONTAINER
from monarch_operator.controller.judge import stalls, verdicts
from monarch_operator.controller.k8s import deletes, reads
from monarch_operator.controller.spec import policy
from monarch_operator.controller.state import attempts, lastseen, observe
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Event, Pass


def fail(state: Pass, reason: str, message: str) -> None:
    """The job Failed for ``reason`` at once, whatever restart budget is left (class Fatal:
    nothing a restart could cure); the attempt records it, a Warning event follows."""
    end_attempt(state, policy.FATAL, reason, message)
    if st.is_true(state.status, st.RUNNING):
        state.condition(st.RUNNING, False, reason, message)


def succeed(state: Pass, outcome: observe.LauncherOutcome) -> None:
    """The launcher exited 0: the attempt and the job Succeeded (final)."""
    state.status["launcher"] = {"exitCode": outcome.exit_code or 0,
                                "reason": observe.launcher_reason(outcome)}
    state.status["completionTime"] = state.now_text
    state.status.pop("attemptWorkers", None)
    state.status = attempts.update_current(state.status, endTime=state.now_text,
                                           **{"class": "Succeeded"}, exitCode=0)
    state.condition(st.RUNNING, False, st.REASON_LAUNCHER_SUCCEEDED, "launcher finished")
    state.condition(st.SUCCEEDED, True, st.REASON_LAUNCHER_SUCCEEDED, "launcher exited 0")
    state.events.append(Event("Normal", st.REASON_LAUNCHER_SUCCEEDED, "job succeeded"))


def end_attempt(state: Pass, failure_class: str, reason: str, message: str,
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
    forgiven = (failure_class == policy.APPLICATION and job.run_policy.progress_resets_backoff
                and stalls.made_progress(state.status))
    if forgiven:  # runPolicy.progressResetsBackoff: progress since the previous failure
        decision = policy.Decision(restart=True, budget=(
            "no budget spent: it reached a step beyond every earlier attempt "
            "(runPolicy.progressResetsBackoff)"))
        state.status = attempts.update_current(state.status, budgetSpent=False)
    if failure_class == policy.INFRASTRUCTURE:
        # The launcher may still run: it is stopped (so that a recreated worker is never
        # folded into the old mesh and a failed job holds no pods) by the pass right after
        # this verdict's status write, never in this pass: its pod, ended or running, is
        # what the verdict rests on (exit code, hardware fault line, stall), and a leader cut
        # off before the write left the next one only "launcher lost". The next attempt's
        # pass stops it once that attempt is stored (launching._let_go_of_previous_launcher),
        # a failed job's once the failure is (release.clean_up).
        # Workers on a lost node or holding an Unhealthy device are recreated: the record
        # names each pod (``recreatedWorkers``) and the pass after its write deletes them
        # (:func:`.release.recreate_lost_workers`), for the same reason.
        state.after_status_write()
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
    if not forgiven:
        state.status["failureCounts"] = {**spent, key: spent.get(key, 0) + 1}
    if failure_class == policy.INFRASTRUCTURE:
        # Rebuilt from the new pods once the gate passes again.
        deletes.delete_if_present("v1", "ConfigMap", job.namespace,
                                  names.hostfile_configmap(job.name))
        state.condition(st.WORKERS_READY, False, st.REASON_RESTARTING,
                        f"re-checking every worker before attempt {attempt + 1}")
    state.status = attempts.begin(state.status, attempt + 1, state.now_text)
    delay = policy.restart_delay_seconds(int(state.status.get("restartCount") or 0))
    backoff = ""
    if delay > 0:
        not_before = state.now + dt.timedelta(seconds=delay)
        state.status = attempts.update_current(
            state.status, notBefore=st.format_time(not_before))
        backoff = f" after a back-off of {delay:.0f}s"
    text = (f"attempt {attempt} failed ({failure_class}: {message}); starting attempt "
            f"{attempt + 1}{backoff}, {decision.budget}")
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
        fields.update(attempts.failing_rank(outcome.message))
        fields["outputTail"] = attempts.output_tail(
            _launcher_output(launcher_pods or []) or outcome.message) or None
    _show_launcher(state, outcome if outcome is not None and outcome.finished else None)
    if lost:
        fields["lostWorkers"] = [worker.name for worker in lost]
        fields["recreatedWorkers"] = [{"name": worker.name, "uid": worker.uid}
                                      for worker in lost if worker.node_lost and worker.uid]
    state.status.pop("attemptWorkers", None)
    state.status = attempts.update_current(state.status, **fields)


def _show_launcher(state: Pass, outcome: observe.LauncherOutcome | None) -> None:
    """``status.launcher`` (the EXIT column) says how the launcher of the attempt that ended
    last ended: its exit code and reason, or nothing when it reported no exit code (lost with
    its pod or node, still stopping), never an earlier attempt's. The status is merge-patched:
    None removes it."""
    if outcome is not None and outcome.exit_code is not None:
        state.status["launcher"] = {"exitCode": outcome.exit_code,
                                    "reason": observe.launcher_reason(outcome)}
    elif state.status.get("launcher") is not None:
        state.status["launcher"] = None


def record_late_ends(state: Pass) -> None:
    """What a launcher said once it ended, for an ended attempt whose end was recorded while
    its launcher still ran (stopped for a suspend or a Kueue eviction, given
    ``runPolicy.checkpointGracePeriodSeconds`` to save its state; stopped after a lost
    worker): the record gets its ``exitCode`` and ``outputTail``, an attempt stopped on
    request (:data:`.policy.STOPPED_ON_REQUEST`) its ``endTime`` from the launcher's end (it
    ran until then), and ``status.launcher`` follows when it is the last attempt that ended.

    The launcher pods are the pass's view's and the pod watch's last state of the newest
    (:mod:`.lastseen`: a pod deleted for a stop goes as soon as it ended); no request but a
    log read, once per such attempt."""
    records = [record for record in state.status.get("attempts") or []
               if record.get("class") and record.get("launchTime")
               and record.get("exitCode") is None]
    if not records:
        return
    job = state.job
    pods = reads.list_pods(job.namespace, {constants.LABEL_JOB: job.name,
                                         constants.LABEL_ROLE: constants.ROLE_LAUNCHER})
    by_attempt = {lastseen.attempt_of(pod): pod for pod in pods}
    last = lastseen.launcher(job.namespace, job.name, int(records[-1]["number"]), job.uid)
    if last is not None and records[-1]["number"] not in by_attempt:
        by_attempt[records[-1]["number"]] = last
    last_ended = [record for record in state.status["attempts"] if record.get("class")][-1]
    for record in records:
        pod = by_attempt.get(record["number"])
        outcome = observe.launcher_outcome(pod)
        if pod is None or outcome.exit_code is None:
            continue  # running still, or never reported an exit code
        fields: dict[str, Any] = {"exitCode": outcome.exit_code, "outputTail": (
            attempts.output_tail(_launcher_output([pod]) or _termination_message(pod))
            or None)}
        finished = verdicts.launcher_end(pod)
        if record["class"] in policy.STOPPED_ON_REQUEST and finished is not None:
            fields["endTime"] = st.format_time(finished)
        state.status["attempts"] = [
            {**entry, **{key: value for key, value in fields.items() if value is not None}}
            if entry.get("number") == record["number"] else entry
            for entry in state.status["attempts"]]
        if record["number"] == last_ended["number"]:
            _show_launcher(state, outcome)


def _termination_message(pod: dict[str, Any]) -> str:
    """The launcher container's whole termination message ("" when none)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") == LAUNCHER_CONTAINER:
            return str(((container.get("state") or {}).get("terminated") or {})
                       .get("message") or "")
    return ""


def _launcher_output(pods: list[dict[str, Any]]) -> str:
    """The tail of the attempt's launcher container log, "" when none can be read."""
    for pod in pods:
        text = reads.pod_log_tail(pod["metadata"].get("namespace", ""), pod["metadata"]["name"],
                                LAUNCHER_CONTAINER, attempts.OUTPUT_TAIL_LINES)
        if text:
            return text
    return ""
