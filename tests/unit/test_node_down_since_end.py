"""A failed launcher whose worker's node was NotReady at some moment since its end is an
infrastructure failure, even when the node is back before the verdict (the CI chaos soak of
stop 27, seed 1: a node crashed at +20 s, the launchers of two jobs failed at once on the lost
ssh sessions, the node was NotReady from about +45 s and back at +57 s, 17 s before it would
have counted as lost, and its first heartbeat let the exit code decide: Application, wrong)."""

from __future__ import annotations

import datetime as dt

import pytest

from monarch_operator.controller.judge import verdicts
from monarch_operator.controller.k8s import client, deletes, nodes
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state import timestamps
from tests.unit.test_launch_pass import NAME, job_body, running_status
from tests.unit.test_verdicts import T0, api, run_policy_pass, running_launcher, worker

__all__ = ["api"]  # the fixture, used by name

SNAPSHOT = [{"name": f"{NAME}-worker-{i}"} for i in (0, 1)]
ENDED = T0 + dt.timedelta(seconds=10)


def ready(since_seconds: float) -> tuple[bool, dt.datetime]:
    return True, T0 + dt.timedelta(seconds=since_seconds)


def not_ready(since_seconds: float) -> tuple[bool, dt.datetime]:
    return False, T0 + dt.timedelta(seconds=since_seconds)


@pytest.mark.parametrize(("node_1", "down"), [
    (ready(-600), []),  # Ready since long before the end: no sign of trouble
    (ready(9), []),  # back before the end (the second before it)
    (ready(10), ["node-1"]),  # back in the second of the end: NotReady at the end
    (ready(47), ["node-1"]),  # NotReady after the end, back before the verdict
    (not_ready(45), ["node-1"]),  # NotReady now, for any time: no confirmation waited for
    (not_ready(-600), ["node-1"]),
    ((False, None), ["node-1"]),  # no Ready condition
])
def test_a_workers_node_not_ready_at_some_moment_since_the_end_is_down(node_1, down):
    pods = [worker(0), worker(1)]  # on node-0 and node-1
    readiness = {"node-0": ready(-600), "node-1": node_1}
    assert verdicts.nodes_down_since(SNAPSHOT, pods, readiness, ENDED) == down


def test_only_the_attempts_workers_nodes_count_and_unknowns_decide_nothing():
    pods = [worker(0), worker(1)]
    assert verdicts.nodes_down_since(SNAPSHOT, pods, {"node-0": ready(-600)}, ENDED) == [
        "node-1"]  # a node gone (not listed) is down
    assert verdicts.nodes_down_since(SNAPSHOT[:1], pods, {"node-0": ready(-600)}, ENDED) == []
    assert verdicts.nodes_down_since(SNAPSHOT, pods, None, ENDED) == []  # may not read nodes
    assert verdicts.nodes_down_since(SNAPSHOT, pods, {}, None) == []  # end not reported


def failed_attempt(settings: Settings) -> tuple[dict, dict, dt.datetime]:
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    body = {**job_body(status), "spec": {**job_body()["spec"], "runPolicy": {"backoffLimit": 0}}}
    return body, running_launcher(settings, launched, exit_code=1, ended=6), launched


@pytest.mark.parametrize(("node_1_back", "reason", "recreated"), [
    (True, st.REASON_WORKER_RESTARTED, None),  # back: its pod is kept for the next attempt
    (False, st.REASON_WORKER_EVICTED, [f"{NAME}-worker-1"]),  # still away: recreated elsewhere
])
def test_a_failed_launcher_whose_workers_node_went_down_is_infrastructure(
        api, node_1_back, reason, recreated):
    settings = Settings.from_env()
    body, failed, launched = failed_attempt(settings)
    end = launched + dt.timedelta(seconds=6)
    now = end + dt.timedelta(seconds=40)
    # Both nodes heartbeat after the end: without the node's readiness, the exit code decides.
    beats = {node: now - dt.timedelta(seconds=1) for node in ("node-0", "node-1")}
    readiness = {"node-0": (True, end - dt.timedelta(seconds=600)),
                 "node-1": (node_1_back, now - dt.timedelta(seconds=2))}
    removed: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nodes, "node_heartbeats", lambda: beats)
        patch.setattr(nodes, "node_readiness", lambda: readiness)
        patch.setattr(deletes, "delete_pod", lambda namespace, name, uid, **kwargs: removed.append(name))
        judged = run_policy_pass(settings, body, [worker(0), worker(1), failed], now)
    record = judged["attempts"][0]
    assert (record["class"], record["reason"]) == ("Infrastructure", reason), record
    assert f"{NAME}-worker-1" in record["message"] and "node-1" in record["message"], record
    # Deleted by the pass after this one's status write (release.recreate_lost_workers).
    assert removed == []
    assert [entry["name"] for entry in record.get("recreatedWorkers") or []] == (recreated or [])

    # The same attempt with node-1 Ready since before the launcher's end: the program's failure.
    readiness["node-1"] = (True, end - dt.timedelta(seconds=1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nodes, "node_heartbeats", lambda: beats)
        patch.setattr(nodes, "node_readiness", lambda: readiness)
        judged = run_policy_pass(settings, body, [worker(0), worker(1), failed], now)
    assert judged["attempts"][0]["class"] == "Application", judged["attempts"][0]


def test_node_readiness_is_one_list_and_a_403_ends_reads(monkeypatch):
    from tests.apifake import FakeApi, Request

    changed = T0 + dt.timedelta(seconds=7)

    def node(name, *conditions):
        return {"metadata": {"name": name}, "status": {"conditions": [
            {"type": kind, "status": value, "lastTransitionTime": "2026-12-01T12:00:07Z"}
            for kind, value in conditions]}}

    def answer(request):
        if len(fake.requests) > 1:
            return 403, {"kind": "Status", "reason": "Forbidden"}
        return 200, {"kind": "NodeList", "items": [
            node("up", ("MemoryPressure", "False"), ("Ready", "True")),
            node("down", ("Ready", "Unknown")), node("new")]}

    fake = FakeApi(answer)
    monkeypatch.setattr(client, "_client", lambda: fake.client)
    nodes.forget_nodes()
    try:
        assert nodes.node_readiness() == {"up": (True, changed), "down": (False, changed),
                                        "new": (False, None)}
        assert nodes.node_readiness() is None  # 403: the pod's own state tells from now on
        assert nodes.node_readiness() is None
        assert fake.requests == [Request("GET", "/api/v1/nodes", {}, None)] * 2
    finally:
        nodes.forget_nodes()
