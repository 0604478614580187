"""The sample MonarchJob end to end in a namespace that enforces the Pod Security "restricted"
level (labels enforce, warn and audit): the API server refuses a privileged pod there, and
admits every worker and launcher pod of the job, which then Succeeds on the real nodes with
sshd, the Monarch workers and the launcher running non-root, with no_new_privs, no
capabilities and runc's RuntimeDefault seccomp filter, as a look at the workers' sshd shows."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from monarch_operator import constants
from monarch_operator.localcluster.demo import SAMPLE, launcher_log, wait_for_phase

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

PSA = "pod-security.kubernetes.io"
RESTRICTED_LABELS = [f"{PSA}/{mode}=restricted" for mode in ("enforce", "warn", "audit")]
PRIVILEGED_POD = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged"},
    "spec": {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "busybox", "command": ["true"],
        "securityContext": {"privileged": True, "runAsUser": 0}}]}}


def pod_admissions(audit_log: Path, start: int, namespace: str) -> list[dict[str, str]]:
    """For each pod created in ``namespace`` (audit log from byte ``start``): its name, the
    response code and the Pod Security annotations the API server recorded."""
    found = []
    with open(audit_log, "rb") as log:
        log.seek(start)
        for line in log:
            event = json.loads(line)
            ref = event.get("objectRef", {})
            if (event.get("verb") == "create" and ref.get("resource") == "pods"
                    and ref.get("namespace") == namespace and not ref.get("subresource")
                    and event.get("stage") == "ResponseComplete"):
                annotations = event.get("annotations", {})
                found.append({"name": ref.get("name") or "",
                              "code": str(event.get("responseStatus", {}).get("code")),
                              **{key: value for key, value in annotations.items()
                                 if key.startswith(PSA)}})
    return found


def test_sample_job_succeeds_in_a_restricted_namespace(kubectl, namespace, local_cluster):
    kubectl("label", "namespace", namespace, *RESTRICTED_LABELS)
    audit_start = local_cluster.audit_log.stat().st_size
    # The namespace really enforces the level: a privileged pod is refused.
    refused = subprocess.run(["kubectl", "create", "-n", namespace, "-f", "-"],
                             input=yaml.safe_dump(PRIVILEGED_POD), capture_output=True,
                             text=True, env=kubectl.env, check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest": privileged' in refused.stderr, \
        refused.stderr
    assert kubectl("get", "pod", "privileged", "-n", namespace, check=False) == ""

    sample = yaml.safe_load(SAMPLE.read_text())
    sample["spec"]["cleanupPolicy"] = "KeepAll"  # the workers stay, for the look inside below
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(sample))
    job = wait_for_phase(kubectl, namespace, "demo", ("Succeeded", "Failed"), timeout=420)
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "demo")
    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    assert job["status"]["launcher"]["exitCode"] == 0
    assert "monarch-launch: succeeded" in log

    admissions = pod_admissions(local_cluster.audit_log, audit_start, namespace)
    privileged = [a for a in admissions if a["name"] == "privileged"]
    assert privileged and privileged[0]["code"] == "403", admissions
    assert "privileged" in privileged[0].get(f"{PSA}/audit-violations", ""), privileged
    job_pods = [a for a in admissions if a["name"] != "privileged"]
    # Every worker (demo-worker-0..2) and the launcher pod (demo-launcher), each judged
    # "restricted" and admitted without a violation.
    assert {a["name"] for a in job_pods if a["name"].startswith("demo-worker-")} == {
        f"demo-worker-{i}" for i in range(3)}, admissions
    assert "demo-launcher" in {a["name"] for a in job_pods}, admissions
    assert len(job_pods) >= 4, admissions
    for admission in job_pods:
        assert admission["code"] == "201", admission
        assert admission.get(f"{PSA}/enforce-policy") == "restricted:latest", admission
        assert f"{PSA}/audit-violations" not in admission, admission

    # Inside a worker: sshd (the main process; its pid file is in the entrypoint's state
    # directory, in the pod's runtime emptyDir) runs as uid 1000 with no_new_privs, no
    # capabilities and a seccomp filter, as runc applied them from the pod's securityContext.
    sshd_status = kubectl(
        "exec", "-n", namespace, "demo-worker-0", "-c", "worker", "--", "sh", "-c",
        f'cat "/proc/$(cat {constants.SSHD_STATE_DIR}/sshd.pid)/status"')
    seen = {key: value.strip() for key, _, value in
            (line.partition(":") for line in sshd_status.splitlines()) if value}
    assert seen["Name"] == "sshd", seen
    assert seen["Uid"].split()[:2] == ["1000", "1000"], seen
    assert seen["NoNewPrivs"] == "1", seen
    assert seen["CapBnd"] == seen["CapEff"] == "0000000000000000", seen
    assert seen["Seccomp"] == "2", seen  # SECCOMP_MODE_FILTER
    # Field case C25: the ranks (sshd's children, in this container) get a memory-backed
    # /dev/shm larger than the runtime's 64 MiB default: the kubelet sizes it (no memory limit
    # here: the node's allocatable memory).
    shm = kubectl("exec", "-n", namespace, "demo-worker-0", "-c", "worker", "--",
                  "df", "-k", "/dev/shm").splitlines()[-1].split()
    assert shm[0] == "tmpfs" and int(shm[1]) > 64 * 1024, shm
