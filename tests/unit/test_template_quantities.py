"""Resource quantities inside pod templates (spec.workers.template, spec.launcher.template):
the API server refuses a malformed one without naming the field, so the spec check names it
(the job fails at its first pass, InvalidSpec, before anything is created)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from monarch_operator.controller.spec.rules import QUANTITY_PATTERN, InvalidSpecError
from monarch_operator.controller.spec.spec import JobSpec

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"


def body(**spec: object) -> dict:
    return {"metadata": {"name": "q", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                     "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}, **spec}}


@pytest.mark.parametrize(("spec", "field", "value"), [
    ({"workers": {"replicas": 2, "gpusPerWorker": 1, "template": {"spec": {"containers": [
        {"name": "worker", "resources": {"limits": {"cpu": "lots"}}}]}}}},
     "spec.workers.template.spec.containers[0].resources.limits.cpu", "lots"),
    ({"launcher": {"template": {"spec": {"initContainers": [
        {"name": "prep"}, {"name": "fetch", "resources": {"requests": {"memory": "8GG"}}}]}}}},
     "spec.launcher.template.spec.initContainers[1].resources.requests.memory", "8GG"),
    ({"launcher": {"template": {"spec": {"resources": {"limits": {"cpu": ""}}}}}},
     "spec.launcher.template.spec.resources.limits.cpu", ""),
], ids=["worker-container", "launcher-init-container", "pod-level-empty"])
def test_a_malformed_quantity_in_a_template_names_its_field(spec, field, value):
    with pytest.raises(InvalidSpecError) as raised:
        JobSpec.from_body(body(**spec))
    assert str(raised.value) == (f"{field} must be a quantity such as 2, 500m or 8Gi, "
                                 f"not {value!r}")


def test_quantities_as_kubernetes_writes_them_pass():
    JobSpec.from_body(body(workers={"replicas": 2, "gpusPerWorker": 1, "template": {"spec": {
        "containers": [{"name": "worker", "resources": {
            "limits": {"cpu": 2, "memory": "8Gi", "ephemeral-storage": "1e9"},
            "requests": {"cpu": "500m", "memory": "0.5Gi"}}}]}}}))


def test_the_pattern_is_the_crds():
    """The same rule as the CRD's for spec.launcher.resources (admission)."""
    text = CRD.read_text()
    patterns = {line.split("pattern:", 1)[1].strip().strip("'")
                for line in text.splitlines() if "pattern:" in line and "[KMGTPE]i" in line}
    assert patterns == {QUANTITY_PATTERN.pattern}, patterns
    assert yaml.safe_load(text)  # still a valid manifest
