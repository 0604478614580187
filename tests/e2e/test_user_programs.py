"""A user's own programs as MonarchJobs, end to end on the local control plane.

The samples under examples/ run unchanged except for the job name and the program's own flags:
examples/rl_kl (the user's Policy and Reference actors and controller, through
``spec.launcher.program``) with separate and colocated roles, and examples/torchrun_demo (an
unchanged torchrun script, through ``spec.spmd``). Real worker pods run sshd, the launcher pod
runs monarch-launch, and Monarch meshes run the user's code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from monarch_operator.localcluster.demo import launcher_log, wait_for_phase
from tests.cluster.helpers import job_status, wait_until
from tests.cluster.test_kubectl_plugin import plugin

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLACEMENT = re.compile(
    r"^placement (?P<role>trainer|ref) rank=(?P<rank>\d+) host=(?P<host>\S+) \S+ "
    r"gpus=(?P<gpus>\S+)$",
    re.MULTILINE,
)
STEP = re.compile(r"^step (?P<step>\d+)/\d+ loss=(?P<loss>\S+) kl=(?P<kl>\S+)$", re.MULTILINE)
TIMEOUT_S = 420
STEP_SECONDS = 10  # rl_kl's --step-seconds where a run must still be going after step 1


def sample(path: str, name: str, **launcher: Any) -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / path).read_text())
    body["metadata"]["name"] = name
    body["spec"].setdefault("launcher", {}).update(launcher)
    return body


def run_job(kubectl, namespace: str, body: dict[str, Any], state_dir: Path):
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    name = body["metadata"]["name"]
    job = wait_for_phase(kubectl, namespace, name, ("Succeeded", "Failed"), timeout=TIMEOUT_S)
    return job, launcher_log(kubectl, state_dir, namespace, name)


def placements(log: str, role: str) -> list[tuple[str, str]]:
    found = [m for m in PLACEMENT.finditer(log) if m["role"] == role]
    return [(m["host"], m["gpus"]) for m in sorted(found, key=lambda m: int(m["rank"]))]


def failed_message(job: dict[str, Any]) -> str:
    conditions = {c["type"]: c for c in job["status"].get("conditions", [])}
    return conditions["Failed"]["message"]


def test_user_program_with_separate_roles_succeeds(kubectl, namespace, local_cluster):
    """The rl_kl sample with 10 s steps; after step 1, ``kubectl monarch stacks`` (issue 35
    item 4: SIGUSR1 to the launcher through the real kubelet's exec, the launcher's ssh to every
    worker pod) prints every rank of both roles, and the job goes on to Succeeded."""
    body = sample("rl_kl/monarchjob.yaml", "rl-kl")
    body["spec"]["launcher"]["args"] += ["--step-seconds", str(STEP_SECONDS)]
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    wait_until(lambda: (job_status(kubectl, namespace, "rl-kl").get("progress") or {}).get(
        "step", 0) >= 1, TIMEOUT_S, "rl-kl at step 1")

    asked = plugin(local_cluster, "stacks", "rl-kl", "-n", namespace, "--wait", "25")

    job = wait_for_phase(kubectl, namespace, "rl-kl", ("Succeeded", "Failed"), timeout=TIMEOUT_S)
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "rl-kl")
    assert asked.returncode == 0, (asked.stdout, asked.stderr)
    for role, ranks, hosts in (("trainer", 4, "rl-kl-worker-[01]"), ("ref", 2, "rl-kl-worker-2")):
        for rank in range(ranks):
            assert re.search(rf"\b{role} rank {rank} on {hosts}\S*: ", asked.stdout), (
                asked.stdout)
    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    assert len(job["status"].get("attempts", [])) == 1, job["status"]  # nothing was stopped
    trainer_hosts = {host for host, _ in placements(log, "trainer")}
    assert trainer_hosts == {"rl-kl-worker-0", "rl-kl-worker-1"}, log[-4000:]
    assert {host for host, _ in placements(log, "ref")} == {"rl-kl-worker-2"}, log[-4000:]
    steps = [(int(m["step"]), float(m["loss"])) for m in STEP.finditer(log)]
    assert [step for step, _ in steps] == [1, 2, 3], log[-4000:]
    assert [loss for _, loss in steps] == sorted((loss for _, loss in steps), reverse=True)
    assert "rl_kl: done" in log


def test_user_program_with_colocated_roles_sees_its_gpu_sets(kubectl, namespace, local_cluster):
    body = sample("rl_kl/monarchjob-colocated.yaml", "rl-kl-co")

    job, log = run_job(kubectl, namespace, body, local_cluster.state_dir)

    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    assert placements(log, "trainer") == [
        ("rl-kl-co-worker-0", "0"), ("rl-kl-co-worker-1", "0")
    ], log[-4000:]
    assert placements(log, "ref") == [("rl-kl-co-worker-0", "1,2")] * 2 + [
        ("rl-kl-co-worker-1", "1,2")
    ] * 2, log[-4000:]


def test_torchrun_script_as_a_monarchjob_sees_torchrun_and_pod_variables(
    kubectl, namespace, local_cluster
):
    body = yaml.safe_load((EXAMPLES / "torchrun_demo/monarchjob.yaml").read_text())

    job, log = run_job(kubectl, namespace, body, local_cluster.state_dir)

    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    ranks = re.findall(
        r"rank (\d+)/4 local_rank=(\d) master=(\S+):\d+ NCCL_SOCKET_IFNAME=(\S+) FOO=(\S+)", log
    )
    assert sorted(int(rank) for rank, *_ in ranks) == [0, 1, 2, 3], log[-4000:]
    assert {local for _, local, *_ in ranks} == {"0", "1"}
    assert len({master for _, _, master, *_ in ranks}) == 1
    # Field case C16: the worker template's env reaches every rank through sshd.
    assert {(nic, foo) for *_, nic, foo in ranks} == {("eth7", "bar")}, log[-4000:]
    assert "step 3/3 mean_loss=" in log
    # Rank 0's MONARCH_PROGRESS lines reached the status through the launcher's own token.
    progress = job["status"].get("progress") or {}
    assert (progress.get("step"), progress.get("percent")) == (3, "100%"), job["status"]
    assert progress.get("mainMetric", "").startswith("mean_loss="), progress


def test_a_raise_caught_by_the_controller_lets_the_job_succeed(kubectl, namespace, local_cluster):
    body = sample("rl_kl/monarchjob.yaml", "caught",
                  args=["--steps", "3", "--raise-at-step", "2", "--catch"])

    job, log = run_job(kubectl, namespace, body, local_cluster.state_dir)

    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    assert re.search(
        r"^caught: trainer rank 3 \(host caught-worker-1\.\S+, local rank 1\): "
        r"raised ValueError: bad batch at step 2$", log, re.MULTILINE
    ), log[-4000:]
    assert [int(m["step"]) for m in STEP.finditer(log)] == [1, 3]


def test_an_uncaught_raise_fails_the_job_naming_role_rank_host(kubectl, namespace, local_cluster):
    body = sample("rl_kl/monarchjob.yaml", "uncaught", args=["--raise-at-step", "2"])

    job, log = run_job(kubectl, namespace, body, local_cluster.state_dir)

    assert job["status"]["phase"] == "Failed", log[-4000:]
    assert job["status"]["launcher"]["exitCode"] == 1
    message = failed_message(job)
    assert re.search(
        r"trainer rank 3 \(host uncaught-worker-1\.\S+, local rank 1\): "
        r"raised ValueError: bad batch at step 2", message
    ), message


def test_a_rank_exiting_3_fails_the_job_with_exit_code_3(kubectl, namespace, local_cluster):
    body = sample("rl_kl/monarchjob.yaml", "exit3",
                  args=["--exit-at-step", "2", "--exit-code", "3"])

    job, log = run_job(kubectl, namespace, body, local_cluster.state_dir)

    assert job["status"]["phase"] == "Failed", log[-4000:]
    assert job["status"]["launcher"]["exitCode"] == 3, log[-4000:]
    assert re.search(r"trainer rank \d \(host exit3-worker-\d\.\S+, local rank \d\): "
                     r"exited with code 3", failed_message(job)), failed_message(job)
