"""Each MonarchJob's NetworkPolicy on the local API server: created before the workers, owned
by the job, selecting exactly the job's worker and launcher pods; off with the operator
setting. Enforcement is shown on the real nodes: tests/e2e/test_network_policy_enforced.py."""

from __future__ import annotations

import pytest

from tests.cluster.helpers import get_json, job_manifest, wait_until

pytestmark = pytest.mark.cluster

LONG_LAUNCHER = {"command": ["sh", "-c", "sleep 600"]}


def selector_text(policy: dict) -> str:
    return ",".join(f"{key}={value}"
                    for key, value in sorted(policy["spec"]["podSelector"]["matchLabels"].items()))


def pod_names(kubectl, namespace: str, selector: str) -> set[str]:
    return set(kubectl("get", "pods", "-n", namespace, "-l", selector,
                       "-o", "jsonpath={.items[*].metadata.name}").split())


def launcher_running(kubectl, namespace: str, job: str) -> set[str]:
    pods = get_json(kubectl, "pods", "-n", namespace, "-l",
                    f"monarch-operator.dev/job={job},monarch-operator.dev/role=launcher")
    return {pod["metadata"]["name"] for pod in pods["items"]
            if (pod.get("status") or {}).get("phase") == "Running"}


def test_policy_is_owned_and_selects_exactly_the_jobs_pods(kubectl, namespace):
    for name in ("np-a", "np-b"):
        kubectl("apply", "-n", namespace, "-f", "-",
                stdin=job_manifest(name, launcher=LONG_LAUNCHER))
    # A pod that is not the operator's but carries a job's label (any user may label a pod).
    kubectl("run", "intruder", "-n", namespace, "--image=none", "--restart=Never",
            "--labels=monarch-operator.dev/job=np-a", "--command", "--", "sleep", "600")
    for name in ("np-a", "np-b"):
        wait_until(lambda name=name: launcher_running(kubectl, namespace, name), 180,
                   f"{name}'s launcher running")
    policies = {}
    for name in ("np-a", "np-b"):
        job = get_json(kubectl, "monarchjob", name, "-n", namespace)
        policy = get_json(kubectl, "networkpolicy", f"{name}-isolation", "-n", namespace)
        assert policy is not None, f"no NetworkPolicy for {name}"
        [owner] = policy["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "MonarchJob", name, job["metadata"]["uid"], True)
        # The policy exists before the workers: its creation time is not after the
        # StatefulSet's.
        workers = get_json(kubectl, "statefulset", f"{name}-worker", "-n", namespace)
        assert policy["metadata"]["creationTimestamp"] <= workers["metadata"]["creationTimestamp"]
        policies[name] = policy
        selected = pod_names(kubectl, namespace, selector_text(policy))
        expected = {f"{name}-worker-0", f"{name}-worker-1"} | launcher_running(
            kubectl, namespace, name)
        assert selected == expected, (name, selected)
        # Ingress only from the same selector (same namespace, no namespaceSelector).
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["ingress"] == [
            {"from": [{"podSelector": policy["spec"]["podSelector"]}]}]
    a_pods = pod_names(kubectl, namespace, selector_text(policies["np-a"]))
    b_pods = pod_names(kubectl, namespace, selector_text(policies["np-b"]))
    assert not a_pods & b_pods and "intruder" not in a_pods
    # Owned: deleting the job deletes its policy (garbage collector), the other job's stays.
    kubectl("delete", "monarchjob", "np-a", "-n", namespace, "--wait=true")
    wait_until(lambda: get_json(kubectl, "networkpolicy", "np-a-isolation", "-n",
                                namespace) is None, 60, "np-a's NetworkPolicy deleted")
    assert get_json(kubectl, "networkpolicy", "np-b-isolation", "-n", namespace) is not None


def test_no_policy_when_the_setting_is_off(kubectl, namespace, operator_process):
    operator_process.start(MONARCH_OPERATOR_NETWORK_POLICY="false")
    kubectl("apply", "-n", namespace, "-f", "-",
            stdin=job_manifest("np-off", launcher=LONG_LAUNCHER))
    wait_until(lambda: get_json(kubectl, "statefulset", "np-off-worker", "-n", namespace),
               60, "np-off's workers")
    assert kubectl("get", "networkpolicies", "-n", namespace, "-o", "name") == ""
