"""Generated MonarchJob specs, valid and invalid, on the real API server with the operator
running (issue 9 item 9): each is refused at admission naming the field, or gets a status
within seconds (Running, Succeeded, Suspended, a reasoned wait, Failed naming the field); never
a traceback in the operator's log, never a job without status, no child without its owner,
bounded API writes per job (from the audit log).

A derandomized set of specs (hypothesis, the same every run) keeps CI reproducible;
``bench/generated_specs.py`` runs 500 with a seed of your choice.
"""

from __future__ import annotations

import pytest
import yaml

from monarch_operator.testing import apiaudit, speccheck, specgen
from tests.cluster.helpers import get_json, wait_until
from tests.cluster.test_operator import job_manifest

pytestmark = pytest.mark.cluster

CI_SPECS = 48


def test_generated_specs_are_refused_naming_the_field_or_get_a_truthful_status(
        local_cluster, kubectl, operator):
    specs = specgen.generate_specs(CI_SPECS)
    report = speccheck.check_specs(
        speccheck.Kubectl(kubectl.env), specs, audit_log=local_cluster.audit_log,
        operator_log=operator, batch_size=16, progress=print)
    print(report.summary())
    # The generator covers both sides, so the properties below are about something.
    assert report.refused >= CI_SPECS // 4, report.summary()
    assert report.specs - report.refused >= CI_SPECS // 4, report.summary()
    assert report.problems == [], "\n\n".join(report.problems)
    assert (report.tracebacks, report.without_status, report.orphans) == (0, 0, 0)


def refused_job(kubectl, namespace: str, manifest: str, reason: str = "TemplateRefused") -> dict:
    """Apply ``manifest`` (one MonarchJob), wait until it is Failed with ``reason``; returns
    its Failed condition."""
    name = yaml.safe_load(manifest)["metadata"]["name"]
    kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
    job = wait_until(lambda: (found := get_json(kubectl, "monarchjob", name, "-n", namespace))
                     and (found.get("status") or {}).get("phase") == "Failed" and found,
                     60, f"{name} Failed")
    (failed,) = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == reason, failed
    return failed


def test_a_queue_name_label_kueue_cannot_take_fails_the_job_naming_it(kubectl, namespace,
                                                                       operator):
    """``ZB`` is a valid label value but no LocalQueue name: the job fails at once naming the
    label (a generated flaw, pinned here by name), with no child and no Workload made."""
    body = yaml.safe_load(job_manifest("badqueue"))
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "ZB", "team": "a"}
    failed = refused_job(kubectl, namespace, yaml.safe_dump(body), reason="InvalidSpec")
    assert failed["message"].startswith(
        "metadata.labels['kueue.x-k8s.io/queue-name'] 'ZB' must name a Kueue object"), failed
    assert get_json(kubectl, "statefulset", "badqueue-worker", "-n", namespace) is None
    assert get_json(kubectl, "secret", "badqueue-ssh", "-n", namespace) is None


def test_unknown_field_in_a_template_fails_the_job_naming_it(kubectl, namespace, operator):
    """A field Kubernetes does not know in a pod template (a typo such as ``nodeSelectr``) is
    never dropped silently: the operator creates with strict field validation, the API server
    refuses the StatefulSet, and the job fails at once naming the field (a generated flaw,
    pinned here by name)."""
    failed = refused_job(kubectl, namespace, job_manifest(
        "typo", workers={"replicas": 2, "gpusPerWorker": 1,
                         "template": {"spec": {"nodeSelectr": {"pool": "gpu"}}}}))
    assert failed["message"].startswith("spec.workers.template: the API server refused "
                                        "StatefulSet typo-worker"), failed["message"]
    assert "spec.template.spec.nodeSelectr" in failed["message"], failed
    assert "strict decoding error: unknown field" in failed["message"], failed
    assert get_json(kubectl, "statefulset", "typo-worker", "-n", namespace) is None


def test_a_launcher_template_kubernetes_refuses_fails_the_job_before_any_worker(
        kubectl, namespace, operator, local_cluster):
    """The launcher pod is made only once every worker is Ready; a typo in its template is
    found by a dry run before the workers' StatefulSet exists (field case C12), so the job
    fails at once naming the field and no worker ever holds a GPU."""
    failed = refused_job(kubectl, namespace, job_manifest(
        "ltypo", launcher={"template": {"spec": {"containers": [
            {"name": "launcher", "imagePullPolicyy": "Always"}]}}}))
    assert failed["message"].startswith("spec.launcher: the API server refused Pod "
                                        "ltypo-launcher"), failed["message"]
    assert 'unknown field "spec.containers[0].imagePullPolicyy"' in failed["message"], failed
    creates = [request for request in apiaudit.read_log(local_cluster.audit_log, 0)[0]
               if request.verb == "create" and request.namespace == namespace
               and request.resource in ("statefulsets", "pods")]
    # The refused dry run (its request is in the audit log, so the log covers the operator),
    # and nothing else: no StatefulSet was ever created.
    assert [(request.resource, request.code) for request in creates] == [("pods", 400)], creates
