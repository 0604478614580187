"""Attach mode in a pass, over a cache view and without a cluster (issue 23 item 1): the worker
pods get their rank labels before the launcher is created, status.meshes is published, and a
recreated worker gets its label back; an SSH-mode job's pods are never patched."""

from __future__ import annotations

from typing import Any

import pytest

from monarch_operator import constants, names
from monarch_operator.controller.k8s import nodes, writes
from monarch_operator.controller.spec import attachmode
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from tests.unit.test_launch_pass import NAME, NAMESPACE, job_body, make_view, ready_worker, run_pass

TRAINER = f"{constants.GROUP}/trainer-rank"
REF = f"{constants.GROUP}/ref-rank"


def attach_body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    body = job_body(status, {"program": "/app/train.py"})
    body["spec"]["mode"] = "attach"
    body["spec"]["meshes"] = {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}
    return body


@pytest.fixture()
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What a pass sends, in order: ``("create", "Kind name")``, ``("label", (pod, labels))``,
    ``("status", status)``."""
    calls: list[tuple[str, Any]] = []

    def post(desired: dict[str, Any]) -> dict[str, Any]:
        calls.append(("create", f"{desired['kind']} {desired['metadata']['name']}"))
        return {**desired, "metadata": {**desired["metadata"], "uid": "new"}}

    def label_pod(namespace: str, name: str, labels: dict[str, str | None]) -> bool:
        assert namespace == NAMESPACE
        calls.append(("label", (name, labels)))
        return True

    def patch_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        calls.append(("status", status))
        return {}

    monkeypatch.setattr(writes, "_post", post)
    monkeypatch.setattr(writes, "label_pod", label_pod)
    monkeypatch.setattr(writes, "patch_job_status", patch_status)
    monkeypatch.setattr(nodes, "node_is_ready", lambda node: True)
    return calls


def test_ready_workers_are_labelled_before_the_launcher_is_created(sent):
    settings = Settings.from_env()
    run_pass(settings, make_view(settings, body=attach_body()))
    kinds = [kind for kind, _ in sent]
    labels = [value for kind, value in sent if kind == "label"]
    assert labels == [(names.worker_pod(NAME, 0), {TRAINER: "0"}),
                      (names.worker_pod(NAME, 1), {REF: "0"})]
    launcher = kinds.index("create", max(i for i, kind in enumerate(kinds) if kind == "label"))
    assert ("create", f"Pod {names.launcher_pod(NAME, 1)}") in sent[launcher:]
    [status] = [value for kind, value in sent if kind == "status"]
    assert status["meshes"] == attachmode.published_meshes(JobSpec.from_body(attach_body()))
    assert "run the Monarch worker loop" in str(status["conditions"])


def test_labelled_workers_are_not_patched_again_and_a_recreated_one_is(sent):
    settings = Settings.from_env()
    labelled = ready_worker(0)
    labelled["metadata"]["labels"][TRAINER] = "0"
    recreated = ready_worker(1)  # a new pod: the StatefulSet's template has no rank labels
    run_pass(settings, make_view(settings, body=attach_body(), worker_pods=[labelled, recreated]))
    assert [value for kind, value in sent if kind == "label"] == [
        (names.worker_pod(NAME, 1), {REF: "0"})]


def test_ssh_mode_pods_are_never_labelled_and_publish_no_meshes(sent):
    settings = Settings.from_env()
    run_pass(settings, make_view(settings))
    assert [kind for kind, _ in sent if kind == "label"] == []
    [status] = [value for kind, value in sent if kind == "status"]
    assert "meshes" not in status
