"""Creates in order (writes.ensure_together: the hostfile ConfigMap, then the launcher pod) and
the JSON create itself (writes._post), no cluster: the POST is faked at the HTTP layer or above.

The cluster tests cover what the API server does with them (test_generated_specs.py: an unknown
field refused by strict field validation, naming it).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from monarch_operator.controller.k8s import client as k8s_client
from monarch_operator.controller.k8s import errors, writes
from tests.unit.test_cache import KEY, SECRET, make_cache, obj

CONFIG_MAP, POD = ("v1", "ConfigMap"), ("v1", "Pod")


def owned(kind: tuple[str, str], name: str) -> dict[str, Any]:
    body = obj(kind, name, "")
    body["metadata"]["ownerReferences"] = [{"uid": "job-uid", "controller": True}]
    return body


@pytest.fixture()
def posts(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replaces writes._post: records each create (name, and the names already answered when
    it was sent); a name in ``fail`` is answered with that error, one in ``taken`` with 409
    (and the read after it finds the object given there)."""
    state: dict[str, Any] = {"sent": [], "answered": [], "fail": {}, "taken": {}}
    lock = threading.Lock()

    def post(desired: dict[str, Any]) -> dict[str, Any]:
        name = desired["metadata"]["name"]
        with lock:
            state["sent"].append((name, tuple(state["answered"])))
        try:
            if name in state["fail"]:
                raise state["fail"][name]
            if name in state["taken"]:
                raise ApiException(status=409, reason="AlreadyExists")
            return {**desired, "metadata": {**desired["metadata"], "uid": f"uid-{name}"}}
        finally:
            with lock:
                state["answered"].append(name)

    monkeypatch.setattr(writes, "_post", post)
    monkeypatch.setattr(writes.reads, "_read_api",
                        lambda api_version, kind, namespace, name: state["taken"].get(name))
    return state


def test_the_launcher_is_sent_once_its_hostfile_is_the_jobs_own(posts):
    job_cache, _, _ = make_cache()
    job_cache.attach(CONFIG_MAP, {})
    with k8s_client.reading_from(job_cache.view(KEY)):
        (hostfile, made_hostfile), (launcher, made_launcher) = writes.ensure_together(
            owned(CONFIG_MAP, "demo-hostfile"), owned(POD, "demo-launcher"), owner_uid="job-uid")
    assert posts["sent"] == [("demo-hostfile", ()), ("demo-launcher", ("demo-hostfile",))]
    assert (hostfile["metadata"]["uid"], launcher["metadata"]["uid"]) == (
        "uid-demo-hostfile", "uid-demo-launcher")
    assert made_hostfile and made_launcher
    view = job_cache.view(KEY)  # both expected by the next pass, before their watch events
    assert view.get(CONFIG_MAP, "demo-hostfile")["metadata"]["uid"] == "uid-demo-hostfile"
    assert view.get(POD, "demo-launcher")["metadata"]["uid"] == "uid-demo-launcher"


def test_a_failed_hostfile_create_raises_and_no_launcher_is_sent(posts):
    """The ConfigMap refused: the pass fails on that error and sends no pod (the next pass
    sends both again)."""
    posts["fail"]["demo-hostfile"] = ApiException(status=500, reason="etcd timeout")
    job_cache, _, _ = make_cache()
    job_cache.attach(CONFIG_MAP, {})
    with k8s_client.reading_from(job_cache.view(KEY)), pytest.raises(ApiException) as raised:
        writes.ensure_together(owned(CONFIG_MAP, "demo-hostfile"), owned(POD, "demo-launcher"),
                            owner_uid="job-uid")
    assert raised.value.status == 500
    assert [name for name, _ in posts["sent"]] == ["demo-hostfile"]
    view = job_cache.view(KEY)
    assert view.get(POD, "demo-launcher") is None
    assert view.get(CONFIG_MAP, "demo-hostfile") is None


def earlier_jobs(kind: tuple[str, str], name: str) -> dict[str, Any]:
    """``name`` as an earlier MonarchJob of the same name left it (garbage collection due)."""
    body = obj(kind, name, "old-object-uid")
    body["metadata"]["ownerReferences"] = [{"kind": "MonarchJob", "uid": "earlier-job-uid",
                                            "controller": True}]
    return body


@pytest.mark.parametrize("seen_by_the_view", [False, True], ids=["create-409", "in-the-view"])
def test_no_launcher_is_sent_beside_a_hostfile_another_job_holds(posts, seen_by_the_view):
    """A kubelet mounts the hostfile ConfigMap by name: a launcher sent beside an earlier job's
    hostfile (the job deleted and applied again at once) ran on that job's hosts and addresses.
    Whether the view shows the ConfigMap (an unowned one with the job's label) or the create
    finds it (409; the view leaves other jobs' children out), no pod is sent."""
    foreign = earlier_jobs(CONFIG_MAP, "demo-hostfile")
    job_cache, _, _ = make_cache()
    if seen_by_the_view:
        foreign["metadata"].pop("ownerReferences")
        job_cache.attach(CONFIG_MAP, {KEY: [foreign]})
    else:
        job_cache.attach(CONFIG_MAP, {})
        posts["taken"]["demo-hostfile"] = foreign
    with k8s_client.reading_from(job_cache.view(KEY)), pytest.raises(
            errors.NotOwnedError, match="ConfigMap ns/demo-hostfile exists but is controlled by"):
        writes.ensure_together(owned(CONFIG_MAP, "demo-hostfile"), owned(POD, "demo-launcher"),
                            owner_uid="job-uid")
    assert "demo-launcher" not in [name for name, _ in posts["sent"]]
    assert job_cache.view(KEY).get(POD, "demo-launcher") is None


def test_only_what_is_missing_is_created(posts):
    job_cache, _, _ = make_cache(secrets=[{**owned(SECRET, "demo-ssh"),
                                           "metadata": {**owned(SECRET, "demo-ssh")["metadata"],
                                                        "uid": "s1"}}])
    with k8s_client.reading_from(job_cache.view(KEY)):
        results = writes.ensure_together(owned(SECRET, "demo-ssh"), owned(POD, "demo-launcher"),
                                      owner_uid="job-uid")
    assert [name for name, _ in posts["sent"]] == ["demo-launcher"]
    assert [(found["metadata"]["uid"], made) for found, made in results] == [
        ("s1", False), ("uid-demo-launcher", True)]


class FakeResponse:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason = status, "Bad Request" if status == 400 else "Created"
        self.data = json.dumps(body).encode()
        self.headers: dict[str, str] = {}

    def read(self) -> bytes:
        return self.data

    def getheaders(self) -> dict[str, str]:
        return self.headers


@pytest.fixture()
def http(monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[FakeResponse]]:
    """The client's HTTP call, faked: records each request and answers the next reply."""
    requests: list[dict[str, Any]] = []
    replies: list[FakeResponse] = []
    client = k8s_client._client()

    def call_api(method: str, url: str, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> FakeResponse:
        requests.append({"method": method, "url": url, "body": body,
                         "content_type": (header_params or {}).get("Content-Type")})
        return replies.pop(0)

    monkeypatch.setattr(client, "call_api", call_api)
    return requests, replies


def test_post_sends_json_with_strict_field_validation_and_returns_the_stored_object(http):
    requests, replies = http
    desired = owned(("apps/v1", "StatefulSet"), "demo-worker")
    replies.append(FakeResponse(201, {**desired, "metadata": {**desired["metadata"],
                                                              "uid": "ss1"}}))
    created = writes._post(desired)
    assert created["metadata"]["uid"] == "ss1"
    [request] = requests
    assert request["method"] == "POST" and request["content_type"] == "application/json"
    assert request["url"].endswith(
        "/apis/apps/v1/namespaces/ns/statefulsets?fieldValidation=Strict"), request["url"]
    assert request["body"] == desired


def test_a_refused_create_is_an_api_exception_with_the_servers_message(http):
    """What ensure() turns into RefusedError naming the field (C12)."""
    _, replies = http
    message = ('Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
               'unknown field "spec.nodeSelectr"')
    replies.append(FakeResponse(400, {"kind": "Status", "message": message}))
    with pytest.raises(ApiException) as raised:
        writes._post(owned(POD, "demo-launcher"))
    assert raised.value.status == 400
    assert errors.api_error_message(raised.value) == message
    replies.append(FakeResponse(400, {"kind": "Status", "message": message}))
    job_cache, _, _ = make_cache()
    refused = 'refused Pod demo-launcher: .*unknown field "spec.nodeSelectr"'
    with k8s_client.reading_from(job_cache.view(KEY)), pytest.raises(errors.RefusedError,
                                                                      match=refused):
        writes.ensure(owned(POD, "demo-launcher"), "job-uid")


FORBIDDEN_RBAC = ('statefulsets.apps "demo-worker" is forbidden: User '
                  '"system:serviceaccount:mo:mo-monarch-operator" cannot create resource '
                  '"statefulsets" in API group "apps" in the namespace "team-a"')
# What OwnerReferencesPermissionEnforcement answers without update on monarchjobs/finalizers
# (kubernetes plugin/pkg/admission/gc).
FORBIDDEN_OWNER = ('statefulsets.apps "demo-worker" is forbidden: cannot set blockOwnerDeletion '
                   'if an ownerReference refers to a resource you can\'t set finalizers on: ...')
QUOTA = ('pods "demo-launcher" is forbidden: exceeded quota: gpus, requested: '
         'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: '
         'requests.nvidia.com/gpu=8')
POD_SECURITY = ('pods "demo-launcher" is forbidden: violates PodSecurity "restricted:latest": '
                'runAsNonRoot != true (pod or container "launcher" must set '
                'securityContext.runAsNonRoot=true)')


@pytest.mark.parametrize(("message", "raised", "says"), [
    (FORBIDDEN_RBAC, errors.ForbiddenError, "refused to let the operator create Pod demo-launcher: "
                                          "statefulsets.apps"),
    (FORBIDDEN_OWNER, errors.ForbiddenError, "cannot set blockOwnerDeletion"),
    (POD_SECURITY, errors.RefusedError, "refused Pod demo-launcher: .*violates PodSecurity"),
    (QUOTA, ApiException, "403"),
], ids=["rbac", "owner-references-plugin", "pod-security", "quota"])
def test_a_403_is_lasting_unless_it_is_a_quota(http, message, raised, says):
    """C24: a 403 about the operator's permissions (RBAC, or the OwnerReferencesPermission-
    Enforcement plugin) cannot pass on a retry, nor can a Pod Security violation of the
    template: they raise what ends the job at once. A full quota may have room later: the
    plain ApiException, which the pass retries."""
    _, replies = http
    replies.append(FakeResponse(403, {"kind": "Status", "message": message, "code": 403}))
    job_cache, _, _ = make_cache()
    with k8s_client.reading_from(job_cache.view(KEY)), pytest.raises(raised, match=says) as caught:
        writes.ensure(owned(POD, "demo-launcher"), "job-uid")
    assert not isinstance(caught.value, (errors.ForbiddenError, errors.RefusedError)) or \
        type(caught.value) is raised


def test_a_foreign_object_in_the_way_is_looked_up_again_at_every_pass(monkeypatch):
    """C6: a Secret of the job's name that the job does not control (409, read) is not put in
    the view as if created: the watches select the job's label and never confirm it, so the
    view would answer the next passes with it for EXPECTATION_SECONDS after its deletion."""
    foreign = obj(SECRET, "demo-ssh", "foreign-uid")
    in_the_api: dict[str, Any] = {"demo-ssh": foreign}

    def post(desired: dict[str, Any]) -> dict[str, Any]:
        if desired["metadata"]["name"] in in_the_api:
            raise ApiException(status=409, reason="AlreadyExists")
        return {**desired, "metadata": {**desired["metadata"], "uid": "uid-ours"}}

    monkeypatch.setattr(writes, "_post", post)
    monkeypatch.setattr(writes.reads, "_read_api",
                        lambda api_version, kind, namespace, name: in_the_api.get(name))
    job_cache, _, _ = make_cache()
    with k8s_client.reading_from(job_cache.view(KEY)), pytest.raises(errors.NotOwnedError):
        writes.ensure(owned(SECRET, "demo-ssh"), owner_uid="job-uid")
    assert job_cache.view(KEY).get(SECRET, "demo-ssh") is None, "not expected by the view"
    del in_the_api["demo-ssh"]  # the user deletes it; the next pass (5 s later) creates ours
    with k8s_client.reading_from(job_cache.view(KEY)):
        (found, made) = writes.ensure(owned(SECRET, "demo-ssh"), owner_uid="job-uid")
    assert made and found["metadata"]["uid"] == "uid-ours"
