"""``deletes.delete_exact`` deletes every kind the operator creates for a job (a job deleted while
its children were being created has each fresh one deleted by uid). CI found the launcher's
ServiceAccount, Role and RoleBinding missing: ``ValueError: v1 ServiceAccount is not a kind of
child of a job`` and a traceback in the operator's log."""

from __future__ import annotations

import kubernetes
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


class RecordingApi:
    """Stands for one typed API class: records each ``delete_namespaced_*`` call."""

    calls: list[tuple[str, str, str, str]] = []

    def __init__(self, _client: object) -> None:
        pass

    def __getattr__(self, method: str):
        def call(name: str, namespace: str, body: object) -> None:
            assert body.preconditions.uid == "uid-1"
            RecordingApi.calls.append((type(self).__name__, method, namespace, name))
        return call


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[str, str, str, str]]:
    RecordingApi.calls = []
    for api in ("CoreV1Api", "AppsV1Api", "NetworkingV1Api", "RbacAuthorizationV1Api"):
        monkeypatch.setattr(kubernetes.client, api, type(api, (RecordingApi,), {}))
    monkeypatch.setattr(client, "_client", lambda: None)
    return RecordingApi.calls


def job() -> JobSpec:
    return JobSpec.from_body({
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": {"image": "img", "workers": {"replicas": 2, "gpusPerWorker": 1}}})


@pytest.mark.parametrize("build, method", [
    (build_launcher_account, "delete_namespaced_service_account"),
    (build_progress_role, "delete_namespaced_role"),
    (build_progress_binding, "delete_namespaced_role_binding"),
    (build_progress_configmap, "delete_namespaced_config_map"),
    (build_worker_service, "delete_namespaced_service"),
    (build_network_policy, "delete_namespaced_network_policy"),
])
def test_every_child_kind_is_deleted_by_uid(recorded, build, method):
    child = build(job())
    assert deletes.delete_exact(child["apiVersion"], child["kind"], "team-a",
                            child["metadata"]["name"], "uid-1")
    assert [call[1:] for call in recorded] == [(method, "team-a", child["metadata"]["name"])]


def test_a_kind_never_created_is_refused(recorded):
    with pytest.raises(ValueError, match="v1 Node is not a kind of child of a job"):
        deletes.delete_exact("v1", "Node", "team-a", "n", "uid-1")
    assert recorded == []
