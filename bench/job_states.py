"""``kubectl get monarchjobs`` with a job in each state, captured from a fresh local control plane
with the operator (the table of states in docs/monarchjob.md, "What `kubectl get monarchjobs`
shows", comes from this script's output).

Jobs, 2 one-GPU workers each unless said otherwise:
- ``waiting``: one worker asking for 9 GPUs (nodes have 8): Starting, the scheduler's reason;
- ``running``: a launcher that reports steps 240 and 250 of 1000 (loss), then sleeps: Running,
  with STEP, PROGRESS, ETA and METRIC;
- ``restarting``: workers pinned to one node; once it runs the node is cordoned and worker 1
  deleted, so the recreated pod cannot be scheduled: Restarting, waiting for that worker;
- ``held``: created with ``suspend: true``: Suspended;
- ``done``: a launcher that exits 0: Succeeded (READY 0/2 once its workers are released);
- ``broken``: a launcher that exits 3: Failed, EXIT 3;
- ``unseen``: applied before the operator starts: no status yet (how a job looks before the
  operator's first pass, or in a namespace it does not watch), then deleted.

Run: ``flock /tmp/monarch-tests.lock .venv/bin/python bench/job_states.py`` as root (it brings
up its own local cluster; two at once collide on pod IPs). Prints the narrow and the wide table
and each job's status.message, then takes everything down.
"""

from __future__ import annotations

import sys
from typing import Any

from restart_latency import cluster_with_operator, manifest, wait

from monarch_operator.localcluster.demo import Kubectl

NAMESPACE = "team-a"
PINNED_NODE = "kwok-gpu-2"
# Jobs and the phase each one is shown in.
EXPECTED = {"waiting": "Starting", "running": "Running", "restarting": "Restarting",
            "held": "Suspended", "done": "Succeeded", "broken": "Failed"}


def status_of(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return kubectl.json("monarchjob", name, "-n", NAMESPACE).get("status") or {}


# The running job's program: two progress reports 2 s apart (a rate, so an ETA), then it works.
REPORTING = ("import time; from monarch_operator.job import report; "
             "report(240, total_steps=1000, metrics={\"loss\": 0.31}); time.sleep(2); "
             "report(250, total_steps=1000, metrics={\"loss\": 0.30}); time.sleep(3600)")


def apply(kubectl: Kubectl, text: str) -> None:
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=text)


def create_jobs(kubectl: Kubectl) -> None:
    pinned = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [PINNED_NODE]}]}]}}}}
    apply(kubectl, manifest("waiting", "true", workers={"replicas": 1, "gpusPerWorker": 9},
                            meshes={"trainer": {"hosts": 1}, "ref": {"hosts": 1},
                                    "colocate": True}))
    apply(kubectl, manifest("running", f"exec python3 -c '{REPORTING}'",
                            progress={"reportIntervalSeconds": 1}))
    apply(kubectl, manifest("restarting", "exec sleep 3600",
                            workers={"replicas": 2, "gpusPerWorker": 1,
                                     "template": {"spec": pinned}}))
    apply(kubectl, manifest("held", "true", suspend=True))
    apply(kubectl, manifest("done", "echo done"))
    apply(kubectl, manifest("broken", "echo 'step 2: loss is NaN' >&2; exit 3"))


def make_restarting(kubectl: Kubectl) -> None:
    """Cordon the node the ``restarting`` job is pinned to and delete one of its workers."""
    wait(lambda: status_of(kubectl, "restarting").get("phase") == "Running", 180,
         "restarting Running")
    kubectl("cordon", PINNED_NODE)
    kubectl("delete", "pod", "restarting-worker-1", "-n", NAMESPACE, "--wait=false")


def settled(kubectl: Kubectl) -> bool:
    """Every job in its phase, and the finished ones' workers released (READY 0/N)."""
    for name, phase in EXPECTED.items():
        status = status_of(kubectl, name)
        if status.get("phase") != phase:
            return False
        if phase in ("Succeeded", "Failed") and not status.get("readyWorkers", "").startswith("0/"):
            return False
        if name == "restarting" and "waiting for" not in status.get("message", ""):
            return False
        if name == "running" and (status.get("progress") or {}).get("step") != 250:
            return False
    return True


def show_unseen(kubectl: Kubectl) -> None:
    """A job applied before the operator runs has no status: STATUS and READY are empty."""
    apply(kubectl, manifest("unseen", "true"))
    print(f"$ kubectl get monarchjobs -n {NAMESPACE}   # no operator running yet")
    print(kubectl("get", "monarchjobs", "-n", NAMESPACE), end="", flush=True)
    kubectl("delete", "monarchjob", "unseen", "-n", NAMESPACE)


def main() -> int:
    with cluster_with_operator(NAMESPACE, before_operator=show_unseen) as kubectl:
        create_jobs(kubectl)
        make_restarting(kubectl)
        wait(lambda: settled(kubectl), 240, "every job in its state")
        print(f"\n$ kubectl get monarchjobs -n {NAMESPACE}")
        print(kubectl("get", "monarchjobs", "-n", NAMESPACE), end="")
        print(f"\n$ kubectl get monarchjobs -n {NAMESPACE} -o wide")
        print(kubectl("get", "monarchjobs", "-n", NAMESPACE, "-o", "wide"), end="")
        for name in EXPECTED:
            print(f"{name}: {status_of(kubectl, name).get('message', '')}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
