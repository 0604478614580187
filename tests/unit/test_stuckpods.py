"""When the operator stops waiting for a deleted pod and force-deletes it (controller/stuckpods.py),
and which lost workers it deletes itself (attempts.LostWorker), without a cluster."""

from __future__ import annotations

import datetime as dt

from monarch_operator.controller import attempts, stuckpods

DELETED_AT = "2026-11-30T12:00:00Z"  # deletionTimestamp: the end of the grace period
DEADLINE = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def deleting(name: str = "j-launcher-abc", grace: int | None = 5, **metadata) -> dict:
    meta = {"name": name, "deletionTimestamp": DELETED_AT, **metadata}
    if grace is not None:
        meta["deletionGracePeriodSeconds"] = grace
    return {"metadata": meta, "spec": {"nodeName": "kwok-gpu-2"}, "status": {"phase": "Running"}}


def at(seconds: float) -> dt.datetime:
    return DEADLINE + dt.timedelta(seconds=seconds)


def test_a_deleted_pod_is_awaited_through_its_grace_period_then_overdue():
    pod = deleting()
    bound = stuckpods.FORCE_DELETE_AFTER_SECONDS
    assert stuckpods.is_awaited(pod, at(-5)) and not stuckpods.is_overdue(pod, at(-5))
    assert stuckpods.is_awaited(pod, at(bound - 1))
    assert stuckpods.is_overdue(pod, at(bound)) and not stuckpods.is_awaited(pod, at(bound))
    assert stuckpods.seconds_until_overdue([pod], at(-5)) == bound + 5
    assert stuckpods.seconds_until_overdue([pod], at(bound + 30)) == 0.0


def test_deletion_timestamps_as_the_api_server_and_the_client_write_them():
    """The API server writes ``...Z``; the Python client's ``sanitize_for_serialization``
    (how the operator reads pods) writes ``...+00:00``."""
    for text in (DELETED_AT, "2026-11-30T12:00:00+00:00", "2026-11-30T13:00:00+01:00"):
        pod = deleting()
        pod["metadata"]["deletionTimestamp"] = text
        assert stuckpods.deletion_deadline(pod) == DEADLINE, text


def test_a_pod_not_being_deleted_is_neither_awaited_nor_overdue():
    running = {"metadata": {"name": "j-worker-0"}, "status": {"phase": "Running"}}
    assert not stuckpods.is_awaited(running, at(1000))
    assert not stuckpods.is_overdue(running, at(1000))
    assert stuckpods.seconds_until_overdue([running], at(0)) is None


def test_a_force_deleted_pod_held_by_a_finalizer_is_not_deleted_again_nor_waited_for():
    """Force deletion sets the grace period to 0; a finalizer may keep the object. Deleting it
    again would change nothing (and write on every pass), waiting for it would block for ever."""
    held = deleting(grace=0, finalizers=["example.com/hold"])
    assert stuckpods.is_force_deleted(held)
    assert not stuckpods.is_overdue(held, at(1000)) and not stuckpods.is_awaited(held, at(1000))
    assert stuckpods.seconds_until_overdue([held], at(0)) is None
    # The earliest of the others decides when to look again.
    later = deleting("j-worker-1")
    later["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:10Z"
    assert stuckpods.seconds_until_overdue([held, later, deleting()], at(0)) == (
        stuckpods.FORCE_DELETE_AFTER_SECONDS)


def test_the_event_says_where_the_pod_is_stuck_and_why():
    text = stuckpods.describe_stuck(deleting(finalizers=["example.com/hold"]), at(16), False)
    assert text == ("j-launcher-abc on node kwok-gpu-2 (NotReady) (finalizers: example.com/hold),"
                    " 16s past its grace period")
    assert stuckpods.describe_stuck(deleting(), at(20), True) == (
        "j-launcher-abc on node kwok-gpu-2, 20s past its grace period")


def pod(name: str, uid: str, ready: str = "True", node: str = "node-2", **status) -> dict:
    return {"metadata": {"name": name, "uid": uid}, "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}],
                       "containerStatuses": [{"name": "worker", "restartCount": 0,
                                              "state": {"running": {}}}], **status}}


def test_only_workers_of_a_lost_node_are_deleted_by_the_operator_and_restarts_are_in_place():
    snapshot = attempts.worker_snapshot("j", 3, [pod("j-worker-0", "a"), pod("j-worker-1", "b"),
                                                 pod("j-worker-2", "c")])
    restarted = pod("j-worker-2", "c")
    restarted["status"]["containerStatuses"][0]["restartCount"] = 1
    exited = pod("j-worker-0", "a", ready="False", node="node-1")
    exited["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 143}}
    now = [exited, pod("j-worker-1", "b", ready="False"), restarted]
    lost = {worker.name: worker for worker in attempts.lost_workers(
        snapshot, now, frozenset({"node-2"}))}
    assert lost["j-worker-1"].node_lost and not lost["j-worker-1"].in_place
    assert lost["j-worker-1"].describe() == "j-worker-1 (node node-2 NotReady)"
    assert lost["j-worker-2"].in_place and not lost["j-worker-2"].node_lost
    assert lost["j-worker-0"].cause == "container worker exited 143"
    assert lost["j-worker-0"].in_place and not lost["j-worker-0"].node_lost


def test_the_gate_finds_workers_whose_node_is_lost(monkeypatch):
    # A not-Ready worker on a NotReady node is deleted by the gate (recreated elsewhere), not
    # waited for until Kubernetes evicts it after 300 s (seen in CI: both workers of a job on
    # the node that was lost; the second one held the next attempt for four minutes).
    from monarch_operator.controller import gate, k8s

    monkeypatch.setattr(k8s, "node_is_ready", lambda node: node != "lost")
    on = lambda node, **meta: {"metadata": {"name": "w-0", **meta},  # noqa: E731
                               "spec": {"nodeName": node} if node else {}}
    assert gate._lost_node(on("lost")) == "lost"
    assert gate._lost_node(on("fine")) is None
    assert gate._lost_node(on(None)) is None  # not scheduled yet
    assert gate._lost_node(on("lost", deletionTimestamp="2026-11-30T12:00:00Z")) is None
    assert gate._lost_node(None) is None
