"""Worker groups and roles on the real API server and the operator (docs/roles.md): every rule
of the CRD refuses naming its field with the message JobSpec.from_body gives
(tests/roles_cases.py); every sample and documented MonarchJob is admitted and keeps its
children's names; and a job of 3 groups (one CPU-only) and 4 roles on simulated nodes gets a
StatefulSet and Service per group, one hostfile of every group, MONARCH_ROLES on its launcher
and READY counting every group, and cannot change its roles while it runs."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from monarch_operator import constants
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.service import build_worker_services
from monarch_operator.controller.builders.statefulset import build_worker_statefulsets
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from tests.cluster.helpers import get_json, running_attempt, wait_until
from tests.roles_cases import REFUSALS, refused_job, roles_job

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
SIMULATE = "localcluster.monarch-operator.dev/simulate"


def apply(kubectl, namespace: str, body: dict[str, Any],
          *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "apply", "-n", namespace, *flags, "-f", "-"],
                          input=json.dumps(body), capture_output=True, text=True,
                          env=kubectl.env)


def test_each_rule_refuses_on_the_api_server_naming_its_field(kubectl, namespace):
    assert apply(kubectl, namespace, roles_job(), "--dry-run=server").returncode == 0
    wrong = []
    for refusal in REFUSALS:
        result = apply(kubectl, namespace, refused_job(refusal), "--dry-run=server")
        said = " ".join(result.stderr.split())
        if (result.returncode == 0 or f"{refusal.field}:" not in said
                or (refusal.server or refusal.message) not in said):
            wrong.append(f"{refusal.name}: rc {result.returncode}: {said}")
    assert not wrong, "\n".join(wrong)


def _documented_jobs() -> list[tuple[str, dict[str, Any]]]:
    """Every whole MonarchJob manifest of the samples, the examples and the docs."""
    found = []
    files = sorted((ROOT / "crds" / "samples").glob("*.yaml")) + sorted(
        (ROOT / "examples").glob("*/*.yaml"))
    for path in files:
        found += [(str(path.relative_to(ROOT)), body) for body in yaml.safe_load_all(
            path.read_text()) if isinstance(body, dict) and body.get("kind") == "MonarchJob"]
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for block in re.findall(r"```ya?ml\n(.*?)```", path.read_text(), re.S):
            try:
                bodies = list(yaml.safe_load_all(block))
            except yaml.YAMLError:
                continue
            found += [(str(path.relative_to(ROOT)), body) for body in bodies
                      if isinstance(body, dict) and body.get("kind") == "MonarchJob"]
    return found


def test_every_sample_and_documented_job_is_admitted_with_its_child_names(kubectl, namespace):
    jobs = _documented_jobs()
    assert len(jobs) >= 10, [where for where, _ in jobs]
    for where, body in jobs:
        result = apply(kubectl, namespace, body, "--dry-run=server", "-o", "json")
        assert result.returncode == 0, f"{where}: {result.stderr}"
        job = JobSpec.from_body(json.loads(result.stdout))  # as admitted: defaults applied
        sets = [s["metadata"]["name"] for s in build_worker_statefulsets(job, Settings())]
        services = [s["metadata"]["name"] for s in build_worker_services(job)]
        env = {e["name"] for e in build_launcher_pod(job, Settings())["spec"]["containers"][0][
            "env"]}
        if "workerGroups" in body["spec"]:
            groups = [g["name"] for g in body["spec"]["workerGroups"]]
            assert sets == services == [f"{job.name}-{g}" for g in groups], where
            assert constants.ENV_ROLES in env, where
        else:  # as before worker groups existed
            assert sets == services == [f"{job.name}-worker"], where
            assert constants.ENV_ROLES not in env, where
            assert (constants.ENV_TRAINER_HOSTS in env) == (job.spmd is None), where


def _running_job() -> dict[str, Any]:
    body = roles_job("rl")
    spec = body["spec"]
    # spec.workers.template applies to every group; the reward group adds its own env.
    spec["workers"] = {"template": {"metadata": {"labels": {SIMULATE: "ready"}}}}
    spec["workerGroups"][2]["template"] = {"spec": {"containers": [
        {"name": "worker", "env": [{"name": "SCORER", "value": "cpu"}]}]}}
    spec["launcher"] = {"command": ["sh", "-c", "exit 7"],
                        "template": {"metadata": {"labels": {SIMULATE: "ready"}}}}
    return body


def test_three_groups_four_roles_run_with_one_hostfile_and_roles_env(kubectl, namespace):
    body = _running_job()
    result = apply(kubectl, namespace, body)
    assert result.returncode == 0, result.stderr
    domain = f"{namespace}.svc.cluster.local"

    def launched():
        job = get_json(kubectl, "monarchjob", "rl", "-n", namespace)
        pods = get_json(kubectl, "pods", "-n", namespace, "-l",
                        f"{constants.LABEL_ROLE}={constants.ROLE_LAUNCHER}")
        return (job.get("status", {}).get("readyWorkers") == "4/4" and pods["items"]
                and (job, pods["items"][0]))
    _, launcher = wait_until(launched, 120, "4/4 workers Ready and a launcher pod")

    sets = {s["metadata"]["name"]: s for s in get_json(
        kubectl, "statefulsets", "-n", namespace)["items"]}
    assert sorted(sets) == ["rl-generator", "rl-reward", "rl-trainer"]
    for name, replicas, gpus in (("rl-generator", 2, "4"), ("rl-trainer", 1, "4"),
                                 ("rl-reward", 1, None)):
        spec = sets[name]["spec"]
        group = name.removeprefix("rl-")
        assert spec["replicas"] == replicas
        assert spec["selector"]["matchLabels"][constants.LABEL_GROUP] == group
        container = spec["template"]["spec"]["containers"][0]
        assert (container.get("resources") or {}).get("limits", {}).get(
            constants.GPU_RESOURCE) == gpus, name
        assert spec["template"]["metadata"]["labels"][SIMULATE] == "ready"
    reward_env = {e["name"]: e.get("value") for e in
                  sets["rl-reward"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert reward_env["SCORER"] == "cpu"
    services = {s["metadata"]["name"] for s in get_json(
        kubectl, "services", "-n", namespace)["items"]}
    assert {"rl-generator", "rl-reward", "rl-trainer"} <= services
    pods = get_json(kubectl, "pods", "-n", namespace, "-l",
                    f"{constants.LABEL_ROLE}={constants.ROLE_WORKER}")["items"]
    assert sorted((p["metadata"]["name"], p["metadata"]["labels"][constants.LABEL_GROUP])
                  for p in pods) == [("rl-generator-0", "generator"),
                                     ("rl-generator-1", "generator"),
                                     ("rl-reward-0", "reward"), ("rl-trainer-0", "trainer")]

    hostfile = get_json(kubectl, "configmap", "rl-hostfile", "-n", namespace)["data"]
    fqdn = {name: f"{name}.{name.rsplit('-', 1)[0]}.{domain}"
            for name in ("rl-generator-0", "rl-generator-1", "rl-trainer-0", "rl-reward-0")}
    assert hostfile["hostfile"].splitlines() == [
        f"{fqdn['rl-generator-0']} slots=4", f"{fqdn['rl-generator-1']} slots=4",
        f"{fqdn['rl-trainer-0']} slots=4", f"{fqdn['rl-reward-0']} slots=1"]
    assert hostfile["hostfile.reward"].splitlines() == [f"{fqdn['rl-reward-0']} slots=1"]
    assert len(hostfile["hostfile.generator"].splitlines()) == 2
    assert len(hostfile["addresses"].splitlines()) == 4

    env = {e["name"]: e.get("value") for e in launcher["spec"]["containers"][0]["env"]}
    assert json.loads(env[constants.ENV_ROLES]) == [
        {"name": "generator", "hosts": [fqdn["rl-generator-0"], fqdn["rl-generator-1"]]},
        {"name": "trainer", "hosts": [fqdn["rl-trainer-0"]], "gpus": 2},
        {"name": "ref", "hosts": [fqdn["rl-trainer-0"]], "gpus": 2, "colocateWith": "trainer"},
        {"name": "reward", "hosts": [fqdn["rl-reward-0"]], "gpus": 0}]
    assert constants.ENV_TRAINER_HOSTS not in env
    ready_column = kubectl("get", "monarchjob", "rl", "-n", namespace, "--no-headers",
                           "-o", "custom-columns=READY:.status.readyWorkers")
    assert ready_column.strip() == "4/4"

    changed = copy.deepcopy(body)
    changed["spec"]["roles"][0]["hosts"] = 1
    result = apply(kubectl, namespace, changed)
    assert result.returncode != 0
    assert "spec.roles cannot be added, removed or changed" in result.stderr


def test_a_lost_worker_of_one_group_is_infrastructure_naming_its_group_and_pod(kubectl,
                                                                             namespace):
    """A generator worker deleted mid-run ends the attempt as Infrastructure, naming the pod
    and its group; only that pod is recreated (the other groups' pods keep their uids) and
    the next attempt starts on them."""
    body = _running_job()
    body["spec"]["launcher"] = {"command": ["sh", "-c", "exec sleep 600"]}
    body["spec"]["runPolicy"] = {"backoffLimit": 0, "infrastructureBackoffLimit": 2}
    result = apply(kubectl, namespace, body)
    assert result.returncode == 0, result.stderr
    running_attempt(kubectl, namespace, "rl", 1)

    def worker_uids() -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in get_json(
            kubectl, "pods", "-n", namespace, "-l",
            f"{constants.LABEL_ROLE}={constants.ROLE_WORKER}")["items"]}
    before = worker_uids()
    assert sorted(before) == ["rl-generator-0", "rl-generator-1", "rl-reward-0",
                              "rl-trainer-0"]
    time.sleep(3)  # the launcher has run a while: the loss is mid-run
    kubectl("delete", "pod", "rl-generator-1", "-n", namespace, "--wait=false")
    status = running_attempt(kubectl, namespace, "rl", 2)

    first = status["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", "WorkerEvicted"), first
    assert first["lostWorkers"] == ["rl-generator-1"], first
    assert "worker rl-generator-1 (group generator, deleted) lost mid-run" in first[
        "message"], first
    assert status["attempts"][1].get("launchTime"), status["attempts"]
    assert status.get("failureCounts") == {"infrastructure": 1}, status
    after = worker_uids()
    kept = ["rl-generator-0", "rl-reward-0", "rl-trainer-0"]
    assert {name: after.get(name) for name in kept} == {name: before[name] for name in kept}
    assert after.get("rl-generator-1") not in (None, before["rl-generator-1"]), after
    snapshot = {entry["name"]: entry["uid"] for entry in status["attemptWorkers"]}
    assert snapshot == after, (snapshot, after)
