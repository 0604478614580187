"""The informer-style cache (controller/k8s/cache.py) and the k8s layer reading from it.

The indexes are plain dicts here, shaped as kopf's are ((namespace, job) -> the objects); that
kopf fills them from its watches (initial list first, DELETED drops) is exercised by the cluster
tests (test_operator_watches.py, with an operator killed and restarted between creations).
"""

from __future__ import annotations

from typing import Any

import pytest

from monarch_operator.controller.k8s import cache, client, reads, writes
from tests import apifake

JOB_KIND = ("monarch-operator.dev/v1alpha1", "MonarchJob")
POD, SECRET = ("v1", "Pod"), ("v1", "Secret")
KEY = ("ns", "demo")


def obj(kind: tuple[str, str], name: str, uid: str, version: int = 1,
        **labels: str) -> dict[str, Any]:
    return {"apiVersion": kind[0], "kind": kind[1],
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "resourceVersion": str(version), "generation": 1,
                         "labels": labels}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_cache(**indexes: list[dict[str, Any]]) -> tuple[cache.JobCache, dict[str, Any], Clock]:
    """A cache over dict indexes: job, pods, secrets (each a list of bodies of job KEY)."""
    clock = Clock()
    job_cache = cache.JobCache(JOB_KIND, clock)
    stores = {"job": {KEY: indexes.get("job", [obj(JOB_KIND, "demo", "job-uid")])},
              "pods": {KEY: indexes.get("pods", [])}, "secrets": {KEY: indexes.get("secrets", [])}}
    job_cache.attach(JOB_KIND, stores["job"])
    job_cache.attach(POD, stores["pods"])
    job_cache.attach(SECRET, stores["secrets"])
    return job_cache, stores, clock


def test_an_update_seen_by_the_watch_is_what_the_next_view_shows():
    job_cache, stores, _ = make_cache(pods=[obj(POD, "demo-worker-0", "p0", 1)])
    assert job_cache.view(KEY).get(POD, "demo-worker-0")["metadata"]["resourceVersion"] == "1"
    stores["pods"][KEY] = [obj(POD, "demo-worker-0", "p0", 7)]  # MODIFIED
    assert job_cache.view(KEY).get(POD, "demo-worker-0")["metadata"]["resourceVersion"] == "7"


def test_a_deletion_seen_by_the_watch_leaves_the_view():
    job_cache, stores, _ = make_cache(pods=[obj(POD, "demo-worker-0", "p0"),
                                            obj(POD, "demo-worker-1", "p1")])
    stores["pods"][KEY] = [obj(POD, "demo-worker-1", "p1")]  # DELETED demo-worker-0
    view = job_cache.view(KEY)
    assert view.get(POD, "demo-worker-0") is None
    assert [pod["metadata"]["name"] for pod in view.select(POD, {})] == ["demo-worker-1"]


def test_a_deleted_job_has_no_view_job():
    job_cache, stores, _ = make_cache()
    stores["job"].clear()
    assert job_cache.view(KEY).job is None


def test_select_is_a_label_selector():
    job_cache, _, _ = make_cache(pods=[obj(POD, "w", "1", role="worker"),
                                       obj(POD, "l", "2", role="launcher")])
    view = job_cache.view(KEY)
    assert [pod["metadata"]["name"] for pod in view.select(POD, {"role": "launcher"})] == ["l"]


def test_own_create_is_shown_until_the_watch_confirms_it_or_it_expires():
    job_cache, stores, clock = make_cache()
    view = job_cache.view(KEY)
    view.created(SECRET, obj(SECRET, "demo-ssh", "s1"))
    # Not indexed yet: the next pass still sees it (no second create).
    assert job_cache.view(KEY).get(SECRET, "demo-ssh")["metadata"]["uid"] == "s1"
    stores["secrets"][KEY] = [obj(SECRET, "demo-ssh", "s1", 5)]  # the watch caught up
    assert job_cache.view(KEY).get(SECRET, "demo-ssh")["metadata"]["resourceVersion"] == "5"
    stores["secrets"][KEY] = []  # then deleted by someone: the index decides again
    assert job_cache.view(KEY).get(SECRET, "demo-ssh") is None
    job_cache.view(KEY).created(SECRET, obj(SECRET, "demo-ssh", "s2"))
    clock.now += cache.EXPECTATION_SECONDS + 1  # never confirmed: forgotten
    assert job_cache.view(KEY).get(SECRET, "demo-ssh") is None


def with_managed_fields(body: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """``body`` as the API server replies with it: ``managedFields`` and the other sections."""
    managed = [{"manager": "monarch-operator", "operation": "Update", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}]
    return {**body, "metadata": {**body["metadata"], "managedFields": managed}, **sections}


def test_what_the_cache_keeps_of_our_own_writes_is_slimmed_as_the_watchs_copies_are():
    # A burst of new jobs keeps a reply per created child and per status patch until the
    # watch catches up (docs/performance.md, "Operator weight, round 2"): those are slimmed
    # too, so that they cost what the watch's copies cost.
    job_cache, _, _ = make_cache()
    view = job_cache.view(KEY)
    secret = with_managed_fields(obj(SECRET, "demo-ssh", "s1"), data={"id_ed25519": "KEY"},
                                 type="Opaque")
    pod = with_managed_fields(obj(POD, "demo-worker-0", "p0"),
                              spec={"nodeName": "n1", "volumes": [{"name": "v"}],
                                    "containers": [{"name": "worker", "image": "i",
                                                    "env": [{"name": "A", "value": "1"}]}]},
                              status={"phase": "Pending"})
    view.created(SECRET, secret)
    view.created(POD, pod)
    view.status_written(with_managed_fields(obj(JOB_KIND, "demo", "job-uid", 12),
                                            spec={"image": "i"}, status={"phase": "Running"}))
    later = job_cache.view(KEY)
    kept_secret = later.get(SECRET, "demo-ssh")
    assert kept_secret["metadata"]["uid"] == "s1" and "managedFields" not in kept_secret["metadata"]
    assert "data" not in kept_secret  # no key material kept, as for the watch's Secrets
    kept_pod = later.get(POD, "demo-worker-0")
    assert kept_pod["spec"] == {"nodeName": "n1", "containers": [{"name": "worker"}]}
    assert kept_pod["status"] == {"phase": "Pending"}
    assert "managedFields" not in later.job["metadata"]
    assert later.job["status"] == {"phase": "Running"} and later.job["spec"] == {"image": "i"}
    assert "managedFields" in secret["metadata"]  # the caller's reply is left as it was


def test_own_delete_hides_the_object_until_the_watch_drops_it():
    job_cache, stores, _ = make_cache(secrets=[obj(SECRET, "demo-ssh", "s1")])
    job_cache.view(KEY).deleted(SECRET, "demo-ssh")
    assert job_cache.view(KEY).get(SECRET, "demo-ssh") is None  # still indexed: hidden
    stores["secrets"][KEY] = [obj(SECRET, "demo-ssh", "s2")]  # a new one of the same name
    assert job_cache.view(KEY).get(SECRET, "demo-ssh")["metadata"]["uid"] == "s2"


def test_the_job_is_the_newer_of_the_watch_and_our_status_patch():
    job_cache, stores, _ = make_cache(job=[obj(JOB_KIND, "demo", "job-uid", 10)])
    view = job_cache.view(KEY)
    view.job["status"] = {"phase": "Starting"}  # the pass edits its own copy only
    assert "status" not in stores["job"][KEY][0]
    written = {**obj(JOB_KIND, "demo", "job-uid", 12), "status": {"phase": "Running"}}
    view.status_written(written)
    assert job_cache.view(KEY).job["status"] == {"phase": "Running"}  # the watch lags
    assert job_cache.is_own_write(KEY, "12")
    stores["job"][KEY] = [{**obj(JOB_KIND, "demo", "job-uid", 15), "status": {"phase": "X"}}]
    assert job_cache.view(KEY).job["status"] == {"phase": "X"}  # the watch is newer


def test_a_status_patch_after_a_spec_edit_is_not_taken_as_our_own_write():
    job_cache, _, _ = make_cache()
    view = job_cache.view(KEY)  # the pass reconciled generation 1
    edited = obj(JOB_KIND, "demo", "job-uid", 20)
    edited["metadata"]["generation"] = 2  # the spec changed while the pass ran
    view.status_written(edited)
    assert not job_cache.is_own_write(KEY, "20")  # its event still wakes the job
    job_cache.forget(KEY)
    assert not job_cache.is_own_write(KEY, "20")


class FakeApi:
    """The API's read and create of Secrets, through the layer's one client
    (:mod:`tests.apifake`); records every call as ``get NAME`` or ``create NAME``."""

    def __init__(self, existing: dict[str, Any] | None = None) -> None:
        self.existing = existing
        self.calls: list[str] = []
        self.api = apifake.FakeApi(self.answer)

    def answer(self, request: apifake.Request) -> tuple[int, Any]:
        collection = "/api/v1/namespaces/ns/secrets"
        if request.method == "GET":
            self.calls.append(f"get {request.path.removeprefix(collection + '/')}")
            return (404, {"kind": "Status"}) if self.existing is None else (200, self.existing)
        assert (request.method, request.path) == ("POST", collection), request
        self.calls.append(f"create {request.body['metadata']['name']}")
        if self.existing is not None:
            return 409, {"kind": "Status", "reason": "AlreadyExists"}
        self.existing = {**request.body, "metadata": {**request.body["metadata"], "uid": "s-new"}}
        return 201, self.existing


@pytest.fixture()
def fake_api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    api = FakeApi()
    monkeypatch.setattr(client, "_client", lambda: api.api.client)
    return api


def owned_secret(uid: str) -> dict[str, Any]:
    secret = obj(SECRET, "demo-ssh", uid)
    secret["metadata"]["ownerReferences"] = [{"uid": "job-uid", "controller": True}]
    return secret


def test_after_a_restart_the_relisted_cache_answers_without_the_api(fake_api):
    """An operator restarted: kopf's initial list filled the index; ensure() sends nothing."""
    job_cache, _, _ = make_cache(secrets=[owned_secret("s1")])
    with client.reading_from(job_cache.view(KEY)):
        observed, created = writes.ensure(owned_secret(""), "job-uid")
    assert (observed["metadata"]["uid"], created, fake_api.calls) == ("s1", False, [])


def test_missing_from_the_cache_but_existing_is_never_created_twice(fake_api):
    """The watch has not shown it yet: the create is answered 409, the API read decides."""
    fake_api.existing = owned_secret("s1")
    job_cache, _, _ = make_cache()
    with client.reading_from(job_cache.view(KEY)):
        observed, created = writes.ensure(owned_secret(""), "job-uid")
    assert (observed["metadata"]["uid"], created) == ("s1", False)
    assert fake_api.calls == ["create demo-ssh", "get demo-ssh"]
    with client.reading_from(job_cache.view(KEY)):  # the next pass: expected, no request
        writes.ensure(owned_secret(""), "job-uid")
    assert fake_api.calls == ["create demo-ssh", "get demo-ssh"]


def test_outside_a_pass_reads_go_to_the_api(fake_api):
    fake_api.existing = owned_secret("s1")
    assert reads.read("v1", "Secret", "ns", "demo-ssh")["metadata"]["uid"] == "s1"
    assert fake_api.calls == ["get demo-ssh"]
