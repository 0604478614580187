"""Every object the operator deletes is the one it read: the DELETE carries the read object's
uid as a precondition, so a namesake created since (a StatefulSet's replacement pod, the next
attempt's hostfile) is never hit.

Field case (a clean-clone CI run, test_lost_workers): two passes working from views a moment
apart both found the worker pod on a lost node overdue and force-deleted it by name; the
StatefulSet had recreated it 17 ms after the first DELETE, and the second removed the new pod
(grace period 0) before it was bound: three pods of that name, where two were expected.

The API server here is :class:`tests.apifake.FakeApi` answering as a real one does: 409 when
``preconditions.uid`` is not the stored object's, 404 when there is none; a force-deleted
worker is recreated at once under a new uid, as its StatefulSet does.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest

from monarch_operator.controller.k8s import client, deletes, nodes, reads
from monarch_operator.controller.release import release
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Pass
from tests.apifake import FakeApi, Request

NAMESPACE = "team-a"
NOW = dt.datetime(2026, 12, 6, 12, 1, 0, tzinfo=dt.UTC)


class StatefulPods:
    """The pods of a namespace as the API server stores them; a deleted ``w-`` pod (a
    StatefulSet's) is recreated at once with a new uid."""

    def __init__(self, *names: str) -> None:
        self._uids = (f"uid-{n}" for n in itertools.count())
        self.pods = {name: self._new(name) for name in names}
        self.deleted: list[str] = []  # uids, in the order they went

    def _new(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": next(self._uids)},
                "spec": {"nodeName": "kwok-gpu-2"}, "status": {"phase": "Running"}}

    def answer(self, request: Request) -> tuple[int, Any]:
        prefix = f"/api/v1/namespaces/{NAMESPACE}/pods/"
        assert request.method == "DELETE" and request.path.startswith(prefix), request
        name = request.path.removeprefix(prefix)
        stored = self.pods.get(name)
        if stored is None:
            return 404, {"kind": "Status", "reason": "NotFound", "code": 404}
        wanted = ((request.body or {}).get("preconditions") or {}).get("uid")
        if wanted is not None and wanted != stored["metadata"]["uid"]:
            return 409, {"kind": "Status", "reason": "Conflict", "code": 409}
        self.deleted.append(stored["metadata"]["uid"])
        self.pods[name] = self._new(name)  # its StatefulSet's replacement
        return 200, stored

    def overdue(self, name: str) -> dict[str, Any]:
        """The stored pod as a pass reads it, being deleted since long before :data:`NOW`."""
        pod = self.pods[name]
        return {**pod, "metadata": {**pod["metadata"], "deletionGracePeriodSeconds": 5,
                                    "deletionTimestamp": "2026-12-06T12:00:00Z"}}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> tuple[StatefulPods, FakeApi]:
    pods = StatefulPods("w-worker-0", "w-worker-1")
    fake = FakeApi(pods.answer)
    monkeypatch.setattr(client, "_client", lambda: fake.client)
    monkeypatch.setattr(nodes, "node_is_ready", lambda node: False)
    return pods, fake


def a_pass() -> Pass:
    job = JobSpec.from_body({
        "metadata": {"name": "w", "namespace": NAMESPACE, "uid": "j", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                 "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}}})
    return Pass(job=job, status={"attempt": 2, "attempts": [{"number": 1}, {"number": 2}]},
                now=NOW, force_delete_after=3.0)


def test_two_passes_that_read_one_stuck_pod_force_delete_it_once_never_its_replacement(api):
    pods, fake = api
    stale = pods.overdue("w-worker-1")  # what both passes' views hold
    first, second = a_pass(), a_pass()
    assert release.let_go_of_stuck(first, [stale]) == []
    replacement = pods.pods["w-worker-1"]["metadata"]["uid"]
    assert release.let_go_of_stuck(second, [stale]) == []

    assert pods.deleted == [stale["metadata"]["uid"]], "the replacement was deleted"
    assert pods.pods["w-worker-1"]["metadata"]["uid"] == replacement
    assert [request.body["gracePeriodSeconds"] for request in fake.requests] == [0, 0]
    # The first pass tells it and records it; the second, answered 409, neither.
    assert [event.reason for event in first.events] == [st.REASON_POD_FORCE_DELETED]
    assert first.status["attempts"][-1]["forceDeletedPods"] == ["w-worker-1"]
    assert second.events == [] and "forceDeletedPods" not in second.status["attempts"][-1]


def test_a_pod_delete_and_stop_name_the_pod_read_never_a_namesake(api):
    pods, fake = api
    read = pods.pods["w-worker-0"]
    assert deletes.stop_pod(read, grace_seconds=7) is True
    assert fake.requests[-1].body == {"preconditions": {"uid": read["metadata"]["uid"]},
                                      "gracePeriodSeconds": 7}
    now = pods.pods["w-worker-0"]["metadata"]["uid"]
    # The same read again (a view a moment behind): the namesake stays.
    assert deletes.stop_pod(read) is False
    assert deletes.delete_pod(NAMESPACE, "w-worker-0", read["metadata"]["uid"],
                              force=True) is False
    assert pods.pods["w-worker-0"]["metadata"]["uid"] == now
    assert pods.deleted == [read["metadata"]["uid"]]
    # Gone entirely: 404, also False.
    del pods.pods["w-worker-0"]
    assert deletes.delete_pod(NAMESPACE, "w-worker-0", now) is False


def test_a_child_deleted_if_present_is_the_one_read(monkeypatch: pytest.MonkeyPatch):
    """``delete_if_present`` (hostfile, Services, the SSH Secret, StatefulSets): by the uid of
    what the pass read; a namesake answers 409 and stays."""
    stored = {"uid": "hostfile-2"}
    sent: list[Request] = []

    def answer(request: Request) -> tuple[int, Any]:
        sent.append(request)
        assert request.method == "DELETE"
        assert request.path == f"/api/v1/namespaces/{NAMESPACE}/configmaps/w-hostfile"
        if request.body["preconditions"]["uid"] != stored["uid"]:
            return 409, {"kind": "Status", "reason": "Conflict", "code": 409}
        return 200, {"kind": "Status", "status": "Success"}

    fake = FakeApi(answer)
    monkeypatch.setattr(client, "_client", lambda: fake.client)
    read = {"metadata": {"name": "w-hostfile", "uid": "hostfile-1"}}
    monkeypatch.setattr(reads, "read", lambda *args: read)
    assert deletes.delete_if_present("v1", "ConfigMap", NAMESPACE, "w-hostfile") is False
    read["metadata"]["uid"] = "hostfile-2"
    assert deletes.delete_if_present("v1", "ConfigMap", NAMESPACE, "w-hostfile") is True
    assert [request.body["preconditions"] for request in sent] == [
        {"uid": "hostfile-1"}, {"uid": "hostfile-2"}]
    assert all(request.body["propagationPolicy"] == "Background" for request in sent)
