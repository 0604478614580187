"""What a job evicted by Kueue shows while it stops and once it stopped (issue 32 item 6),
over a cache view without a cluster: READY counts the workers still there, the message says
the cause first without Kueue's UIDs, no ETA while it does not run, and the attempt's record
gets its launcher's end (time, exit code, output) and the checkpoint its own time.
tests/cluster/test_kueue.py runs the same with Kueue on the local control plane."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from monarch_operator import constants, names
from monarch_operator.controller.builders.progress import build_progress_configmap
from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.k8s import client as k8s_client
from monarch_operator.controller.k8s import deletes, nodes, reads, writes
from monarch_operator.controller.kueue import client
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st
from tests.unit.test_launch_pass import (
    NAME,
    job_body,
    launcher_pod,
    make_view,
    running_status,
    stored,
)

GRACE = 30
T0 = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
PREEMPTED = ("Preempted to accommodate a workload (UID: 527a9fa8-fb86-4116-b295-4f4dd72e478f, "
             "JobUID: 1f1c675a-711f-4a13-a3bd-da3d50e6f893) due to prioritization in the "
             "ClusterQueue; preemptor path: /cq; preemptee path: /cq")
CHECKPOINT = "/ckpt/demo/step-120"


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Kueue's Workload (evicted by a preemption) and the writes a pass sends."""
    sent: dict[str, list[Any]] = {"pods": [], "deleted": [], "status": []}
    workload = {"metadata": {"name": "demo-w", "namespace": "team-a", "generation": 1},
                "status": {"admission": {"clusterQueue": "cq"}, "conditions": [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                    {"type": "Admitted", "status": "True", "reason": "Admitted"},
                    {"type": "Evicted", "status": "True", "reason": "Preempted",
                     "message": PREEMPTED}]}}
    monkeypatch.setattr(client, "read_workload", lambda namespace, name: workload)
    monkeypatch.setattr(client, "write_workload_status", lambda *args: True)
    monkeypatch.setattr(deletes, "delete_pod", lambda namespace, name, uid, force=False,
                        grace_seconds=None: sent["pods"].append((name, grace_seconds)) or True)
    monkeypatch.setattr(deletes, "delete_if_present", lambda api_version, kind, namespace, name: (
        sent["deleted"].append(kind) or True))
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: None)
    monkeypatch.setattr(reads, "pod_log_tail", lambda *args, **kwargs: "")
    monkeypatch.setattr(writes, "patch_job_status", lambda namespace, name, status: (
        sent["status"].append(status) or job_body(status)))
    return sent


def queued_body(status: dict[str, Any]) -> dict[str, Any]:
    body = job_body(status)
    body["metadata"]["labels"] = {wl.LABEL_QUEUE_NAME: "user-queue"}
    body["spec"] = {**body["spec"], "runPolicy": {"checkpointGracePeriodSeconds": GRACE}}
    return body


def admitted_running(settings: Settings) -> dict[str, Any]:
    """A running attempt 1, admitted by ClusterQueue cq, whose program reported step 120 of
    1000 with an ETA."""
    status = running_status(settings)
    status["queue"] = {"name": "user-queue", "workload": "demo-w", "clusterQueue": "cq",
                       "admissions": 1}
    status["progress"] = {"attempt": 1, "step": 120, "totalSteps": 1000, "percent": "12%",
                          "progressPercentage": 12, "stepsPerSecond": 2.0,
                          "estimatedRemainingSeconds": 440, "eta": "7m20s"}
    return status


def run(settings: Settings, status: dict[str, Any], launcher: dict[str, Any],
        now: dt.datetime, report: dict[str, Any] | None = None) -> reconcile.Outcome:
    body = queued_body(status)
    view = make_view(settings, status, [launcher], body=body)
    if report is not None:
        configmap = build_progress_configmap(JobSpec.from_body(body))
        configmap["data"] = {constants.PROGRESS_REPORT_KEY: json.dumps(report)}
        view.children[("v1", "ConfigMap")][names.progress_configmap(NAME)] = stored(
            configmap, "cm-progress")
    with k8s_client.reading_from(view):
        return reconcile.reconcile(body, settings, now)


def stopped_launcher(settings: Settings) -> dict[str, Any]:
    """Attempt 1's launcher, ended 20 s after the stop was asked for, naming its checkpoint."""
    pod = launcher_pod(settings, deletionTimestamp=st.format_time(T0 + dt.timedelta(seconds=30)),
                       deletionGracePeriodSeconds=GRACE)
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "launcher", "state": {
        "terminated": {"exitCode": 143, "finishedAt": st.format_time(T0 + dt.timedelta(
            seconds=20)), "message": "monarch-launch: saved at step 120; terminated by signal "
                                     f"15 (SIGTERM) [checkpoint: {CHECKPOINT}]"}}}]}
    return pod


def evicted(settings: Settings) -> reconcile.Outcome:
    """The pass that finds the running job's Workload evicted."""
    return run(settings, admitted_running(settings), launcher_pod(settings), T0)


def stopped(settings: Settings, first: reconcile.Outcome, saved_at: str) -> reconcile.Outcome:
    """The pass once attempt 1's launcher ended, its program having said at ``saved_at``
    where it saved its state."""
    report = {"attempt": 1, "step": 120, "totalSteps": 1000, "checkpoint": CHECKPOINT,
              "checkpointTime": saved_at, "time": saved_at}
    return run(settings, first.status, stopped_launcher(settings),
               T0 + dt.timedelta(seconds=25), report)


def test_ready_counts_the_workers_still_there_while_the_launcher_saves(api):
    settings = Settings.from_env()
    recorded = evicted(settings)
    assert api["pods"] == [] and api["deleted"] == []  # the attempt's ending is stored first
    assert recorded.status["attempts"][0]["class"] == "Evicted"
    assert recorded.wake_after == 0.0
    status = run(settings, recorded.status, launcher_pod(settings), T0).status
    assert api["pods"] == [(names.launcher_pod(NAME, 1), GRACE)]  # the launcher goes first
    assert api["deleted"] == []  # the workers stay while it saves its state
    # Both workers are still there and Ready, holding their GPUs: READY says so, not 0/2.
    assert (status["phase"], status["readyWorkers"]) == ("Queued", "2/2")


def test_the_message_says_the_cause_first_without_kueues_uids(api):
    settings = Settings.from_env()
    status = evicted(settings).status
    assert status["message"].startswith("preempted by Kueue; 3 pod(s) still terminating, then "
                                        "requeued in LocalQueue user-queue"), status["message"]
    record = status["attempts"][0]
    assert (record["class"], record["reason"]) == ("Evicted", "EvictedPreempted")
    assert "UID" not in status["message"] and "UID" not in record["message"], record
    assert "due to prioritization in the ClusterQueue" in record["message"]


def test_a_job_that_does_not_run_shows_no_eta(api):
    settings = Settings.from_env()
    progress = evicted(settings).status["progress"]
    # Nothing runs: no time left is shown (the ETA column empty; None removes it from the
    # stored status), the rest of the report kept.
    assert progress["step"] == 120 and progress["percent"] == "12%"
    assert progress.get("eta") is None and progress.get("estimatedRemainingSeconds") is None


def test_an_evicted_attempt_ends_when_its_launcher_did_with_its_exit_code_and_output(api):
    settings = Settings.from_env()
    first = evicted(settings)
    assert first.status["attempts"][0]["endTime"] == st.format_time(T0)  # as asked: so far
    done = stopped(settings, first, st.format_time(T0 + dt.timedelta(seconds=12)))
    record = done.status["attempts"][0]
    assert record["endTime"] == st.format_time(T0 + dt.timedelta(seconds=20)), record
    assert record["exitCode"] == 143 and done.status["launcher"]["exitCode"] == 143
    assert record["outputTail"] == [
        f"monarch-launch: saved at step 120; terminated by signal 15 (SIGTERM) "
        f"[checkpoint: {CHECKPOINT}]"]
    assert record["checkpoint"] == CHECKPOINT
    assert api["deleted"] == ["StatefulSet", "ConfigMap"]  # then the workers go


def test_the_checkpoints_time_is_when_the_program_saved_it(api):
    settings = Settings.from_env()
    saved_at = st.format_time(T0 + dt.timedelta(seconds=12))
    done = stopped(settings, evicted(settings), saved_at)
    # When the program said it saved it (its launcher's report), not when its launcher
    # ended (20 s) nor when the operator noticed (25 s).
    assert done.status["lastCheckpoint"] == {"location": CHECKPOINT, "attempt": 1,
                                             "time": saved_at}
