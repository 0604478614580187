"""A real Monarch program restarted by the run policy, end to end on the local control plane.

The rl_kl sample raises on trainer rank 3 in its first attempt (``MONARCH_ATTEMPT=1``) and runs
clean in the second: the job succeeds on the same worker pods (same uids), and the first
attempt's record names the failing role, rank and host from the launcher's failure line.
"""

from __future__ import annotations

import re

import pytest
import yaml

from monarch_operator.localcluster.demo import wait_for_phase
from tests.cluster.helpers import PodWatch
from tests.e2e.test_user_programs import STEP, TIMEOUT_S, sample

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

PROGRAM = ('extra=""; if [ "$MONARCH_ATTEMPT" = 1 ]; then extra="--raise-at-step 2"; fi; '
           'exec monarch-launch run rl_kl.controller:main --steps 3 $extra')


def test_a_raise_in_the_first_attempt_restarts_on_the_same_pods_and_succeeds(kubectl,
                                                                             namespace):
    body = sample("rl_kl/monarchjob.yaml", "retry")
    body["spec"]["launcher"] = {"command": ["sh", "-c", PROGRAM]}
    body["spec"]["runPolicy"] = {"backoffLimit": 1}
    with PodWatch(kubectl, namespace, "retry") as watch:
        kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
        job = wait_for_phase(kubectl, namespace, "retry", ("Succeeded", "Failed"),
                             timeout=2 * TIMEOUT_S)

    status = job["status"]
    log = kubectl("logs", "retry-launcher-2", "-n", namespace, check=False)
    assert status["phase"] == "Succeeded", (status, log[-4000:])
    first, second = status["attempts"]
    assert (first["class"], first["exitCode"]) == ("Application", 1), first
    assert (first.get("role"), first.get("rank")) == ("trainer", 3), (first, log[-4000:])
    assert first["host"].startswith("retry-worker-1."), first
    assert "raised ValueError: bad batch at step 2" in first["message"], first
    assert second["class"] == "Succeeded"
    assert watch.pods_seen() == {"retry-worker-0": 1, "retry-worker-1": 1, "retry-worker-2": 1}
    assert [int(m["step"]) for m in STEP.finditer(log)] == [1, 2, 3], log[-4000:]
    assert re.search(r"^rl_kl: done", log, re.MULTILINE), log[-4000:]
