"""A job whose pods run as a uid this machine does not know (field case C38), on the simulated
nodes: the node agent gives such a uid no passwd entry and ``HOME=/``, as runc does with an image
that does not know it (it once wrote an entry for it, which hid the failure). The worker
entrypoint and the launcher give the uid a name through nss_wrapper, and the job Succeeds. The
real-node test, with the worker image's own passwd and runc, is tests/e2e/test_any_uid.py."""

from __future__ import annotations

import os

import pytest

from monarch_operator.launcher import userentry
from tests.cluster.helpers import apply_manifest, job_manifest, job_status, wait_phase

pytestmark = pytest.mark.cluster

ARBITRARY_UID = 1000680000
TEMPLATE = {"spec": {"securityContext": {"runAsUser": ARBITRARY_UID, "runAsGroup": 0,
                                         "fsGroup": ARBITRARY_UID}}}


def test_a_job_as_a_uid_the_machine_does_not_know_succeeds(kubectl, namespace):
    if userentry.has_entry(ARBITRARY_UID):
        reason = f"uid {ARBITRARY_UID} has a passwd entry on this machine"
        if os.environ.get("CI"):  # never a skip to get green: CI's machines have no such entry
            pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)", pytrace=False)
        pytest.skip(reason)
    apply_manifest(kubectl, namespace, job_manifest(
        "anyuid", workers={"replicas": 2, "gpusPerWorker": 1, "template": TEMPLATE},
        launcher={"steps": 1, "template": TEMPLATE}))
    try:
        status = wait_phase(kubectl, namespace, "anyuid", "Succeeded", timeout=300)
    except AssertionError:
        pods = kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False)
        logs = {pod: kubectl("logs", pod, "-n", namespace, "--tail=30", check=False)
                for pod in ("anyuid-worker-0", "anyuid-launcher")}
        status = job_status(kubectl, namespace, "anyuid")
        raise AssertionError(f"{status}\n{pods}\n{logs}") from None
    assert status["launcher"]["exitCode"] == 0
    worker_log = kubectl("logs", "anyuid-worker-0", "-n", namespace, check=False)
    assert f"uid {ARBITRARY_UID} has no passwd entry: named monarch, home /run/monarch/home" \
        in worker_log or not worker_log, worker_log  # released workers may be gone already
