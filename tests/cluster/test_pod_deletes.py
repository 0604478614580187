"""The operator's pod deletes against the real API server: a DELETE by the uid it read leaves a
namesake created since alone (answered 409), also with grace period 0, the way the lost-worker
force deletion sends it. The unit tests (tests/unit/test_pod_deletes_by_uid.py) rest on these
answers; this checks them where they come from.
"""

from __future__ import annotations

import json

import kubernetes
import pytest

from monarch_operator.controller.k8s import client, deletes

pytestmark = pytest.mark.cluster


@pytest.fixture
def operator_api(local_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's k8s layer, in this process, talking to the test's cluster."""
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(local_cluster.kubeconfig),
                                       client_configuration=config)
    api = kubernetes.client.ApiClient(config)
    monkeypatch.setattr(client, "_client", lambda: api)


def create_pod(kubectl, namespace: str, name: str) -> dict:
    """A pod that never runs (its node does not exist), held by nothing: returns it as read."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": "no-such-node", "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "c", "image": "example.invalid/none:1"}]}}))
    return json.loads(kubectl("get", "pod", name, "-n", namespace, "-o", "json"))


def uid_of(kubectl, namespace: str, name: str) -> str | None:
    out = kubectl("get", "pod", name, "-n", namespace, "-o", "jsonpath={.metadata.uid}",
                  "--ignore-not-found")
    return out.strip() or None


def test_a_delete_by_a_stale_read_leaves_the_namesake_and_a_current_one_goes(
        kubectl, bare_namespace, operator_api):
    first = create_pod(kubectl, bare_namespace, "w-worker-1")
    kubectl("delete", "pod", "w-worker-1", "-n", bare_namespace, "--grace-period=0", "--force")
    second = create_pod(kubectl, bare_namespace, "w-worker-1")  # its StatefulSet's replacement
    old = first["metadata"]["uid"]
    new = second["metadata"]["uid"]
    assert old != new

    assert deletes.delete_pod(bare_namespace, "w-worker-1", old, force=True) is False
    assert deletes.stop_pod(first) is False
    assert uid_of(kubectl, bare_namespace, "w-worker-1") == new, "the namesake was deleted"

    assert deletes.delete_pod(bare_namespace, "w-worker-1", new, force=True) is True
    assert uid_of(kubectl, bare_namespace, "w-worker-1") is None
    assert deletes.delete_pod(bare_namespace, "w-worker-1", new, force=True) is False  # 404
