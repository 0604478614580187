"""The operator against the real local control plane: children, ownership, status, admission."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster.helpers import get_json, job_manifest, wait_until

pytestmark = pytest.mark.cluster


def test_children_owned_hostfile_and_launcher_exit_code(kubectl, namespace):
    """A job whose launcher exits 3: every child is owned; the job ends Failed with code 3."""
    kubectl("apply", "-n", namespace, "-f", "-",
            stdin=job_manifest("kids", launcher={"command": ["sh", "-c", "cat $MONARCH_HOSTFILE; exit 3"]}))
    job = get_json(kubectl, "monarchjob", "kids", "-n", namespace)
    uid = job["metadata"]["uid"]
    for kind, name in [("secret", "kids-ssh"), ("service", "kids-worker"),
                       ("statefulset", "kids-worker")]:
        child = wait_until(lambda k=kind, n=name: get_json(kubectl, k, n, "-n", namespace),
                           30, f"{kind}/{name}")
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["controller"] is True
    job = wait_until(lambda: (j := get_json(kubectl, "monarchjob", "kids", "-n", namespace))
                     and j.get("status", {}).get("phase") == "Failed" and j, 120, "job Failed")
    status = job["status"]
    assert status["launcher"]["exitCode"] == 3
    assert status["observedGeneration"] == job["metadata"]["generation"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "LauncherFailed" and "code 3" in failed["message"]
    hostfile = get_json(kubectl, "configmap", "kids-hostfile", "-n", namespace)
    assert hostfile["data"]["hostfile"] == (
        f"kids-worker-0.kids-worker.{namespace}.svc.cluster.local slots=1\n"
        f"kids-worker-1.kids-worker.{namespace}.svc.cluster.local slots=1\n")
    assert hostfile["metadata"]["ownerReferences"][0]["uid"] == uid
    launcher = get_json(kubectl, "pod", "kids-launcher", "-n", namespace)
    assert launcher["metadata"]["ownerReferences"][0]["uid"] == uid
    # Finished jobs hold no GPUs: the worker StatefulSet is gone.
    wait_until(lambda: get_json(kubectl, "statefulset", "kids-worker", "-n", namespace) is None,
               30, "worker StatefulSet deleted")
    # READY counts the workers Ready now: none once they are released.
    table = wait_until(lambda: (t := kubectl("get", "monarchjobs", "-n", namespace))
                       and " 0/2 " in t and t, 30, "READY 0/2")
    header, row = table.strip().splitlines()
    # The progress columns are there, empty: the launcher reported nothing.
    assert header.split() == ["NAME", "STATUS", "READY", "RESTARTS", "STEP", "PROGRESS", "ETA",
                              "AGE"]
    assert row.split()[:3] == ["kids", "Failed", "0/2"]


def test_job_waits_with_ready_count_until_workers_are_ready(kubectl, namespace):
    """More GPUs than a node has: the pod stays Pending; no hostfile, no launcher (C2)."""
    # One worker asking for more GPUs than any node has: unschedulable, never Ready.
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "toolarge", workers={"replicas": 1, "gpusPerWorker": 9},
        meshes={"trainer": {"hosts": 1}, "ref": {"hosts": 1}, "colocate": True},
        startupTimeoutSeconds=10))
    job = wait_until(lambda: (j := get_json(kubectl, "monarchjob", "toolarge", "-n", namespace))
                     and j.get("status", {}).get("phase") == "Failed" and j, 60,
                     "toolarge Failed by startup timeout")
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "StartupTimeout"
    assert "toolarge-worker-0 (Unschedulable:" in failed["message"], failed["message"]
    assert "Insufficient nvidia.com/gpu" in failed["message"], "the scheduler's reason is kept"
    assert job["status"]["readyWorkers"] == "0/1"
    assert get_json(kubectl, "configmap", "toolarge-hostfile", "-n", namespace) is None
    assert get_json(kubectl, "pod", "toolarge-launcher", "-n", namespace) is None


def test_invalid_specs_refused_at_admission_naming_the_rule(kubectl, namespace):

    for name, fragment in [("a" * 46, "at most 45"), ("7b-run", "DNS-1035"),
                           ("exp.v2", "DNS-1035")]:
        result = subprocess.run(["kubectl", "apply", "-n", namespace, "-f", "-"],
                                input=job_manifest(name), capture_output=True, text=True,
                                env=kubectl.env)
        assert result.returncode != 0
        assert fragment in result.stderr, result.stderr
        # The CEL rules sit on metadata.name itself: the refusal names the field, never <nil>.
        assert f'metadata.name: Invalid value: "{name}"' in result.stderr, result.stderr
        assert "<nil>" not in result.stderr, result.stderr
        assert get_json(kubectl, "monarchjob", name, "-n", namespace) is None
    result = subprocess.run(["kubectl", "apply", "-n", namespace, "-f", "-"],
                            input=job_manifest("toomany", meshes={"trainer": {"hosts": 2},
                                                                  "ref": {"hosts": 1}}),
                            capture_output=True, text=True, env=kubectl.env)
    assert result.returncode != 0 and "must not exceed workers.replicas" in result.stderr
    assert "spec.meshes: Invalid value" in result.stderr, "the rule names its field"
    colocated = {"trainer": {"hosts": 2}, "ref": {"hosts": 2}, "colocate": True}
    for name, spec, fragment in [
        ("onegpu", {"workers": {"replicas": 2, "gpusPerWorker": 1}, "meshes": colocated},
         "spec.workers.gpusPerWorker: Invalid value"),
        ("unequal", {"workers": {"replicas": 2, "gpusPerWorker": 2},
                     "meshes": {**colocated, "ref": {"hosts": 1}}},
         "meshes.trainer.hosts and meshes.ref.hosts must be equal"),
        # A kubelet would only fail the pods (InvalidImageName); the local agent runs no
        # images at all: refused at admission, naming the field.
        ("badimage", {"image": "Bad Image!!:::"}, "spec.image: Invalid value"),
        ("badlauncherimage", {"launcher": {"image": "Worker:1"}},
         "spec.launcher.image: Invalid value"),
    ]:
        result = subprocess.run(["kubectl", "apply", "-n", namespace, "-f", "-"],
                                input=job_manifest(name, **spec), capture_output=True,
                                text=True, env=kubectl.env)
        assert result.returncode != 0 and fragment in result.stderr, result.stderr


def test_longest_valid_name_is_accepted(kubectl, namespace):
    name = "a" * 45
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(name))
    wait_until(lambda: get_json(kubectl, "pod", f"{name}-worker-0", "-n", namespace), 60,
               "worker pod of the 45-character job")


def test_deleting_the_job_deletes_its_children(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("gone"))
    wait_until(lambda: get_json(kubectl, "statefulset", "gone-worker", "-n", namespace), 30,
               "StatefulSet")
    kubectl("delete", "monarchjob", "gone", "-n", namespace, "--wait=true", "--timeout=30s")
    for kind, name in [("secret", "gone-ssh"), ("service", "gone-worker"),
                       ("statefulset", "gone-worker")]:
        wait_until(lambda k=kind, n=name: get_json(kubectl, k, n, "-n", namespace) is None, 60,
                   f"{kind}/{name} garbage-collected")
