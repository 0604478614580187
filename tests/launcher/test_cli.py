"""monarch-launch flags: environment defaults (what the operator's launcher pod sets), usage
errors, and the ssh options handed to SSHJob. No ssh, no Monarch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from monarch_operator.launcher.cli import build_parser, config_from_args, main
from monarch_operator.launcher.ssh import SshSettings, ssh_args


def test_flags_default_from_the_operator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_HOSTFILE", "/etc/monarch/hostfile/hostfile")
    monkeypatch.setenv("MONARCH_SSH_KEY", "/etc/monarch/ssh/id_ed25519")
    monkeypatch.setenv("MONARCH_SSH_PORT", "2222")
    monkeypatch.setenv("MONARCH_TRAINER_HOSTS", "3")
    monkeypatch.setenv("MONARCH_REF_HOSTS", "1")
    monkeypatch.setenv("MONARCH_COLOCATE", "false")
    monkeypatch.setenv("MONARCH_CLIENT_ADDRESS", "tcp://192.0.2.5:0")

    config = config_from_args(build_parser().parse_args([]))

    assert config.hostfile == "/etc/monarch/hostfile/hostfile"
    assert config.ssh.key == "/etc/monarch/ssh/id_ed25519"
    assert config.ssh.port == 2222
    assert (config.trainer_hosts, config.ref_hosts, config.colocate) == (3, 1, False)
    assert config.client_address == "tcp://192.0.2.5:0"
    assert config.python_exe == sys.executable
    assert config.monarch_port == 22222


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_COLOCATE", "true")
    monkeypatch.setenv("MONARCH_SSH_PORT", "2222")

    args = build_parser().parse_args(["--hostfile", "h", "--no-colocate", "--ssh-port", "22"])

    assert (args.colocate, args.ssh_port) == (False, 22)


def test_defaults_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "MONARCH_SSH_PORT",
        "MONARCH_SSH_KEY",
        "MONARCH_COLOCATE",
        "MONARCH_TRAINER_HOSTS",
    ):
        monkeypatch.delenv(name, raising=False)

    args = build_parser().parse_args(["--hostfile", "h"])

    assert (args.ssh_port, args.ssh_key, args.colocate, args.trainer_hosts) == (
        22,
        None,
        False,
        None,
    )
    assert args.steps == 3


def test_bad_environment_value_is_a_clear_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_COLOCATE", "maybe")

    with pytest.raises(SystemExit, match="MONARCH_COLOCATE='maybe' is not true/false"):
        build_parser()


def test_missing_hostfile_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MONARCH_HOSTFILE", raising=False)

    with pytest.raises(SystemExit) as caught:
        main([])

    assert caught.value.code == 2
    assert "--hostfile is required (or set MONARCH_HOSTFILE)" in capsys.readouterr().err


def test_unreadable_hostfile_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hostfile", "/nonexistent/hostfile"]) == 2
    assert "monarch-launch: failed:" in capsys.readouterr().err


def test_help_shows_examples_and_exit_status() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "monarch_operator.launcher", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )

    assert "examples:" in result.stdout and "exit status:" in result.stdout


def test_ssh_args_for_sshjob() -> None:
    settings = SshSettings(port=2222, user="root", key="/k")

    assert ssh_args(settings) == [
        "-p",
        "2222",
        "-i",
        "/k",
        "-l",
        "root",
        "-tt",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=5",
    ]
    assert "-tt" not in ssh_args(settings, tty=False)
    assert "-i" not in ssh_args(SshSettings(port=22, user="u"))
