"""Checkpoint before a stop, the operator's side (issue 21 item 4), over a cache view: with
``runPolicy.checkpointGracePeriodSeconds`` a suspend deletes the launcher first with that grace
period and keeps the workers until it ended; the location its termination message names goes
into ``status.lastCheckpoint`` and the next attempt's ``MONARCH_CHECKPOINT``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator import constants, names
from monarch_operator.controller.builders.launcher import launcher_env
from monarch_operator.controller.builders.statefulset import (
    WORKER_STOP_MARGIN_SECONDS,
    build_worker_statefulset,
)
from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.k8s import client, deletes, nodes, reads, writes
from monarch_operator.controller.launch import checkpoints
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st
from monarch_operator.launcher import stoprequest
from tests.unit.test_launch_pass import (
    job_body,
    launcher_pod,
    make_view,
    ready_worker,
    running_status,
    stored,
)

GRACE = 45


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Records the pod deletions (name, grace) and other deletions a pass sends."""
    sent: dict[str, list[Any]] = {"pods": [], "deleted": []}
    monkeypatch.setattr(deletes, "delete_pod", lambda namespace, name, uid, force=False,
                        grace_seconds=None: sent["pods"].append((name, grace_seconds)) or True)
    monkeypatch.setattr(deletes, "delete_if_present", lambda api_version, kind, namespace, name: (
        sent["deleted"].append(kind) or True))
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: None)
    monkeypatch.setattr(nodes, "node_cordoned", lambda node: node == "node-0")  # being drained
    monkeypatch.setattr(writes, "_post", lambda desired: stored(desired, "x"))  # the hostfile
    monkeypatch.setattr(reads, "pod_log_tail", lambda *args, **kwargs: "")
    monkeypatch.setattr(writes, "patch_job_status",
                        lambda namespace, name, status: job_body(status))
    return sent


def suspended_body(status: dict[str, Any], grace: int) -> dict[str, Any]:
    body = job_body(status)
    body["spec"] = {**body["spec"], "suspend": True,
                    "runPolicy": {"checkpointGracePeriodSeconds": grace}}
    return body


def run(settings: Settings, body: dict[str, Any], launcher: dict[str, Any],
        now: dt.datetime) -> reconcile.Outcome:
    with client.reading_from(make_view(settings, body["status"], [launcher])):
        return reconcile.reconcile(body, settings, now)


def ended_launcher(settings: Settings, message: str) -> dict[str, Any]:
    pod = launcher_pod(settings, deletionTimestamp="2026-12-01T12:01:00Z")
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "launcher", "state": {
        "terminated": {"exitCode": 143, "message": message,
                       "finishedAt": "2026-12-01T12:00:20Z"}}}]}
    return pod


def test_with_a_grace_period_the_launcher_goes_first_and_its_checkpoint_is_kept(api):
    settings = Settings.from_env()
    status = running_status(settings)
    now = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
    recorded = run(settings, suspended_body(status, GRACE), launcher_pod(settings), now)
    assert api["pods"] == [] and api["deleted"] == []  # the ending is stored first
    assert recorded.status["attempts"][0]["class"] == "Suspended"
    assert recorded.wake_after == 0
    first = run(settings, suspended_body(recorded.status, GRACE), launcher_pod(settings), now)
    assert api["pods"] == [(names.launcher_pod("demo", 1), GRACE)]
    assert api["deleted"] == []  # the workers (and hostfile) stay while it saves its state
    assert first.wake_after == GRACE
    assert "CheckpointRequested" in [event.reason for event in first.events]
    # Meanwhile: the launcher is terminating; the workers still stay.
    terminating = launcher_pod(settings, deletionTimestamp="2026-12-01T12:00:45Z")
    waiting = run(settings, suspended_body(first.status, GRACE), terminating,
                  now + dt.timedelta(seconds=10))
    assert api["deleted"] == [] and waiting.wake_after == pytest.approx(35)
    assert "saving its state" in st.get_condition(waiting.status, st.SUSPENDED)["message"]
    # It ended, naming its checkpoint: the workers go, the location is recorded.
    message = "terminated by signal 15 (SIGTERM) [checkpoint: s3://runs/demo/step-120]"
    done = run(settings, suspended_body(waiting.status, GRACE), ended_launcher(settings, message),
               now + dt.timedelta(seconds=20))
    assert api["deleted"] == ["StatefulSet", "ConfigMap"]
    assert done.status["lastCheckpoint"] == {"location": "s3://runs/demo/step-120", "attempt": 1,
                                             "time": "2026-12-01T12:00:20Z"}
    first_attempt = done.status["attempts"][0]
    assert (first_attempt["class"], first_attempt["checkpoint"]) == ("Suspended",
                                                                      "s3://runs/demo/step-120")
    assert "CheckpointSaved" in [event.reason for event in done.events]
    # The next attempt's launcher resumes from it.
    job = JobSpec.from_body(suspended_body(done.status, GRACE))
    env = {item["name"]: item.get("value") for item in
           launcher_env(job, 2, 0, checkpoints.location(done.status))}
    assert env[constants.ENV_CHECKPOINT] == "s3://runs/demo/step-120"
    assert env[constants.ENV_STOP_GRACE] == str(GRACE)


def test_a_launcher_that_outlives_the_period_does_not_keep_the_workers(api):
    settings = Settings.from_env()
    status = running_status(settings)
    terminating = launcher_pod(settings, deletionTimestamp="2026-12-01T12:00:45Z")
    now = dt.datetime(2026, 12, 1, 12, 0, 46, tzinfo=dt.UTC)
    recorded = run(settings, suspended_body(status, GRACE), terminating, now)
    run(settings, suspended_body(recorded.status, GRACE), terminating, now)
    assert api["deleted"] == ["StatefulSet", "ConfigMap"]


def test_without_a_grace_period_launcher_and_workers_go_at_once(api):
    settings = Settings.from_env()
    status = running_status(settings)
    now = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
    recorded = run(settings, suspended_body(status, 0), launcher_pod(settings), now)
    assert api["pods"] == [] and api["deleted"] == []
    outcome = run(settings, suspended_body(recorded.status, 0), launcher_pod(settings), now)
    assert api["pods"] == [(names.launcher_pod("demo", 1), None)]  # the pod's own grace
    assert api["deleted"] == ["StatefulSet", "ConfigMap"]
    assert "CheckpointRequested" not in [event.reason for event in outcome.events]
    env = {item["name"] for item in launcher_env(JobSpec.from_body(job_body()), 1)}
    assert not env & {constants.ENV_CHECKPOINT, constants.ENV_STOP_GRACE}


def test_the_operator_reads_the_marker_the_launcher_writes():
    assert checkpoints.MARKER.pattern == stoprequest._MARKER.pattern
    for message in ("[checkpoint: /ckpt/7]", "failed: x [checkpoint: /ckpt/7]  "):
        assert checkpoints.MARKER.search(message)["location"] == "/ckpt/7"
    assert checkpoints.MARKER.search("[checkpoint: /ckpt/7] then more") is None


def test_a_launcher_gone_before_the_pass_saw_its_end_still_gives_its_checkpoint(api):
    """The launcher pod's last state came with its DELETED event, the pass ran after: the
    location is remembered from the watch (handlers.on_child_event)."""
    settings = Settings.from_env()
    status = running_status(settings)
    gone = ended_launcher(settings, "terminated by signal 15 (SIGTERM) [checkpoint: /ckpt/9]")
    checkpoints.remember("team-a", "demo", gone)
    try:
        body = suspended_body(status, GRACE)
        with client.reading_from(make_view(settings, body["status"], [])):
            outcome = reconcile.reconcile(body, settings,
                                          dt.datetime(2026, 12, 1, 12, 1, tzinfo=dt.UTC))
        assert outcome.status["lastCheckpoint"]["location"] == "/ckpt/9"
        # An older attempt's launcher never replaces it.
        older = ended_launcher(settings, "[checkpoint: /ckpt/older]")
        older["metadata"]["labels"] = {**older["metadata"]["labels"],
                                       constants.LABEL_ATTEMPT: "0"}
        checkpoints.remember("team-a", "demo", older)
        with checkpoints._seen_lock:
            assert checkpoints._seen[("team-a", "demo")] is gone
    finally:
        checkpoints.forget("team-a", "demo")


def grace_body(status: dict[str, Any], grace: int) -> dict[str, Any]:
    body = job_body(status)
    body["spec"] = {**body["spec"], "runPolicy": {"checkpointGracePeriodSeconds": grace}}
    return body


def drained_worker(ordinal: int, **status: Any) -> dict[str, Any]:
    """Worker ``ordinal`` evicted by a drain: asked to go with its grace period, marked
    ``DisruptionTarget``, still running (its sessions are open)."""
    pod = ready_worker(ordinal)
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T12:01:00Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = GRACE + 15
    pod["status"] = {**pod["status"], "conditions": [
        {"type": "Ready", "status": "True"},
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
         "lastTransitionTime": "2026-12-01T12:00:00Z"}], **status}
    return pod


def run_running(settings: Settings, status: dict[str, Any], grace: int,
                launcher: dict[str, Any], workers: list[dict[str, Any]],
                now: dt.datetime) -> reconcile.Outcome:
    body = grace_body(status, grace)
    with client.reading_from(make_view(settings, status, [launcher], worker_pods=workers,
                                    body=body)):
        return reconcile.reconcile(body, settings, now)


def test_a_drained_worker_waits_while_the_launcher_saves_then_the_attempt_ends(api):
    """A node drain evicts worker 0: the launcher is asked to stop first (deleted with the
    grace period) and the attempt waits, Running, while worker 0 still runs; once the launcher
    ended with its checkpoint, the attempt ends as a lost worker (Infrastructure) and the
    checkpoint is kept for the next one."""
    settings = Settings.from_env()
    status = running_status(settings)
    now = dt.datetime(2026, 12, 1, 12, 0, 1, tzinfo=dt.UTC)
    workers = [drained_worker(0), ready_worker(1)]
    first = run_running(settings, status, GRACE, launcher_pod(settings), workers, now)
    assert api["pods"] == [(names.launcher_pod("demo", 1), GRACE)]
    assert api["deleted"] == []
    running = st.get_condition(first.status, st.RUNNING)
    assert running["reason"] == st.REASON_CHECKPOINT_BEFORE_DISRUPTION, running
    assert "demo-worker-0" in running["message"]
    assert first.status["attempt"] == 1 and "CheckpointRequested" in [
        event.reason for event in first.events]
    terminating = launcher_pod(settings, deletionTimestamp="2026-12-01T12:00:46Z")
    waiting = run_running(settings, first.status, GRACE, terminating, workers,
                          now + dt.timedelta(seconds=10))
    assert waiting.status["attempt"] == 1 and waiting.wake_after == pytest.approx(35)
    message = "terminated by signal 15 (SIGTERM) [checkpoint: /ckpt/demo/step-7]"
    done = run_running(settings, waiting.status, GRACE, ended_launcher(settings, message),
                       workers, now + dt.timedelta(seconds=20))
    ended = done.status["attempts"][0]
    assert (ended["class"], ended["reason"]) == ("Infrastructure", st.REASON_WORKER_EVICTED)
    # Worded as what happened: its node (cordoned) was drained, not "deleted" (issue 32).
    assert "demo-worker-0 (evicted by a drain of node node-0)" in ended["message"], ended
    assert ended["checkpoint"] == "/ckpt/demo/step-7"
    assert done.status["attempt"] == 2
    assert done.status["lastCheckpoint"]["location"] == "/ckpt/demo/step-7"


@pytest.mark.parametrize("grace, worker", [
    (0, drained_worker(0)),  # no grace period: as before
    (GRACE, drained_worker(0, phase="Failed")),  # nothing of it runs any more
    (GRACE, {**ready_worker(0), "status": {"phase": "Running", "containerStatuses": [
        {"name": "worker", "restartCount": 1, "state": {"running": {}}}]}}),  # it crashed
])
def test_a_worker_that_cannot_wait_ends_the_attempt_at_once(api, grace, worker):
    settings = Settings.from_env()
    status = running_status(settings)
    outcome = run_running(settings, status, grace, launcher_pod(settings),
                          [worker, ready_worker(1)],
                          dt.datetime(2026, 12, 1, 12, 0, 1, tzinfo=dt.UTC))
    assert outcome.status["attempts"][0]["class"] == "Infrastructure"
    assert (names.launcher_pod("demo", 1), GRACE) not in api["pods"]


def test_the_workers_keep_their_sessions_for_the_grace_period():
    """The worker pods get the period (the entrypoint's wait after SIGTERM) and a pod grace
    period that covers it; without one, neither."""
    settings = Settings.from_env()
    spec = build_worker_statefulset(JobSpec.from_body(grace_body({}, GRACE)),
                                    settings)["spec"]["template"]["spec"]
    env = {item["name"]: item.get("value") for item in spec["containers"][0]["env"]}
    assert env[constants.ENV_STOP_GRACE] == str(GRACE)
    assert spec["terminationGracePeriodSeconds"] == GRACE + WORKER_STOP_MARGIN_SECONDS
    plain = build_worker_statefulset(JobSpec.from_body(job_body()),
                                     settings)["spec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in plain
    assert constants.ENV_STOP_GRACE not in {item["name"] for item in plain["containers"][0]["env"]}
