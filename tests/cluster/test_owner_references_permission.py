"""Field case C24: the API server runs the OwnerReferencesPermissionEnforcement admission
plugin (on by default in OpenShift; every local cluster here turns it on). A child whose owner
reference has ``blockOwnerDeletion: true`` may only be created by a user that may ``update``
``monarchjobs/finalizers``. The chart grants that (tests/unit/test_chart_rbac.py derives the
rule from the code; tests/e2e/test_chart_operator.py runs the sample under the chart's account
in both RBAC modes). Here the grant is taken away: the job must fail at once with the API
server's words, never sit Starting, and the operator must not retry the create in a loop.
"""

from __future__ import annotations

import json
import time

import pytest

from monarch_operator.localcluster.demo import start_operator, stop_process
from tests.chart import CHART, helm, token_kubeconfig
from tests.cluster.helpers import apply_manifest, job_manifest, job_pods, wait_until

pytestmark = pytest.mark.cluster

RELEASE = "mo"
FINALIZERS = "monarchjobs/finalizers"


def without_finalizers_rule(kubectl, namespace: str, role: str) -> None:
    """Replace the chart's Role by the same Role less its ``monarchjobs/finalizers`` rule."""
    body = json.loads(kubectl("get", "role", role, "-n", namespace, "-o", "json"))
    kept = [rule for rule in body["rules"] if FINALIZERS not in rule.get("resources", [])]
    assert len(kept) == len(body["rules"]) - 1, f"the chart's Role has no {FINALIZERS} rule"
    body["rules"] = kept
    kubectl("replace", "-f", "-", stdin=json.dumps(body))


def create_requests(audit_log, start: int, user: str, namespace: str) -> list[str]:
    """Creates ``user`` sent in ``namespace`` (audit log from byte ``start``), with codes."""
    sent = []
    with open(audit_log, "rb") as log:
        log.seek(start)
        for line in log:
            event = json.loads(line)
            ref = event.get("objectRef", {})
            if (event.get("verb") == "create" and ref.get("namespace") == namespace
                    and event.get("user", {}).get("username") == user):
                sent.append(f"{ref.get('resource')} {event['responseStatus']['code']}")
    return sent


def test_without_the_finalizers_permission_the_job_fails_at_once_naming_it(
        kubectl, helm_env, chart_namespace, local_cluster, tmp_path):
    account = f"{RELEASE}-monarch-operator"
    user = f"system:serviceaccount:{chart_namespace}:{account}"
    helm("install", RELEASE, str(CHART), "-n", chart_namespace,
         "--set", f"watchNamespaces={{{chart_namespace}}}", env=helm_env)
    kubectl("scale", "deployment", account, "-n", chart_namespace, "--replicas=0")
    without_finalizers_rule(kubectl, chart_namespace, account)
    config = token_kubeconfig(kubectl, chart_namespace, account, tmp_path / "kubeconfig")
    audit_start = local_cluster.audit_log.stat().st_size
    operator = start_operator(tmp_path, {"KUBECONFIG": str(config)},
                              namespaces=(chart_namespace,))
    try:
        applied = time.monotonic()
        apply_manifest(kubectl, chart_namespace, job_manifest(
            "demo", launcher={"command": ["sh", "-c", "exit 0"]}))
        status = wait_until(
            lambda: (job := json.loads(kubectl("get", "monarchjob", "demo", "-n",
                                               chart_namespace, "-o", "json")))
            .get("status", {}).get("phase") in ("Failed", "Succeeded") and job["status"],
            60, "demo Failed")
        failed_after = time.monotonic() - applied
        time.sleep(5)  # long enough for a retry loop to show in the audit log
    finally:
        stop_process(operator)
        helm("uninstall", RELEASE, "-n", chart_namespace, env=helm_env, check=False)
    assert status["phase"] == "Failed", status
    [failed] = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "OperatorForbidden", failed
    assert "cannot set blockOwnerDeletion" in failed["message"], failed["message"]
    assert "finalizers" in failed["message"], failed["message"]
    assert job_pods(kubectl, chart_namespace, "demo") == []
    # One refused create, not a retry storm: the job ended on the first answer.
    creates = create_requests(local_cluster.audit_log, audit_start, user, chart_namespace)
    refused = [create for create in creates if create.endswith(" 403")]
    assert 1 <= len(refused) <= 2, creates
    print(f"failed {failed_after:.1f} s after apply; creates sent: {creates}")
