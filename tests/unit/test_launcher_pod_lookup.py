"""Which pod is an attempt's launcher (release.launcher_pod), read from a pass's view: the pod
the operator names, else, for a job started by an operator version that ran the launcher as a
batch Job, that Job's pod (generated name) by the attempt's labels."""

from __future__ import annotations

from monarch_operator.controller.k8s import client
from monarch_operator.controller.k8s.cache import JobView
from monarch_operator.controller.release import release

POD = ("v1", "Pod")


def pod(name: str, attempt: int, role: str = "launcher", job: str = "j") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "labels": {
        "monarch-operator.dev/job": job, "monarch-operator.dev/role": role,
        "monarch-operator.dev/attempt": str(attempt)}}}


def lookup(pods: list[dict], attempt: int) -> str | None:
    view = JobView(("ns", "j"), None, {POD: {p["metadata"]["name"]: p for p in pods}})
    with client.reading_from(view):
        found = release.launcher_pod("ns", "j", attempt)
    return None if found is None else found["metadata"]["name"]


def test_the_named_pod_of_the_attempt():
    pods = [pod("j-launcher", 1), pod("j-launcher-2", 2), pod("j-worker-0", 1, role="worker")]
    assert lookup(pods, 1) == "j-launcher"
    assert lookup(pods, 2) == "j-launcher-2"
    assert lookup(pods, 3) is None


def test_a_batch_jobs_pod_from_an_older_operator_is_found_by_its_labels():
    assert lookup([pod("j-launcher-2-x7k2p", 2)], 2) == "j-launcher-2-x7k2p"
    assert lookup([pod("j-launcher-x7k2p", 1), pod("j-launcher", 1)], 1) == "j-launcher"


def test_another_jobs_or_roles_pods_are_never_the_launcher():
    assert lookup([pod("k-launcher", 1, job="k"), pod("j-worker-0", 1, role="worker")], 1) is None
