"""What one poll of a wait costs: ``kubectl get ... -o json`` as a kubectl run against the same
GET answered in the calling process (``localcluster/kubeget.py``, what ``Kubectl`` does now).

Starts its own local cluster (kwok nodes), applies a MonarchJob and reads it ``--reads`` times
each way, the way the tests' waits do (``wait_phase``: the job; ``job_pods``: pods by label);
prints wall and CPU milliseconds per read (CPU: this process for the in-process reads, the
kubectl children for the runs) and checks that both ways printed the same objects.

Run::

    flock /tmp/monarch-tests.lock .venv/bin/python bench/kubectl_get.py --reads 200
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds
from monarch_operator.localcluster.kubeget import InProcessGet

JOB = """apiVersion: monarch-operator.dev/v1alpha1
kind: MonarchJob
metadata: {name: bench}
spec:
  image: ghcr.io/monarch-operator/worker:0.1.0
  suspend: true
  workers: {replicas: 2, gpusPerWorker: 1}
  meshes: {trainer: {hosts: 1}, ref: {hosts: 1}}
"""


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=200, help="reads each way (default 200)")
    args = parser.parse_args()
    forms = [("get", "monarchjob", "bench", "-n", "default", "-o", "json"),
             ("get", "pods", "-n", "default", "-l", "monarch-operator.dev/job=bench", "-o",
              "json")]
    with tempfile.TemporaryDirectory(prefix="kubectl-get-") as state:
        cluster = LocalCluster(Path(state), nodes=1, gpus_per_node=8)
        cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
        try:
            kubectl = Kubectl(cluster.env())
            install_crds(kubectl)
            kubectl("apply", "-n", "default", "-f", "-", stdin=JOB)
            reader = InProcessGet(kubectl.env["KUBECONFIG"])
            reader.answer(forms[0])  # discovery, once per client (as in a test run)
            print(f"{'form':<10} {'way':<12} {'wall ms':>8} {'CPU ms':>8}")
            for form in forms:
                kubectl_out = in_process_out = ""
                started, cpu = time.monotonic(), cpu_seconds(resource.RUSAGE_CHILDREN)
                for _ in range(args.reads):
                    kubectl_out = subprocess.run(["kubectl", *form], capture_output=True,
                                                 text=True, env=kubectl.env, check=True).stdout
                kubectl_row = (time.monotonic() - started,
                               cpu_seconds(resource.RUSAGE_CHILDREN) - cpu)
                started, cpu = time.monotonic(), cpu_seconds(resource.RUSAGE_SELF)
                for _ in range(args.reads):
                    answered = reader.answer(form)
                    assert answered is not None, form
                    in_process_out = answered[1]
                in_process_row = (time.monotonic() - started,
                                  cpu_seconds(resource.RUSAGE_SELF) - cpu)
                same = json.loads(kubectl_out) == json.loads(in_process_out)
                for way, (wall, cpu_used) in (("kubectl", kubectl_row),
                                              ("in-process", in_process_row)):
                    print(f"{form[1]:<10} {way:<12} {1000 * wall / args.reads:8.1f} "
                          f"{1000 * cpu_used / args.reads:8.1f}")
                if not same:
                    print(f"DIFFERENT output for {' '.join(form)}")
                    return 1
        finally:
            cluster.down(quiet=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
