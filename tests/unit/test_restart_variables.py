"""Restart variables on every rank (field case C21), without a cluster: the operator gives the
launcher pod the job's restart count when the attempt started (a resume is no restart) and the
most its run policy allows; ``monarch-torchrun`` reads them once and every rank gets the same
``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS`` and ``MONARCH_ATTEMPT``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.k8s import client, deletes, nodes, writes
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import attempts
from monarch_operator.launcher.programs.spmd import SpmdConfigError, restart_variables
from monarch_operator.launcher.programs.spmd_actor import World, rank_environment
from monarch_operator.launcher.session.environment import ALLOWED_ENV
from tests.unit.test_launch_pass import job_body, make_view, stored

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def launched_env(status: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The env of the launcher pod a pass over ``status`` (every worker Ready) creates."""
    created: list[dict[str, Any]] = []

    def post(desired: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        created.append(desired)
        return stored(desired, f"uid-{desired['metadata']['name']}")

    monkeypatch.setattr(writes, "_post", post)
    monkeypatch.setattr(writes, "patch_job_status", lambda namespace, name, body: job_body(body))
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: None)
    monkeypatch.setattr(deletes, "stop_pod", lambda pod: False)
    settings = Settings.from_env()
    body = {**job_body(status), "spec": {**job_body()["spec"], "runPolicy": {
        "backoffLimit": 1, "infrastructureBackoffLimit": 2}}}
    with client.reading_from(make_view(settings, status)):
        reconcile.reconcile(body, settings, NOW)
    (pod,) = [obj for obj in created if obj["kind"] == "Pod"]
    return {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}


def test_the_launcher_of_a_restart_gets_the_restart_count_when_it_started(monkeypatch):
    status = attempts.begin({}, 1, "2026-12-01T11:00:00Z")
    status = attempts.begin(status, 2, "2026-12-01T11:01:00Z")  # after a failure
    env = launched_env(status, monkeypatch)
    assert (env["MONARCH_ATTEMPT"], env["MONARCH_RESTART_COUNT"],
            env["MONARCH_MAX_RESTARTS"]) == ("2", "1", "3")


def test_a_resume_after_a_suspend_is_no_restart(monkeypatch):
    status = attempts.begin({}, 1, "2026-12-01T11:00:00Z")
    status = attempts.begin(status, 2, "2026-12-01T11:01:00Z", restart=False)  # suspended
    env = launched_env(status, monkeypatch)
    assert (env["MONARCH_ATTEMPT"], env["MONARCH_RESTART_COUNT"]) == ("2", "0")


def world(**restarts: Any) -> World:
    return World(hosts=("h0", "h1"), addresses=("10.244.0.1", "10.244.0.2"), nproc_per_node=2,
                 master_addr="10.244.0.1", master_port=29500, run_id="r", **restarts)


def test_every_rank_sees_the_same_restart_variables():
    restarts = restart_variables({"MONARCH_ATTEMPT": "2", "MONARCH_RESTART_COUNT": "1",
                                  "MONARCH_MAX_RESTARTS": "3"})
    seen = {(rank_env["RANK"], rank_env["TORCHELASTIC_RESTART_COUNT"],
             rank_env["TORCHELASTIC_MAX_RESTARTS"], rank_env["MONARCH_ATTEMPT"])
            for group in (0, 1) for local in (0, 1)
            for rank_env in [rank_environment(world(**restarts), group, local,
                                              {"MONARCH_ATTEMPT": "stale"})]}
    assert seen == {(str(rank), "1", "3", "2") for rank in range(4)}


def test_standalone_without_a_restart_is_0_everywhere():
    restarts = restart_variables({})
    assert restarts == {"restart_count": 0, "max_restarts": 0, "attempt": None}
    env = rank_environment(world(**restarts), 1, 1, {})
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
    assert "MONARCH_ATTEMPT" not in env


@pytest.mark.parametrize(("variable", "value"), [
    ("MONARCH_RESTART_COUNT", "-1"), ("MONARCH_MAX_RESTARTS", "two"), ("MONARCH_ATTEMPT", "0")])
def test_a_malformed_variable_is_refused_naming_it(variable, value):
    with pytest.raises(SpmdConfigError, match=f"{variable}='{value}': must be a whole number"):
        restart_variables({variable: value})


def test_the_run_variables_reach_the_workers_in_role_mode_too():
    for name in ("MONARCH_ATTEMPT", "MONARCH_RESTART_COUNT", "MONARCH_MAX_RESTARTS"):
        assert name in ALLOWED_ENV
