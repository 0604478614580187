"""When the current attempt's launcher pod is lost with its node (attempts.lost_launcher,
judging._end_if_launcher_lost), without a cluster: only a running launcher that is not Ready
on a NotReady node is lost; nodes are read only for launchers that are not Ready."""

from __future__ import annotations

import datetime as dt

import pytest

from monarch_operator.controller.judge import judging
from monarch_operator.controller.k8s import nodes
from monarch_operator.controller.state import attempts, observe


def launcher(ready: str = "True", node: str | None = "kwok-gpu-0", phase: str = "Running",
             name: str = "j-launcher-1-abcde") -> dict:
    return {"metadata": {"name": name, "labels": {"monarch-operator.dev/role": "launcher"}},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}}


LOST = frozenset({"kwok-gpu-0"})


def test_a_running_launcher_not_ready_on_a_not_ready_node_is_lost_with_it():
    pod = launcher(ready="False")
    assert attempts.launcher_nodes_to_check([pod]) == {"kwok-gpu-0"}
    assert attempts.lost_launcher([pod], LOST) == ("j-launcher-1-abcde", "kwok-gpu-0")


def test_a_launcher_not_ready_on_a_ready_node_is_not_lost():
    pod = launcher(ready="False")
    assert attempts.lost_launcher([pod], frozenset()) is None
    assert attempts.lost_launcher([pod], frozenset({"kwok-gpu-1"})) is None


@pytest.mark.parametrize("pod", [
    launcher(ready="True"),  # the node controller has not marked it yet: its node is not read
    launcher(ready="False", phase="Succeeded"),  # finished: its outcome is judged instead
    launcher(ready="False", phase="Failed"),
    launcher(ready="False", node=None),  # never scheduled: on no node to lose
], ids=["ready", "succeeded", "failed", "unscheduled"])
def test_a_ready_finished_or_unscheduled_launcher_is_not_lost(pod):
    assert attempts.launcher_nodes_to_check([pod]) == set()
    assert attempts.lost_launcher([pod], LOST) is None


def test_the_lost_one_is_named_among_the_attempts_launcher_pods():
    pods = [launcher(ready="False", node="kwok-gpu-1", name="j-launcher-1-aaaaa"),
            launcher(ready="False", name="j-launcher-1-bbbbb")]
    assert attempts.launcher_nodes_to_check(pods) == {"kwok-gpu-0", "kwok-gpu-1"}
    assert attempts.lost_launcher(pods, LOST) == ("j-launcher-1-bbbbb", "kwok-gpu-0")


def test_nodes_are_read_only_for_a_launcher_that_is_not_ready(monkeypatch):
    read: list[str] = []
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: read.append(node))
    running = observe.LauncherOutcome(finished=False)
    state = FakePass()
    # Ready: no node read, nothing ends, no pass asked for.
    assert judging._end_if_launcher_lost(state, running, [launcher()]) is None  # type: ignore[arg-type]
    assert read == [] and set(state.wakes) == {None}
    # Not Ready on a node that is Ready: the node is read, the attempt goes on, and a pass is
    # asked for (a node lost before its pod was Ready gives no pod event).
    assert judging._end_if_launcher_lost(  # type: ignore[arg-type]
        state, running, [launcher(ready="False")]) is None
    assert read == ["kwok-gpu-0"] and state.wakes[-1] == attempts.LAUNCHER_RECHECK_SECONDS


class FakePass:
    """What _end_if_launcher_lost uses of a Pass when nothing is lost."""

    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
        self.wakes: list[float | None] = []

    def wake_in(self, seconds: float | None) -> None:
        self.wakes.append(seconds)


def test_a_launcher_not_ready_is_looked_at_again_only_for_a_while():
    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
    window = attempts.LAUNCHER_RECHECK_WINDOW_SECONDS

    def since(seconds: float, ready: str = "False") -> dict:
        pod = launcher(ready=ready)
        changed = now - dt.timedelta(seconds=seconds)
        pod["status"]["conditions"][0]["lastTransitionTime"] = changed.strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        return pod

    assert attempts.launcher_recheck_in([since(1)], now) == attempts.LAUNCHER_RECHECK_SECONDS
    assert attempts.launcher_recheck_in([since(window - 1)], now) == (
        attempts.LAUNCHER_RECHECK_SECONDS)
    assert attempts.launcher_recheck_in([since(window)], now) is None  # a probe of its own
    assert attempts.launcher_recheck_in([since(1, ready="True")], now) is None
    finished = since(1)
    finished["status"]["phase"] = "Succeeded"
    assert attempts.launcher_recheck_in([finished], now) is None
    no_condition = launcher()
    no_condition["status"]["conditions"] = []
    assert attempts.launcher_recheck_in([no_condition], now) == (
        attempts.LAUNCHER_RECHECK_SECONDS)


def test_a_lost_launcher_ends_the_attempt_as_an_infrastructure_failure(monkeypatch):
    from monarch_operator.controller.judge import endings
    from monarch_operator.controller.spec import policy
    from monarch_operator.controller.state import status as st

    ended: list[tuple] = []
    monkeypatch.setattr(nodes, "node_not_ready_since",
                        lambda node: None if node != "kwok-gpu-0" else nodes.NEVER_READY)
    monkeypatch.setattr(endings, "end_attempt",
                        lambda *args: ended.append(args) or policy.INFRASTRUCTURE)
    running = observe.LauncherOutcome(finished=False)
    pods = [launcher(ready="False")]
    state = FakePass()
    assert judging._end_if_launcher_lost(state, running, pods) == policy.INFRASTRUCTURE  # type: ignore[arg-type]
    assert ended == [(state, policy.INFRASTRUCTURE, st.REASON_LAUNCHER_LOST,
                      "launcher pod j-launcher-1-abcde lost with its node kwok-gpu-0 (NotReady)",
                      running, None, pods)]


def test_a_node_is_lost_only_once_not_ready_for_the_confirmation_time():
    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
    confirm = attempts.NODE_LOSS_CONFIRM_SECONDS

    def ago(seconds: float) -> dt.datetime:
        return now - dt.timedelta(seconds=seconds)

    assert attempts.confirmed_lost({}, now) == (frozenset(), None)
    assert attempts.confirmed_lost({"a": None, "b": ago(3)}, now) == (frozenset(), confirm - 3)
    assert attempts.confirmed_lost(
        {"a": ago(confirm), "b": ago(confirm - 5), "c": ago(1), "gone": nodes.NEVER_READY},
        now) == (frozenset({"a", "gone"}), 5)


def test_a_not_ready_blip_after_a_control_plane_outage_ends_no_attempt(monkeypatch):
    """C18 with the API server paused longer than the node-monitor grace: on resuming, the
    node controller marks the nodes NotReady (and the launcher pod not Ready) until the
    kubelets' next Lease renewals; the attempt goes on and is looked at again when the node
    would count as lost. NotReady for the confirmation time, it is lost."""
    from monarch_operator.controller.judge import endings
    from monarch_operator.controller.spec import policy

    state = FakePass()
    since = {"kwok-gpu-0": state.now - dt.timedelta(seconds=2)}
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: since.get(node))
    ended: list[tuple] = []
    monkeypatch.setattr(endings, "end_attempt",
                        lambda *args: ended.append(args) or policy.INFRASTRUCTURE)
    running = observe.LauncherOutcome(finished=False)
    pods = [launcher(ready="False")]
    assert judging._end_if_launcher_lost(state, running, pods) is None  # type: ignore[arg-type]
    assert ended == [] and attempts.NODE_LOSS_CONFIRM_SECONDS - 2 in state.wakes
    since["kwok-gpu-0"] -= dt.timedelta(seconds=attempts.NODE_LOSS_CONFIRM_SECONDS)
    assert judging._end_if_launcher_lost(state, running, pods) == policy.INFRASTRUCTURE  # type: ignore[arg-type]
    assert len(ended) == 1
