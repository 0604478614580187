"""Attach mode on the local cluster (issue 23 item 1): the CRD's rules for spec.mode, each role
mesh's label selector selecting exactly its workers with ranks in hostfile order (also for a
recreated worker), the same meshes in status and in the launcher's environment, the launcher's
ServiceAccount allowed what Monarch's KubernetesJob calls, and a program written against
Monarch's own KubernetesJob, with nothing of ours, attaching from the launcher pod to real worker
loops (the node agent runs pods as local processes), again from a second attempt on the same
pods. NetworkPolicy is not enforced here: that is for the real nodes."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.cluster.helpers import (
    IMAGE,
    get_json,
    job_manifest,
    running_attempt,
    wait_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster

LONG_LAUNCHER = {"command": ["sh", "-c", "sleep 600"]}
# "The image" of the local cluster is this machine's Python; its worker processes must import
# this checkout's monarch_operator (launcher/attachworker.py), wherever the venv points.
CHECKOUT = Path(__file__).resolve().parents[2] / "operator"
WORKERS_FROM_CHECKOUT = {"spec": {"containers": [
    {"name": "worker", "env": [{"name": "PYTHONPATH", "value": str(CHECKOUT)}]}]}}


def attach_manifest(name: str, launcher: dict | None = None, **spec: object) -> str:
    body = yaml.safe_load(job_manifest(name, mode="attach", launcher=launcher or LONG_LAUNCHER,
                                       **spec))
    body["spec"]["workers"]["replicas"] = 3
    body["spec"]["workers"]["template"] = WORKERS_FROM_CHECKOUT
    body["spec"]["meshes"] = {"trainer": {"hosts": 2}, "ref": {"hosts": 1}}
    return yaml.safe_dump(body)


def ranked_pods(kubectl, namespace: str, mesh: dict) -> list[tuple[str, str]]:
    """``(rank label value, pod name)`` of the pods the mesh's selector selects, by rank."""
    pods = get_json(kubectl, "pods", "-n", namespace, "-l", mesh["labelSelector"])["items"]
    return sorted((pod["metadata"]["labels"][mesh["podRankLabel"]], pod["metadata"]["name"])
                  for pod in pods if not pod["metadata"].get("deletionTimestamp"))


def test_role_meshes_are_published_and_select_their_workers_by_rank(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", "-", stdin=attach_manifest("att"))
    status = running_attempt(kubectl, namespace, "att", 1)
    meshes = {mesh["meshName"]: mesh for mesh in status["meshes"]}
    assert sorted(meshes) == ["ref", "trainer"]
    assert (meshes["trainer"]["replicas"], meshes["ref"]["replicas"]) == (2, 1)
    assert {mesh["port"] for mesh in meshes.values()} == {26600}
    assert ranked_pods(kubectl, namespace, meshes["trainer"]) == [("0", "att-worker-0"),
                                                                  ("1", "att-worker-1")]
    assert ranked_pods(kubectl, namespace, meshes["ref"]) == [("0", "att-worker-2")]

    worker = get_json(kubectl, "pod", "att-worker-0", "-n", namespace)
    assert worker["spec"]["containers"][0]["env"][0] == {"name": "MONARCH_PORT",
                                                         "value": "26600"}
    launcher = get_json(kubectl, "pod", "att-launcher", "-n", namespace)
    env = {item["name"]: item.get("value") for item in launcher["spec"]["containers"][0]["env"]}
    assert json.loads(env["MONARCH_OPERATOR_MESHES"]) == status["meshes"]
    assert env["MONARCH_OPERATOR_NAMESPACE"] == namespace

    account = f"system:serviceaccount:{namespace}:att-launcher"

    def can(*what: str) -> str:
        return kubectl("auth", "can-i", *what, "-n", namespace, f"--as={account}",
                       check=False).strip()

    assert [can("list", "pods"), can("watch", "pods"), can("get", "pods")] == ["yes"] * 3
    assert [can("delete", "pods"), can("create", "pods/portforward"),
            can("get", "secrets")] == ["no"] * 3

    # A recreated worker gets its rank label back (the StatefulSet's template has none).
    uid = worker["metadata"]["uid"]
    kubectl("delete", "pod", "att-worker-0", "-n", namespace, "--wait=false")
    wait_until(lambda: ranked_pods(kubectl, namespace, meshes["trainer"]) == [
        ("0", "att-worker-0"), ("1", "att-worker-1")] and get_json(
            kubectl, "pod", "att-worker-0", "-n", namespace)["metadata"]["uid"] != uid,
        120, "the recreated att-worker-0 labelled trainer rank 0")


def refusal(kubectl, *args: str, stdin: str | None = None) -> str:
    """The API server's refusal of ``kubectl ARGS`` (its stderr); fails if it went through."""
    done = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True,
                          env=kubectl.env, check=False)
    assert done.returncode != 0, done.stdout
    return done.stderr


def test_the_crd_refuses_what_attach_mode_cannot_run_and_a_mode_change(kubectl, namespace):
    body = yaml.safe_load(attach_manifest("att-bad"))
    body["spec"]["launcher"] = {}
    assert "mode attach needs launcher.program or launcher.command" in refusal(
        kubectl, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    body["spec"]["launcher"] = {"program": "my_rl.controller:main"}
    assert "module:function needs mode ssh" in refusal(
        kubectl, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    body["spec"]["launcher"] = {"program": "/app/train.py"}
    body["spec"]["mode"] = "mpi"
    assert "Unsupported value" in refusal(
        kubectl, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    assert get_json(kubectl, "monarchjob", "att-bad", "-n", namespace) is None
    kubectl("apply", "-n", namespace, "-f", "-", stdin=attach_manifest("att-fixed"))
    assert "spec.mode cannot change" in refusal(
        kubectl, "patch", "monarchjob", "att-fixed", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"mode": "ssh"}}')
    # SSH mode stays the default.
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("plain"))
    assert get_json(kubectl, "monarchjob", "plain", "-n", namespace)["spec"]["mode"] == "ssh"
    assert get_json(kubectl, "monarchjob", "att-fixed", "-n", namespace)["spec"]["mode"] == (
        "attach")


# Written against Monarch's public KubernetesJob API alone (the GRPO-on-Kubernetes tutorial's
# shape, with our selectors), plus the client's listen address the local cluster needs; the
# first attempt fails on purpose after attaching.
UPSTREAM_PROGRAM = textwrap.dedent("""
    import os, socket, sys
    from monarch.actor import Actor, endpoint
    from monarch.job.kubernetes import KubernetesJob

    class Where(Actor):
        @endpoint
        def host(self) -> str:
            return socket.gethostname()

    job = KubernetesJob(namespace=NAMESPACE, timeout=120)
    # The local cluster's pod IPs are loopback addresses, which the hostname transport that
    # KubernetesJob sets refuses; a real cluster needs no such line.
    from monarch.config import configure
    configure(default_transport=os.environ["MONARCH_CLIENT_ADDRESS"])
    for mesh, hosts in (("trainer", 2), ("ref", 1)):
        job.add_mesh(mesh, hosts, pod_rank_label=f"monarch-operator.dev/{mesh}-rank",
                     label_selector=f"monarch-operator.dev/job={JOB},"
                                    f"monarch-operator.dev/role=worker,monarch-operator.dev/{mesh}-rank")
    state = job.state(cached_path=None)
    for mesh in ("trainer", "ref"):
        procs = getattr(state, mesh).spawn_procs(per_host={"procs": 1})
        hosts = list(procs.spawn("where", Where).host.call().get().values())
        print("ATTACHED", mesh, ",".join(hosts), flush=True)
        procs.stop().get()
    if os.environ.get("MONARCH_ATTEMPT") == "1":
        sys.exit(3)
""")


def test_an_unmodified_kubernetesjob_program_attaches_and_reattaches(kubectl, namespace):
    program = f"NAMESPACE, JOB = {namespace!r}, 'att-run'\n" + UPSTREAM_PROGRAM
    kubectl("apply", "-n", namespace, "-f", "-", stdin=attach_manifest(
        "att-run", launcher={"command": ["python", "-u", "-c", program]},
        runPolicy={"backoffLimit": 1}, cleanupPolicy="KeepAll"))
    def worker_uids() -> dict[str, str]:
        return {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in get_json(
            kubectl, "pods", "-n", namespace, "-l",
            "monarch-operator.dev/job=att-run,monarch-operator.dev/role=worker")["items"]}

    first = running_attempt(kubectl, namespace, "att-run", 1)
    workers = worker_uids()
    assert len(workers) == 3 and first["meshes"]
    done = wait_phase(kubectl, namespace, "att-run", "Succeeded", timeout=420)
    assert done["restartCount"] == 1, done
    assert worker_uids() == workers, "the second attempt must re-attach to the same worker pods"
    # The first launcher pod is gone (a finished job keeps only its last); its record keeps
    # the end of its log (terminationMessagePolicy FallbackToLogsOnError).
    first_record = json.dumps(done["attempts"][0])
    last_log = kubectl("logs", "att-run-launcher-2", "-n", namespace)
    for output in (first_record, last_log):
        assert "ATTACHED trainer att-run-worker-0,att-run-worker-1" in output, output[-3000:]
        assert "ATTACHED ref att-run-worker-2" in output, output[-3000:]


HELPER_PROGRAM = textwrap.dedent("""
    import socket
    from monarch.actor import Actor, endpoint
    from monarch_operator.job import kubernetes_job

    class Where(Actor):
        @endpoint
        def host(self) -> str:
            return socket.gethostname()

    job = kubernetes_job()
    state = job.state(cached_path=None)
    for mesh in ("trainer", "ref"):
        procs = getattr(state, mesh).spawn_procs(per_host={"procs": 1})
        hosts = list(procs.spawn("where", Where).host.call().get().values())
        print("HELPER", mesh, ",".join(hosts), flush=True)
        procs.stop().get()
    job.kill()
    print("KILLED", flush=True)
""")



def test_the_job_api_helper_attaches_from_a_launcher_program_and_kill_keeps_the_pods(
        kubectl, namespace, scripts):
    script = scripts / "attach_helper.py"
    script.write_text(HELPER_PROGRAM)
    script.chmod(0o644)
    launcher = {"program": str(script), "template": {"spec": {"containers": [
        {"name": "launcher", "env": [{"name": "PYTHONPATH", "value": str(CHECKOUT)}]}]}}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=attach_manifest(
        "att-help", launcher=launcher, cleanupPolicy="KeepAll"))
    running_attempt(kubectl, namespace, "att-help", 1)
    workers = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in get_json(
        kubectl, "pods", "-n", namespace, "-l",
        "monarch-operator.dev/job=att-help,monarch-operator.dev/role=worker")["items"]}
    done = wait_phase(kubectl, namespace, "att-help", "Succeeded", timeout=300)
    log = kubectl("logs", "att-help-launcher", "-n", namespace)
    assert "HELPER trainer att-help-worker-0,att-help-worker-1" in log, log[-3000:]
    assert "HELPER ref att-help-worker-2" in log and "KILLED" in log, log[-3000:]
    assert done["restartCount"] == 0
    kept = get_json(kubectl, "pods", "-n", namespace, "-l",
                    "monarch-operator.dev/job=att-help,monarch-operator.dev/role=worker")["items"]
    assert {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in kept} == workers
    assert not any(pod["metadata"].get("deletionTimestamp") for pod in kept)


# What docs/attach.md asks of a client pod outside the job: a Role to find the pods, and the
# label that the job's NetworkPolicy admits.
CLIENT_RBAC = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: attach-client}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: attach-client}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: attach-client}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: attach-client}
subjects:
- {kind: ServiceAccount, name: attach-client}
"""


def test_an_unmodified_program_attaches_from_another_pod_of_the_namespace(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", "-", stdin=attach_manifest("att-out"))
    running_attempt(kubectl, namespace, "att-out", 1)
    kubectl("apply", "-n", namespace, "-f", "-", stdin=CLIENT_RBAC)
    program = f"NAMESPACE, JOB = {namespace!r}, 'att-out'\n" + UPSTREAM_PROGRAM
    client = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "client", "labels": {"monarch-operator.dev/attach-to":
                                                        "att-out"}},
              "spec": {"restartPolicy": "Never", "serviceAccountName": "attach-client",
                       "containers": [{"name": "client", "image": IMAGE,
                                       "command": ["python", "-u", "-c", program],
                                       "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {
                                                    "fieldPath": "status.podIP"}}},
                                               {"name": "MONARCH_CLIENT_ADDRESS",
                                                "value": "tcp://$(POD_IP):0"}]}]}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(client))
    wait_until(lambda: (get_json(kubectl, "pod", "client", "-n", namespace)["status"]
                        .get("phase") in ("Succeeded", "Failed")), 240, "the client pod ended")
    log = kubectl("logs", "client", "-n", namespace)
    assert get_json(kubectl, "pod", "client", "-n", namespace)["status"]["phase"] == (
        "Succeeded"), log[-3000:]
    assert "ATTACHED trainer att-out-worker-0,att-out-worker-1" in log, log[-3000:]
    assert "ATTACHED ref att-out-worker-2" in log, log[-3000:]
    # The job's policy admits the client: one of its ingress peers selects exactly that pod.
    policy = get_json(kubectl, "networkpolicy", "att-out-isolation", "-n", namespace)
    [rule] = policy["spec"]["ingress"]
    admitted = set()
    for peer in rule["from"]:
        selector = ",".join(f"{key}={value}" for key, value
                            in sorted(peer["podSelector"]["matchLabels"].items()))
        admitted |= {pod["metadata"]["name"] for pod in get_json(
            kubectl, "pods", "-n", namespace, "-l", selector)["items"]}
    assert "client" in admitted and "ports" not in rule
