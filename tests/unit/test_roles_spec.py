"""spec.workerGroups and spec.roles in JobSpec.from_body: the four-role example parses, each
rule refuses naming its field with the CRD's own message (tests/roles_cases.py; the cluster
test applies the same manifests to the API server), and the CRD lists exactly those rules."""

from pathlib import Path

import pytest
import yaml

from monarch_operator import names
from monarch_operator.controller.judge import judging
from monarch_operator.controller.spec import groups
from monarch_operator.controller.spec.rules import InvalidSpecError
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts
from tests.roles_cases import REFUSALS, refused_job, roles_job

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"


def test_the_four_role_example_parses_into_groups_and_roles():
    job = JobSpec.from_body(roles_job())
    assert [(g.name, g.replicas, g.gpus_per_worker, g.slots) for g in job.groups] == [
        ("generator", 2, 4, 4), ("trainer", 1, 4, 4), ("reward", 1, 0, 1)]
    assert job.worker_count == 4
    assert job.worker_pod_names() == ["rl-generator-0", "rl-generator-1", "rl-trainer-0",
                                      "rl-reward-0"]
    assert [(r.name, r.group, r.hosts, r.gpus, r.colocate_with) for r in job.roles] == [
        ("generator", "generator", None, None, None), ("trainer", "trainer", None, 2, None),
        ("ref", "trainer", None, 2, "trainer"), ("reward", "reward", None, None, None)]


def test_a_job_without_groups_has_its_one_unnamed_group():
    job = JobSpec.from_body({"metadata": {"name": "demo"},
                             "spec": {"image": "img:1", "workers": {"replicas": 3}}})
    (group,) = job.groups
    assert (group.name, group.replicas, group.gpus_per_worker, group.labelled) == (
        names.LEGACY_GROUP, 3, 8, False)
    assert job.roles == () and job.worker_groups == ()
    assert job.worker_pod_names() == ["demo-worker-0", "demo-worker-1", "demo-worker-2"]


def test_roles_take_consecutive_slices_in_role_order():
    body = roles_job()
    body["spec"]["workerGroups"][0]["replicas"] = 5
    body["spec"]["roles"][0]["hosts"] = 2
    body["spec"]["roles"].insert(1, {"name": "critic", "group": "generator", "hosts": 1})
    body["spec"]["roles"].append({"name": "rest", "group": "generator"})
    job = JobSpec.from_body(body)
    assert groups.role_ordinals(job.worker_groups, job.roles) == {
        "generator": [0, 1], "critic": [2], "trainer": [0], "ref": [0], "reward": [0],
        "rest": [3, 4]}


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r.name for r in REFUSALS])
def test_each_rule_refuses_naming_the_field_with_the_crds_message(refusal):
    with pytest.raises(InvalidSpecError) as raised:
        JobSpec.from_body(refused_job(refusal))
    assert refusal.message in str(raised.value)


def test_the_longest_group_name_that_fits_is_admitted():
    body = roles_job("j" * 43)
    body["spec"]["workerGroups"][0]["name"] = "g" * 8
    body["spec"]["roles"][0]["group"] = "g" * 8
    job = JobSpec.from_body(body)
    assert len(names.group_set(job.name, "g" * 8)) == names.MAX_GROUP_SET_LENGTH == 52


def _rules(schema, found):
    """Every x-kubernetes-validations entry under ``schema``."""
    if isinstance(schema, dict):
        found += schema.get("x-kubernetes-validations") or []
        for value in schema.values():
            _rules(value, found)
    elif isinstance(schema, list):
        for value in schema:
            _rules(value, found)
    return found


def test_the_crd_and_from_body_have_the_same_group_and_role_rules():
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    # The group image's rule is spec.image's, which from_body leaves to the API server too.
    fields = [rule for rule in _rules(spec["properties"]["workerGroups"], [])
              + _rules(spec["properties"]["roles"], [])
              if not rule["message"].startswith("must be an image reference")]
    ours = fields + [rule for rule in schema["x-kubernetes-validations"]
                     + spec["x-kubernetes-validations"]
                     if "oldSelf" not in rule["rule"]
                     and ("workerGroups" in rule["rule"] or "roles" in rule["rule"])]
    assert sorted(rule["message"] for rule in ours) == sorted(groups.RULE_MESSAGES)
    assert spec["properties"]["workerGroups"]["maxItems"] == groups.MAX_GROUPS == 17
    assert spec["properties"]["roles"]["maxItems"] == groups.MAX_ROLES
    item = spec["properties"]["workerGroups"]["items"]["properties"]
    assert item["gpusPerWorker"]["minimum"] == 0
    assert names.GROUP_NAME_PATTERN in item["name"]["x-kubernetes-validations"][0]["rule"]
    for reserved in names.RESERVED_GROUP_NAMES:
        assert f"'{reserved}'" in item["name"]["x-kubernetes-validations"][0]["rule"]
    assert f"<= {names.MAX_GROUP_SET_LENGTH})" in schema["x-kubernetes-validations"][0]["rule"]
    workers = spec["properties"]["workers"]["properties"]
    assert (workers["replicas"]["default"], workers["gpusPerWorker"]["default"]) == (
        groups.WORKERS_DEFAULT_REPLICAS, groups.WORKERS_DEFAULT_GPUS)
    assert "(self.workers.replicas == 2 && self.workers.gpusPerWorker == 8)" in [
        r["rule"] for r in spec["x-kubernetes-validations"]][
        [r["message"] for r in spec["x-kubernetes-validations"]].index(groups.MSG_NO_WORKERS)]


def test_groups_and_roles_cannot_change_unless_suspended():
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    transitions = {r["fieldPath"] for r in spec["x-kubernetes-validations"]
                   if "oldSelf" in r["rule"]}
    assert {".workerGroups", ".roles"} <= transitions


def test_the_group_limit_follows_the_pinned_kueue():
    # Kueue v0.19.2: jobframework.MaxPodSets = 18 (Workload.spec.podSets MaxItems), one of
    # them the launcher's. A Kueue bump must look at the limit again.
    from monarch_operator.localcluster.kueue import KUEUE_VERSION

    assert KUEUE_VERSION.startswith("v0.19.")
    assert groups.MAX_GROUPS + 1 == 18


def test_a_lost_worker_is_worded_with_its_group_only_in_a_job_with_groups():
    lost = [attempts.LostWorker("rl-generator-1", "deleted"),
            attempts.LostWorker("rl-reward-0", "evicted by a drain of node n1")]
    assert judging.lost_mid_run_message(JobSpec.from_body(roles_job()), lost) == (
        "worker rl-generator-1 (group generator, deleted), rl-reward-0 (group reward, evicted "
        "by a drain of node n1) lost mid-run")
    legacy = JobSpec.from_body({"metadata": {"name": "demo"}, "spec": {
        "image": "img:1", "workers": {"replicas": 2}}})
    assert legacy.group_of_pod("demo-worker-1") is None
    assert judging.lost_mid_run_message(
        legacy, [attempts.LostWorker("demo-worker-1", "deleted")]) == (
        "worker demo-worker-1 (deleted) lost mid-run")
