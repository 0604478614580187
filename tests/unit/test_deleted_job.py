"""A job deleted while a pass of it runs (controller/k8s/cache.py, k8s/writes.py,
engine/passes.py): the pass creates nothing more, a create that raced the deletion is undone, and
the job's DELETED event yields exactly the deleted job's own children to delete. The cluster
test of the same is tests/cluster/test_quick_delete.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from monarch_operator.controller.engine import passes
from monarch_operator.controller.k8s import cache, client, deletes, errors, writes
from tests.unit.test_cache import (
    JOB_KIND,
    KEY,
    POD,
    SECRET,
    FakeApi,
    make_cache,
    obj,
    owned_secret,
)

STATEFULSET = ("apps/v1", "StatefulSet")


@pytest.fixture()
def fake_api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    """The API's read/create of Secrets, recording each call (test_cache.py's)."""
    api = FakeApi()
    monkeypatch.setattr(client, "_client", lambda: api.api.client)
    return api


def owned(kind: tuple[str, str], name: str, uid: str, owner: str, **metadata: Any
          ) -> dict[str, Any]:
    body = obj(kind, name, uid)
    body["metadata"].update(metadata, ownerReferences=[{"uid": owner, "controller": True}])
    return body


def test_a_pass_of_a_deleted_job_creates_nothing(fake_api: FakeApi):
    job_cache, _, _ = make_cache()
    view = job_cache.view(KEY)  # taken while the job existed
    assert job_cache.job_deleted(KEY, "job-uid") == []
    with client.reading_from(view), pytest.raises(errors.JobGoneError, match="job was deleted"):
        writes.ensure(owned_secret(""), "job-uid")
    assert fake_api.calls == []


def test_a_namesake_created_since_is_not_taken_as_gone(fake_api: FakeApi):
    job_cache, stores, _ = make_cache()
    job_cache.job_deleted(KEY, "job-uid")
    stores["job"][KEY] = [obj(JOB_KIND, "demo", "new-uid")]  # created again, same name
    with client.reading_from(job_cache.view(KEY)):
        _, created = writes.ensure(owned(SECRET, "demo-ssh", "", "new-uid"), "new-uid")
    assert created and fake_api.calls == ["create demo-ssh"]


def test_a_create_that_races_the_deletion_is_deleted_again(fake_api: FakeApi,
                                                           monkeypatch: pytest.MonkeyPatch):
    """The DELETED event comes while the create is on the wire: the handler cannot know of the
    new object, so the pass deletes it itself, by uid."""
    job_cache, _, _ = make_cache()
    answer = fake_api.api.answer
    handed_to_handler: list[list[Any]] = []

    def create_while_deleted(request: Any) -> tuple[int, Any]:
        if request.method == "POST":
            handed_to_handler.append(job_cache.job_deleted(KEY, "job-uid"))
        return answer(request)

    deleted: list[tuple[str, ...]] = []
    monkeypatch.setattr(fake_api.api, "answer", create_while_deleted)
    monkeypatch.setattr(deletes, "delete_exact", lambda *args: deleted.append(args) or True)
    with client.reading_from(job_cache.view(KEY)), pytest.raises(errors.JobGoneError):
        writes.ensure(owned_secret(""), "job-uid")
    assert handed_to_handler == [[]]
    assert deleted == [("v1", "Secret", "ns", "demo-ssh", "s-new")]
    assert job_cache.view(KEY).get(SECRET, "demo-ssh") is None  # nothing expected of it


def test_a_create_done_before_the_deletion_is_the_handlers_to_delete(fake_api: FakeApi,
                                                                     monkeypatch):
    job_cache, _, _ = make_cache()
    monkeypatch.setattr(deletes, "delete_exact", lambda *args: pytest.fail("deleted twice"))
    with client.reading_from(job_cache.view(KEY)):
        observed, created = writes.ensure(owned_secret(""), "job-uid")
    known = job_cache.job_deleted(KEY, "job-uid")  # not indexed yet: from the expectation
    assert [(kind, body["metadata"]["uid"]) for kind, body in known] == [(SECRET, "s-new")]
    assert cache.leftover_children("job-uid", known) == known


def test_leftovers_are_the_deleted_jobs_own_children_not_yet_being_deleted():
    secret = owned(SECRET, "demo-ssh", "s1", "job-uid")
    statefulset = owned(STATEFULSET, "demo-worker", "ss1", "job-uid")
    worker = owned(POD, "demo-worker-0", "p0", "ss1")  # goes with its StatefulSet
    launcher = owned(POD, "demo-launcher", "p1", "job-uid")  # a pod the job controls
    going = owned(SECRET, "demo-old", "s0", "job-uid", deletionTimestamp="2026-11-30T00:00:00Z")
    namesakes = owned(SECRET, "demo-ssh", "s2", "new-uid")  # the next job of that name
    job_cache, stores, _ = make_cache(secrets=[secret, going, namesakes],
                                      pods=[worker, launcher])
    job_cache.attach(STATEFULSET, {KEY: [statefulset]})
    known = job_cache.job_deleted(KEY, "job-uid")
    assert len(known) == 6
    leftovers = cache.leftover_children("job-uid", known)
    assert sorted(body["metadata"]["uid"] for _, body in leftovers) == ["p1", "s1", "ss1"]
    assert cache.leftover_children("", known) == []


def test_a_job_deleted_with_orphan_propagation_leaves_its_children():
    """``kubectl delete --cascade=orphan``: the job carried the ``orphan`` finalizer while
    the garbage collector took its owner references off the children; the cache may still
    show them owned when the DELETED event comes, and nothing is deleted."""
    secret = owned(SECRET, "demo-ssh", "s1", "job-uid")
    job_cache, _, _ = make_cache(secrets=[secret])
    job_cache.mark_gone("job-uid", orphaning=True)
    assert job_cache.job_deleted(KEY, "job-uid") == []
    # The same, deleted in the background: its Secret is a leftover to delete.
    job_cache, _, _ = make_cache(secrets=[secret])
    job_cache.mark_gone("job-uid")
    assert [body["metadata"]["uid"] for _, body in cache.leftover_children(
        "job-uid", job_cache.job_deleted(KEY, "job-uid"))] == ["s1"]


def test_gone_uids_are_forgotten_after_a_while():
    job_cache, _, clock = make_cache()
    job_cache.mark_gone("old-uid")
    assert job_cache.is_gone("old-uid") and not job_cache.is_gone("job-uid")
    clock.now += cache.GONE_SECONDS + 1
    job_cache.mark_gone("other-uid")
    assert not job_cache.is_gone("old-uid") and job_cache.is_gone("other-uid")


def test_delete_leftovers_deletes_each_by_uid_and_never_raises(monkeypatch, caplog):
    calls: list[tuple[str, ...]] = []

    def delete_exact(api_version: str, kind: str, namespace: str, name: str, uid: str) -> bool:
        calls.append((kind, name, uid))
        if kind == "Service":
            raise ApiException(status=403, reason="Forbidden")
        return kind != "ConfigMap"  # already gone

    monkeypatch.setattr(deletes, "delete_exact", delete_exact)
    known = [(SECRET, owned(SECRET, "demo-ssh", "s1", "job-uid")),
             (("v1", "Service"), owned(("v1", "Service"), "demo-worker", "v1", "job-uid")),
             (("v1", "ConfigMap"), owned(("v1", "ConfigMap"), "demo-hostfile", "c1", "job-uid")),
             (POD, owned(POD, "demo-worker-0", "p0", "ss1"))]
    with caplog.at_level(logging.INFO, logger="monarch_operator"):
        assert passes.delete_leftovers("ns", "demo", "job-uid", known) == 1
    assert calls == [("Secret", "demo-ssh", "s1"), ("Service", "demo-worker", "v1"),
                     ("ConfigMap", "demo-hostfile", "c1")]
    assert "deleting Service demo-worker of the deleted job failed" in caplog.text
    assert "deleted its Secret demo-ssh" in caplog.text


def test_a_pass_whose_job_went_stops_quietly(monkeypatch, caplog):
    """The status patch of a job deleted meanwhile is a 404: no error, no retry."""
    runner = passes.PassRunner(passes.Settings())

    def gone(namespace: str, name: str) -> passes.PassReport:
        raise errors.JobGoneError(f"MonarchJob {namespace}/{name} was deleted")

    monkeypatch.setattr(runner, "_run", gone)
    with caplog.at_level(logging.INFO, logger="monarch_operator"):
        report = runner.run("ns", "demo")
    assert (report.body, report.next_pass_seconds) == (None, None)
    assert [record.levelname for record in caplog.records] == ["INFO"]
