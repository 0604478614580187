"""Child names and the job-name limit (field case C7)."""

from pathlib import Path

import pytest
import yaml

from monarch_operator import names

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"


def test_longest_child_fits_revision_hash_label():
    longest = "a" * names.MAX_JOB_NAME_LENGTH
    names.validate_job_name(longest)
    revision_label = f"{names.worker_set(longest)}-{'x' * 10}"
    assert len(revision_label) == 63
    assert names.MAX_JOB_NAME_LENGTH == 45


@pytest.mark.parametrize(
    ("job_name", "fragment"),
    [
        ("a" * 46, "at most 45"),
        ("exp.v2", "DNS-1035"),
        ("7b-run", "starting with a letter"),
        ("Demo", "lowercase"),
        ("demo-", "DNS-1035"),
    ],
)
def test_invalid_job_names_are_refused_with_the_rule(job_name, fragment):
    with pytest.raises(ValueError, match=fragment):
        names.validate_job_name(job_name)


def test_crd_cel_rules_use_the_same_limit_and_pattern():
    crd = yaml.safe_load(CRD.read_text())
    # On metadata.name itself, so that a refusal names the field (not "<nil>").
    name = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"][
        "properties"]["name"]
    rules = [r["rule"] for r in name["x-kubernetes-validations"]]
    assert f"size(self) <= {names.MAX_JOB_NAME_LENGTH}" in rules
    assert any(names.JOB_NAME_PATTERN in rule for rule in rules)


def test_child_names():
    assert names.ssh_secret("demo") == "demo-ssh"
    assert names.worker_set("demo") == "demo-worker"
    assert names.worker_pod("demo", 10) == "demo-worker-10"
    assert names.hostfile_configmap("demo") == "demo-hostfile"
    assert names.launcher_pod("demo") == "demo-launcher"
    assert (names.worker_fqdn("demo", "team-a", 2, "cluster.local")
            == "demo-worker-2.demo-worker.team-a.svc.cluster.local")
