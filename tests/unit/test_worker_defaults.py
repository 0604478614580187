"""The operator's default worker labels and env (chart ``workerDefaults``, field case C33):
read from the environment with clear errors, applied under the job's own labels and env, and
kept out of the Kueue Workload (an upgrade that changes them must not replace a queued job's
Workload)."""

from __future__ import annotations

import dataclasses

import pytest

from monarch_operator import constants
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.kueue.workload import ANNOTATION_SPEC_HASH, build_workload
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from tests.chart import CHART, by_kind, helm, render

DEFAULTS = Settings(worker_labels=(("cost-centre", "ml"), ("team", "default")),
                    worker_env=(("HF_HOME", "/cache/hf"), ("SSH_PORT", "1")))


def make_job(labels=None, **spec):
    body = {"metadata": {"name": "demo", "namespace": "team-a", "uid": "uid-1",
                         "generation": 1, "labels": labels or {}},
            "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                     "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}, **spec}}
    return JobSpec.from_body(body)


def worker_env(statefulset):
    [container] = statefulset["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value") for item in container["env"]}


def test_settings_read_labels_and_env_as_sorted_pairs(monkeypatch):
    monkeypatch.setenv("MONARCH_OPERATOR_WORKER_LABELS", '{"team": "a", "example.com/tier": "x"}')
    monkeypatch.setenv("MONARCH_OPERATOR_WORKER_ENV", '{"B": "2", "A_1": ""}')
    settings = Settings.from_env()
    assert settings.worker_labels == (("example.com/tier", "x"), ("team", "a"))
    assert settings.worker_env == (("A_1", ""), ("B", "2"))


def test_settings_without_the_variables_have_none(monkeypatch):
    monkeypatch.delenv("MONARCH_OPERATOR_WORKER_LABELS", raising=False)
    monkeypatch.setenv("MONARCH_OPERATOR_WORKER_ENV", "")
    settings = Settings.from_env()
    assert (settings.worker_labels, settings.worker_env) == ((), ())


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("MONARCH_OPERATOR_WORKER_LABELS", "{not json", "not JSON"),
    ("MONARCH_OPERATOR_WORKER_LABELS", '["a"]', "JSON object of strings"),
    ("MONARCH_OPERATOR_WORKER_LABELS", '{"a": 1}', "JSON object of strings"),
    ("MONARCH_OPERATOR_WORKER_LABELS", '{"bad key!": "x"}', "label key 'bad key!'"),
    ("MONARCH_OPERATOR_WORKER_LABELS", '{"Upper.Case/x": "x"}', "label key"),
    ("MONARCH_OPERATOR_WORKER_LABELS", '{"team": "' + "v" * 64 + '"}', "at most 63"),
    ("MONARCH_OPERATOR_WORKER_ENV", '{"1ABC": "x"}', "env name '1ABC'"),
    ("MONARCH_OPERATOR_WORKER_ENV", '{"A-B": "x"}', "env name 'A-B'"),
])
def test_bad_defaults_are_refused_naming_the_variable(monkeypatch, variable, value, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable) as raised:
        Settings.from_env()
    assert words in str(raised.value)


def test_defaults_reach_the_worker_pods_under_the_jobs_own():
    job = make_job(labels={"team": "mine"}, workers={
        "replicas": 2, "gpusPerWorker": 1,
        "template": {"spec": {"containers": [{"name": "worker",
                                              "env": [{"name": "HF_HOME", "value": "/x"}]}]}}})
    statefulset = build_worker_statefulset(job, DEFAULTS)
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert labels["cost-centre"] == "ml"
    assert labels["team"] == "mine"  # the job's label wins
    assert labels[constants.LABEL_JOB] == "demo"
    env = worker_env(statefulset)
    assert env["HF_HOME"] == "/x"  # the job's template wins
    assert env["SSH_PORT"] == str(constants.SSH_PORT)  # the operator's own wins
    # Only the pod template: the StatefulSet's own labels and selector are as before.
    plain = build_worker_statefulset(job, Settings())
    assert statefulset["metadata"] == plain["metadata"]
    assert statefulset["spec"]["selector"] == plain["spec"]["selector"]
    assert "cost-centre" not in plain["spec"]["template"]["metadata"]["labels"]


def test_defaults_change_nothing_the_workload_asks_kueue_for():
    job = make_job()
    before = build_workload(job, Settings(kueue=True), "user-queue")
    after = build_workload(job, dataclasses.replace(DEFAULTS, kueue=True), "user-queue")
    assert after == before
    assert (after["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
            == before["metadata"]["annotations"][ANNOTATION_SPEC_HASH])


def test_chart_passes_worker_defaults_to_the_operator_as_json():
    [deployment] = by_kind(render("--set", "workerDefaults.labels.team=a",
                                  "--set", "workerDefaults.env.HF_HOME=/cache"), "Deployment")
    env = {item["name"]: item.get("value")
           for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MONARCH_OPERATOR_WORKER_LABELS"] == '{"team":"a"}'
    assert env["MONARCH_OPERATOR_WORKER_ENV"] == '{"HF_HOME":"/cache"}'
    [plain] = by_kind(render(), "Deployment")
    names = {item["name"] for item in plain["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not names & {"MONARCH_OPERATOR_WORKER_LABELS", "MONARCH_OPERATOR_WORKER_ENV"}


def test_chart_schema_refuses_a_bad_env_name():
    result = helm("template", "mo", str(CHART), "--set", "workerDefaults.env.1X=a", check=False)
    # (helm v3.22 names the wrong path for a propertyNames failure; the name and rule are right)
    assert result.returncode != 0 and "'1X' does not match pattern" in result.stderr, \
        result.stderr
