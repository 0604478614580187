"""Pure builders: table of named cases, no cluster."""

import copy

import pytest

from monarch_operator import constants
from monarch_operator.controller.builders.hostfile import build_hostfile_configmap
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.builders.sshkeys import JobKeys
from monarch_operator.controller.builders.statefulset import (
    build_worker_statefulset,
    merge_pod_template,
)
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.hostfile import parse_hostfile

SETTINGS = Settings()


def make_job(**spec_overrides):
    body = {
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 12, "gpusPerWorker": 4},
                 "meshes": {"trainer": {"hosts": 8}, "ref": {"hosts": 4}}},
    }
    body["spec"].update(spec_overrides)
    return JobSpec.from_body(body)


def all_children(job):
    return [
        build_ssh_secret(job, SETTINGS, JobKeys(b"private", b"ssh-ed25519 AAAA client\n",
                                                b"host", b"ssh-ed25519 BBBB host\n")),
        build_worker_service(job),
        build_worker_statefulset(job, SETTINGS),
        build_hostfile_configmap(job, SETTINGS),
        build_launcher_pod(job, SETTINGS),
    ]


def test_every_child_is_owned_by_the_job_as_controller():
    for child in all_children(make_job()):
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["uid"] == "uid-1" and ref["controller"] is True, child["kind"]
        assert ref["apiVersion"] == f"{constants.GROUP}/{constants.VERSION}"
        assert child["metadata"]["labels"][constants.LABEL_JOB] == "demo"


def test_builders_are_deterministic():
    assert all_children(make_job()) == all_children(make_job())


def test_hostfile_lists_fqdns_in_ordinal_order_with_slots():
    hosts = parse_hostfile(build_hostfile_configmap(make_job(), SETTINGS)["data"]["hostfile"])
    assert [h.name.split(".")[0] for h in hosts] == [f"demo-worker-{i}" for i in range(12)]
    assert hosts[2].name == "demo-worker-2.demo-worker.team-a.svc.cluster.local"
    assert {h.slots for h in hosts} == {4}


def test_hostfile_configmap_carries_each_workers_current_address_in_ordinal_order():
    """C20: beside the hostfile, the pod IP each worker had when the launcher was made, so the
    launcher can wait until the name resolves to it (a recreated pod has a new address)."""
    pods = [{"metadata": {"name": f"demo-worker-{i}"}, "status": {"podIP": f"10.244.1.{i + 2}"}}
            for i in reversed(range(12))]
    pods[0]["status"] = {}  # demo-worker-11 has no IP yet: left out, never guessed
    data = build_hostfile_configmap(make_job(), SETTINGS, pods)["data"]
    lines = data["addresses"].splitlines()
    assert lines[0] == "demo-worker-0.demo-worker.team-a.svc.cluster.local 10.244.1.2"
    assert [line.split()[0] for line in lines] == [
        h.name for h in parse_hostfile(data["hostfile"])][:11]
    assert lines[10].endswith(" 10.244.1.12")
    assert "addresses" not in build_hostfile_configmap(make_job(), SETTINGS)["data"]


def test_statefulset_runs_sshd_in_the_gpu_container():
    sts = build_worker_statefulset(make_job(), SETTINGS)
    spec = sts["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == "demo-worker"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"][constants.GPU_RESOURCE] == "4"
    assert container["readinessProbe"]["tcpSocket"]["port"] == constants.SSH_PORT
    assert container["command"] == ["/usr/local/bin/monarch-worker-entrypoint"]
    assert pod["enableServiceLinks"] is False
    assert pod["dnsConfig"]["searches"] == ["demo-worker.team-a.svc.cluster.local"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_worker_template_override_merges_containers_by_name():
    job = make_job(workers={"replicas": 2, "gpusPerWorker": 8, "template": {
        "metadata": {"labels": {"team": "a"}},
        "spec": {"nodeSelector": {"gpu": "h100"},
                 "containers": [{"name": "worker", "env": [{"name": "X", "value": "1"}]}]}}})
    template = build_worker_statefulset(job, SETTINGS)["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "a"
    assert template["metadata"]["labels"][constants.LABEL_ROLE] == "worker"
    assert template["spec"]["nodeSelector"] == {"gpu": "h100"}
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["X"] == "1" and env["SSH_PORT"] == str(constants.SSH_PORT)
    assert container["readinessProbe"]["tcpSocket"]["port"] == constants.SSH_PORT


def test_worker_template_integer_quantities_are_sent_as_strings():
    # Field case C12A: `cpu: 2` is valid Kubernetes; the client only sends quantity strings.
    job = make_job(workers={"replicas": 1, "gpusPerWorker": 2, "template": {"spec": {
        "containers": [{"name": "worker", "resources": {"limits": {"cpu": 2, "memory": "4Gi"},
                                                        "requests": {"cpu": 0.5}}}],
        "initContainers": [{"name": "prep", "resources": {"limits": {"cpu": 1}}}]}}})
    spec = build_worker_statefulset(job, SETTINGS)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["cpu"] == "2"
    assert container["resources"]["limits"]["memory"] == "4Gi"
    assert container["resources"]["limits"][constants.GPU_RESOURCE] == "2"
    assert container["resources"]["requests"]["cpu"] == "0.5"
    assert spec["initContainers"][0]["resources"]["limits"]["cpu"] == "1"


def test_merge_does_not_modify_inputs():
    base = {"spec": {"containers": [{"name": "a", "image": "x"}]}}
    override = {"spec": {"containers": [{"name": "b", "image": "y"}]}}
    before = copy.deepcopy((base, override))
    merged = merge_pod_template(base, override)
    assert (base, override) == before
    assert [c["name"] for c in merged["spec"]["containers"]] == ["a", "b"]


def test_launcher_pod_never_restarts_is_owned_by_the_job_and_gets_meshes_and_files():
    manifest = build_launcher_pod(make_job(), SETTINGS)
    assert (manifest["apiVersion"], manifest["kind"]) == ("v1", "Pod")
    (owner,) = manifest["metadata"]["ownerReferences"]
    assert owner["kind"] == "MonarchJob" and owner["controller"] is True
    pod = manifest["spec"]
    assert pod["restartPolicy"] == "Never"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env[constants.ENV_TRAINER_HOSTS] == "8"
    assert env[constants.ENV_REF_HOSTS] == "4"
    assert env[constants.ENV_COLOCATE] == "false"
    assert env[constants.ENV_HOSTFILE] == "/etc/monarch/hostfile/hostfile"
    assert env[constants.ENV_CLIENT_ADDRESS] == "tcp://$(POD_IP):0"
    assert pod["containers"][0]["command"] == ["monarch-launch", "--steps", "3"]


def test_launcher_failure_reaches_status_through_the_termination_message():
    pod = build_launcher_pod(make_job(), SETTINGS)["spec"]
    assert pod["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_custom_launcher_command_is_used_as_given():
    job = make_job(launcher={"command": ["python", "train.py"], "image": "other:2"})
    container = build_launcher_pod(job, SETTINGS)["spec"]["containers"][0]
    assert container["command"] == ["python", "train.py"]
    assert container["image"] == "other:2"


@pytest.mark.parametrize("bad", [{"image": ""}, {"image": None}])
def test_spec_without_image_is_refused(bad):
    with pytest.raises(ValueError, match="spec.image"):
        make_job(**bad)


# Found by the generated specs (issue 9 item 9): the builders merge a user's template into the
# pod's metadata and spec and then add labels and fix quantities there, so a template whose
# metadata, spec, labels or annotations is not an object crashed every pass with a traceback
# (AttributeError/TypeError) and left the job without status. The CRD refuses these now; an
# object admitted under an older CRD fails as InvalidSpec naming the field.
@pytest.mark.parametrize("field", ["workers", "launcher"])
@pytest.mark.parametrize("template, named", [
    ({"metadata": "x"}, "template.metadata must be an object, not string"),
    ({"spec": "x"}, "template.spec must be an object, not string"),
    ({"spec": None}, "template.spec must be an object, not null"),
    ({"spec": []}, "template.spec must be an object, not array"),
    ({"metadata": {"labels": None}}, "template.metadata.labels must map names to strings"),
    ({"metadata": {"labels": "a=b"}}, "template.metadata.labels must map names to strings"),
    ({"metadata": {"annotations": {"a": 1}}}, "template.metadata.annotations must map"),
    ("x", "template must be an object (a pod template), not string"),
])
def test_template_of_the_wrong_shape_is_invalid_naming_the_field(field, template, named):
    extra = {"replicas": 12, "gpusPerWorker": 4} if field == "workers" else {}
    with pytest.raises(ValueError, match=f"spec.{field}." + named.replace("(", r"\(")
                       .replace(")", r"\)")):
        make_job(**{field: {**extra, "template": template}})


def test_template_with_empty_metadata_and_spec_builds():
    job = make_job(workers={"replicas": 12, "gpusPerWorker": 4, "template": {
        "metadata": {"labels": {"team": "a"}}, "spec": {"nodeSelector": {"pool": "gpu"}}}},
        launcher={"template": {"metadata": {}, "spec": {}}})
    assert build_worker_statefulset(job, SETTINGS)["spec"]["template"]["metadata"]["labels"][
        "team"] == "a"
    assert build_launcher_pod(job, SETTINGS)["spec"]["restartPolicy"] == "Never"


def test_the_crds_image_rule_admits_references_and_refuses_the_rest():
    # The CEL rule on spec.image and spec.launcher.image (the same regular expression, RE2
    # syntax that Python's re reads alike here).
    import re
    from pathlib import Path

    import yaml

    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" /
                          "monarchjobs.monarch-operator.dev.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [spec["properties"]["image"]["x-kubernetes-validations"][0]["rule"],
             spec["properties"]["launcher"]["properties"]["image"][
                 "x-kubernetes-validations"][0]["rule"]]
    assert rules[1] == "self == '' || " + rules[0]  # an empty launcher image: spec.image
    pattern = re.fullmatch(r"self\.matches\('(.*)'\)", rules[0]).group(1)
    for image in ["worker", "img:1", "ghcr.io/monarch-operator/worker:0.1.0",
                  "localhost:5000/worker@sha256:" + "a" * 64, "nvcr.io/nvidia/pytorch:24.05-py3",
                  "python:3.11.14-slim-bookworm", "my_org/my__img:latest"]:
        assert re.match(pattern, image), image
    for image in ["Bad Image!!:::", "MyImage", "img:", "img:1:2", "-img", "img/",
                  "ghcr.io//x", "img@sha256:xyz", "img tag"]:
        assert not re.match(pattern, image), image


def _shm_mounts(job):
    """(mounts at /dev/shm in the worker container, volumes named by them) of the worker pod."""
    spec = build_worker_statefulset(job, SETTINGS)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    names = {m["name"] for m in mounts}
    return mounts, [v for v in spec["volumes"] if v["name"] in names]


def test_worker_gets_a_memory_backed_dev_shm_sized_by_the_kubelet():
    # Field case C25: not the runtime's 64 MiB; no sizeLimit of ours (pod memory limit, else
    # the node's allocatable memory).
    mounts, volumes = _shm_mounts(make_job())
    assert [m["name"] for m in mounts] == ["dshm"]
    assert volumes == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def test_a_template_sizes_dev_shm_by_the_volume_name():
    job = make_job(workers={"replicas": 1, "gpusPerWorker": 2, "template": {"spec": {
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]}}})
    mounts, volumes = _shm_mounts(job)
    assert len(mounts) == 1
    assert volumes == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]


def test_the_users_own_dev_shm_mount_wins_and_is_the_only_one():
    job = make_job(workers={"replicas": 1, "gpusPerWorker": 2, "template": {"spec": {
        "containers": [{"name": "worker", "volumeMounts": [
            {"name": "bigshm", "mountPath": "/dev/shm"}]}],
        "volumes": [{"name": "bigshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]}}})
    mounts, volumes = _shm_mounts(job)
    assert [m["name"] for m in mounts] == ["bigshm"]
    assert [v["name"] for v in volumes] == ["bigshm"]
    spec = build_worker_statefulset(job, SETTINGS)["spec"]["template"]["spec"]
    assert "dshm" not in {v["name"] for v in spec["volumes"]}
