"""The job's NetworkPolicy builder and its operator setting: pure, no cluster."""

from __future__ import annotations

import pytest

from monarch_operator import constants
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec

SETTINGS = Settings()


def make_job(name: str = "demo", **spec_overrides) -> JobSpec:
    body = {
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 3, "gpusPerWorker": 2},
                 "meshes": {"trainer": {"hosts": 2}, "ref": {"hosts": 1}}},
    }
    body["spec"].update(spec_overrides)
    return JobSpec.from_body(body)


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def pod_labels(job: JobSpec) -> dict[str, dict]:
    return {
        "worker": build_worker_statefulset(job, SETTINGS)["spec"]["template"]["metadata"]["labels"],
        "launcher": build_launcher_pod(job, SETTINGS)["metadata"]["labels"],
    }


def test_policy_is_named_owned_and_namespaced():
    policy = build_network_policy(make_job())
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "demo-isolation"
    assert policy["metadata"]["namespace"] == "team-a"
    [owner] = policy["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["controller"], owner["kind"]) == ("uid-demo", True, "MonarchJob")


@pytest.mark.parametrize("case", [
    {"name": "plain"},
    {"name": "user labels in both templates", "spec": {
        "workers": {"replicas": 2, "gpusPerWorker": 1,
                    "template": {"metadata": {"labels": {"team": "rl", constants.LABEL_JOB: "x"}}}},
        "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
        "launcher": {"template": {"metadata": {"labels": {"team": "rl"}}}}}},
], ids=lambda case: case["name"])
def test_selects_the_jobs_worker_and_launcher_pods_and_no_other_jobs(case):
    job = make_job(**case.get("spec", {}))
    policy = build_network_policy(job)
    selector = policy["spec"]["podSelector"]
    for role, labels in pod_labels(job).items():
        assert selects(selector, labels), role
    for role, labels in pod_labels(make_job("demo2")).items():
        assert not selects(selector, labels), role
    # A pod that only borrows the job label (not made by the operator) is not selected.
    assert not selects(selector, {constants.LABEL_JOB: "demo"})


def test_ingress_only_from_the_jobs_own_pods_on_any_port():
    policy = build_network_policy(make_job())
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]  # egress untouched
    [rule] = spec["ingress"]
    assert rule == {"from": [{"podSelector": spec["podSelector"]}]}  # no namespaceSelector
    assert "ports" not in rule  # procs, collectives and the client use run-time ports


def test_builder_is_deterministic():
    assert build_network_policy(make_job()) == build_network_policy(make_job())


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("true", True), ("false", False),
                                                 ("False", False)])
def test_setting_from_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MONARCH_OPERATOR_NETWORK_POLICY", raising=False)
    else:
        monkeypatch.setenv("MONARCH_OPERATOR_NETWORK_POLICY", value)
    assert Settings.from_env().network_policy is expected


def test_setting_refuses_other_words(monkeypatch):
    monkeypatch.setenv("MONARCH_OPERATOR_NETWORK_POLICY", "off")
    with pytest.raises(ValueError, match="MONARCH_OPERATOR_NETWORK_POLICY='off': must be true or false"):
        Settings.from_env()
