"""Termination messages on the local cluster: the node agent reports what a container wrote to
its terminationMessagePath (or its log's tail), and a failed launcher's line reaches the job."""

from __future__ import annotations

import os

import pytest
import yaml
from tests.cluster.helpers import get_json, wait_until

pytestmark = pytest.mark.cluster

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"


def pod_manifest(name: str, script: str, **container) -> str:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": IMAGE,
                                     "command": ["sh", "-c", script], **container}]}}
    return yaml.safe_dump(body)


def terminated_state(kubectl, namespace: str, name: str) -> dict:
    def terminated():
        pod = get_json(kubectl, "pod", name, "-n", namespace) or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if "terminated" in (status.get("state") or {}):
                return status["state"]["terminated"]
        return None
    return wait_until(terminated, 60, f"pod {name} terminated")


def test_agent_reports_termination_message_file_and_log_fallback(kubectl, namespace):
    """File policy: the file's content; FallbackToLogsOnError: the last 80 lines of the log;
    a custom path under /dev works; the machine's /dev is never written."""
    pods = {
        "file": pod_manifest("file", "printf 'boom happened' > /dev/termination-log; exit 3"),
        "fallback": pod_manifest(
            "fallback", "i=1; while [ $i -le 100 ]; do echo line $i; i=$((i+1)); done; exit 1",
            terminationMessagePolicy="FallbackToLogsOnError"),
        "custom": pod_manifest(
            "custom", "printf 'custom path' > /dev/monarch/end; exit 0",
            terminationMessagePath="/dev/monarch/end"),
    }
    kubectl("apply", "-n", namespace, "-f", "-", stdin="---\n".join(pods.values()))
    file_state = terminated_state(kubectl, namespace, "file")
    assert file_state["exitCode"] == 3 and file_state["message"] == "boom happened"
    fallback_state = terminated_state(kubectl, namespace, "fallback")
    assert fallback_state["exitCode"] == 1
    assert fallback_state["message"] == "".join(f"line {i}\n" for i in range(21, 101))
    custom_state = terminated_state(kubectl, namespace, "custom")
    assert custom_state["exitCode"] == 0 and custom_state["message"] == "custom path"
    assert not os.path.lexists("/dev/termination-log") and not os.path.lexists("/dev/monarch")


def test_failed_launcher_line_becomes_the_jobs_failed_message(kubectl, namespace):
    """The launcher's termination message is the Failed condition's message; exit code kept."""
    line = "trainer rank 1 failed: boom"
    body = {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": "endline"},
            "spec": {"image": IMAGE, "workers": {"replicas": 2, "gpusPerWorker": 1},
                     "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
                     "launcher": {"command": [
                         "sh", "-c", f"echo '{line}' > /dev/termination-log; exit 3"]}}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    job = wait_until(lambda: (j := get_json(kubectl, "monarchjob", "endline", "-n", namespace))
                     and j.get("status", {}).get("phase") == "Failed" and j, 120, "job Failed")
    status = job["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "LauncherFailed"
    assert failed["message"] == f"launcher exited with code 3: {line}", failed["message"]
    assert status["launcher"]["exitCode"] == 3 and status["launcher"]["reason"] == line
