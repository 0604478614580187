"""Every rank's stack on the local control plane (issue 35 items 3 and 4, field case C35).

An SPMD job of 2 workers by 2 ranks: rank 2 sleeps in native code before ``all_reduce`` #3 while
ranks 0, 1 and 3 wait in it. ``kubectl monarch stacks`` on the running job names rank 2 and the
job goes on; at ``progressDeadlineSeconds`` the attempt ends ``ProgressStalled``, its message
naming rank 2, its host and frame and the collective the three others wait in, its record one
line per rank; the next attempt Succeeds; the dump is still shown once the pods are gone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster.helpers import apply_manifest, job_manifest, job_status, wait_until
from tests.cluster.test_kubectl_plugin import plugin

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 30  # the CRD's least
SCRIPT = (REPO / "tests" / "data" / "spmd" / "c35_stuck_rank.py").read_text().replace(
    "    if rank == STUCK_RANK:",
    '    if rank == STUCK_RANK and os.environ.get("MONARCH_ATTEMPT") == "1":')


def test_c35_the_stuck_rank_is_named_on_request_and_in_the_stalled_attempts_record(
        local_cluster, kubectl, namespace, scripts):
    script = scripts / "c35_stuck_rank.py"
    script.write_text(SCRIPT)
    script.chmod(0o644)
    sleep_line = 1 + SCRIPT.splitlines().index("    time.sleep(3600)  # the stuck rank: native "
                                               "code, outside any collective")
    apply_manifest(kubectl, namespace, job_manifest(
        "c35", workers={"replicas": 2, "gpusPerWorker": 2},
        spmd={"script": str(script), "nprocPerNode": 2},
        progress={"reportIntervalSeconds": 1},
        runPolicy={"progressDeadlineSeconds": DEADLINE_S},
        launcher={"env": [{"name": "PYTHONPATH", "value": str(REPO / "operator")}]}))
    wait_until(lambda: (job_status(kubectl, namespace, "c35").get("progress") or {})
               .get("step") == 2, 120, "c35 at step 2")
    odd = re.compile(rf"rank 2 on c35-worker-1\S* is not in all_reduce #3 where 3 ranks wait: "
                     rf"c35_stuck_rank\.py:{sleep_line} load_batch")

    asked = plugin(local_cluster, "stacks", "c35", "-n", namespace, "--wait", "20")
    assert asked.returncode == 0 and odd.search(asked.stdout), (asked.stdout, asked.stderr)
    assert "rank 0 on c35-worker-0" in asked.stdout and "in all_reduce #3" in asked.stdout
    assert job_status(kubectl, namespace, "c35")["attempt"] == 1  # the run went on

    ended = wait_until(lambda: (found := job_status(kubectl, namespace, "c35")).get(
        "attempts", [{}])[0].get("class") and found, 120, "c35 attempt 1 ended")
    first = ended["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", "ProgressStalled"), first
    assert odd.search(first["message"]), first
    assert len(first["stacks"]) == 4, first
    assert re.match(r"rank 0 on c35-worker-0\S*: in all_reduce #3 at c35_stuck_rank\.py:\d+ "
                    r"main$", first["stacks"][0]), first
    assert first["stacks"][2].startswith("rank 2 on c35-worker-1"), first

    done = wait_until(lambda: (found := job_status(kubectl, namespace, "c35")).get("phase") in (
        "Succeeded", "Failed") and found, 180, "c35 finished")
    assert done["phase"] == "Succeeded", f"{done.get('message')}\n{done['attempts'][1:]}"
    kept = plugin(local_cluster, "stacks", "c35", "-n", namespace)
    assert kept.returncode == 0 and odd.search(kept.stdout), (kept.stdout, kept.stderr)
    assert "(the run stalled)" in kept.stdout.splitlines()[0], kept
