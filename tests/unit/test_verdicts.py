"""One verdict per attempt from what happened and when (issue 20 item 1, field case C19), without
a cluster: the pure judgment (:mod:`.verdicts`) and whole passes over a cache view that see the
same events delivered in either order."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator import constants
from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.judge import verdicts
from monarch_operator.controller.k8s import client, deletes, reads, writes
from monarch_operator.controller.k8s import nodes as k8s_nodes
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import attempts, lastseen, timestamps
from monarch_operator.controller.state import status as st
from tests.unit import test_launch_pass
from tests.unit.test_launch_pass import (
    NAME,
    job_body,
    launcher_pod,
    make_view,
    ready_worker,
    running_status,
    stored,
)

T0 = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def worker(ordinal: int = 1, uid: str | None = None, **status: Any) -> dict[str, Any]:
    pod = ready_worker(ordinal)
    pod["metadata"]["uid"] = uid or f"w{ordinal}"
    pod["status"]["containerStatuses"] = [{"name": "worker", "restartCount": 0,
                                           "state": {"running": {"startedAt": at(-60)}}}]
    pod["status"].update(status)
    return pod


def restarted_worker(ended: float, ordinal: int = 1) -> dict[str, Any]:
    """A worker whose container ended at ``ended`` and was restarted in place."""
    return worker(ordinal, containerStatuses=[{
        "name": "worker", "restartCount": 1, "state": {"running": {"startedAt": at(ended + 1)}},
        "lastState": {"terminated": {"exitCode": 137, "finishedAt": at(ended)}}}])


def launcher(phase: str = "Running", exit_code: int | None = None, ended: float | None = None,
             **metadata: Any) -> dict[str, Any]:
    pod = {"metadata": {"name": f"{NAME}-launcher", "uid": "l1", **metadata},
           "spec": {"nodeName": "node-9"}, "status": {"phase": phase}}
    if exit_code is not None:
        pod["status"]["containerStatuses"] = [{"name": "launcher", "state": {"terminated": {
            "exitCode": exit_code, "startedAt": at(0), "finishedAt": at(ended or 0)}}}]
    return pod


def judge(launcher_pod_: dict[str, Any], workers: list[dict[str, Any]], now: float,
          snapshot: list[dict[str, Any]] | None = None) -> verdicts.Verdict:
    snapshot = snapshot or [{"name": f"{NAME}-worker-{i}", "uid": f"w{i}", "restartCount": 0}
                            for i in (0, 1)]
    phase = launcher_pod_["status"]["phase"]
    return verdicts.judge(launcher_pod_, phase in ("Succeeded", "Failed"), phase == "Succeeded",
                          attempts.lost_workers(snapshot, workers), snapshot, workers,
                          T0 + dt.timedelta(seconds=now), T0)


def test_a_worker_lost_before_the_launcher_ended_wins_whatever_the_exit_code():
    for phase, code in (("Failed", 1), ("Succeeded", 0)):
        verdict = judge(launcher(phase, code, ended=10), [worker(0), restarted_worker(9)], 11)
        assert verdict.kind == verdicts.WORKER_LOST, (phase, verdict)
        assert [lost.name for lost in verdict.lost] == [f"{NAME}-worker-1"]
    # In the same second counts as before (the launcher most likely ended because of it).
    assert judge(launcher("Failed", 1, ended=10), [worker(0), restarted_worker(10)],
                 11).kind == verdicts.WORKER_LOST


def test_a_worker_lost_after_the_launcher_ended_does_not_change_its_verdict():
    late = [worker(0), restarted_worker(12)]
    assert judge(launcher("Failed", 3, ended=10), late, 14).kind == verdicts.EXIT_CODE
    assert judge(launcher("Succeeded", 0, ended=10), late, 14).kind == verdicts.SUCCEEDED
    deleted_late = worker(1)
    deleted_late["metadata"].update(deletionTimestamp=at(41), deletionGracePeriodSeconds=30)
    assert judge(launcher("Failed", 3, ended=10), [worker(0), deleted_late],
                 14).kind == verdicts.EXIT_CODE


def test_a_deleted_workers_time_is_its_deletion_request_not_its_deletion_timestamp():
    deleted = worker(1)  # asked at 9 with the default grace period: deletionTimestamp 9 + 30
    deleted["metadata"].update(deletionTimestamp=at(39), deletionGracePeriodSeconds=30)
    assert judge(launcher("Failed", 255, ended=10), [worker(0), deleted],
                 11).kind == verdicts.WORKER_LOST


def test_a_finished_launcher_waits_for_late_reports_then_is_judged_by_its_exit_code():
    quiet = [worker(0), worker(1)]
    settling = judge(launcher("Failed", 1, ended=10), quiet, 11)
    assert settling.kind == verdicts.SETTLING
    assert settling.wait_seconds == pytest.approx(verdicts.SETTLE_SECONDS - 1)
    assert judge(launcher("Failed", 1, ended=10), quiet,
                 10 + verdicts.SETTLE_SECONDS).kind == verdicts.EXIT_CODE
    assert judge(launcher("Succeeded", 0, ended=10), quiet, 11).kind == verdicts.SETTLING
    assert judge(launcher("Succeeded", 0, ended=10), quiet, 14).kind == verdicts.SUCCEEDED


@pytest.mark.parametrize(("extra", "stopped"), [
    ({"metadata": {"deletionTimestamp": at(35), "deletionGracePeriodSeconds": 30}}, "deleted"),
    ({"conditions": [{"type": "DisruptionTarget", "status": "True", "lastTransitionTime": at(5),
                      "reason": "EvictionByEvictionAPI"}]},
     "evicted through the Eviction API"),
    ({"reason": "Evicted", "message": "The node was low on resource: memory."},
     "evicted by the kubelet of node node-9: The node was low on resource: memory."),
    ({"conditions": [{"type": "DisruptionTarget", "status": "True", "lastTransitionTime": at(4),
                      "reason": "PreemptionByScheduler"}]},
     "preempted by the scheduler for a pod of higher priority"),
])
def test_an_exit_code_is_a_claim_a_launcher_stopped_from_outside_is_never_succeeded(extra,
                                                                                  stopped):
    for phase, code in (("Succeeded", 0), ("Failed", 143), ("Failed", 1)):
        pod = launcher(phase, code, ended=6, **extra.get("metadata", {}))
        pod["status"].update({key: value for key, value in extra.items() if key != "metadata"})
        verdict = judge(pod, [worker(0), worker(1)], 7)
        assert (verdict.kind, verdict.stopped) == (verdicts.LAUNCHER_STOPPED, stopped), phase


def test_a_launcher_deleted_after_it_ended_keeps_its_exit_codes_verdict():
    pod = launcher("Succeeded", 0, ended=6, deletionTimestamp=at(37),
                   deletionGracePeriodSeconds=30)
    assert judge(pod, [worker(0), worker(1)], 20).kind == verdicts.SUCCEEDED


def test_a_replaced_worker_counts_from_its_replacements_creation():
    replaced = worker(1, uid="w1-new")
    replaced["metadata"]["creationTimestamp"] = at(8)
    assert judge(launcher("Failed", 1, ended=10), [worker(0), replaced],
                 11).kind == verdicts.WORKER_LOST
    replaced["metadata"]["creationTimestamp"] = at(12)
    assert judge(launcher("Failed", 1, ended=10), [worker(0), replaced],
                 14).kind == verdicts.EXIT_CODE
    # Gone without a trace: when is unknown, so a failure is not blamed on the program alone.
    assert judge(launcher("Failed", 1, ended=10), [worker(0)], 14).kind == verdicts.WORKER_LOST
    assert judge(launcher("Succeeded", 0, ended=10), [worker(0)], 14).kind == verdicts.SUCCEEDED


# -- whole passes: the same events delivered in either order -----------------------------------


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    sent: dict[str, list[Any]] = {"status": [], "deleted": []}
    monkeypatch.setattr(writes, "_post", lambda desired, dry_run=False: stored(desired, "x"))
    monkeypatch.setattr(writes, "patch_job_status", lambda namespace, name, status: (
        sent["status"].append(status) or job_body(status)))
    monkeypatch.setattr(k8s_nodes, "node_not_ready_since", lambda node: None)
    monkeypatch.setattr(k8s_nodes, "node_heartbeats", lambda: None)  # unknown: judged at once
    monkeypatch.setattr(k8s_nodes, "node_readiness", lambda: None)  # unknown: no node was down
    monkeypatch.setattr(deletes, "stop_pod", lambda pod: bool(pod) and not sent["deleted"].append(
        pod["metadata"]["name"]))
    monkeypatch.setattr(deletes, "delete_if_present", lambda *args: True)
    monkeypatch.setattr(reads, "pod_log_tail", lambda *args: "")
    return sent


def running_launcher(settings: Settings, launched: dt.datetime, exit_code: int | None = None,
                     ended: float | None = None) -> dict[str, Any]:
    pod = launcher_pod(settings)
    pod["spec"]["nodeName"] = "node-9"
    if exit_code is not None:
        pod["status"] = {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [
            {"name": "launcher", "state": {"terminated": {
                "exitCode": exit_code, "startedAt": st.format_time(launched),
                "finishedAt": st.format_time(launched + dt.timedelta(seconds=ended or 0))}}}]}
    return pod


def lost_then_failed(settings: Settings, launched: dt.datetime) -> list[dict[str, Any]]:
    """Worker 1's container ended 5 s after the launch; the launcher failed 1 s later."""
    restarted = worker(1)
    restarted["status"]["containerStatuses"] = [{
        "name": "worker", "restartCount": 1, "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 137, "finishedAt": st.format_time(
            launched + dt.timedelta(seconds=5))}}}]
    return [worker(0), restarted, running_launcher(settings, launched, exit_code=1, ended=6)]


def verdict_of(status: dict[str, Any]) -> tuple:
    first = status["attempts"][0]
    return (first.get("class"), first.get("reason"), first.get("lostWorkers"),
            status.get("failureCounts"))


@pytest.mark.parametrize("backoff_limit", [0, 2])
def test_the_same_events_in_either_order_give_the_same_verdict(api, backoff_limit):
    settings = Settings.from_env()
    status = running_status(settings)
    spec_policy = {"backoffLimit": backoff_limit}
    status_with = dict(status)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    seconds = dt.timedelta(seconds=1)

    # The worker's loss arrives first (the launcher still runs), then the launcher's end.
    workers_first = [worker(0), lost_then_failed(settings, launched)[1],
                     running_launcher(settings, launched)]
    with_policy = {**job_body(status_with), "spec": {**job_body()["spec"],
                                                     "runPolicy": spec_policy}}
    order_a = run_policy_pass(settings, with_policy, workers_first, launched + 5.5 * seconds)

    # The launcher's failure arrives first (the worker's kubelet reports late): no verdict yet.
    launcher_first = [worker(0), worker(1),
                      running_launcher(settings, launched, exit_code=1, ended=6)]
    early = run_policy_pass(settings, with_policy, launcher_first, launched + 6.5 * seconds)
    assert (early["attempts"][0].get("class"), early.get("attempt")) == (None, 1), early
    order_b = run_policy_pass(settings, {**with_policy, "status": early},
                              lost_then_failed(settings, launched), launched + 7.5 * seconds)

    assert verdict_of(order_a) == verdict_of(order_b) == (
        "Infrastructure", st.REASON_WORKER_RESTARTED, [f"{NAME}-worker-1"],
        {"infrastructure": 1})


def run_policy_pass(settings: Settings, body: dict[str, Any], pods: list[dict[str, Any]],
                    now: dt.datetime) -> dict[str, Any]:
    """One reconcile pass of ``body`` at ``now`` over a view whose pods are ``pods`` (the
    workers as given, instead of always Ready ones, and the launcher)."""
    with pytest.MonkeyPatch.context() as patch:
        by_ordinal = {int(pod["metadata"]["name"].rsplit("-", 1)[1]): pod for pod in pods
                      if "-worker-" in pod["metadata"]["name"]}
        patch.setattr(test_launch_pass, "ready_worker", by_ordinal.__getitem__)
        view = make_view(settings, body["status"],
                         [pod for pod in pods if "-worker-" not in pod["metadata"]["name"]])
    with client.reading_from(view):
        return reconcile.reconcile(body, settings, now).status


def test_a_launcher_deleted_mid_run_that_exits_0_is_an_infrastructure_failure(api):
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    pod = running_launcher(settings, launched, exit_code=0, ended=4)
    pod["metadata"].update(deletionTimestamp=st.format_time(launched + dt.timedelta(seconds=33)),
                           deletionGracePeriodSeconds=30)
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"infrastructureBackoffLimit": 0}}}
    after = run_policy_pass(settings, body, [worker(0), worker(1), pod],
                            launched + dt.timedelta(seconds=5))
    record = after["attempts"][0]
    assert record["class"] == "Infrastructure" and record["reason"] == st.REASON_LAUNCHER_LOST
    assert record["message"] == (f"launcher pod {NAME}-launcher deleted while it ran "
                                 "(it exited 0)"), record
    assert st.is_true(after, st.FAILED) and not st.is_true(after, st.SUCCEEDED)


@pytest.mark.parametrize("deleted_after_end", [True, False])
def test_a_launcher_gone_before_the_pass_saw_its_end_is_judged_by_its_last_state(
        api, deleted_after_end):
    """The chaos soak's race: the launcher exited 0 and its pod was deleted (a node loss, a
    delete) before a pass ran; the watch's last state of it decides. Ended before the deletion:
    its own verdict (Succeeded). Deleted while it ran (it exited 0 on SIGTERM): LauncherLost."""
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    pod = running_launcher(settings, launched, exit_code=0, ended=4)
    asked = 10 if deleted_after_end else 2
    pod["metadata"].update(
        deletionTimestamp=st.format_time(launched + dt.timedelta(seconds=asked + 30)),
        deletionGracePeriodSeconds=30)
    lastseen.remember("team-a", NAME, pod)
    try:
        body = {**job_body(status), "spec": {**job_body()["spec"],
                                             "runPolicy": {"infrastructureBackoffLimit": 0}}}
        after = run_policy_pass(settings, body, [worker(0), worker(1)],
                                launched + dt.timedelta(seconds=20))
    finally:
        lastseen.forget("team-a", NAME)
    record = after["attempts"][0]
    if deleted_after_end:
        assert record["class"] == "Succeeded" and st.is_true(after, st.SUCCEEDED), record
    else:
        assert (record["class"], record["reason"]) == ("Infrastructure",
                                                       st.REASON_LAUNCHER_LOST), record
        assert record["message"].endswith("deleted while it ran (it exited 0)"), record


def test_a_launcher_gone_unseen_or_seen_running_is_lost(api):
    """No ended state was ever delivered (deleted while the operator was away, or its last
    state still running): the launcher was lost, as far as the operator can tell."""
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"infrastructureBackoffLimit": 0}}}
    for last in (None, running_launcher(settings, launched)):
        if last is not None:
            lastseen.remember("team-a", NAME, last)
        try:
            after = run_policy_pass(settings, body, [worker(0), worker(1)],
                                    launched + dt.timedelta(seconds=20))
        finally:
            lastseen.forget("team-a", NAME)
        record = after["attempts"][0]
        assert (record["class"], record["reason"]) == ("Infrastructure",
                                                       st.REASON_LAUNCHER_LOST), record
        assert record["message"] == f"launcher pod {NAME}-launcher was deleted while it ran"


def test_a_launcher_gone_unseen_with_a_worker_lost_is_judged_by_the_worker(api):
    """Chaos soak: a worker deleted, the operator killed before it saw that, its launcher gone
    when it came back. The known loss decides (WorkerEvicted), not the unknown one."""
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"infrastructureBackoffLimit": 0}}}
    after = run_policy_pass(settings, body, [worker(0), worker(1, uid="replacement")],
                            launched + dt.timedelta(seconds=20))
    record = after["attempts"][0]
    assert (record["class"], record["reason"]) == ("Infrastructure",
                                                   st.REASON_WORKER_EVICTED), record
    assert record["message"].endswith(f"(launcher pod {NAME}-launcher gone too)"), record
    assert record["lostWorkers"] == [f"{NAME}-worker-1"], record


def test_only_the_newest_attempts_launcher_is_kept_per_job():
    def pod(attempt: int) -> dict[str, Any]:
        return {"metadata": {"name": f"j-launcher-{attempt}",
                             "labels": {constants.LABEL_ATTEMPT: str(attempt)}}}
    try:
        lastseen.remember("ns", "j", pod(2))
        lastseen.remember("ns", "j", pod(1))  # the previous attempt's pod, stopped late
        lastseen.remember("ns", "j", {"metadata": {"name": "no-label"}})
        assert lastseen.launcher("ns", "j", 2, "") == pod(2)
        assert lastseen.launcher("ns", "j", 1, "") is None
        lastseen.remember("ns", "j", pod(3))
        assert lastseen.launcher("ns", "j", 2, "") is None and lastseen.launcher("ns", "j", 3, "")
    finally:
        lastseen.forget("ns", "j")
    assert lastseen.launcher("ns", "j", 3, "") is None


# -- a failed launcher waits for its workers' nodes to heartbeat (issue 20, chaos soak) --------


def beats(seconds_after_t0: float, *nodes: str) -> dict[str, dt.datetime]:
    return {node: T0 + dt.timedelta(seconds=seconds_after_t0) for node in nodes}


def test_silent_nodes_are_those_without_a_heartbeat_after_the_launchers_end():
    snapshot = [{"name": f"{NAME}-worker-{i}"} for i in (0, 1)]
    pods = [worker(0), worker(1)]  # on node-0 and node-1
    ended = T0 + dt.timedelta(seconds=10)
    # A renewal in the second of the end may have come before it: not a sign of life after it.
    assert verdicts.silent_nodes(snapshot, pods, {**beats(10.5, "node-0"), **beats(11, "node-1")},
                                 ended) == ["node-0"]
    assert verdicts.silent_nodes(snapshot, pods, beats(12, "node-0", "node-1"), ended) == []
    assert verdicts.silent_nodes(snapshot, pods, {}, ended) == ["node-0", "node-1"]  # no Lease
    # Only the attempt's workers count.
    assert verdicts.silent_nodes(snapshot[:1], pods, beats(12, "node-0"), ended) == []


def test_the_hold_is_bounded_and_needs_heartbeats_to_be_readable():
    snapshot, pods = [{"name": f"{NAME}-worker-0"}], [worker(0)]
    ended = T0 + dt.timedelta(seconds=10)
    hold = verdicts.NODE_SILENCE_HOLD_SECONDS
    assert verdicts.heartbeat_hold(snapshot, pods, {}, ended, ended) == ["node-0"]
    assert verdicts.heartbeat_hold(snapshot, pods, {}, ended,
                                   ended + dt.timedelta(seconds=hold)) == []
    assert verdicts.heartbeat_hold(snapshot, pods, None, ended, ended) == []  # may not read
    assert verdicts.heartbeat_hold(snapshot, pods, {}, None, ended) == []


def test_a_launcher_failed_while_a_workers_node_is_silent_waits_then_is_infrastructure(api):
    """Seen in the 30-minute chaos soak: a node crashed, the launcher's ssh to it failed and
    the launcher exited 1 seconds later, long before the node controller marked the node
    NotReady; the attempt was judged Application and spent the backoff limit. Now the verdict
    waits for the node: NotReady -> Infrastructure, a heartbeat -> the exit code decides."""
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"backoffLimit": 0}}}
    failed = running_launcher(settings, launched, exit_code=1, ended=6)
    end = launched + dt.timedelta(seconds=6)
    silent = {"node-0": end + dt.timedelta(seconds=2), "node-1": end - dt.timedelta(seconds=3)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(k8s_nodes, "node_heartbeats", lambda: silent)
        held = run_policy_pass(settings, body, [worker(0), worker(1), failed],
                               end + dt.timedelta(seconds=5))
    assert held["attempts"][0].get("class") is None and not st.is_true(held, st.FAILED), held
    running = st.get_condition(held, st.RUNNING)
    assert running["reason"] == st.REASON_AWAITING_NODE_HEARTBEAT, running
    assert "node-1" in running["message"] and "node-0" not in running["message"], running

    # The node controller marks node-1 NotReady and its pod not Ready: a lost worker.
    lost = worker(1)
    lost["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(k8s_nodes, "node_heartbeats", lambda: silent)
        patch.setattr(k8s_nodes, "node_not_ready_since",
                      lambda node: None if node != "node-1" else k8s_nodes.NEVER_READY)
        patch.setattr(deletes, "delete_pod", lambda *args, **kwargs: True)  # the lost worker
        judged = run_policy_pass(settings, {**body, "status": held}, [worker(0), lost, failed],
                                 end + dt.timedelta(seconds=25))
    record = judged["attempts"][0]
    assert (record["class"], record["reason"]) == ("Infrastructure", st.REASON_WORKER_EVICTED)

    # Had node-1 heartbeated after the end, the exit code would have decided.
    alive = {**silent, "node-1": end + dt.timedelta(seconds=4)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(k8s_nodes, "node_heartbeats", lambda: alive)
        app = run_policy_pass(settings, {**body, "status": held}, [worker(0), worker(1), failed],
                              end + dt.timedelta(seconds=6))
    assert app["attempts"][0]["class"] == "Application", app["attempts"][0]
