"""The children of a job with worker groups and roles (docs/roles.md): a StatefulSet and
Service per group named from names.py, its pods labelled with the group, GPUs per group (none
for a CPU-only one), one hostfile of every group plus a key per group, MONARCH_ROLES on the
launcher, the NetworkPolicy over every group, one Kueue pod set per group with admission
applied per group (field case C31); a job without groups keeps its children as they were."""

from __future__ import annotations

import json

from monarch_operator import constants, names
from monarch_operator.controller.builders.hostfile import build_hostfile_configmap
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.secret import worker_host_pattern
from monarch_operator.controller.builders.service import (
    build_worker_service,
    build_worker_services,
)
from monarch_operator.controller.builders.statefulset import (
    build_worker_statefulset,
    build_worker_statefulsets,
)
from monarch_operator.controller.kueue import admission
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.hostfile import parse_hostfile
from monarch_operator.launcher.hosts.layout import plan_layout
from monarch_operator.launcher.hosts.rolespecs import roles_from_json
from tests.roles_cases import roles_job

SETTINGS = Settings()
DOMAIN = "team-a.svc.cluster.local"


def job(**spec) -> JobSpec:
    body = roles_job("rl", **spec)
    body["metadata"].update(namespace="team-a", uid="u-1")
    return JobSpec.from_body(body)


def fqdn(group: str, ordinal: int) -> str:
    return f"rl-{group}-{ordinal}.rl-{group}.{DOMAIN}"


def test_one_statefulset_and_service_per_group_labelled_with_the_group():
    spec = job()
    sets = build_worker_statefulsets(spec, SETTINGS)
    services = build_worker_services(spec)
    assert [s["metadata"]["name"] for s in sets] == ["rl-generator", "rl-trainer", "rl-reward"]
    assert [s["metadata"]["name"] for s in services] == [s["metadata"]["name"] for s in sets]
    for worker_set, service, group in zip(sets, services, spec.groups, strict=True):
        selector = worker_set["spec"]["selector"]["matchLabels"]
        assert selector[constants.LABEL_GROUP] == group.name
        assert service["spec"]["selector"] == selector
        assert worker_set["spec"]["template"]["metadata"]["labels"][
            constants.LABEL_GROUP] == group.name
        assert worker_set["spec"]["serviceName"] == service["metadata"]["name"]
        assert worker_set["spec"]["replicas"] == group.replicas
        pod = worker_set["spec"]["template"]["spec"]
        assert pod["dnsConfig"]["searches"] == [f"rl-{group.name}.{DOMAIN}"]
    limits = [(s["spec"]["template"]["spec"]["containers"][0].get("resources") or {}).get(
        "limits", {}) for s in sets]
    assert limits == [{constants.GPU_RESOURCE: "4"}, {constants.GPU_RESOURCE: "4"}, {}]


def test_a_group_template_merges_over_the_workers_template_and_its_image_wins():
    body = roles_job("rl", workers={"template": {"spec": {
        "nodeSelector": {"zone": "z1"},
        "containers": [{"name": "worker", "env": [{"name": "A", "value": "1"}]}]}}})
    body["spec"]["workerGroups"][2].update(image="cpu:1", template={"spec": {
        "nodeSelector": {"pool": "cpu"},
        "containers": [{"name": "worker", "env": [{"name": "B", "value": "2"}]}]}})
    spec = JobSpec.from_body(body)
    generator, _, reward = build_worker_statefulsets(spec, SETTINGS)
    reward_pod = reward["spec"]["template"]["spec"]
    assert reward_pod["nodeSelector"] == {"zone": "z1", "pool": "cpu"}
    env = {e["name"]: e.get("value") for e in reward_pod["containers"][0]["env"]}
    assert (env["A"], env["B"]) == ("1", "2")
    assert reward_pod["containers"][0]["image"] == "cpu:1"
    generator_pod = generator["spec"]["template"]["spec"]
    assert generator_pod["nodeSelector"] == {"zone": "z1"}
    assert generator_pod["containers"][0]["image"] == spec.image


def test_the_hostfile_lists_every_group_in_order_plus_a_key_per_group():
    data = build_hostfile_configmap(job(), SETTINGS)["data"]
    hosts = parse_hostfile(data["hostfile"])
    assert [(h.name, h.slots) for h in hosts] == [
        (fqdn("generator", 0), 4), (fqdn("generator", 1), 4), (fqdn("trainer", 0), 4),
        (fqdn("reward", 0), 1)]  # a CPU-only worker takes one process
    assert data["hostfile.reward"] == f"{fqdn('reward', 0)} slots=1\n"
    assert [h.name for h in parse_hostfile(data["hostfile.generator"])] == [
        fqdn("generator", 0), fqdn("generator", 1)]
    pods = [{"metadata": {"name": name}, "status": {"podIP": f"192.0.2.{i}"}}
            for i, name in enumerate(job().worker_pod_names())]
    addresses = build_hostfile_configmap(job(), SETTINGS, pods)["data"]["addresses"]
    assert addresses.splitlines()[3] == f"{fqdn('reward', 0)} 192.0.2.3"


def test_the_launcher_gets_monarch_roles_and_no_trainer_ref_variables():
    env = {e["name"]: e.get("value") for e in
           build_launcher_pod(job(), SETTINGS)["spec"]["containers"][0]["env"]}
    assert json.loads(env[constants.ENV_ROLES]) == [
        {"name": "generator", "hosts": [fqdn("generator", 0), fqdn("generator", 1)]},
        {"name": "trainer", "hosts": [fqdn("trainer", 0)], "gpus": 2},
        {"name": "ref", "hosts": [fqdn("trainer", 0)], "gpus": 2, "colocateWith": "trainer"},
        {"name": "reward", "hosts": [fqdn("reward", 0)], "gpus": 0}]
    hostfile_names = [h.name for h in parse_hostfile(
        build_hostfile_configmap(job(), SETTINGS)["data"]["hostfile"])]
    for role in json.loads(env[constants.ENV_ROLES]):
        assert set(role["hosts"]) <= set(hostfile_names)
    for legacy in (constants.ENV_TRAINER_HOSTS, constants.ENV_REF_HOSTS, constants.ENV_COLOCATE):
        assert legacy not in env
    assert constants.ENV_ROLES in constants.LAUNCHER_RESERVED_ENV


def test_roles_with_hosts_and_procs_in_the_env():
    body = roles_job("rl")
    body["spec"]["workerGroups"][0]["replicas"] = 3
    body["spec"]["roles"][0].update(hosts=2, procs=4)
    body["spec"]["roles"].insert(1, {"name": "critic", "group": "generator"})
    spec = JobSpec.from_body({**body, "metadata": {"name": "rl", "namespace": "team-a"}})
    env = {e["name"]: e.get("value") for e in
           build_launcher_pod(spec, SETTINGS)["spec"]["containers"][0]["env"]}
    roles = json.loads(env[constants.ENV_ROLES])
    assert roles[0] == {"name": "generator", "hosts": [fqdn("generator", 0),
                                                       fqdn("generator", 1)], "procs": 4}
    assert roles[1] == {"name": "critic", "hosts": [fqdn("generator", 2)]}


def test_known_hosts_and_network_policy_cover_every_group():
    spec = job()
    assert worker_host_pattern(spec, SETTINGS).split(",") == [
        f"[*.rl-{group}.{DOMAIN}]:2222" for group in ("generator", "trainer", "reward")]
    selector = build_network_policy(spec)["spec"]["podSelector"]["matchLabels"]
    for worker_set in build_worker_statefulsets(spec, SETTINGS):
        labels = worker_set["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()


def test_a_job_without_groups_keeps_its_children_as_they_were():
    legacy = JobSpec.from_body({"metadata": {"name": "demo", "namespace": "team-a"},
                                "spec": {"image": "img:1", "workers": {"replicas": 3,
                                                                       "gpusPerWorker": 2}}})
    (worker_set,) = build_worker_statefulsets(legacy, SETTINGS)
    assert worker_set == build_worker_statefulset(legacy, SETTINGS)
    assert worker_set["metadata"]["name"] == names.worker_set("demo") == "demo-worker"
    assert constants.LABEL_GROUP not in worker_set["spec"]["selector"]["matchLabels"]
    assert constants.LABEL_GROUP not in worker_set["spec"]["template"]["metadata"]["labels"]
    assert constants.LABEL_GROUP not in worker_set["metadata"]["labels"]
    assert build_worker_service(legacy)["metadata"]["name"] == "demo-worker"
    data = build_hostfile_configmap(legacy, SETTINGS)["data"]
    assert sorted(data) == ["hostfile"]
    assert worker_host_pattern(legacy, SETTINGS) == f"[*.demo-worker.{DOMAIN}]:2222"
    env = {e["name"] for e in build_launcher_pod(legacy, SETTINGS)["spec"]["containers"][0]["env"]}
    assert constants.ENV_ROLES not in env and constants.ENV_TRAINER_HOSTS in env
    pod_sets = wl.build_workload(legacy, SETTINGS, "q")["spec"]["podSets"]
    assert [(p["name"], p["count"]) for p in pod_sets] == [("workers", 3), ("launcher", 1)]


def test_one_kueue_pod_set_per_group_with_its_own_count_and_requests():
    spec = job()
    pod_sets = wl.build_workload(spec, SETTINGS, "q")["spec"]["podSets"]
    assert [(p["name"], p["count"]) for p in pod_sets] == [
        ("generator", 2), ("trainer", 1), ("reward", 1), ("launcher", 1)]
    for pod_set, worker_set in zip(pod_sets, build_worker_statefulsets(spec, SETTINGS),
                                   strict=False):
        assert pod_set["template"] == worker_set["spec"]["template"]
        assert pod_set["topologyRequest"]["podIndexLabel"] == "apps.kubernetes.io/pod-index"


def _flavored(reward_selector=None):
    body = roles_job("rl")
    body["metadata"]["namespace"] = "team-a"
    if reward_selector:
        body["spec"]["workerGroups"][2]["template"] = {"spec": {"nodeSelector": reward_selector}}
    spec = JobSpec.from_body(body)
    updates = {"generator": wl.PodSetUpdate(node_selector={"pool": "gpu-a"}),
               "trainer": wl.PodSetUpdate(node_selector={"pool": "gpu-a"}),
               "reward": wl.PodSetUpdate(node_selector={"pool": "cpu"},
                                         tolerations=[{"key": "cpu", "operator": "Exists"}]),
               "launcher": wl.PodSetUpdate(node_selector={"pool": "cpu"})}
    return spec, updates


def test_admission_puts_each_groups_flavor_into_that_group_only():
    spec, updates = _flavored({"zone": "z1"})
    assert admission._flavor_conflict(spec, updates) is None
    admitted = admission._with_admission(spec, updates)
    selectors = [s["spec"]["template"]["spec"]["nodeSelector"]
                 for s in build_worker_statefulsets(admitted, SETTINGS)]
    assert selectors == [{"pool": "gpu-a"}, {"pool": "gpu-a"}, {"pool": "cpu", "zone": "z1"}]
    reward_pod = build_worker_statefulsets(admitted, SETTINGS)[2]["spec"]["template"]["spec"]
    assert reward_pod["tolerations"] == [{"key": "cpu", "operator": "Exists"}]
    # The job's own spec is untouched: an eviction builds from it again.
    assert spec.worker_groups[0].template == {}


def test_a_group_selector_that_contradicts_its_flavor_is_refused_naming_both():
    spec, updates = _flavored({"pool": "gpu-b"})
    message = admission._flavor_conflict(spec, updates)
    assert message is not None
    assert "'reward'" in message and "pool=gpu-b" in message and "pool=cpu" in message


def test_kubectl_monarch_places_each_roles_ranks_on_its_workers():
    from monarch_operator.plugin import views

    body = roles_job("rl")
    body["metadata"]["namespace"] = "team-a"
    places = [(p.role, p.rank, p.ordinal, p.gpu) for p in views.rank_places(body)]
    assert [p for p in places if p[0] == "ref"] == [("ref", 0, 2, 2), ("ref", 1, 2, 3)]
    assert [p for p in places if p[0] == "reward"] == [("reward", 0, 3, 0)]
    assert len([p for p in places if p[0] == "generator"]) == 8
    rows = views.hosts_table(body, [])
    assert rows[-1][3:5] == [fqdn("reward", 0), "rl-reward-0 (missing)"]


def test_a_group_kueue_cannot_place_for_its_own_selector_is_explained(monkeypatch):
    from monarch_operator.controller.kueue import client

    spec, _ = _flavored({"pool": "gpu-b"})
    monkeypatch.setattr(client, "flavor_specs", lambda names: {
        "cpu-f": {"nodeLabels": {"pool": "cpu"}}})
    kueue_words = ("couldn't assign flavors to pod set reward: flavor cpu-f doesn't match "
                   "node affinity")
    assert admission._selector_hint(spec, kueue_words) == (
        "; spec.workerGroups 'reward': its nodeSelector pool=gpu-b contradicts pool=cpu of "
        "flavor cpu-f")
    assert admission._selector_hint(spec, "insufficient quota") == ""


def test_the_launcher_plans_what_the_operator_gives_it():
    # The two halves of the contract meet: the operator's hostfile and MONARCH_ROLES, read by
    # the launcher's own parser and planner, give each role its hosts and GPUs; the CPU-only
    # group's role gets no device (it once got CUDA_VISIBLE_DEVICES=0 from slots=1).
    env = {e["name"]: e.get("value") for e in
           build_launcher_pod(job(), SETTINGS)["spec"]["containers"][0]["env"]}
    hosts = parse_hostfile(build_hostfile_configmap(job(), SETTINGS)["data"]["hostfile"])
    plan = plan_layout(hosts, roles_from_json(env[constants.ENV_ROLES], constants.ENV_ROLES))
    placed = {role.role: (role.hosts, role.procs_per_host, role.cuda_visible_devices)
              for role in plan.roles}
    assert placed == {"generator": (2, 4, "0,1,2,3"), "trainer": (1, 2, "0,1"),
                      "ref": (1, 2, "2,3"), "reward": (1, 1, "")}
