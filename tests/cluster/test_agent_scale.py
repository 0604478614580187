"""The node agent at scale: jobs at once, and many pods started and deleted one after another,
with the agent's own open file descriptors and child processes staying flat (not one per pod)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from monarch_operator.localcluster.demo import SAMPLE, launcher_log, wait_for_phase
from tests.cluster.helpers import wait_until

pytestmark = pytest.mark.cluster

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
CHURN_WAVES = 10
CHURN_PODS_PER_WAVE = 20
SLEEPERS = 50
LIGHT_JOBS = 10
# Slack for what the agent may open besides pods: API connections, a log, a pipe mid-start.
FD_SLACK = 6


def agent_pid(local_cluster) -> int:
    return int(local_cluster.pid("agent"))


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def child_pids(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry))
    return children


def pod(name: str, script: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": IMAGE,
                                     "command": ["sh", "-c", script]}]}}


def pod_phases(kubectl, namespace: str) -> dict[str, str]:
    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    return {p["metadata"]["name"]: (p.get("status") or {}).get("phase", "") for p in pods}


def test_two_sample_jobs_at_once_both_succeed(kubectl, namespace, local_cluster):
    """The sample job twice at once (renamed): both Succeed (each sandbox starts, whatever fd
    numbers the agent holds by then)."""
    names = ["demo-a", "demo-b"]
    sample = yaml.safe_load(SAMPLE.read_text())
    for name in names:
        sample["metadata"]["name"] = name
        kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(sample))
    for name in names:
        job = wait_for_phase(kubectl, namespace, name, ("Succeeded", "Failed"), timeout=600)
        log = launcher_log(kubectl, local_cluster.state_dir, namespace, name)
        assert job["status"]["phase"] == "Succeeded", (job["status"], log[-3000:])


def test_pod_churn_keeps_agent_fds_and_children_flat(kubectl, namespace, local_cluster):
    """~200 pods in waves of 20 (most exit 0 at once, some sleep and are deleted while running):
    every short pod Succeeds, and the agent's fds and children do not grow with the pods run."""
    pid = agent_pid(local_cluster)
    baseline_fds = open_fds(pid)
    fds_after_wave, children_after_wave, finished_fds = [], [], []
    for wave in range(CHURN_WAVES):
        pods = [pod(f"w{wave}-exit-{i}", "exit 0") for i in range(CHURN_PODS_PER_WAVE - 4)]
        pods += [pod(f"w{wave}-sleep-{i}", "sleep 300") for i in range(4)]
        kubectl("apply", "-n", namespace, "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))

        def settled():
            phases = pod_phases(kubectl, namespace)
            short = [v for k, v in phases.items() if "-exit-" in k]
            done = len(short) == CHURN_PODS_PER_WAVE - 4 and all(
                v in ("Succeeded", "Failed") for v in short)
            return phases if done else None

        phases = wait_until(settled, 120, f"wave {wave} short pods finished")
        failed = sorted(k for k, v in phases.items() if "-exit-" in k and v != "Succeeded")
        assert not failed, f"wave {wave}: pods that exit 0 did not Succeed: {failed}"
        # Finished pods still exist here: the agent must not hold anything for them.
        finished_fds.append(open_fds(pid))
        kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s")
        wait_until(lambda: not child_pids(pid), 30, "the agent's children gone")
        fds_after_wave.append(open_fds(pid))
        children_after_wave.append(len(child_pids(pid)))
    print(f"agent fds: baseline {baseline_fds}, with finished pods {finished_fds}, "
          f"after each wave {fds_after_wave}; children after each wave {children_after_wave}")
    assert max(finished_fds) <= baseline_fds + FD_SLACK + 4, finished_fds  # 4 sleepers running
    assert max(fds_after_wave) <= baseline_fds + FD_SLACK, fds_after_wave
    assert max(fds_after_wave) - min(fds_after_wave) <= FD_SLACK, fds_after_wave
    assert children_after_wave == [0] * CHURN_WAVES


def test_fifty_pods_running_at_once_then_deleted(kubectl, namespace, local_cluster):
    """A Deployment of 50 pods running ``sleep``: all Running and Ready at once (one namespace
    fd each in the agent), then deleted: the agent's fds and children back to the baseline."""
    pid = agent_pid(local_cluster)
    baseline_fds = open_fds(pid)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sleepers"},
        "spec": {"replicas": SLEEPERS, "selector": {"matchLabels": {"app": "sleepers"}},
                 "template": {"metadata": {"labels": {"app": "sleepers"}},
                              "spec": {"containers": [{"name": "main", "image": IMAGE,
                                                       "command": ["sleep", "3600"]}]}}}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(deployment))

    def all_ready():
        pods = json.loads(kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
        ready = [p for p in pods if p["status"].get("phase") == "Running" and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])]
        return pods if len(ready) == SLEEPERS else None

    pods = wait_until(all_ready, 180, f"{SLEEPERS} pods Running and Ready")
    assert len({p["status"]["podIP"] for p in pods}) == SLEEPERS
    running_fds = open_fds(pid)
    assert len(child_pids(pid)) == SLEEPERS  # each container's main process
    kubectl("delete", "deployment", "sleepers", "-n", namespace)
    wait_until(lambda: not json.loads(kubectl("get", "pods", "-n", namespace, "-o",
                                              "json"))["items"], 120, "every pod deleted")
    wait_until(lambda: not child_pids(pid), 30, "the agent's children gone")
    settled_fds = open_fds(pid)
    print(f"agent fds: baseline {baseline_fds}, {SLEEPERS} pods running {running_fds}, "
          f"after deletion {settled_fds}")
    assert baseline_fds + SLEEPERS <= running_fds <= baseline_fds + SLEEPERS + FD_SLACK
    assert settled_fds <= baseline_fds + FD_SLACK


def test_ten_light_jobs_in_a_row_all_succeed_with_finished_pods_kept(kubectl, namespace,
                                                                     local_cluster):
    """Ten MonarchJobs one after another, each kept when done (its finished launcher pod too):
    2 sshd workers (Secret and ConfigMap volumes, tcpSocket readiness), a launcher that reads
    the hostfile and key and reaches each worker's sshd by its name, then the workers
    terminated. Every job Succeeds; the agent's fds do not grow with the jobs done."""
    pid = agent_pid(local_cluster)
    reach_workers = ('test -s "$MONARCH_SSH_KEY" && while read -r host slots; do python3 -c '
                     '"import socket, sys; socket.create_connection((sys.argv[1], 2222), 5)" '
                     '"$host" || exit 1; done < "$MONARCH_HOSTFILE"')
    fds_after_job = []
    for index in range(LIGHT_JOBS):
        name = f"light-{index}"
        job = {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
               "metadata": {"name": name},
               "spec": {"image": IMAGE, "workers": {"replicas": 2, "gpusPerWorker": 1},
                        "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
                        "launcher": {"command": ["sh", "-c", reach_workers]}}}
        kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(job))
        done = wait_for_phase(kubectl, namespace, name, ("Succeeded", "Failed"), timeout=180)
        log = launcher_log(kubectl, local_cluster.state_dir, namespace, name)
        assert done["status"]["phase"] == "Succeeded", (done["status"], log[-2000:])
        wait_until(lambda name=name: not [p for p in json.loads(kubectl(
            "get", "pods", "-n", namespace, "-l", f"monarch-operator.dev/job={name}",
            "-o", "json"))["items"] if "-worker-" in p["metadata"]["name"]], 60,
            f"{name}'s workers gone")
        fds_after_job.append(open_fds(pid))
    phases = pod_phases(kubectl, namespace)
    launchers = {k: v for k, v in phases.items() if "-launcher" in k}
    print(f"agent fds after each job: {fds_after_job}; launcher pods kept: {launchers}")
    assert len(launchers) == LIGHT_JOBS and set(launchers.values()) == {"Succeeded"}, phases
    assert max(fds_after_job) - min(fds_after_job) <= FD_SLACK, fds_after_job
