"""Checkpoint before a stop, the operator's side (issue 21 item 4), over a cache view: with
``runPolicy.checkpointGracePeriodSeconds`` a suspend deletes the launcher first with that grace
period and keeps the workers until it ended; the location its termination message names goes
into ``status.lastCheckpoint`` and the next attempt's ``MONARCH_CHECKPOINT``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator import constants, names
from monarch_operator.controller import checkpoints, k8s, reconcile
from monarch_operator.controller import status as st
from monarch_operator.controller.builders.launcher import launcher_env
from monarch_operator.controller.settings import Settings
from monarch_operator.controller.spec import JobSpec
from monarch_operator.launcher import stoprequest
from tests.unit.test_launch_pass import job_body, launcher_pod, make_view, running_status

GRACE = 45


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Records the pod deletions (name, grace) and other deletions a pass sends."""
    sent: dict[str, list[Any]] = {"pods": [], "deleted": []}
    monkeypatch.setattr(k8s, "delete_pod", lambda namespace, name, force=False,
                        grace_seconds=None: sent["pods"].append((name, grace_seconds)) or True)
    monkeypatch.setattr(k8s, "delete_if_present", lambda api_version, kind, namespace, name: (
        sent["deleted"].append(kind) or True))
    monkeypatch.setattr(k8s, "node_is_ready", lambda node: True)
    monkeypatch.setattr(k8s, "patch_job_status", lambda namespace, name, status: job_body(status))
    return sent


def suspended_body(status: dict[str, Any], grace: int) -> dict[str, Any]:
    body = job_body(status)
    body["spec"] = {**body["spec"], "suspend": True,
                    "runPolicy": {"checkpointGracePeriodSeconds": grace}}
    return body


def run(settings: Settings, body: dict[str, Any], launcher: dict[str, Any],
        now: dt.datetime) -> reconcile.Outcome:
    with k8s.reading_from(make_view(settings, body["status"], [launcher])):
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
    first = run(settings, suspended_body(status, GRACE), launcher_pod(settings), now)
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
    run(settings, suspended_body(status, GRACE), terminating,
        dt.datetime(2026, 12, 1, 12, 0, 46, tzinfo=dt.UTC))
    assert api["deleted"] == ["StatefulSet", "ConfigMap"]


def test_without_a_grace_period_launcher_and_workers_go_at_once(api):
    settings = Settings.from_env()
    status = running_status(settings)
    outcome = run(settings, suspended_body(status, 0), launcher_pod(settings),
                  dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC))
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
        with k8s.reading_from(make_view(settings, body["status"], [])):
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
