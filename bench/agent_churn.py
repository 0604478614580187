"""The local cluster's node agent under pod churn: many pods started, run and deleted, with the
agent's open file descriptors, child processes and memory sampled all along.

Starts its own local control plane in a temporary directory (run it under the cluster-test lock:
``flock /tmp/monarch-tests.lock``), then keeps ``--concurrent`` pods alive until ``--pods`` pods
were started: most run ``sleep 1`` and exit 0, every tenth sleeps until it is deleted while
running (the agent's stop path). Finished pods are deleted at once. Prints the wall time, pods
per second, create -> Running and create -> Succeeded latencies, failures, and the agent's fds,
children, RSS and CPU seconds: baseline, first and last quarter of the run, maximum, end.
Flat means: the last quarter's fds and children equal the first quarter's.

Run: ``flock /tmp/monarch-tests.lock .venv/bin/python bench/agent_churn.py --pods 1000
--concurrent 50`` as root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from monarch_operator.localcluster.cluster import LocalCluster

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
NAMESPACE = "churn"


def agent_sample(pid: int) -> dict[str, float]:
    """The agent's open fds, live children, RSS (MiB) and CPU seconds right now."""
    children = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children += 1
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "children": children,
            "rss_mib": rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20,
            "cpu_s": (int(fields[11]) + int(fields[12])) / ticks}


def pod_body(name: str, script: str) -> dict[str, Any]:
    """A pod that runs ``sh -c script`` once (restartPolicy Never)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": IMAGE,
                                     "command": ["sh", "-c", script]}]}}


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (nan for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def churn(core: kubernetes.client.CoreV1Api, agent_pid: int, total: int, concurrent: int
          ) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """Run the churn; returns per-pod timings and agent samples (one per loop, ~0.2 s)."""
    created: dict[str, float] = {}
    running_at: dict[str, float] = {}
    finished: dict[str, tuple[float, str]] = {}
    deleted: set[str] = set()
    samples: list[dict[str, float]] = []
    started = 0
    while len(finished) < total:
        now = time.monotonic()
        pods = core.list_namespaced_pod(NAMESPACE).items
        active = 0
        for pod in pods:
            name, phase = pod.metadata.name, pod.status.phase
            if name in deleted:
                continue
            if phase == "Running" and name not in running_at:
                running_at[name] = now
            if phase in ("Succeeded", "Failed"):
                finished[name] = (now, phase)
            elif "-kill-" in name and name in running_at and now - running_at[name] > 1:
                finished[name] = (now, "Deleted")
            else:
                active += 1
                continue
            core.delete_namespaced_pod(name, NAMESPACE)
            deleted.add(name)
        while active < concurrent and started < total:
            name = f"p{started}-kill-x" if started % 10 == 9 else f"p{started}-exit-x"
            script = "sleep 300" if "-kill-" in name else "sleep 1"
            core.create_namespaced_pod(NAMESPACE, pod_body(name, script))
            created[name] = time.monotonic()
            started += 1
            active += 1
        samples.append({"t": now, **agent_sample(agent_pid)})
        time.sleep(0.2)
    timings = {"created": created, "running": running_at, "finished": finished}
    return timings, samples


def report(timings: dict[str, Any], samples: list[dict[str, float]],
           baseline: dict[str, float], wall: float, settled: dict[str, float]) -> int:
    """Print the numbers; returns 1 on failed pods or fds/children left afterwards, else 0."""
    created, running, finished = timings["created"], timings["running"], timings["finished"]
    to_running = [running[n] - created[n] for n in running if n in created]
    to_done = [finished[n][0] - created[n] for n in finished
               if finished[n][1] == "Succeeded" and n in created]
    failed = sorted(n for n, (_, phase) in finished.items() if phase == "Failed")
    print(f"pods started: {len(created)} in {wall:.1f}s ({len(created) / wall:.1f} pods/s); "
          f"failed: {len(failed)} {failed[:5]}")
    print(f"create -> Running   p50 {percentile(to_running, 0.5):.2f}s  "
          f"p95 {percentile(to_running, 0.95):.2f}s  max {max(to_running, default=0):.2f}s")
    print(f"create -> Succeeded p50 {percentile(to_done, 0.5):.2f}s  "
          f"p95 {percentile(to_done, 0.95):.2f}s  (the pod sleeps 1 s)")
    quarter = max(1, len(samples) // 4)
    first, last = samples[:quarter], samples[-quarter:]
    print(f"{'agent':<10}{'baseline':>10}{'1st qtr':>10}{'last qtr':>10}{'max':>8}"
          f"{'settled':>9}")
    for key in ("fds", "children", "rss_mib"):
        print(f"{key:<10}{baseline[key]:>10.0f}{statistics.median(s[key] for s in first):>10.0f}"
              f"{statistics.median(s[key] for s in last):>10.0f}"
              f"{max(s[key] for s in samples):>8.0f}{settled[key]:>9.0f}")
    print(f"agent CPU: {settled['cpu_s'] - baseline['cpu_s']:.1f}s over the run "
          f"({(settled['cpu_s'] - baseline['cpu_s']) / len(created) * 1000:.0f} ms per pod)")
    flat = settled["fds"] <= baseline["fds"] + 2 and settled["children"] == 0
    print("flat: yes" if flat else "flat: NO (fds or children left after the pods are gone)")
    return 0 if flat and not failed else 1


def main() -> int:
    """Run the churn on a fresh local cluster; exit 1 on failed pods or leaked fds/children."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods to start in all")
    parser.add_argument("--concurrent", type=int, default=50, help="pods alive at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-churn-") as state:
        cluster = LocalCluster(Path(state), nodes=3)
        cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
        try:
            kubernetes.config.load_kube_config(str(cluster.kubeconfig))
            core = kubernetes.client.CoreV1Api()
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            while True:  # the namespace's service account comes from the controller-manager
                try:
                    core.read_namespaced_service_account("default", NAMESPACE)
                    break
                except ApiException:
                    time.sleep(0.2)
            agent_pid = cluster.pid("agent")
            assert agent_pid is not None
            baseline = agent_sample(agent_pid)
            started = time.monotonic()
            timings, samples = churn(core, agent_pid, args.pods, args.concurrent)
            wall = time.monotonic() - started
            while core.list_namespaced_pod(NAMESPACE).items:
                time.sleep(0.2)
            time.sleep(1)  # one more agent pass after the last deletion
            return report(timings, samples, baseline, wall, agent_sample(agent_pid))
        finally:
            cluster.down(quiet=True)


if __name__ == "__main__":
    sys.exit(main())
