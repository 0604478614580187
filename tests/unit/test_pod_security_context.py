"""The worker and launcher pods' security contexts: Pod Security "restricted" by default, and a
user's template still changes any field (the API server's Pod Security admission judges the
result: tests/cluster/test_pod_security.py)."""

from __future__ import annotations

import pytest

from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec

SETTINGS = Settings()
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def make_job(worker_template=None, launcher_template=None):
    spec = {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 2},
            "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}}
    if worker_template is not None:
        spec["workers"]["template"] = worker_template
    if launcher_template is not None:
        spec["launcher"] = {"template": launcher_template}
    return JobSpec.from_body({"metadata": {"name": "demo", "namespace": "ns", "uid": "u",
                                           "generation": 1}, "spec": spec})


def worker_pod(job):
    return build_worker_statefulset(job, SETTINGS)["spec"]["template"]["spec"]


def launcher_pod(job):
    return build_launcher_pod(job, SETTINGS)["spec"]


POD_KINDS = [pytest.param(worker_pod, "worker", {}, id="worker"),
             pytest.param(launcher_pod, "launcher", {}, id="launcher")]


@pytest.mark.parametrize(("pod_of", "container_name", "_"), POD_KINDS)
def test_pods_are_restricted_by_default(pod_of, container_name, _):
    pod = pod_of(make_job())
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": SETTINGS.worker_user_id,
        "runAsGroup": SETTINGS.worker_user_id, "fsGroup": SETTINGS.worker_user_id,
        "seccompProfile": {"type": "RuntimeDefault"}}
    assert SETTINGS.worker_user_id != 0
    (container,) = pod["containers"]
    assert container["name"] == container_name
    assert container["securityContext"] == RESTRICTED_CONTAINER
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert all("hostPort" not in port for port in container.get("ports", []))


def _template(container_name):
    return {"spec": {
        "securityContext": {"runAsUser": 2000, "runAsGroup": 2000},
        "containers": [{"name": container_name, "securityContext": {
            "capabilities": {"add": ["NET_BIND_SERVICE"]}}}]}}


@pytest.mark.parametrize(("pod_of", "container_name"), [(worker_pod, "worker"),
                                                        (launcher_pod, "launcher")])
def test_a_template_overrides_single_fields_and_keeps_the_rest(pod_of, container_name):
    if container_name == "worker":
        job = make_job(worker_template=_template(container_name))
    else:
        job = make_job(launcher_template=_template(container_name))
    pod = pod_of(job)
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 2000, "runAsGroup": 2000,
        "fsGroup": SETTINGS.worker_user_id, "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}


def test_a_template_may_loosen_the_defaults():
    # The user's choice wins (in a "restricted" namespace the API server then refuses the pod).
    job = make_job(worker_template={"spec": {
        "securityContext": {"seccompProfile": {"type": "Unconfined"}},
        "containers": [{"name": "worker", "securityContext": {
            "allowPrivilegeEscalation": True, "capabilities": {"drop": []}}}]}})
    pod = worker_pod(job)
    assert pod["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": True, "capabilities": {"drop": []}}


def test_containers_added_by_a_template_are_left_as_written():
    # Only the operator's own containers get the container-level defaults; a sidecar or init
    # container is the user's (the pod-level non-root user and seccomp profile still apply).
    job = make_job(worker_template={"spec": {
        "initContainers": [{"name": "prep", "image": "busybox", "command": ["true"]}]}})
    pod = worker_pod(job)
    assert "securityContext" not in pod["initContainers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1.5", "", "2147483648"])
def test_the_worker_uid_setting_must_be_non_root(monkeypatch, value):
    monkeypatch.setenv("MONARCH_OPERATOR_WORKER_UID", value)
    with pytest.raises(ValueError, match=(
            f"MONARCH_OPERATOR_WORKER_UID={value!r}: must be a non-root uid, 1-2147483647")):
        Settings.from_env()


@pytest.mark.parametrize(("value", "expected"), [(None, 1000), ("1", 1), ("65532", 65532)])
def test_the_worker_uid_setting(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MONARCH_OPERATOR_WORKER_UID", raising=False)
    else:
        monkeypatch.setenv("MONARCH_OPERATOR_WORKER_UID", value)
    settings = Settings.from_env()
    assert settings.worker_user_id == expected
    job = make_job()
    assert worker_pod_for(job, settings)["securityContext"]["runAsUser"] == expected


def worker_pod_for(job, settings):
    return build_worker_statefulset(job, settings)["spec"]["template"]["spec"]


ARBITRARY_UID = {"runAsUser": 1000680000, "runAsGroup": 0, "fsGroup": 1000680000}


@pytest.mark.parametrize(("pod_of", "container_name", "_"), POD_KINDS)
def test_an_arbitrary_uid_keeps_the_runtime_emptydir_named_by_monarch_runtime_dir(
        pod_of, container_name, _):
    """Field case C38: whatever uid a template (or OpenShift's restricted-v2) gives, each
    container has the pod's writable runtime folder, where the worker keeps sshd's files and a
    uid without a passwd entry gets one and its home; nothing depends on HOME."""
    template = {"spec": {"securityContext": dict(ARBITRARY_UID)}}
    job = make_job(worker_template=template, launcher_template=template)
    pod = pod_of(job)
    assert {key: pod["securityContext"][key] for key in ARBITRARY_UID} == ARBITRARY_UID
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["monarch-runtime"] == {"name": "monarch-runtime", "emptyDir": {}}
    (container,) = pod["containers"]
    assert {"name": "monarch-runtime", "mountPath": "/run/monarch"} in container["volumeMounts"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["MONARCH_RUNTIME_DIR"] == "/run/monarch"
    assert "HOME" not in env
