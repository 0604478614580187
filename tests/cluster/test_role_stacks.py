"""Every Monarch proc's stack of a role-mode job on the local control plane (issue 35 items 3 and
4): the user's program (tests/data/roles/stuckrole.py, ``launcher.program``) on a trainer role
of 2 workers by 2 ranks and a ref role of 2 ranks on a third worker; in attempt 1 trainer rank 2
sleeps in ``time.sleep`` outside any collective while the three other trainer ranks wait in
``all_reduce`` #3. ``kubectl monarch stacks`` on the running job names it and the job goes on;
at ``progressDeadlineSeconds`` the attempt ends ``ProgressStalled``, its message naming trainer
rank 2, its host and frame and the collective the others wait in, its record one line per proc;
the next attempt Succeeds; the dump is still shown once the pods are gone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster.helpers import apply_manifest, job_manifest, job_status, wait_until
from tests.cluster.test_kubectl_plugin import plugin

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "data" / "roles" / "stuckrole.py"
DEADLINE_S = 30  # the CRD's least


def test_the_stuck_trainer_rank_is_named_on_request_and_in_the_stalled_attempts_record(
        local_cluster, kubectl, namespace, scripts):
    text = PROGRAM.read_text()
    (scripts / "stuckrole.py").write_text(text)
    (scripts / "stuckrole.py").chmod(0o644)
    marks = scripts / "stuckrole-marks"
    marks.mkdir()
    marks.chmod(0o1777)  # the ranks (other users) leave their step marks here
    sleep_line = 1 + text.splitlines().index(
        "    time.sleep(3600)  # the stuck rank: native code, outside any collective")
    apply_manifest(kubectl, namespace, job_manifest(
        "stuckrole", workers={"replicas": 3, "gpusPerWorker": 2},
        meshes={"trainer": {"hosts": 2}, "ref": {"hosts": 1}},
        progress={"reportIntervalSeconds": 1},
        runPolicy={"progressDeadlineSeconds": DEADLINE_S},
        launcher={"program": "stuckrole:main", "args": ["--steps", "4", "--stuck-attempt", "1"],
                  "env": [{"name": "PYTHONPATH", "value": f"{scripts}:{REPO / 'operator'}"}]}))
    wait_until(lambda: (job_status(kubectl, namespace, "stuckrole").get("progress") or {})
               .get("step") == 2, 180, "stuckrole at step 2")
    # Step 2 in the status does not mean the ranks have step 3's call yet: on a loaded machine
    # (a fresh one's first image imports beside it, 2026-12-07) the stacks were taken before
    # they had it, and no rank was stuck yet.
    entered = [marks / f"attempt1-step3-rank{rank}" for rank in range(4)]
    wait_until(lambda: all(mark.exists() for mark in entered), 60,
               "every trainer rank in step 3 of attempt 1")
    odd = re.compile(rf"trainer rank 2 on stuckrole-worker-1\S* is not in all_reduce #3 where "
                     rf"3 ranks wait: stuckrole\.py:{sleep_line} load_batch")

    asked = plugin(local_cluster, "stacks", "stuckrole", "-n", namespace, "--wait", "25")
    assert asked.returncode == 0 and odd.search(asked.stdout), (asked.stdout, asked.stderr)
    assert "trainer rank 0 on stuckrole-worker-0" in asked.stdout, asked.stdout
    assert "ref rank 1 on stuckrole-worker-2" in asked.stdout, asked.stdout
    assert job_status(kubectl, namespace, "stuckrole")["attempt"] == 1  # the run went on

    ended = wait_until(lambda: (found := job_status(kubectl, namespace, "stuckrole")).get(
        "attempts", [{}])[0].get("class") and found, 120, "stuckrole attempt 1 ended")
    first = ended["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", "ProgressStalled"), first
    assert odd.search(first["message"]), first
    assert len(first["stacks"]) == 6, first  # 4 trainer ranks, 2 ref ranks
    assert re.match(r"trainer rank 0 on stuckrole-worker-0\S*: in all_reduce #3 at "
                    r"stuckrole\.py:\d+ step$", first["stacks"][0]), first
    assert first["stacks"][2].startswith("trainer rank 2 on stuckrole-worker-1"), first
    assert first["stacks"][4].startswith("ref rank 0 on stuckrole-worker-2"), first

    done = wait_until(lambda: (found := job_status(kubectl, namespace, "stuckrole")).get(
        "phase") in ("Succeeded", "Failed") and found, 240, "stuckrole finished")
    assert done["phase"] == "Succeeded", f"{done.get('message')}\n{done['attempts'][1:]}"
    kept = plugin(local_cluster, "stacks", "stuckrole", "-n", namespace)
    assert kept.returncode == 0 and odd.search(kept.stdout), (kept.stdout, kept.stderr)
    assert "(the run stalled)" in kept.stdout.splitlines()[0], kept
