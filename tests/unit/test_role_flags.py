"""Named roles as users and the operator give them (issue 33): ``--role``, ``--roles``,
``MONARCH_ROLES``, which wins, the dry run's split, and the job API's ``roles``. No ssh, no
Monarch workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monarch_operator import constants
from monarch_operator.launcher.cli import main
from monarch_operator.launcher.hosts.layout import RoleSpec
from monarch_operator.launcher.hosts.plans import RoleNotFound
from monarch_operator.launcher.hosts.rolespecs import (
    RolesFormatError,
    choose_roles,
    role_from_flag,
    roles_argv,
    roles_from_json,
    roles_from_option,
)
from monarch_operator.launcher.programs.job import Job

# Documentation addresses (RFC 5737): nothing is dialed in these tests.
HOSTS = ["--hosts", "192.0.2.1,192.0.2.2,192.0.2.3,192.0.2.4", "--slots-per-host", "4"]
LEGACY = ("MONARCH_TRAINER_HOSTS", "MONARCH_REF_HOSTS", "MONARCH_COLOCATE",
          "MONARCH_TRAINER_GPUS", "MONARCH_REF_GPUS", "MONARCH_ROLES", "MONARCH_HOSTFILE",
          "MONARCH_LAUNCH_ARGS")


@pytest.fixture(autouse=True)
def no_operator_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LEGACY:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("generator=2", RoleSpec("generator", 2)),
        ("trainer=1,gpus=4", RoleSpec("trainer", 1, gpus=4)),
        ("ref=@trainer,gpus=4", RoleSpec("ref", None, gpus=4, colocate_with="trainer")),
        ("reward=node1+node2,gpus=0,procs=2", RoleSpec("reward", ("node1", "node2"), gpus=0,
                                                        procs=2)),
        ("critic=node7", RoleSpec("critic", ("node7",))),
    ],
)
def test_role_flag_syntax(text: str, spec: RoleSpec) -> None:
    assert role_from_flag(text) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Gen=2", "--role Gen=2: role 'Gen': the name must be lowercase letters and digits"),
        ("gen", "--role gen: expected NAME=HOSTS[,gpus=G][,procs=P]"),
        ("gen=", "--role gen=: expected NAME=HOSTS"),
        ("gen=a++b", "--role gen=a++b: HOSTS 'a++b' is not a count, host+host+... or @ROLE"),
        ("gen=2,gpu=1", "--role gen=2,gpu=1: 'gpu=1' is not gpus=G or procs=P"),
        ("gen=2,gpus=-1", "'gpus=-1' is not gpus=G or procs=P (whole numbers"),
    ],
)
def test_bad_role_flags_name_the_flag_and_the_syntax(text: str, message: str) -> None:
    with pytest.raises(RolesFormatError) as caught:
        role_from_flag(text)
    assert message in str(caught.value)


def test_monarch_roles_json_is_read_in_order() -> None:
    text = json.dumps([
        {"name": "generator", "hosts": ["w-0", "w-1"]},
        {"name": "trainer", "hosts": ["w-2"], "gpus": 2, "procs": 2},
        {"name": "ref", "hosts": ["w-2"], "gpus": 2, "colocateWith": "trainer"},
        {"name": "reward", "hosts": 1, "gpus": 0},
        {"name": "buffer", "colocateWith": "trainer", "gpus": 0},
    ])

    assert roles_from_json(text, "MONARCH_ROLES") == [
        RoleSpec("generator", ("w-0", "w-1")),
        RoleSpec("trainer", ("w-2",), gpus=2, procs=2),
        RoleSpec("ref", ("w-2",), gpus=2, colocate_with="trainer"),
        RoleSpec("reward", 1, gpus=0),
        RoleSpec("buffer", None, gpus=0, colocate_with="trainer"),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("not json", "MONARCH_ROLES: not JSON"),
        ({"name": "x"}, "MONARCH_ROLES: expected a non-empty list of roles"),
        ([], "MONARCH_ROLES: expected a non-empty list of roles"),
        (["x"], "MONARCH_ROLES: role #1 must be an object"),
        ([{"name": "ref_model", "hosts": 1}],
         "MONARCH_ROLES: role 'ref_model': the name must be lowercase letters and digits"),
        ([{"name": 7, "hosts": 1}], "MONARCH_ROLES: role 7: the name must be"),
        ([{"name": "x", "hosts": 1, "gpu": 1}],
         "MONARCH_ROLES: role 'x': unknown key gpu (a role has name, hosts, gpus, procs, "
         "colocateWith)"),
        ([{"name": "x"}], "MONARCH_ROLES: role 'x': hosts (a count, or a list of host names) "
                          "must be an integer of at least 1, got None"),
        ([{"name": "x", "hosts": True}], "role 'x': hosts (a count, or a list of host names)"),
        ([{"name": "x", "hosts": []}], "role 'x': hosts (a count, or a list of host names)"),
        ([{"name": "x", "hosts": 1, "gpus": -1}],
         "MONARCH_ROLES: role 'x': gpus must be an integer of at least 0, got -1"),
        ([{"name": "x", "hosts": 1, "procs": 0}], "role 'x': procs must be an integer of at "
                                                  "least 1, got 0"),
        ([{"name": "x", "hosts": 1, "colocateWith": 3}], "role 'x': colocateWith must be"),
    ],
)
def test_bad_monarch_roles_name_the_variable_the_role_and_the_rule(
    data: object, message: str
) -> None:
    text = data if isinstance(data, str) else json.dumps(data)
    with pytest.raises(RolesFormatError) as caught:
        roles_from_json(text, constants.ENV_ROLES)
    assert message in str(caught.value)


def test_roles_option_reads_yaml_json_files_and_inline_json(tmp_path: Path) -> None:
    expected = [RoleSpec("generator", 2), RoleSpec("ref", None, colocate_with="generator")]
    yaml_file = tmp_path / "roles.yaml"
    yaml_file.write_text("- name: generator\n  hosts: 2\n- name: ref\n  colocateWith: generator\n")
    json_file = tmp_path / "roles.json"
    json_file.write_text(json.dumps([{"name": "generator", "hosts": 2},
                                     {"name": "ref", "colocateWith": "generator"}]))

    assert roles_from_option(str(yaml_file)) == (expected, f"--roles {yaml_file}")
    assert roles_from_option(str(json_file))[0] == expected
    assert roles_from_option(json_file.read_text()) == (expected, "--roles")
    with pytest.raises(RolesFormatError, match="--roles /nonexistent.yaml: cannot read it"):
        roles_from_option("/nonexistent.yaml")


ROLES_JSON = json.dumps([{"name": "generator", "hosts": 1}])


@pytest.mark.parametrize(
    ("flags", "option", "legacy", "environ", "source", "warning"),
    [
        ([], None, [], {"MONARCH_ROLES": ROLES_JSON}, "MONARCH_ROLES", None),
        ([], None, [], {"MONARCH_ROLES": ROLES_JSON, "MONARCH_TRAINER_HOSTS": "2",
                        "MONARCH_COLOCATE": "false"}, "MONARCH_ROLES",
         "MONARCH_ROLES is set, so MONARCH_TRAINER_HOSTS, MONARCH_COLOCATE are ignored"),
        (["trainer=1"], None, [], {"MONARCH_ROLES": ROLES_JSON}, "--role",
         "--role wins over MONARCH_ROLES, which is ignored"),
        (["trainer=1"], None, [], {"MONARCH_TRAINER_HOSTS": "2"}, "--role", None),
        ([], None, ["--trainer-hosts"], {"MONARCH_ROLES": ROLES_JSON}, "",
         "--trainer-hosts given: MONARCH_ROLES is ignored"),
        ([], None, [], {"MONARCH_TRAINER_HOSTS": "2"}, "", None),
    ],
    ids=["env", "env over trainer/ref env", "flag over env", "flag, trainer/ref env",
         "trainer/ref flag over env", "no roles"],
)
def test_which_roles_win(flags: list[str], option: str | None, legacy: list[str],
                         environ: dict[str, str], source: str, warning: str | None) -> None:
    specs, got_source, warnings = choose_roles(flags, option, legacy, environ)

    assert got_source == source
    assert (specs is None) == (source == "")
    assert warnings == ([warning] if warning else [])


def test_role_and_roles_together_are_refused() -> None:
    with pytest.raises(RolesFormatError, match="not both"):
        choose_roles(["a=1"], ROLES_JSON, [], {})


def test_role_flags_are_refused_with_a_trainer_ref_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*HOSTS, "--role", "trainer=2", "--colocate", "--ref-gpus", "1",
                 "--dry-run"]) == 2
    assert ("--role names every role, so it cannot be combined with --colocate, --ref-gpus"
            in capsys.readouterr().err)


def test_a_trainer_ref_variable_is_not_a_flag_and_role_wins_over_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MONARCH_TRAINER_HOSTS", "3")
    monkeypatch.setenv("MONARCH_COLOCATE", "true")

    assert main([*HOSTS, "--role", "trainer=1", "--role", "ref=1", "--dry-run"]) == 0
    assert "mesh ref: hosts=192.0.2.2 procs/host=4" in capsys.readouterr().out


def test_dry_run_prints_the_split_in_text(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*HOSTS, "--role", "generator=2", "--role", "trainer=1,gpus=3",
                 "--role", "ref=@trainer", "--role", "reward=192.0.2.4,gpus=0", "--dry-run"])

    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[1:] == [
        "plan: 4 roles on 3 host meshes, some colocated",
        "mesh generator: hosts=192.0.2.1,192.0.2.2 procs/host=4",
        "mesh trainer: hosts=192.0.2.3 procs/host=4",
        "mesh reward: hosts=192.0.2.4 procs/host=4",
        "role generator: mesh=generator hosts=2 procs/host=4 world=8 "
        "CUDA_VISIBLE_DEVICES=0,1,2,3",
        "role trainer: mesh=trainer hosts=1 procs/host=3 world=3 CUDA_VISIBLE_DEVICES=0,1,2",
        "role ref: mesh=trainer hosts=1 procs/host=1 world=1 CUDA_VISIBLE_DEVICES=3",
        'role reward: mesh=reward hosts=1 procs/host=1 world=1 CUDA_VISIBLE_DEVICES="" '
        "(CPU only)",
        "monarch-launch: dry run: plan only, nothing started",
    ]


def test_dry_run_json_split_from_monarch_roles_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MONARCH_ROLES", json.dumps([
        {"name": "trainer", "hosts": ["192.0.2.2"], "gpus": 2},
        {"name": "ref", "hosts": ["192.0.2.2"], "colocateWith": "trainer"},
        {"name": "reward", "hosts": ["192.0.2.4"], "gpus": 0, "procs": 2},
    ]))
    monkeypatch.setenv("MONARCH_REF_HOSTS", "1")

    code = main([*HOSTS, "--dry-run", "--json"])

    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert [record["event"] for record in records] == ["warning", "plan", "result"]
    assert records[0]["message"] == "MONARCH_ROLES is set, so MONARCH_REF_HOSTS is ignored"
    plan = records[1]["plan"]
    assert plan["meshes"] == [
        {"name": "trainer", "hosts": ["192.0.2.2"], "slots_per_host": 4},
        {"name": "reward", "hosts": ["192.0.2.4"], "slots_per_host": 4},
    ]
    assert [(r["role"], r["mesh"], r["procs_per_host"], r["world_size"], r["gpus"],
             r["cuda_visible_devices"]) for r in plan["roles"]] == [
        ("trainer", "trainer", 2, 2, [0, 1], "0,1"),
        ("ref", "trainer", 2, 2, [2, 3], "2,3"),
        ("reward", "reward", 2, 2, [], ""),
    ]
    assert plan["unused_hosts"] == ["192.0.2.1", "192.0.2.3"]


def test_bad_monarch_roles_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MONARCH_ROLES", json.dumps([{"name": "trainer", "hosts": ["w-9"]}]))

    assert main([*HOSTS, "--dry-run"]) == 2
    assert ("MONARCH_ROLES: role 'trainer': host 'w-9' is not in the hostfile"
            in capsys.readouterr().err)


def test_the_built_in_example_needs_trainer_and_ref(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*HOSTS, "--role", "generator=1", "--role", "trainer=1", "--dry-run"]) == 2
    assert ("the built-in example (monarch-launch without a program) needs roles 'trainer' "
            "and 'ref'; --role has no ref" in capsys.readouterr().err)


def test_run_dry_run_accepts_any_roles(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", *HOSTS, "--roles", json.dumps([{"name": "generator", "hosts": 3},
                                                        {"name": "reward", "hosts": 1,
                                                         "gpus": 0}]),
                 "--dry-run", "json:dumps"])

    out = capsys.readouterr().out
    assert code == 0, out
    assert "role reward: mesh=reward hosts=1 procs/host=1 world=1" in out


def test_job_from_args_takes_roles_in_every_form(tmp_path: Path) -> None:
    as_flags = Job.from_args(hosts=["192.0.2.1", "192.0.2.2"], slots_per_host=2,
                             roles=["generator=1", "reward=1,gpus=0"])
    as_objects = Job.from_args(hosts=["192.0.2.1", "192.0.2.2"], slots_per_host=2,
                               roles=[{"name": "generator", "hosts": 1},
                                      RoleSpec("reward", 1, gpus=0)])

    for job in (as_flags, as_objects):
        assert job.plan.role_names == ("generator", "reward")
        assert job.plan.role("reward").cuda_visible_devices == ""
    assert roles_argv(["a=1", "b=@a"]) == ["--role", "a=1", "--role", "b=@a"]
    assert roles_argv([RoleSpec("a", ("h1",), gpus=0)]) == [
        "--roles", '[{"name": "a", "hosts": ["h1"], "gpus": 0}]']


def test_job_roles_exist_only_when_entered_and_a_missing_trainer_is_named() -> None:
    import contextlib

    job = Job.from_args(hosts=["192.0.2.1", "192.0.2.2"], roles=["generator=1", "reward=1"])
    with pytest.raises(RuntimeError, match="only inside 'with job:'"):
        _ = job.roles
    job._stack = contextlib.ExitStack()  # as if entered, with no procs spawned
    job._procs = {"generator": "gen-mesh", "reward": "reward-mesh"}

    assert dict(job.roles) == {"generator": "gen-mesh", "reward": "reward-mesh"}
    with pytest.raises(RoleNotFound, match="no role 'trainer'; its roles are generator, reward"):
        _ = job.trainer
