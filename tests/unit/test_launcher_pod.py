"""The launcher pod built from spec.launcher, spec.meshes.*.gpus and spec.spmd: exact command,
env, resources and template merge (table of named cases, no cluster)."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from monarch_operator import constants
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.spec import spec as spec_module
from monarch_operator.controller.spec.rules import InvalidSpecError
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec

SETTINGS = Settings()
ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "monarchjobs.monarch-operator.dev.yaml"

# Everything the operator sets, in order, for the base job below (role mode, not colocated).
OPERATOR_ENV = [
    "POD_IP", "MONARCH_JOB_NAME", "MONARCH_JOB_NAMESPACE", "MONARCH_ATTEMPT", "MONARCH_JOB_UID",
    "MONARCH_RESTART_COUNT", "MONARCH_MAX_RESTARTS", "MONARCH_HOSTFILE", "MONARCH_HOST_ADDRESSES",
    "MONARCH_SSH_KEY", "MONARCH_SSH_PORT", "MONARCH_KNOWN_HOSTS", "MONARCH_TRAINER_HOSTS",
    "MONARCH_REF_HOSTS",
    "MONARCH_COLOCATE", "MONARCH_PROGRESS_CONFIGMAP", "MONARCH_PROGRESS_INTERVAL_SECONDS",
    "MONARCH_CLIENT_ADDRESS", "MONARCH_RUNTIME_DIR",
]


def make_job(**spec_overrides):
    spec = {"image": "img:1", "workers": {"replicas": 4, "gpusPerWorker": 4},
            "meshes": {"trainer": {"hosts": 2}, "ref": {"hosts": 2}}}
    spec.update(spec_overrides)
    return JobSpec.from_body({
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": spec,
    })


def launcher_pod(job):
    return build_launcher_pod(job, SETTINGS)


def launcher_container(job):
    (container,) = launcher_pod(job)["spec"]["containers"]
    return container


def env_of(container):
    return {item["name"]: item.get("value") for item in container["env"]}


@pytest.mark.parametrize(
    ("case", "spec", "command"),
    [
        ("built-in example", {}, ["monarch-launch", "--steps", "3"]),
        ("built-in example with args", {"launcher": {"steps": 5, "args": ["--quiet"]}},
         ["monarch-launch", "--steps", "5", "--quiet"]),
        ("program module:function", {"launcher": {"program": "my_rl.train:main"}},
         ["monarch-launch", "run", "my_rl.train:main"]),
        ("program script with args",
         {"launcher": {"program": "/app/train.py", "args": ["--lr", "3e-4", "-v"]}},
         ["monarch-launch", "run", "/app/train.py", "--lr", "3e-4", "-v"]),
        ("command with args", {"launcher": {"command": ["python", "x.py"], "args": ["a"]}},
         ["python", "x.py", "a"]),
        ("spmd script, nproc defaults to gpusPerWorker",
         {"spmd": {"script": "/app/train.py", "args": ["--epochs", "3"]}},
         ["monarch-torchrun", "--nproc-per-node", "4", "/app/train.py", "--epochs", "3"]),
        ("spmd module with nprocPerNode",
         {"spmd": {"module": "my_project.train", "nprocPerNode": 2,
                   "args": ["--config", "b.yaml"]}},
         ["monarch-torchrun", "--nproc-per-node", "2", "-m", "my_project.train",
          "--config", "b.yaml"]),
    ],
)
def test_launcher_command(case, spec, command):
    assert launcher_container(make_job(**spec))["command"] == command, case


def test_operator_env_comes_first_with_job_identity():
    container = launcher_container(make_job())
    assert [item["name"] for item in container["env"]] == OPERATOR_ENV
    env = env_of(container)
    assert env[constants.ENV_JOB_NAME] == "demo"
    assert env[constants.ENV_NAMESPACE] == "team-a"
    assert env[constants.ENV_ATTEMPT] == "1"
    assert (env[constants.ENV_RESTART_COUNT], env[constants.ENV_MAX_RESTARTS]) == ("0", "3")
    assert env[constants.ENV_SSH_KEY] == "/etc/monarch/ssh/id_ed25519"
    assert env[constants.ENV_SSH_PORT] == "2222"
    assert env[constants.ENV_HOST_ADDRESSES] == "/etc/monarch/hostfile/addresses"
    assert constants.ENV_TRAINER_GPUS not in env and constants.ENV_REF_GPUS not in env


def test_c21_restart_variables_say_the_restarts_before_the_attempt_and_the_policys_most():
    job = make_job(runPolicy={"backoffLimit": 2, "infrastructureBackoffLimit": 1})
    # Attempt 3 after a suspend and one restart: restartCount 1 when it started.
    pod = build_launcher_pod(job, Settings(), attempt=3, restart_count=1)
    env = env_of(pod["spec"]["containers"][0])
    assert (env["MONARCH_ATTEMPT"], env["MONARCH_RESTART_COUNT"],
            env["MONARCH_MAX_RESTARTS"]) == ("3", "1", "3")


def test_user_env_is_appended_after_the_operators_unchanged():
    user_env = [{"name": "HF_HOME", "value": "/cache"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
                {"name": "RUN", "value": "$(MONARCH_JOB_NAME)-1"}]
    container = launcher_container(make_job(launcher={"env": copy.deepcopy(user_env)}))
    assert container["env"][:len(OPERATOR_ENV)] == launcher_container(make_job())["env"]
    assert container["env"][len(OPERATOR_ENV):] == user_env


@pytest.mark.parametrize(
    ("meshes", "expected"),
    [
        ({"trainer": {"hosts": 2, "gpus": 3}, "ref": {"hosts": 2, "gpus": 1}, "colocate": True},
         {"MONARCH_TRAINER_GPUS": "3", "MONARCH_REF_GPUS": "1"}),
        ({"trainer": {"hosts": 2, "gpus": 3}, "ref": {"hosts": 2}, "colocate": True},
         {"MONARCH_TRAINER_GPUS": "3"}),
        ({"trainer": {"hosts": 2}, "ref": {"hosts": 2, "gpus": 2}, "colocate": True},
         {"MONARCH_REF_GPUS": "2"}),
        ({"trainer": {"hosts": 2}, "ref": {"hosts": 2}, "colocate": True}, {}),
    ],
)
def test_colocated_gpu_split_is_passed_only_when_given(meshes, expected):
    env = env_of(launcher_container(make_job(meshes=meshes)))
    assert env[constants.ENV_COLOCATE] == "true"
    given = {name: env[name] for name in (constants.ENV_TRAINER_GPUS, constants.ENV_REF_GPUS)
             if name in env}
    assert given == expected


def test_spmd_leaves_out_the_mesh_layout():
    job = make_job(spmd={"script": "t.py"}, meshes={"trainer": {"hosts": 2, "gpus": 3},
                                                    "ref": {"hosts": 2}, "colocate": True})
    names = [item["name"] for item in launcher_container(job)["env"]]
    assert names == [name for name in OPERATOR_ENV
                     if name not in ("MONARCH_TRAINER_HOSTS", "MONARCH_REF_HOSTS",
                                     "MONARCH_COLOCATE")]


def test_resources_are_used_with_numbers_sent_as_strings():
    """cpu: 2 is valid Kubernetes, sent as the string the API server stores (field case C12A)."""
    resources = {"limits": {"cpu": 2, "memory": "4Gi", constants.GPU_RESOURCE: 0},
                 "requests": {"cpu": "500m"}, "claims": [{"name": "c"}]}
    container = launcher_container(make_job(launcher={"resources": copy.deepcopy(resources)}))
    assert container["resources"] == {
        "limits": {"cpu": "2", "memory": "4Gi", constants.GPU_RESOURCE: "0"},
        "requests": {"cpu": "500m"}, "claims": [{"name": "c"}]}
    assert "resources" not in launcher_container(make_job())


def test_numbers_in_the_template_quantities_are_sent_as_strings():
    template = {"spec": {
        "resources": {"limits": {"cpu": 4}},
        "initContainers": [{"name": "prep", "image": "busybox",
                            "resources": {"requests": {"cpu": 0.5, "memory": "1Gi"}}}],
        "containers": [{"name": "launcher", "resources": {"requests": {"memory": 1048576}}}]}}
    spec = launcher_pod(make_job(launcher={"resources": {"limits": {"cpu": 2}},
                                           "template": template}))["spec"]
    assert spec["resources"] == {"limits": {"cpu": "4"}}
    assert spec["initContainers"][0]["resources"] == {"requests": {"cpu": "0.5", "memory": "1Gi"}}
    assert spec["containers"][0]["resources"] == {"limits": {"cpu": "2"},
                                                  "requests": {"memory": "1048576"}}


def test_template_merges_over_the_launcher_pod_containers_by_name():
    template = {
        "metadata": {"labels": {"team": "a", constants.LABEL_ROLE: "mine"},
                     "annotations": {"note": "x"}},
        "spec": {"restartPolicy": "OnFailure", "nodeSelector": {"pool": "cpu"},
                 "serviceAccountName": "trainer",
                 "containers": [
                     {"name": "launcher", "workingDir": "/app",
                      "env": [{"name": "EXTRA", "value": "1"}],
                      "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                     {"name": "sidecar", "image": "busybox"}],
                 "volumes": [{"name": "data", "emptyDir": {}}]},
    }
    job = make_job(launcher={"program": "p:main", "resources": {"limits": {"cpu": 2}},
                             "template": copy.deepcopy(template)})
    pod = launcher_pod(job)
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["labels"][constants.LABEL_ROLE] == "launcher", "job labels win"
    assert pod["metadata"]["annotations"] == {"note": "x"}
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never", "the launcher is never restarted"
    assert spec["nodeSelector"] == {"pool": "cpu"} and spec["serviceAccountName"] == "trainer"
    launcher, sidecar = spec["containers"]
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert launcher["command"] == ["monarch-launch", "run", "p:main"]
    assert launcher["workingDir"] == "/app"
    assert launcher["resources"] == {"limits": {"cpu": "2"}}
    assert [item["name"] for item in launcher["env"]] == [*OPERATOR_ENV, "EXTRA"]
    assert [m["mountPath"] for m in launcher["volumeMounts"]] == [
        "/etc/monarch/hostfile", "/etc/monarch/ssh", "/run/monarch", "/data"]
    assert [v["name"] for v in spec["volumes"]] == ["hostfile", "ssh", "monarch-runtime", "data"]


def test_building_does_not_modify_the_spec():
    spec = {"launcher": {"program": "p", "env": [{"name": "A", "value": "1"}],
                         "resources": {"limits": {"cpu": 2}},
                         "template": {"spec": {"containers": [{"name": "launcher",
                                                               "workingDir": "/w"}]}}}}
    before = copy.deepcopy(spec)
    job = make_job(**spec)
    build_launcher_pod(job, SETTINGS)
    build_launcher_pod(job, SETTINGS)
    assert job.launcher_env == before["launcher"]["env"]
    assert job.launcher_resources == before["launcher"]["resources"]
    assert job.launcher_template == before["launcher"]["template"]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"launcher": {"program": "p", "command": ["x"]}}, "at most one of"),
        ({"launcher": {"command": ["x"]}, "spmd": {"script": "t.py"}}, "at most one of"),
        ({"launcher": {"program": "p"}, "spmd": {"module": "m"}}, "at most one of"),
        ({"spmd": {}}, "exactly one of script and module"),
        ({"spmd": {"script": "t.py", "module": "m"}}, "exactly one of script and module"),
        ({"spmd": {"script": "t.py"}, "launcher": {"args": ["a"]}}, "spec.spmd.args"),
        ({"launcher": {"env": [{"name": "MONARCH_HOSTFILE", "value": "/x"}]}}, "MONARCH_"),
    ],
)
def test_operator_refuses_what_the_crd_refuses_for_the_launcher(spec, fragment):
    """Second defence for objects admitted under an older CRD: refused, naming the field."""
    with pytest.raises(InvalidSpecError, match=fragment):
        make_job(**spec)


def test_samples_still_build():
    for sample in sorted((ROOT / "crds" / "samples").glob("*.yaml")):
        body = yaml.safe_load(sample.read_text())
        body["metadata"].update(namespace="team-a", uid="u")
        container = launcher_container(JobSpec.from_body(body))
        assert container["command"][0] == "monarch-launch", sample.name


def crd_spec_schema():
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_crd_has_the_new_fields_and_rules():
    schema = crd_spec_schema()
    launcher = schema["properties"]["launcher"]["properties"]
    assert {"program", "args", "env", "resources", "template", "command", "steps"} <= set(launcher)
    (env_rule,) = launcher["env"]["x-kubernetes-validations"]
    # The rule lists exactly the operator's own launcher variables, and the builder sets each.
    listed = re.findall(r"'([A-Z_]+)'", env_rule["rule"])
    assert listed == list(constants.LAUNCHER_RESERVED_ENV)
    quantity = launcher["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True, "cpu: 2 as a YAML integer (C12A)"
    meshes = schema["properties"]["meshes"]["properties"]
    assert meshes["trainer"]["properties"]["gpus"]["minimum"] == 1
    assert meshes["ref"]["properties"]["gpus"]["minimum"] == 1
    spmd = schema["properties"]["spmd"]["properties"]
    assert set(spmd) == {"script", "module", "args", "nprocPerNode"}
    assert spmd["nprocPerNode"]["minimum"] == 1
    paths = {rule.get("fieldPath") for rule in schema["x-kubernetes-validations"]}
    assert {".meshes.trainer.gpus", ".meshes.ref.gpus", ".launcher", ".launcher.args",
            ".spmd.nprocPerNode"} <= paths


def test_spec_defaults_match_the_crd():
    properties = crd_spec_schema()["properties"]
    workers = properties["workers"]["properties"]
    assert workers["replicas"]["default"] == spec_module.DEFAULT_REPLICAS
    assert workers["gpusPerWorker"]["default"] == spec_module.DEFAULT_GPUS_PER_WORKER
    assert properties["launcher"]["properties"]["steps"]["default"] == spec_module.DEFAULT_STEPS
    for role in ("trainer", "ref"):
        hosts = properties["meshes"]["properties"][role]["properties"]["hosts"]
        assert hosts["default"] == spec_module.DEFAULT_MESH_HOSTS
    assert (properties["startupTimeoutSeconds"]["default"]
            == spec_module.DEFAULT_STARTUP_TIMEOUT_SECONDS)
