"""The in-process ``kubectl get -o json`` (``localcluster/kubeget.py``) prints what kubectl
prints, exits as kubectl exits, and leaves to kubectl what it cannot answer the same way.

Every test's wait goes through it (``Kubectl`` in ``localcluster/demo.py``), so a difference
would change what the waits see. Against the real local control plane: each form is run both
ways on the same objects and the outputs compared as JSON."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from monarch_operator.localcluster.demo import Kubectl
from monarch_operator.localcluster.kubeget import InProcessGet
from tests.cluster.helpers import apply_manifest, job_manifest, wait_until

pytestmark = pytest.mark.cluster


def both_ways(kubectl: Kubectl, *args: str) -> tuple[tuple[int, str, str] | None,
                                                     subprocess.CompletedProcess[str]]:
    """``args`` answered in this process (None: left to kubectl) and by the kubectl binary."""
    answered = InProcessGet(kubectl.env["KUBECONFIG"]).answer(args)
    ran = subprocess.run(["kubectl", *args], capture_output=True, text=True, env=kubectl.env,
                         check=False)
    return answered, ran


def parsed(text: str) -> object:
    return json.loads(text) if text else ""


def test_each_plain_form_prints_what_kubectl_prints(kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest(
        "kg", suspend=True, launcher={"command": ["sh", "-c", "exit 0"]}))
    kubectl("create", "configmap", "kg-a", "-n", namespace, "--from-literal=k=v")
    kubectl("label", "configmap", "kg-a", "-n", namespace, "pick=yes")
    # The job's status is written by the operator: both reads must see the same version.
    wait_until(lambda: json.loads(kubectl("get", "monarchjob", "kg", "-n", namespace, "-o",
                                          "json")).get("status", {}).get("phase") == "Suspended",
               60, "kg Suspended")
    forms = [
        ("get", "monarchjob", "kg", "-n", namespace, "-o", "json"),
        ("get", "mj", "-n", namespace, "-o", "json"),
        ("get", "monarchjobs.monarch-operator.dev", "kg", "-n", namespace, "-o", "json"),
        ("get", "configmaps", "-n", namespace, "-l", "pick=yes", "-o", "json"),
        ("get", "configmap/kg-a", "-n", namespace, "-o", "json"),
        ("get", "configmaps", "-n", namespace, "-l", "pick=no", "-o", "json"),
        ("get", "configmaps", "-n", namespace, "-l", "pick=no", "--ignore-not-found", "-o",
         "json"),
        ("get", "namespace", namespace, "-o", "json"),
        ("get", "crd/monarchjobs.monarch-operator.dev", "-o", "json"),
        ("get", "pod", "nothing-here", "-n", namespace, "-o", "json"),
        ("get", "pod", "nothing-here", "-n", namespace, "--ignore-not-found", "-o", "json"),
        ("get", "nodes", "-o", "json"),
    ]
    for form in forms:
        answered, ran = both_ways(kubectl, *form)
        assert answered is not None, f"{form} was left to kubectl"
        assert answered[0] == ran.returncode, (form, answered, ran.stderr)
        assert parsed(answered[1]) == parsed(ran.stdout), form
        assert answered[2].strip() == ran.stderr.strip(), form


def test_forms_it_cannot_answer_the_same_way_go_to_kubectl(kubectl, namespace):
    for form in [("get", "pods", "-A", "-o", "json"),
                 ("get", "pods", "-n", namespace, "-o", "name"),
                 ("get", "no-such-kind", "x", "-o", "json")]:
        answered, ran = both_ways(kubectl, *form)
        assert answered is None, form
    # Through Kubectl: the binary's words for a kind the server does not serve.
    with pytest.raises(RuntimeError, match="doesn't have a resource type"):
        kubectl("get", "no-such-kind", "x", "-o", "json")


def test_a_kind_installed_later_is_found_and_one_deleted_goes_to_kubectl(kubectl, namespace):
    group = f"g{uuid.uuid4().hex[:6]}.kubeget.test"
    reader = InProcessGet(kubectl.env["KUBECONFIG"])
    form = ("get", f"widgets.{group}", "-n", namespace, "-o", "json")
    assert reader.answer(form) is None  # not served yet: kubectl says so
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"widgets.{group}"},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                        "openAPIV3Schema": {"type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True}}}]}}
    kubectl("apply", "-f", "-", stdin=json.dumps(crd))
    try:
        kubectl("wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s")
        kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(
            {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w"}}))
        answered = wait_until(lambda: reader.answer(form), 30, "the new kind answered")
        assert [item["metadata"]["name"] for item in json.loads(answered[1])["items"]] == ["w"]
    finally:
        kubectl("delete", f"crd/widgets.{group}", "--wait=true", "--timeout=60s")
    named = ("get", f"widget.{group}", "w", "-n", namespace, "-o", "json")
    answered = reader.answer(named)
    ran = subprocess.run(["kubectl", *named], capture_output=True, text=True, env=kubectl.env,
                         check=False)
    assert answered is None or (answered[0], answered[1]) == (ran.returncode, ran.stdout)
    assert ran.returncode != 0
