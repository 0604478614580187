"""Pod Security admission on the local API server: a namespace labelled to enforce the
"restricted" level refuses a privileged pod and admits the operator's worker and launcher pods
and the chart's operator and `helm test` pods as built and rendered (server-side dry-run of
each pod, which is where the API server enforces the level; for workload objects such as a
StatefulSet it only warns). The sample job running there end to end is in
tests/e2e/test_pod_security.py."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.localcluster.demo import SAMPLE
from tests.chart import by_kind, render
from tests.cluster.helpers import get_json, wait_until

pytestmark = pytest.mark.cluster

PSA = "pod-security.kubernetes.io"
RESTRICTED_LABELS = [f"{PSA}/{mode}=restricted" for mode in ("enforce", "warn", "audit")]


def restrict(kubectl, namespace: str) -> None:
    """Label ``namespace`` to enforce, warn about and audit the "restricted" level."""
    kubectl("label", "namespace", namespace, "--overwrite", *RESTRICTED_LABELS)


def dry_run_pod(kubectl, namespace: str, name: str, template: dict[str, Any]
                ) -> subprocess.CompletedProcess[str]:
    """Create a Pod from a pod ``template`` with ``--dry-run=server`` (every admission plugin
    runs, nothing is stored; the ServiceAccount it names is created first); the completed
    kubectl run."""
    account = template["spec"].get("serviceAccountName")
    if account and get_json(kubectl, "serviceaccount", account, "-n", namespace) is None:
        # The operator creates the launcher's own ServiceAccount with the job's first objects.
        kubectl("create", "serviceaccount", account, "-n", namespace)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": (template.get("metadata") or {}).get("labels",
                                                                                      {})},
           "spec": template["spec"]}
    return subprocess.run(["kubectl", "create", "--dry-run=server", "-n", namespace, "-f", "-"],
                          input=yaml.safe_dump(pod), capture_output=True, text=True,
                          env=kubectl.env, check=False)


def sample_job(**spec_changes: Any) -> JobSpec:
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"].update(namespace="ns", uid="0a1b", generation=1)
    body["spec"].update(spec_changes)
    return JobSpec.from_body(body)


def worker_template(job: JobSpec) -> dict[str, Any]:
    return build_worker_statefulset(job, Settings())["spec"]["template"]


def launcher_template(job: JobSpec) -> dict[str, Any]:
    pod = build_launcher_pod(job, Settings())
    return {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}


def test_a_restricted_namespace_refuses_a_privileged_pod(kubectl, namespace):
    """The API server really enforces the label: a privileged root pod, and a pod that just
    says nothing about its security, are refused, naming what breaks the level."""
    restrict(kubectl, namespace)
    privileged = {"spec": {"containers": [{"name": "main", "image": "busybox",
                                           "securityContext": {"privileged": True}}]}}
    refused = dry_run_pod(kubectl, namespace, "privileged", privileged)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
    assert "privileged" in refused.stderr
    plain = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    refused = dry_run_pod(kubectl, namespace, "plain", plain)
    assert refused.returncode != 0
    for rule in ("allowPrivilegeEscalation != false", "unrestricted capabilities",
                 "runAsNonRoot != true", "seccompProfile"):
        assert rule in refused.stderr, refused.stderr
    # Without the label the same pod is admitted: the refusal is the namespace's level.
    kubectl("label", "namespace", namespace, *(f"{label.split('=')[0]}-"
                                               for label in RESTRICTED_LABELS))
    assert dry_run_pod(kubectl, namespace, "plain", plain).returncode == 0


@pytest.mark.parametrize("template_of", [worker_template, launcher_template],
                         ids=["worker", "launcher"])
def test_the_operators_pods_pass_the_restricted_level(kubectl, namespace, template_of):
    restrict(kubectl, namespace)
    admitted = dry_run_pod(kubectl, namespace, "pod", template_of(sample_job()))
    assert admitted.returncode == 0, admitted.stderr
    assert "Warning" not in admitted.stderr, admitted.stderr


def test_a_worker_template_that_allows_privilege_escalation_is_refused(kubectl, namespace):
    """A template still changes the security context, and the API server judges the result:
    the same worker with allowPrivilegeEscalation: true is refused in the namespace."""
    restrict(kubectl, namespace)
    job = sample_job(workers={"replicas": 3, "gpusPerWorker": 2, "template": {"spec": {
        "containers": [{"name": "worker",
                        "securityContext": {"allowPrivilegeEscalation": True}}]}}})
    refused = dry_run_pod(kubectl, namespace, "pod", worker_template(job))
    assert refused.returncode != 0
    assert 'allowPrivilegeEscalation != false (container "worker"' in refused.stderr, \
        refused.stderr


def test_the_charts_operator_and_test_pods_pass_the_restricted_level(kubectl, namespace):
    restrict(kubectl, namespace)
    objects = render(namespace=namespace)
    (deployment,) = by_kind(objects, "Deployment")
    test_pods = [obj for obj in by_kind(objects, "Pod")
                 if "test" in obj["metadata"].get("annotations", {}).get("helm.sh/hook", "")]
    assert test_pods, "the chart's helm test pod"
    # ServiceAccount admission wants the pods' account to exist.
    kubectl("apply", "-n", namespace, "-f", "-",
            stdin=yaml.safe_dump_all(by_kind(objects, "ServiceAccount")))
    for name, template in [("operator", deployment["spec"]["template"]),
                           *((pod["metadata"]["name"], pod) for pod in test_pods)]:
        admitted = dry_run_pod(kubectl, namespace, name, template)
        assert admitted.returncode == 0, (name, admitted.stderr)
        assert "Warning" not in admitted.stderr, (name, admitted.stderr)


def test_a_job_whose_workers_break_the_level_says_so_and_waits(kubectl, namespace):
    """The operator's own view: a MonarchJob in a restricted namespace whose worker template
    allows privilege escalation gets no worker pods, and its WorkersReady condition names the
    Pod Security refusal (the StatefulSet controller's FailedCreate). It waits rather than
    fails: relabelling the namespace lets the pods be created."""
    restrict(kubectl, namespace)
    body = yaml.safe_load(SAMPLE.read_text())
    body["spec"]["workers"]["template"] = {"spec": {"containers": [
        {"name": "worker", "securityContext": {"allowPrivilegeEscalation": True}}]}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    name = body["metadata"]["name"]

    def refusal() -> str | None:
        job = get_json(kubectl, "monarchjob", name, "-n", namespace) or {}
        for condition in (job.get("status") or {}).get("conditions") or []:
            message = condition.get("message") or ""
            if condition.get("type") == "WorkersReady" and "PodSecurity" in message:
                return message
        return None

    message = wait_until(refusal, 90, "WorkersReady naming the Pod Security refusal")
    assert "not created: FailedCreate" in message, message
    assert 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false' \
        in message, message
    assert kubectl.json("pods", "-n", namespace)["items"] == []
    assert get_json(kubectl, "monarchjob", name, "-n", namespace)["status"]["phase"] \
        not in ("Failed", "Succeeded")
