"""MultiKueue (issue 37) without a cluster: on the manager a job with ``spec.managedBy:
kueue.x-k8s.io/multikueue`` gets its Workload and nothing else, its status is written only
while nothing is dispatched (``AwaitingDispatch``), an eviction gives the quota back at once,
``spec.suspend`` deactivates the Workload, the TTL counts from the copied ``completionTime``;
on a worker the copy's prebuilt Workload is checked (pod sets) and finished only after the
copy's own finished status is written. tests/cluster/test_multikueue.py runs them with Kueue."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from monarch_operator import constants
from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.k8s import deletes, writes
from monarch_operator.controller.kueue import client, manager, multikueue
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Pass

NOW = dt.datetime(2026, 12, 5, 12, 0, 0, tzinfo=dt.UTC)
UID = "11111111-2222-3333-4444-555555555555"


def dispatched(status: dict[str, Any] | None = None, queue: str | None = "user-queue",
               **spec: Any) -> dict[str, Any]:
    labels = {wl.LABEL_QUEUE_NAME: queue} if queue else {}
    return {"apiVersion": f"{constants.GROUP}/{constants.VERSION}", "kind": constants.KIND,
            "metadata": {"name": "demo", "namespace": "team-a", "uid": UID, "generation": 1,
                         "labels": labels},
            "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                     "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
                     "managedBy": constants.MANAGED_BY_MULTIKUEUE, **spec},
            "status": status or {}}


def conditions(*entries: tuple[str, str, str]) -> list[dict[str, str]]:
    return [{"type": kind, "status": status, "reason": reason, "message": ""}
            for kind, status, reason in entries]


ADMITTED = {"admission": {"clusterQueue": "cq"}, "conditions": conditions(
    ("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"))}
EVICTED = {"admission": {"clusterQueue": "cq"}, "conditions": conditions(
    ("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "False", "NoReservation"),
    ("Evicted", "True", "AdmissionCheck"))}
PENDING = {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                           "message": "couldn't assign flavors"}]}


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A manager cluster: the Workload (None until created), and every write a pass sends.
    Anything else the pass would write (a pod, a StatefulSet, a deletion) fails the test."""
    sent: dict[str, Any] = {"workload": None, "created": [], "workload_status": [],
                            "job_status": [], "active": [], "deleted_jobs": []}

    def create(desired: dict[str, Any], owner_uid: str) -> dict[str, Any]:
        sent["created"].append(desired)
        sent["workload"] = {**desired, "status": {}}
        return dict(sent["workload"])

    monkeypatch.setattr(client, "read_workload", lambda namespace, name: sent["workload"])
    monkeypatch.setattr(client, "create_workload", create)
    monkeypatch.setattr(client, "write_workload_status", lambda workload, status: (
        sent["workload_status"].append(status) or True))
    monkeypatch.setattr(client, "set_workload_active", lambda workload, active, notes: (
        sent["active"].append((active, notes))))
    sent["annotations"] = []
    monkeypatch.setattr(client, "annotate_job", lambda namespace, name, notes: (
        sent["annotations"].append((name, notes))))
    monkeypatch.setattr(writes, "patch_job_status", lambda namespace, name, status: (
        sent["job_status"].append(copy.deepcopy(status)) or {}))
    monkeypatch.setattr(deletes, "delete_monarchjob", lambda namespace, name: (
        sent["deleted_jobs"].append(name) or True))
    for module, names in ((writes, ("ensure", "ensure_together", "create_all", "label_pod")),
                          (deletes, ("delete_pod", "delete_if_present"))):
        for name in names:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _refused(name))
    return sent


def _refused(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the manager's pass called {name}")
    return call


def test_the_manager_makes_the_workload_and_says_it_awaits_dispatch(api):
    outcome = reconcile.reconcile(dispatched(), Settings(), NOW)

    [created] = api["created"]
    assert created["spec"]["queueName"] == "user-queue"
    assert [pod_set["name"] for pod_set in created["spec"]["podSets"]] == ["workers", "launcher"]
    assert created["metadata"]["ownerReferences"][0]["uid"] == UID
    [status] = api["job_status"]
    assert status["phase"] == st.PHASE_QUEUED
    assert st.get_condition(status, st.QUEUED)["reason"] == manager.REASON_AWAITING_DISPATCH
    assert "MultiKueue" in status["message"] and "user-queue" in status["message"]
    assert "attempts" not in status and "startTime" not in status  # nothing of a run
    assert outcome.status_written


def test_an_admitted_dispatched_job_keeps_the_status_multikueue_copied(api):
    api["workload"] = {"metadata": {"name": "demo-w", "namespace": "team-a",
                                    "ownerReferences": [{"uid": UID, "controller": True}]},
                       "spec": {}, "status": ADMITTED}
    copied = {"phase": "Running", "readyWorkers": "2/2", "conditions": conditions(
        ("Running", "True", "LauncherStarted"))}
    outcome = reconcile.reconcile(dispatched(copied), Settings(), NOW)

    assert not api["job_status"] and not api["created"] and not api["workload_status"]
    assert outcome.status == copied


def test_an_eviction_gives_the_quota_back_at_once_and_writes_no_job_status(api):
    api["workload"] = {"metadata": {"name": "demo-w", "namespace": "team-a", "generation": 1,
                                    "ownerReferences": [{"uid": UID, "controller": True}]},
                       "spec": {}, "status": EVICTED}
    reconcile.reconcile(dispatched({"phase": "Running"}), Settings(), NOW)

    [released] = api["workload_status"]
    assert "admission" not in released
    quota = next(c for c in released["conditions"] if c["type"] == "QuotaReserved")
    assert quota["status"] == "False"
    assert not api["job_status"]


# Evicted on the manager 10 s before NOW (Kueue clears status.clusterName as it evicts).
EVICTED_AT = "2026-12-05T11:59:50Z"
DISPATCHED_EVICTED = {**EVICTED, "conditions": [
    {**c, "lastTransitionTime": EVICTED_AT} for c in EVICTED["conditions"]],
    "admissionChecks": [{"name": "mk", "state": "Pending",
                         "message": "Reset to Pending after eviction. Previously: Ready"}]}
NEVER_DISPATCHED = {**DISPATCHED_EVICTED, "admissionChecks": [
    {"name": "mk", "state": "Pending", "message": ""}]}
GRACE = {"runPolicy": {"checkpointGracePeriodSeconds": 30}}
# The copy's status while its launcher saves (attempt 1 running, an earlier eviction of the
# same copy before it), and once the worker's operator ended the attempt.
SAVING = {"phase": "Queued", "attempt": 2, "attempts": [
    {"number": 1, "class": "Evicted", "endTime": "2026-12-05T11:50:00Z"},
    {"number": 2, "startTime": "2026-12-05T11:51:00Z", "launchTime": "2026-12-05T11:51:05Z"}]}
STOPPED = {"phase": "Queued", "attempt": 3, "attempts": [
    *SAVING["attempts"][:1],
    {"number": 2, "launchTime": "2026-12-05T11:51:05Z", "class": "Evicted",
     "endTime": "2026-12-05T11:59:58Z", "exitCode": 0, "checkpoint": "s3://ck/step-40"},
    {"number": 3, "startTime": "2026-12-05T11:59:58Z"}],
    "lastCheckpoint": {"location": "s3://ck/step-40", "attempt": 2}}


def evicted_workload(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "demo-w", "namespace": "team-a", "generation": 1,
                         "ownerReferences": [{"uid": UID, "controller": True}]},
            "spec": {}, "status": copy.deepcopy(status)}


def test_a_dispatched_job_with_a_grace_period_keeps_the_quota_while_its_copy_saves(api):
    api["workload"] = evicted_workload(DISPATCHED_EVICTED)
    outcome = reconcile.reconcile(dispatched(SAVING, **GRACE), Settings(), NOW)
    assert not api["workload_status"] and not api["annotations"] and not api["job_status"]
    # Woken at the grace period's end plus the margin, counted from the eviction (10 s ago).
    assert outcome.wake_after == pytest.approx(30 + manager.STOP_MARGIN_SECONDS - 10)

    outcome = reconcile.reconcile(dispatched(STOPPED, **GRACE), Settings(), NOW)
    [released] = api["workload_status"]
    assert wl_condition(released, "QuotaReserved")["status"] == "False"
    assert api["annotations"] == [
        ("demo", {constants.ANNOTATION_RESUME_CHECKPOINT: "s3://ck/step-40"})]
    [event] = outcome.events
    assert ("once the worker cluster's copy had stopped; checkpoint s3://ck/step-40 kept for "
            "the next dispatch") in event.message


def test_the_quota_goes_back_past_the_grace_period_even_if_the_copy_never_shows_it_stopped(api):
    api["workload"] = evicted_workload(DISPATCHED_EVICTED)
    late = NOW + dt.timedelta(seconds=30 + manager.STOP_MARGIN_SECONDS)
    outcome = reconcile.reconcile(dispatched(SAVING, **GRACE), Settings(), late)
    assert len(api["workload_status"]) == 1 and not api["annotations"]
    assert "after waiting in vain for the worker cluster's copy" in outcome.events[0].message


def test_a_checkpoint_in_the_copied_status_is_kept_however_the_quota_goes_back(api):
    # Saved on a schedule (status.lastCheckpoint), then suspended: the copy goes at once, and
    # the next dispatch still starts from it.
    saved = {**SAVING, "lastCheckpoint": {"location": "s3://ck/step-30", "attempt": 2}}
    api["workload"] = evicted_workload(DISPATCHED_EVICTED)
    api["workload"]["spec"] = {"active": False}
    reconcile.reconcile(dispatched(saved, suspend=True, **GRACE), Settings(), NOW)
    assert len(api["workload_status"]) == 1
    assert api["annotations"] == [
        ("demo", {constants.ANNOTATION_RESUME_CHECKPOINT: "s3://ck/step-30"})]
    # Already on the job: not written again.
    api["annotations"].clear()
    body = dispatched(saved, **GRACE)
    body["metadata"]["annotations"] = {constants.ANNOTATION_RESUME_CHECKPOINT: "s3://ck/step-30"}
    api["workload"]["spec"] = {}
    reconcile.reconcile(body, Settings(), NOW + dt.timedelta(seconds=120))
    assert api["annotations"] == []


def test_a_suspended_job_holds_no_quota_for_a_copy_multikueue_deletes_at_once(api):
    api["workload"] = evicted_workload(DISPATCHED_EVICTED)
    api["workload"]["spec"] = {"active": False}
    outcome = reconcile.reconcile(dispatched(SAVING, suspend=True, **GRACE), Settings(), NOW)
    assert len(api["workload_status"]) == 1
    assert "at once (deactivated" in outcome.events[-1].message


NOT_LAUNCHED = {"phase": "Starting", "attempt": 1, "attempts": [
    {"number": 1, "startTime": "2026-12-05T11:59:40Z"}]}


@pytest.mark.parametrize(("workload_status", "spec"), [
    (DISPATCHED_EVICTED, {}),    # no grace period: nothing to wait for
    (NEVER_DISPATCHED, GRACE),  # no worker admitted a copy: nothing runs anywhere
])
def test_without_a_grace_period_or_a_dispatch_the_quota_goes_back_at_once(api, workload_status,
                                                                          spec):
    api["workload"] = evicted_workload(workload_status)
    outcome = reconcile.reconcile(dispatched(NOT_LAUNCHED, **spec), Settings(), NOW)
    assert len(api["workload_status"]) == 1 and not api["annotations"]
    assert "at once" in outcome.events[0].message


def test_a_copy_the_manager_has_not_seen_launch_is_waited_for_too(api):
    # MultiKueue copies the status when the worker's Workload changes: the copy may have
    # launched although the status here does not say so yet.
    api["workload"] = evicted_workload(DISPATCHED_EVICTED)
    outcome = reconcile.reconcile(dispatched(NOT_LAUNCHED, **GRACE), Settings(), NOW)
    assert not api["workload_status"] and outcome.wake_after is not None
    assert manager.was_dispatched({"status": DISPATCHED_EVICTED})
    assert not manager.was_dispatched({"status": NEVER_DISPATCHED})


def test_copy_stopped_counts_only_an_eviction_ended_after_this_one():
    since = dt.datetime(2026, 12, 5, 11, 59, 50, tzinfo=dt.UTC)
    assert not manager.copy_stopped(SAVING, since)  # its ended attempt is older
    assert manager.copy_stopped(STOPPED, since)
    assert not manager.copy_stopped({}, since)
    failed = copy.deepcopy(STOPPED)
    failed["attempts"][1]["class"] = "Application"
    assert not manager.copy_stopped(failed, since)
    # Ended, but its launcher's last state not read yet: the checkpoint may still come.
    unread = copy.deepcopy(STOPPED)
    for key in ("exitCode", "checkpoint"):
        unread["attempts"][1].pop(key)
    assert not manager.copy_stopped(unread, since)
    unread["attempts"][1]["exitCode"] = 143  # read: it named no checkpoint
    assert manager.copy_stopped(unread, since)


def test_the_resume_checkpoint_annotation_reaches_the_spec():
    body = dispatched()
    body["metadata"]["annotations"] = {constants.ANNOTATION_RESUME_CHECKPOINT: "s3://ck/1"}
    assert JobSpec.from_body(body).resume_checkpoint == "s3://ck/1"
    assert JobSpec.from_body(dispatched()).resume_checkpoint is None


def wl_condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_after_a_lost_worker_the_stale_running_status_becomes_awaiting_dispatch(api):
    # Quota reserved again but the MultiKueue check not Ready: MultiKueue copies nothing.
    api["workload"] = {"metadata": {"name": "demo-w", "namespace": "team-a",
                                    "ownerReferences": [{"uid": UID, "controller": True}]},
                       "spec": {}, "status": {"conditions": conditions(
                           ("QuotaReserved", "True", "QuotaReserved")), "admissionChecks": [
                           {"name": "mk", "state": "Pending"}]}}
    stale = {"phase": "Running", "conditions": conditions(("Running", "True", "Started"))}
    reconcile.reconcile(dispatched(stale), Settings(), NOW)

    [status] = api["job_status"]
    assert status["phase"] == st.PHASE_QUEUED
    assert st.get_condition(status, st.RUNNING)["status"] == "False"
    assert "mk: Pending" in status["message"]


def test_suspend_deactivates_the_workload_and_resume_activates_only_its_own(api):
    api["workload"] = {"metadata": {"name": "demo-w", "namespace": "team-a",
                                    "ownerReferences": [{"uid": UID, "controller": True}]},
                       "spec": {}, "status": PENDING}
    reconcile.reconcile(dispatched(suspend=True), Settings(), NOW)
    assert api["active"] == [(False, {manager.ANNOTATION_DEACTIVATED: "true"})]
    assert api["job_status"][-1]["message"].startswith("suspended; ")

    api["active"].clear()
    api["workload"]["spec"] = {"active": False}  # deactivated by Kueue, not by us
    reconcile.reconcile(dispatched(), Settings(), NOW)
    assert api["active"] == []
    api["workload"]["metadata"]["annotations"] = {manager.ANNOTATION_DEACTIVATED: "true"}
    reconcile.reconcile(dispatched(), Settings(), NOW)
    assert api["active"] == [(True, {manager.ANNOTATION_DEACTIVATED: None})]


def test_the_ttl_counts_from_the_copied_completion_time(api):
    finished = {"phase": "Succeeded", "completionTime": "2026-12-05T11:59:00Z",
                "conditions": conditions(("Succeeded", "True", "LauncherSucceeded"))}
    kept = reconcile.reconcile(dispatched(finished, ttlSecondsAfterFinished=120), Settings(),
                               NOW)
    assert not kept.deleted and not api["deleted_jobs"] and not api["job_status"]
    gone = reconcile.reconcile(dispatched(finished, ttlSecondsAfterFinished=30), Settings(), NOW)
    assert gone.deleted and api["deleted_jobs"] == ["demo"]
    assert not api["created"]  # a finished job gets no Workload again


def test_without_a_queue_it_is_a_warning_event_and_nothing_else(api):
    outcome = reconcile.reconcile(dispatched(queue=None), Settings(), NOW)
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", manager.REASON_NO_QUEUE)]
    assert not api["created"] and not api["job_status"]


# -- the worker's side ----------------------------------------------------------------------------

def test_the_spec_reads_managed_by_and_the_prebuilt_workload():
    body = dispatched()
    assert JobSpec.from_body(body).dispatched
    body["spec"].pop("managedBy")
    body["metadata"]["annotations"] = {"kueue.x-k8s.io/prebuilt-workload-name": "w1"}
    job = JobSpec.from_body(body)
    assert not job.dispatched and job.prebuilt_workload == "w1"
    body["metadata"]["annotations"] = {}
    body["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"] = "w2"
    assert JobSpec.from_body(body).prebuilt_workload == "w2"
    body["spec"]["managedBy"] = constants.MANAGED_BY_OPERATOR
    assert not JobSpec.from_body(body).dispatched


def pod_sets(*counts: tuple[str, int]) -> dict[str, Any]:
    return {"metadata": {"name": "w1"},
            "spec": {"podSets": [{"name": name, "count": count} for name, count in counts]}}


def test_a_pod_set_mismatch_names_both_sides():
    assert multikueue.pod_set_mismatch(pod_sets(("workers", 2), ("launcher", 1)),
                                       pod_sets(("workers", 2), ("launcher", 1))) is None
    mismatch = multikueue.pod_set_mismatch(pod_sets(("workers", 3), ("launcher", 1)),
                                           pod_sets(("workers", 2), ("launcher", 1)))
    assert mismatch == ("Workload w1 asks for pod sets workers x3, launcher x1, the job for "
                        "workers x2, launcher x1")


def test_out_of_sync_finishes_the_workload_once():
    status = multikueue.out_of_sync_status({"metadata": {}, "status": {}}, "why", "t")
    finished = next(c for c in status["conditions"] if c["type"] == wl.FINISHED)
    assert (finished["status"], finished["reason"], finished["message"]) == (
        "True", "OutOfSync", "why")
    assert multikueue.out_of_sync_status({"metadata": {}, "status": status}, "why", "t") is None


def test_a_copy_finishes_its_workload_only_after_its_finished_status_is_written():
    body = dispatched()
    body["spec"].pop("managedBy")
    body["metadata"]["annotations"] = {"kueue.x-k8s.io/prebuilt-workload-name": "w1"}
    state = Pass(job=JobSpec.from_body(body), status={}, now=NOW)
    assert not multikueue.may_finish(state, finished_written=False)
    assert state.wake_after == multikueue.FINISH_RECHECK_SECONDS
    assert multikueue.may_finish(state, finished_written=True)
    own = Pass(job=JobSpec.from_body(dispatched(queue="q") | {"spec": {"image": "i"}}),
               status={}, now=NOW)
    assert multikueue.may_finish(own, finished_written=False)  # not a copy: as before


def test_an_evicted_copy_gives_its_quota_back_only_after_its_ended_attempt_is_written():
    body = dispatched()
    body["spec"].pop("managedBy")
    body["metadata"]["annotations"] = {"kueue.x-k8s.io/prebuilt-workload-name": "w1"}
    state = Pass(job=JobSpec.from_body(body), status=copy.deepcopy(STOPPED), now=NOW,
                 stored=copy.deepcopy(SAVING))
    assert not multikueue.may_release(state)  # MultiKueue would copy the saving status
    assert state.wake_after == multikueue.FINISH_RECHECK_SECONDS
    written = Pass(job=JobSpec.from_body(body), status=copy.deepcopy(STOPPED), now=NOW,
                   stored=copy.deepcopy(STOPPED))
    assert multikueue.may_release(written)
    own = Pass(job=JobSpec.from_body(dispatched(queue="q") | {"spec": {"image": "i"}}),
               status=copy.deepcopy(STOPPED), now=NOW, stored=copy.deepcopy(SAVING))
    assert multikueue.may_release(own)  # not a copy: as before
