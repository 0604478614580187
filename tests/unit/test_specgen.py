"""The MonarchJob spec generator of the generated-specs tests (issue 9 item 9): reproducible,
unique names, and the specs meant to be valid build every child without error."""

from __future__ import annotations

import json

from monarch_operator import names
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.testing import specgen

COUNT = 80


def test_derandomized_specs_are_the_same_every_run_and_a_seed_changes_them():
    first = [spec.body for spec in specgen.generate_specs(COUNT)]
    assert first == [spec.body for spec in specgen.generate_specs(COUNT)]
    assert first != [spec.body for spec in specgen.generate_specs(COUNT, seed=7)]


def test_names_are_unique_and_manifests_are_json():
    specs = specgen.generate_specs(COUNT)
    manifests = [spec.manifest(index) for index, spec in enumerate(specs)]
    assert len({m["metadata"]["name"] for m in manifests}) == COUNT
    json.dumps(manifests)
    # A quarter valid, the rest with flaws of every expectation.
    assert sum(1 for spec in specs if not spec.flaws) == COUNT // specgen.VALID_EVERY
    assert {spec.expected for spec in specs} >= set(specgen.Expect)


def test_valid_specs_are_valid_names_and_build_every_child():
    for index, spec in enumerate(specgen.generate_specs(COUNT)):
        if spec.flaws:
            continue
        body = spec.manifest(index)
        names.validate_job_name(body["metadata"]["name"])
        job = JobSpec.from_body({**body, "metadata": {**body["metadata"], "namespace": "ns",
                                                      "uid": "u"}})
        worker_labels = build_worker_statefulset(job, Settings())["spec"]["template"][
            "metadata"]["labels"]
        assert worker_labels[specgen.SIMULATE_LABEL] == "ready"
        build_launcher_pod(job, Settings())


def test_every_flaw_is_planned_within_one_round():
    planned = {flaw for index in range(len(specgen.FLAWS) * 2)
               for flaw in specgen.planned_flaws(index, 0)}
    assert planned == set(range(len(specgen.FLAWS)))


def test_every_third_spec_gets_a_spec_change_and_every_change_comes_up():
    specs = specgen.generate_specs(len(specgen.UPDATES) * specgen.UPDATE_EVERY)
    changed = [spec for spec in specs if spec.update]
    assert len(changed) == len(specgen.UPDATES)
    assert {spec.update for spec in changed} == {name for name, _ in specgen.UPDATES}
    suspend = next(spec for spec in changed if spec.update == "image-suspended")
    updated = suspend.updated_manifest(1)["spec"]
    assert updated["suspend"] is True
    assert updated["image"] != suspend.manifest(1)["spec"].get("image")
