"""``deletes.delete_exact`` deletes every kind the operator creates for a job (a job deleted while
its children were being created has each fresh one deleted by uid). CI found the launcher's
ServiceAccount, Role and RoleBinding missing: ``ValueError: v1 ServiceAccount is not a kind of
child of a job`` and a traceback in the operator's log."""

from __future__ import annotations

import pytest

from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.progress import (
    build_launcher_account,
    build_progress_binding,
    build_progress_configmap,
    build_progress_role,
)
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.k8s import client, deletes
from monarch_operator.controller.spec.spec import JobSpec
from tests.apifake import FakeApi, Request


@pytest.fixture
def recorded(monkeypatch) -> list[Request]:
    fake = FakeApi(lambda request: (200, {"kind": "Status", "status": "Success"}))
    monkeypatch.setattr(client, "_client", lambda: fake.client)
    return fake.requests


def job() -> JobSpec:
    return JobSpec.from_body({
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": {"image": "img", "workers": {"replicas": 2, "gpusPerWorker": 1}}})


@pytest.mark.parametrize("build, collection", [
    (build_launcher_account, "/api/v1/namespaces/team-a/serviceaccounts"),
    (build_progress_role, "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles"),
    (build_progress_binding, "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings"),
    (build_progress_configmap, "/api/v1/namespaces/team-a/configmaps"),
    (build_worker_service, "/api/v1/namespaces/team-a/services"),
    (build_network_policy, "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies"),
])
def test_every_child_kind_is_deleted_by_uid(recorded, build, collection):
    child = build(job())
    assert deletes.delete_exact(child["apiVersion"], child["kind"], "team-a",
                                child["metadata"]["name"], "uid-1")
    assert recorded == [Request("DELETE", f"{collection}/{child['metadata']['name']}", {}, {
        "propagationPolicy": "Background", "preconditions": {"uid": "uid-1"}})]


def test_gone_or_replaced_is_false_and_other_errors_raise(monkeypatch):
    """404 (gone already) and 409 (the uid precondition failed: a namesake replaced it) are
    "not deleted"; a 500 is the caller's to handle."""
    from kubernetes.client.rest import ApiException

    statuses = iter([404, 409, 500])
    fake = FakeApi(lambda request: (next(statuses), {"kind": "Status", "message": "no"}))
    monkeypatch.setattr(client, "_client", lambda: fake.client)
    assert deletes.delete_exact("v1", "Secret", "team-a", "s", "uid-1") is False
    assert deletes.delete_exact("v1", "Secret", "team-a", "s", "uid-1") is False
    with pytest.raises(ApiException) as raised:
        deletes.delete_exact("v1", "Secret", "team-a", "s", "uid-1")
    assert raised.value.status == 500


def test_a_kind_never_created_is_refused(recorded):
    with pytest.raises(ValueError, match="v1 Node is not a kind of child of a job"):
        deletes.delete_exact("v1", "Node", "team-a", "n", "uid-1")
    assert recorded == []
