"""Range rules of the launcher's flags in both modes: argparse's usage error (exit 2) naming the
flag and the rule, before any host is read or contacted (rules in launcher/flagtypes.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from monarch_operator.launcher import cli, spmd_cli

ROLE = ["--hosts", "a"]
SPMD = ["--hosts", "a", "p.py"]


def role_parse(flags: list[str]) -> argparse.Namespace:
    return cli.build_parser().parse_args([*ROLE, *flags])


def spmd_parse(flags: list[str]) -> argparse.Namespace:
    # Flags go before the script: everything after it belongs to the script.
    return spmd_cli.build_parser().parse_args([*flags, *SPMD])


PARSERS: dict[str, Callable[[list[str]], argparse.Namespace]] = {
    "role": role_parse,
    "spmd": spmd_parse,
}


@pytest.fixture(autouse=True)
def _no_operator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONARCH_SSH_PORT", raising=False)


# fmt: off
REFUSED = [
    ("role", "--ssh-port", "0", "must be a port number 1..65535, got 0"),
    ("role", "--ssh-port", "65536", "must be a port number 1..65535, got 65536"),
    ("role", "--ssh-port", "ssh", "expected a port number 1..65535, got 'ssh'"),
    ("spmd", "--ssh-port", "-22", "must be a port number 1..65535, got -22"),
    ("role", "--monarch-port", "0", "must be a port number 1..65535, got 0"),
    ("spmd", "--monarch-port", "70000", "must be a port number 1..65535, got 70000"),
    ("spmd", "--master-port", "0", "must be a port number 1..65535, got 0"),
    ("spmd", "--master-port", "65536", "must be a port number 1..65535, got 65536"),
    ("spmd", "--master_port", "x", "expected a port number 1..65535, got 'x'"),
    ("role", "--attach-timeout", "0", "must be more than 0 seconds, got 0"),
    ("spmd", "--attach-timeout", "-1.5", "must be more than 0 seconds, got -1.5"),
    ("role", "--attach-timeout", "nan", "expected a finite number of seconds, got 'nan'"),
    ("spmd", "--attach-timeout", "inf", "expected a finite number of seconds, got 'inf'"),
    ("role", "--host-wait", "-1", "must be 0 seconds or more, got -1"),
    ("spmd", "--host-wait", "soon", "expected a number of seconds, got 'soon'"),
    ("role", "--call-timeout", "0", "must be more than 0 seconds, got 0"),
    ("role", "--call-timeout", "-5", "must be more than 0 seconds, got -5"),
    ("role", "--steps", "0", "must be at least 1, got 0"),
    ("role", "--steps", "-3", "must be at least 1, got -3"),
    ("role", "--steps", "2.5", "expected an integer, got '2.5'"),
]
# fmt: on


@pytest.mark.parametrize(
    ("mode", "flag", "value", "message"),
    REFUSED,
    ids=[f"{mode}{flag}={value}" for mode, flag, value, _ in REFUSED],
)
def test_out_of_range_flag_is_a_usage_error_naming_flag_and_rule(
    mode: str, flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        PARSERS[mode]([flag, value])

    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "usage:" in error
    named = error.split("error: argument ", 1)[1].split(": ", 1)[0]  # e.g. --a-b/--a_b
    assert flag in named.split("/")
    assert message in error


# fmt: off
ACCEPTED = [
    ("role", "--ssh-port", "1", "ssh_port", 1),
    ("spmd", "--ssh-port", "65535", "ssh_port", 65535),
    ("role", "--monarch-port", "22222", "monarch_port", 22222),
    ("spmd", "--master-port", "29500", "master_port", 29500),
    ("spmd", "--master-port", "65535", "master_port", 65535),
    ("role", "--attach-timeout", "0.5", "attach_timeout", 0.5),
    ("spmd", "--host-wait", "0", "host_wait", 0.0),
    ("role", "--host-wait", "2.5", "host_wait", 2.5),
    ("role", "--call-timeout", "1e-3", "call_timeout", 0.001),
    ("role", "--steps", "1", "steps", 1),
]
# fmt: on


@pytest.mark.parametrize(
    ("mode", "flag", "value", "attribute", "expected"),
    ACCEPTED,
    ids=[f"{mode}{flag}={value}" for mode, flag, value, _, _ in ACCEPTED],
)
def test_in_range_flag_is_accepted(
    mode: str, flag: str, value: str, attribute: str, expected: float
) -> None:
    assert getattr(PARSERS[mode]([flag, value]), attribute) == expected


@pytest.mark.parametrize("mode", list(PARSERS))
def test_defaults_are_in_range(mode: str) -> None:
    args = PARSERS[mode]([])

    assert (args.ssh_port, args.monarch_port) == (22, 22222)
    assert args.attach_timeout > 0 and args.host_wait >= 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "MONARCH_SSH_PORT='0': must be a port number 1..65535, got 0"),
        ("99999", "MONARCH_SSH_PORT='99999': must be a port number 1..65535, got 99999"),
        ("ssh", "MONARCH_SSH_PORT='ssh': expected a port number 1..65535, got 'ssh'"),
    ],
)
def test_ssh_port_from_the_environment_obeys_the_same_rule(
    value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONARCH_SSH_PORT", value)

    with pytest.raises(SystemExit, match=message):
        cli.build_parser()


def test_role_main_refuses_bad_steps_before_reading_hosts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--hostfile", "/nonexistent/hostfile", "--steps", "0"])

    assert exited.value.code == 2
    assert "argument --steps: must be at least 1, got 0" in capsys.readouterr().err


def test_spmd_main_refuses_bad_master_port(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        spmd_cli.main(["--hosts", "a", "--master-port", "0", "p.py"])

    assert exited.value.code == 2
    assert "argument --master-port/--master_port: must be a port number" in (
        capsys.readouterr().err
    )
