"""Attach mode's pure parts (issue 23 item 1): the spec field, the role meshes and their rank
labels, and what the builders make of a job with ``spec.mode: attach``; SSH mode unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from monarch_operator import constants, names
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.progress import build_progress_role
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.spec import attachmode
from monarch_operator.controller.spec.rules import InvalidSpecError
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state.observe import why_not_ready

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"
SETTINGS = Settings(cluster_domain="cluster.local")
PROGRAM = {"program": "/app/train.py"}


def make_job(mode: str | None = "attach", replicas: int = 3, trainer: int = 2, ref: int = 1,
             colocate: bool = False, **spec: object) -> JobSpec:
    body_spec: dict = {"image": "img:1", "workers": {"replicas": replicas, "gpusPerWorker": 2},
                       "meshes": {"trainer": {"hosts": trainer}, "ref": {"hosts": ref},
                                  "colocate": colocate},
                       "launcher": PROGRAM, **spec}
    if mode is not None:
        body_spec["mode"] = mode
    return JobSpec.from_body({"metadata": {"name": "demo", "namespace": "team-a", "uid": "u1"},
                              "spec": body_spec})


def worker_container(job: JobSpec) -> dict:
    spec = build_worker_statefulset(job, SETTINGS)["spec"]["template"]["spec"]
    return spec["containers"][0]


def env_of(container: dict) -> dict:
    return {item["name"]: item.get("value") for item in container["env"]}


def test_ssh_is_the_default_mode_in_the_spec_and_the_crd():
    assert make_job(mode=None).mode == constants.MODE_SSH
    assert not make_job(mode=None).attach
    mode = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]["properties"]["spec"]["properties"]["mode"]
    assert mode["default"] == constants.MODE_SSH
    assert mode["enum"] == list(constants.MODES)


@pytest.mark.parametrize("spec, words", [
    ({"mode": "mpi"}, "spec.mode 'mpi'"),
    ({"spmd": {"script": "t.py"}, "launcher": {}}, "spec.spmd needs spec.mode ssh"),
    ({"launcher": {}}, "needs spec.launcher.program or spec.launcher.command"),
    ({"launcher": {"program": "my_rl.controller:main"}}, "module:function needs spec.mode ssh"),
])
def test_what_attach_mode_cannot_run_is_refused_naming_the_field(spec, words):
    body_spec = {"image": "img:1", "mode": "attach", "launcher": PROGRAM, **spec}
    with pytest.raises(InvalidSpecError, match=words):
        JobSpec.from_body({"metadata": {"name": "demo"}, "spec": body_spec})


def test_attach_mode_with_a_command_is_accepted():
    assert make_job(launcher={"command": ["python", "/app/train.py"]}).attach


@pytest.mark.parametrize("role, mesh", [("trainer", "trainer"), ("ref", "ref"),
                                        ("ref_model", "refmodel"), ("Policy-2", "policy2")])
def test_mesh_names_are_what_kubernetesjob_accepts(role, mesh):
    assert attachmode.mesh_name(role) == mesh
    assert attachmode.MESH_NAME.match(mesh)


@pytest.mark.parametrize("role", ["", "2nd", "_-"])
def test_a_role_with_no_valid_mesh_name_is_refused(role):
    with pytest.raises(ValueError, match="no valid Monarch mesh name"):
        attachmode.mesh_name(role)


@pytest.mark.parametrize("colocate, trainer, ref, expected", [
    (False, 2, 1, {0: {"trainer": "0"}, 1: {"trainer": "1"}, 2: {"ref": "0"}, 3: {}}),
    (True, 2, 2, {0: {"trainer": "0", "ref": "0"}, 1: {"trainer": "1", "ref": "1"},
                  2: {}, 3: {}}),
])
def test_rank_labels_follow_hostfile_order_per_role(colocate, trainer, ref, expected):
    job = make_job(replicas=4, trainer=trainer, ref=ref, colocate=colocate)
    for ordinal, ranks in expected.items():
        assert attachmode.pod_rank_labels(job, names.worker_pod("demo", ordinal)) == {
            f"{constants.GROUP}/{role}-rank": rank for role, rank in ranks.items()}


def test_published_meshes_hold_what_add_mesh_takes():
    meshes = attachmode.published_meshes(make_job())
    assert meshes == [
        {"role": "trainer", "meshName": "trainer", "replicas": 2, "port": 26600,
         "podRankLabel": "monarch-operator.dev/trainer-rank",
         "labelSelector": "monarch-operator.dev/job=demo,monarch-operator.dev/role=worker,"
                          "monarch-operator.dev/trainer-rank"},
        {"role": "ref", "meshName": "ref", "replicas": 1, "port": 26600,
         "podRankLabel": "monarch-operator.dev/ref-rank",
         "labelSelector": "monarch-operator.dev/job=demo,monarch-operator.dev/role=worker,"
                          "monarch-operator.dev/ref-rank"},
    ]
    assert attachmode.published_meshes(make_job(mode="ssh")) == []


def pod(ordinal: int, **labels: str) -> dict:
    return {"metadata": {"name": names.worker_pod("demo", ordinal), "labels": {
        constants.LABEL_JOB: "demo", **labels}}}


def test_label_changes_set_missing_ranks_fix_wrong_ones_and_drop_stray_ones():
    job = make_job(replicas=4)
    trainer, ref = attachmode.rank_label("trainer"), attachmode.rank_label("ref")
    pods = [pod(0, **{trainer: "0"}),            # right: left alone
            pod(1),                               # recreated: no label yet
            pod(2, **{trainer: "2"}),             # wrong role and rank
            pod(3, **{ref: "0"}),                 # a spare worker carries no rank
            {"metadata": {"name": "someone-else", "labels": {}}}]
    assert attachmode.label_changes(job, pods) == {
        names.worker_pod("demo", 1): {trainer: "1"},
        names.worker_pod("demo", 2): {ref: "0", trainer: None},
        names.worker_pod("demo", 3): {ref: None},
    }


def test_no_label_changes_outside_attach_mode_or_for_pods_being_deleted():
    assert attachmode.label_changes(make_job(mode="ssh"), [pod(0)]) == {}
    leaving = pod(0)
    leaving["metadata"]["deletionTimestamp"] = "2026-12-02T08:00:00Z"
    assert attachmode.label_changes(make_job(), [leaving]) == {}


def test_attach_worker_runs_the_worker_loop_ready_on_its_port():
    container = worker_container(make_job())
    assert container["command"] == ["python", "-u", "-m",
                                    "monarch_operator.launcher.attachworker"]
    # KubernetesJob reads the first container's first literal MONARCH_PORT.
    assert container["env"][0] == {"name": "MONARCH_PORT", "value": "26600"}
    assert env_of(container)[constants.ENV_WORKER_DOMAIN] == "demo-worker.team-a.svc.cluster.local"
    assert container["readinessProbe"]["tcpSocket"] == {"port": 26600}
    assert container["ports"] == [{"name": "monarch", "containerPort": 26600}]
    assert container["resources"]["limits"][constants.GPU_RESOURCE] == "2"


def test_attach_workers_mount_no_ssh_keys():
    spec = build_worker_statefulset(make_job(), SETTINGS)["spec"]["template"]["spec"]
    assert [volume["name"] for volume in spec["volumes"]] == ["dshm", "monarch-runtime"]
    assert all(mount["mountPath"] != constants.SSH_DIR
               for mount in spec["containers"][0]["volumeMounts"])


def test_ssh_mode_workers_are_unchanged():
    container = worker_container(make_job(mode="ssh"))
    assert container["readinessProbe"]["tcpSocket"] == {"port": constants.SSH_PORT}
    assert "MONARCH_PORT" not in env_of(container)
    assert [port["name"] for port in build_worker_service(make_job(mode="ssh"))["spec"]["ports"]
            ] == ["ssh", "monarch"]


def test_attach_service_publishes_names_before_readiness_on_the_worker_loop_port():
    service = build_worker_service(make_job())["spec"]
    assert service["publishNotReadyAddresses"] is True
    assert service["clusterIP"] == "None"
    assert service["ports"] == [{"name": "monarch", "port": 26600, "targetPort": 26600}]


def test_launcher_env_carries_the_meshes_and_namespace_in_attach_mode_only():
    job = make_job()
    env = env_of(build_launcher_pod(job, SETTINGS)["spec"]["containers"][0])
    assert env[constants.ENV_OPERATOR_NAMESPACE] == "team-a"
    assert json.loads(env[constants.ENV_OPERATOR_MESHES]) == attachmode.published_meshes(job)
    ssh_env = env_of(build_launcher_pod(make_job(mode="ssh"), SETTINGS)["spec"]["containers"][0])
    assert constants.ENV_OPERATOR_MESHES not in ssh_env
    assert constants.ENV_OPERATOR_NAMESPACE not in ssh_env


def test_the_launcher_may_list_and_watch_pods_in_attach_mode_only():
    rules = build_progress_role(make_job())["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]} in rules
    assert all("pods" not in rule["resources"]
               for rule in build_progress_role(make_job(mode="ssh"))["rules"])


def test_network_policy_admits_attach_clients_in_attach_mode_only():
    [rule] = build_network_policy(make_job())["spec"]["ingress"]
    assert {"podSelector": {"matchLabels": {constants.LABEL_ATTACH_TO: "demo"}}} in rule["from"]
    assert "ports" not in rule  # client and workers use ports chosen at run time
    [ssh_rule] = build_network_policy(make_job(mode="ssh"))["spec"]["ingress"]
    assert len(ssh_rule["from"]) == 1


def test_a_running_attach_worker_not_ready_is_said_to_wait_for_the_worker_loop():
    for mode, server in (("attach", "the Monarch worker loop"), ("ssh", "sshd")):
        template = build_worker_statefulset(make_job(mode=mode), SETTINGS)["spec"]["template"]
        pod = {"metadata": {"name": "demo-worker-0"}, "spec": template["spec"],
               "status": {"phase": "Running"}}
        assert why_not_ready(pod) == f"{server} not accepting connections yet (readiness probe)"


def roles_attach_job() -> JobSpec:
    """Attach mode on worker groups: generator takes 2 of group gen's 3 workers, critic the
    third, trainer group train's one worker, ref colocated with the trainer."""
    return JobSpec.from_body({"metadata": {"name": "demo", "namespace": "team-a", "uid": "u1"},
                              "spec": {"image": "img:1", "mode": "attach", "launcher": PROGRAM,
                                       "workerGroups": [
                                           {"name": "gen", "replicas": 3, "gpusPerWorker": 1},
                                           {"name": "train", "replicas": 1, "gpusPerWorker": 2}],
                                       "roles": [
                                           {"name": "generator", "group": "gen", "hosts": 2},
                                           {"name": "critic", "group": "gen"},
                                           {"name": "ref", "group": "train",
                                            "colocateWith": "trainer", "gpus": 1},
                                           {"name": "trainer", "group": "train", "gpus": 1}]}})


def test_each_role_on_worker_groups_is_a_mesh_ranked_over_its_own_slice():
    job = roles_attach_job()
    meshes = attachmode.published_meshes(job)
    assert [(m["meshName"], m["replicas"], m["podRankLabel"]) for m in meshes] == [
        ("generator", 2, "monarch-operator.dev/generator-rank"),
        ("critic", 1, "monarch-operator.dev/critic-rank"),
        ("ref", 1, "monarch-operator.dev/ref-rank"),
        ("trainer", 1, "monarch-operator.dev/trainer-rank")]
    assert meshes[0]["labelSelector"] == ("monarch-operator.dev/job=demo,"
                                          "monarch-operator.dev/role=worker,"
                                          "monarch-operator.dev/generator-rank")
    group_pods = [{"metadata": {"name": name, "labels": {}}} for name in job.worker_pod_names()]
    assert attachmode.label_changes(job, group_pods) == {
        "demo-gen-0": {"monarch-operator.dev/generator-rank": "0"},
        "demo-gen-1": {"monarch-operator.dev/generator-rank": "1"},
        "demo-gen-2": {"monarch-operator.dev/critic-rank": "0"},
        "demo-train-0": {"monarch-operator.dev/ref-rank": "0",
                         "monarch-operator.dev/trainer-rank": "0"}}
    # The pods a role's selector matches are its own: the worker label is on every group's pods.
    for group in job.groups:
        labels = build_worker_statefulset(job, SETTINGS, group)["spec"]["template"]["metadata"][
            "labels"]
        assert labels[constants.LABEL_ROLE] == constants.ROLE_WORKER, labels
