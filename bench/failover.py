"""Leader failover of the chart's two operator replicas on the real nodes (issue 34, field case
C32): how long from the leader's end until the standby holds the Lease, p50/p95/max over
``--tries`` tries of each way to end it, while one job runs and another is gated.

Brings up the local cluster with two real nodes and the images ``worker``, ``operator`` and
``examples``, installs the chart (its defaults: 2 replicas, leader election 15/10/2 s) into a
namespace it alone watches, and applies two copies of the sample job (examples/rl_kl, 3
workers of 2 GPUs each on 8 GPUs): ``running`` with ``--step-seconds 1`` and enough steps to
outlast the tries, ``gated`` with 3 steps, whose workers wait for GPUs (its launcher cannot
start) until ``running`` ends. Then, one try after another, alternating:

- ``sigkill``: the leading pod's operator process is killed with SIGKILL on this machine (the
  real nodes' containers are its processes), as a node crash or the OOM killer would; the
  standby takes the Lease once it expires. The killed pod is then deleted so that the
  Deployment gives a fresh standby (a container killed again and again would wait out the
  kubelet's growing restart back-off).
- ``sigterm``: the leading pod's operator process gets SIGTERM on this machine, as the
  kubelet sends it: the hand-over itself (kopf stops, the Lease is released, the standby's
  watch sees it), without the kubelet's own reaction time; the pod is then deleted, as above.
- ``delete``: ``kubectl delete pod`` (SIGTERM and the grace period, as a rolling update or a
  drain does): the leader releases the Lease on its way out.

A try's time runs from just before the kill (or the delete request) to the first read of the
Lease naming the other pod, read every 0.1 s. Between tries both replicas must be Ready again.
At the end both jobs must be Succeeded with one attempt and no restart (the failovers cost
them nothing). Run as root; about 15-20 minutes warm for 10 tries each::

    .venv/bin/python bench/failover.py              # --tries 10
    .venv/bin/python bench/failover.py --tries 3    # quick look

The table goes to stdout, the JSON after it (``--json FILE`` writes it there instead).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from monarch_operator.localcluster.binaries import ensure_helm
from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds, wait_for_phase

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "monarch-operator"
SAMPLE = ROOT / "examples" / "rl_kl" / "monarchjob.yaml"
NAMESPACE = "chart-failover"
RELEASE = "mo"
FULLNAME = f"{RELEASE}-monarch-operator"  # the chart's Deployment and Lease
MODES = ("sigkill", "sigterm", "delete")
POLL_S = 0.1
# Seconds a try may take to fail over before it counts as failed (the Lease lasts 15 s).
FAILOVER_LIMIT_S = 60.0
# Rough seconds per try (failover, then a new replica Ready): sizes the running job, which
# should still run at the last try (a later end only makes the bench wait for it).
TRY_ESTIMATE_S = 30.0


def helm(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(ensure_helm()), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)}: {done.stderr or done.stdout}")
    return done.stdout


def sample_job(name: str, steps: int) -> dict[str, Any]:
    job = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["name"] = name
    job["spec"]["launcher"]["args"] = ["--steps", str(steps), "--beta", "0.1",
                                       "--step-seconds", "1"]
    job["spec"]["startupTimeoutSeconds"] = 3600  # gated for as long as the tries take
    return job


def holder_pod(leases: client.CoordinationV1Api) -> str:
    """The pod named by the Lease's holderIdentity (``<pod>_<suffix>``, docs/ha.md), or ""."""
    try:
        lease = leases.read_namespaced_lease(FULLNAME, NAMESPACE, _request_timeout=5)
    except client.ApiException:
        return ""
    return (lease.spec.holder_identity or "").rsplit("_", 1)[0]


def operator_pods(kubectl: Kubectl) -> dict[str, bool]:
    """``{pod: Ready}`` of the release's operator pods that are not being deleted."""
    pods = kubectl.json("pods", "-n", NAMESPACE, "-l",
                        f"app.kubernetes.io/instance={RELEASE}")["items"]
    return {pod["metadata"]["name"]: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or [])
        for pod in pods if not pod["metadata"].get("deletionTimestamp")}


def operator_pid(pod: str) -> int:
    """The pid on this machine of ``pod``'s operator process (its HOSTNAME is the pod name)."""
    wanted = f"HOSTNAME={pod}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            # The chart's image runs the console script; by hand it is `-m ...controller`.
            if b"monarch-operator" not in cmdline and b"monarch_operator.controller" not in cmdline:
                continue
            if wanted in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                return int(entry)
        except OSError:
            continue
    raise RuntimeError(f"no operator process of pod {pod} on this machine")


def wait_until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(POLL_S)
    raise TimeoutError(f"{what} not within {timeout:g}s")


def one_try(kubectl: Kubectl, leases: client.CoordinationV1Api, mode: str) -> dict[str, Any]:
    """End the leader one way; returns the try's record (seconds until the other pod led)."""
    pods = wait_until("two Ready operator pods and a leader", lambda: (
        (found := operator_pods(kubectl)) and len(found) == 2 and all(found.values())
        and holder_pod(leases) in found and found), 180)
    leader = holder_pod(leases)
    (standby,) = set(pods) - {leader}
    if mode in ("sigkill", "sigterm"):
        pid = operator_pid(leader)
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL if mode == "sigkill" else signal.SIGTERM)
    else:
        started = time.monotonic()
        # In the background: the Lease is read meanwhile, not after kubectl's own start-up.
        subprocess.Popen(["kubectl", "delete", "pod", leader, "-n", NAMESPACE, "--wait=false"],
                         env=kubectl.env, stdout=subprocess.DEVNULL)
    wait_until(f"{standby} leading", lambda: holder_pod(leases) == standby, FAILOVER_LIMIT_S)
    seconds = time.monotonic() - started
    if mode != "delete":  # a fresh standby instead of a restart back-off
        kubectl("delete", "pod", leader, "-n", NAMESPACE, "--grace-period=0", "--force",
                "--wait=false")
    return {"mode": mode, "seconds": round(seconds, 2), "from": leader, "to": standby}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]


def table(tries: list[dict[str, Any]]) -> str:
    lines = ["| how the leader ended | tries | p50 s | p95 s | max s |", "|---|---|---|---|---|"]
    for mode in MODES:
        values = [t["seconds"] for t in tries if t["mode"] == mode]
        if values:
            lines.append(f"| {mode} | {len(values)} | {statistics.median(values):.1f} | "
                         f"{percentile(values, 0.95):.1f} | {max(values):.1f} |")
    return "\n".join(lines)


def job_outcome(kubectl: Kubectl, name: str) -> dict[str, Any]:
    job = wait_for_phase(kubectl, NAMESPACE, name, ("Succeeded", "Failed"), timeout=900,
                         progress=lambda line: print(line, file=sys.stderr, flush=True))
    status = job["status"]
    return {"job": name, "phase": status["phase"], "attempts": len(status.get("attempts", [])),
            "restarts": status.get("restartCount", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=10, help="tries of each mode (default 10)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"which ways to end the leader, comma-separated (default "
                             f"{','.join(MODES)})")
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/monarch-bench-failover"))
    parser.add_argument("--json", type=Path, help="write the results here, not to stdout")
    args = parser.parse_args(argv)
    if args.tries < 1:
        parser.error("--tries must be at least 1")
    modes = [mode for mode in args.modes.split(",") if mode]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: each of {', '.join(MODES)}, not {args.modes!r}")

    def note(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    cluster = LocalCluster(args.state_dir, real_nodes=2, gpus_per_node=4,
                           images=("worker", "operator", "examples"), stop_with_owner=True)
    tries: list[dict[str, Any]] = []
    try:
        cluster.down(quiet=True)
        cluster.up(progress=note)
        kubectl = Kubectl(cluster.env())
        install_crds(kubectl)
        kubectl("create", "namespace", NAMESPACE)
        helm_env = {**cluster.env(), **{f"HELM_{kind}_HOME": str(args.state_dir / f"helm-{kind}")
                                        for kind in ("CACHE", "CONFIG", "DATA")}}
        helm(helm_env, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--wait",
             "--timeout=300s", "--set", f"watchNamespaces={{{NAMESPACE}}}")
        config.load_kube_config(str(cluster.kubeconfig))
        leases = client.CoordinationV1Api()
        steps = int(TRY_ESTIMATE_S * args.tries * len(modes)) + 60
        for job in (sample_job("running", steps), sample_job("gated", 3)):
            kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(job))
        wait_for_phase(kubectl, NAMESPACE, "running", ("Running",), timeout=600, progress=note)
        for number in range(args.tries):
            for mode in modes:
                tried = one_try(kubectl, leases, mode)
                note(f"try {number + 1}/{args.tries} {mode}: {tried['from']} -> "
                     f"{tried['to']} in {tried['seconds']:.1f}s")
                tries.append(tried)
        gated = kubectl.json("monarchjob", "gated", "-n", NAMESPACE)["status"]
        note(f"gated during the tries: {gated.get('phase')} ({gated.get('message', '')[:120]})")
        jobs = [job_outcome(kubectl, "running"), job_outcome(kubectl, "gated")]
    finally:
        cluster.down(quiet=True)
    print(table(tries))
    for job in jobs:
        print(f"job {job['job']}: {job['phase']}, {job['attempts']} attempt(s), "
              f"{job['restarts']} restart(s)")
    report = json.dumps({"tries": tries, "jobs": jobs}, indent=2)
    if args.json:
        args.json.write_text(report)
    else:
        print(report)
    return 0 if all(j["phase"] == "Succeeded" and j["attempts"] == 1 for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
