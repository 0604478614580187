"""The main job end to end: the sample MonarchJob from crds/samples/demo.yaml to Succeeded.

apply -> worker pods (real sshd per pod) -> hostfile -> launcher pod (real monarch-launch) ->
Monarch SSHJob -> trainer mesh on 2 hosts (gloo) + ref mesh on the third -> Succeeded.
"""

from __future__ import annotations

import re

import pytest
import yaml

from monarch_operator.localcluster.demo import SAMPLE, launcher_log, wait_for_phase
from tests.cluster.helpers import get_json, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

RANK_LINE = re.compile(r"^(trainer|ref) rank (\d+)/(\d+) host=(\S+) pid=\d+", re.MULTILINE)
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss=([\d.]+) kl=([\d.]+)", re.MULTILINE)


def test_sample_job_succeeds_with_trainer_and_ref_meshes(kubectl, namespace, local_cluster):
    sample = yaml.safe_load(SAMPLE.read_text())
    kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    job = wait_for_phase(kubectl, namespace, "demo", ("Succeeded", "Failed"), timeout=420)
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "demo")
    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    assert job["status"]["launcher"]["exitCode"] == 0
    # The launcher ran on all three workers (the ranks below); once it Succeeded the workers are
    # released (cleanupPolicy DeleteWorkers) and READY, which counts the workers ready now, drops.
    wait_until(lambda: (get_json(kubectl, "monarchjob", "demo", "-n", namespace)["status"]
                        ["readyWorkers"] == "0/3"), 90, "READY 0/3 after the workers are released")

    ranks = RANK_LINE.findall(log)
    # Hosts are printed as the hostfile names them: <pod>.<service>.<namespace>.svc.<domain>.
    trainer = {int(rank): host.split(".")[0] for role, rank, _, host in ranks if role == "trainer"}
    ref = {int(rank): host.split(".")[0] for role, rank, _, host in ranks if role == "ref"}
    gpus = sample["spec"]["workers"]["gpusPerWorker"]
    trainer_hosts = sample["spec"]["meshes"]["trainer"]["hosts"]
    assert sorted(trainer) == list(range(trainer_hosts * gpus)), log
    # Trainer ranks run on distinct worker pods (each has its own hostname), in ordinal order.
    assert sorted(set(trainer.values())) == [f"demo-worker-{i}" for i in range(trainer_hosts)]
    assert set(ref.values()) == {f"demo-worker-{trainer_hosts}"}, log

    steps = STEP_LINE.findall(log)
    assert [int(s[0]) for s in steps] == list(range(1, sample["spec"]["launcher"]["steps"] + 1))
    losses = [float(s[2]) for s in steps]
    assert losses == sorted(losses, reverse=True), "loss should fall over the steps"
    assert float(steps[-1][3]) > 0, "trainer moved away from the frozen ref: KL > 0"
    assert "monarch-launch: succeeded" in log

    hostfile = kubectl("get", "configmap", "demo-hostfile", "-n", namespace,
                       "-o", "jsonpath={.data.hostfile}")
    assert hostfile.splitlines() == [
        f"demo-worker-{i}.demo-worker.{namespace}.svc.cluster.local slots={gpus}"
        for i in range(3)]
    table = kubectl("get", "monarchjobs", "-n", namespace).splitlines()
    assert table[1].split()[:3] == ["demo", "Succeeded", "0/3"]
