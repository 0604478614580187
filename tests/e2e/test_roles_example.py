"""The four-role GRPO example (examples/grpo/monarchjob.yaml, issue 33) end to end on the real
nodes: four worker groups of 4, 2, 1 and 0 GPUs, one StatefulSet each, one hostfile, and the
program's roles on their own groups' pods with their own GPUs; the loop learns and the job
Succeeds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from monarch_operator.localcluster.demo import launcher_log, wait_for_phase
from tests.cluster.helpers import get_json

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo" / "monarchjob.yaml"
PLACEMENT = re.compile(r"^placement (?P<role>\w+) rank=(?P<rank>\d+) host=(?P<host>\S+) "
                       r"gpus=(?P<gpus>\S*) world=(?P<world>\d+)$", re.MULTILINE)
STEP = re.compile(r"^step (?P<step>\d+)/5 reward=(?P<reward>[\d.]+) ", re.MULTILINE)


def test_the_grpo_example_runs_four_roles_on_four_worker_groups(kubectl, namespace,
                                                               local_cluster):
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["cleanupPolicy"] = "KeepAll"  # the StatefulSets stay to be looked at
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    job = wait_for_phase(kubectl, namespace, "grpo", ("Succeeded", "Failed"), timeout=420)
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "grpo")

    assert job["status"]["phase"] == "Succeeded", (job["status"], log[-4000:])
    placed: dict[str, list[tuple[str, str, int]]] = {}
    for match in sorted(PLACEMENT.finditer(log), key=lambda m: (m["role"], int(m["rank"]))):
        placed.setdefault(match["role"], []).append(
            (match["host"], match["gpus"], int(match["world"])))
    assert placed == {
        "generator": [("grpo-generator-0", "0,1,2,3", 4)] * 4,
        "trainer": [("grpo-trainer-0", "0,1", 2)] * 2,
        "reference": [("grpo-reference-0", "0", 1)],
        "reward": [("grpo-reward-0", "", 1)],
    }, log[-4000:]
    rewards = [float(m["reward"]) for m in STEP.finditer(log)]
    assert len(rewards) == 5 and rewards[-1] >= 0.2, log[-4000:]
    assert "grpo: done" in log
    # One StatefulSet per group, asking the group's GPUs (none for the reward model).
    for group, gpus in (("generator", "4"), ("trainer", "2"), ("reference", "1"),
                        ("reward", None)):
        sts = get_json(kubectl, "statefulset", f"grpo-{group}", "-n", namespace)
        assert sts is not None, group
        limits = sts["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {})
        assert limits.get("nvidia.com/gpu") == gpus, (group, limits)
    kubectl("delete", "monarchjob", "grpo", "-n", namespace, "--wait=true", "--timeout=120s")
