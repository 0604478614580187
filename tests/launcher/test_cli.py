"""monarch-launch flags: environment defaults (what the operator's launcher pod sets), usage
errors, the ssh options handed to SSHJob and the pre-flight (host keys pinned or accept-new), and
how a refused host key is explained. No ssh, no Monarch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_operator import constants
from monarch_operator.hostfile import Host
from monarch_operator.launcher.cli import LaunchConfig, build_parser, config_from_args, main
from monarch_operator.launcher.session.ssh import SshSettings, host_key_failure, ssh_args


def parse_launch(argv: list[str]) -> LaunchConfig:
    return config_from_args(build_parser().parse_args(argv))


def test_flags_default_from_the_operator_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("demo-worker-0.demo-worker.team-a.svc slots=2\n")
    monkeypatch.setenv("MONARCH_HOSTFILE", str(hostfile))
    key = tmp_path / "id_ed25519"
    key.write_text("not a real key; only its existence is checked here\n")
    monkeypatch.setenv("MONARCH_SSH_KEY", str(key))
    monkeypatch.setenv("MONARCH_SSH_PORT", "2222")
    monkeypatch.setenv("MONARCH_TRAINER_HOSTS", "3")
    monkeypatch.setenv("MONARCH_REF_HOSTS", "1")
    monkeypatch.setenv("MONARCH_COLOCATE", "false")
    monkeypatch.setenv("MONARCH_CLIENT_ADDRESS", "tcp://192.0.2.5:0")

    config = config_from_args(build_parser().parse_args([]))

    assert config.hosts == [Host("demo-worker-0.demo-worker.team-a.svc", 2)]
    assert config.source == f"hostfile {hostfile}"
    assert config.session.ssh.key == str(key)
    assert config.session.ssh.port == 2222
    assert (config.trainer_hosts, config.ref_hosts, config.colocate) == (3, 1, False)
    assert config.session.client_address == "tcp://192.0.2.5:0"
    assert config.session.python_exe == sys.executable
    assert config.session.monarch_port == 22222


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

    assert main([]) == 2

    assert "give exactly one host source of --hostfile, --hosts, --slurm; got none" in (
        capsys.readouterr().err
    )


def test_hosts_flag_wins_over_the_operator_hostfile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_HOSTFILE", "/nonexistent")

    config = config_from_args(
        build_parser().parse_args(["--hosts", "a,b", "--slots-per-host", "4"])
    )

    assert config.hosts == [Host("a", 4), Host("b", 4)]


def test_env_flags_reach_the_worker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"PATH": "/opt/bin", "NCCL_DEBUG": "INFO", "SECRET": "x", "WANDB_KEY": "k"}

    config = config_from_args(
        build_parser().parse_args(["--hosts", "a", "--env", "FOO=1", "--env", "WANDB_KEY"]),
        environ,
    )

    assert config.session.environment == {
        "FOO": "1",
        "NCCL_DEBUG": "INFO",
        "PATH": "/opt/bin",
        "WANDB_KEY": "k",
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env", "1X=2"], "--env '1X=2': '1X' is not a variable name"),
        (["--env", "UNSET_HERE"], "--env UNSET_HERE: not set in the launcher's environment"),
        (["--hostfile", "h", "--hosts", "a"], "give exactly one host source"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--hosts", "a", *flags] if "--hosts" not in flags else flags) == 2
    assert message in capsys.readouterr().err


def test_dry_run_prints_the_plan_as_json_and_connects_to_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Documentation addresses (RFC 5737): nothing is dialed in a dry run.
    code = main(
        [
            "--hosts",
            "192.0.2.1,192.0.2.2",
            "--slots-per-host",
            "4",
            "--colocate",
            "--dry-run",
            "--json",
        ]
    )

    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert [record["event"] for record in records] == ["plan", "result"]
    roles = {role["role"]: role for role in records[0]["plan"]["roles"]}
    assert (roles["trainer"]["gpus"], roles["ref"]["gpus"]) == ([0, 1], [2, 3])
    assert records[1]["status"] == "succeeded" and records[1]["dry_run"] is True


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


def test_ssh_args_pin_host_keys_with_a_known_hosts_file() -> None:
    settings = SshSettings(port=2222, user="root", key="/k", known_hosts="/etc/monarch/kh")

    assert ssh_args(settings, "w-0.svc") == [
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
        "HostKeyAlias=[w-0.svc]:2222",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UserKnownHostsFile=/etc/monarch/kh",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "CheckHostIP=no",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
    ]
    assert "-tt" not in ssh_args(settings, "w-0.svc", tty=False)
    assert "-i" not in ssh_args(SshSettings(port=22, user="u"), "h")


def test_ssh_args_without_a_file_use_ssh_own_known_hosts_and_accept_new() -> None:
    options = ssh_args(SshSettings(port=22, user="u"), "node7", tty=False)
    assert "StrictHostKeyChecking=accept-new" in options
    assert "HostKeyAlias=node7" in options, "port 22: the plain name, as ssh files it"
    assert not any(o.startswith(("UserKnownHostsFile", "GlobalKnownHostsFile")) for o in options)
    assert not any(o.endswith("=no") and o.startswith("StrictHost") for o in options)


def test_known_hosts_path_is_absolute_and_quoted_for_ssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    options = ssh_args(SshSettings(port=22, user="u", known_hosts="my dir/100%"), "h")
    assert f'UserKnownHostsFile="{tmp_path}/my dir/100%%"' in options


OFFENDING_KEY_STDERR = """\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
The fingerprint for the ED25519 key sent by the remote host is
SHA256:viKaHgGRT53MF7+/cNXj5la9Z2ZJSq2diyTf4Y8B2tI.
Please contact your system administrator.
Add correct host key in /etc/monarch/ssh/known_hosts to get rid of this message.
Offending ED25519 key in /etc/monarch/ssh/known_hosts:1
  remove with:
  ssh-keygen -f "/etc/monarch/ssh/known_hosts" -R "[w-0.demo-worker]:2222"
Host key for [w-0.demo-worker]:2222 has changed and you have requested strict checking.
Host key verification failed.
"""


def test_a_changed_host_key_is_explained_with_host_file_and_fingerprint() -> None:
    settings = SshSettings(port=2222, user="u", known_hosts="/etc/monarch/ssh/known_hosts")
    failure = host_key_failure(OFFENDING_KEY_STDERR, "w-0.demo-worker", settings)
    reason, detail = failure or ("", "")
    assert reason == "HostKeyChanged"
    assert detail.startswith(
        "w-0.demo-worker presented a host key (SHA256:viKaHgGRT53MF7+/cNXj5la9Z2ZJSq2diyTf4Y8B2tI)"
        " other than the one /etc/monarch/ssh/known_hosts:1 pins for [w-0.demo-worker]:2222;"
    )
    assert "ssh-keygen -f '/etc/monarch/ssh/known_hosts' -R '[w-0.demo-worker]:2222'" in detail


def test_an_unknown_host_under_strict_checking_names_the_file_and_the_fix() -> None:
    settings = SshSettings(port=22, user="u", known_hosts="/k/known_hosts")
    stderr = ("No ED25519 host key is known for node3 and you have requested strict checking.\n"
              "Host key verification failed.\n")
    reason, detail = host_key_failure(stderr, "node3", settings) or ("", "")
    assert reason == "HostKeyUnknown"
    assert detail.startswith("no host key for node3 in /k/known_hosts; refused")
    assert "ssh-keyscan -p 22 node3" in detail


def test_other_ssh_failures_are_not_host_key_failures() -> None:
    settings = SshSettings(port=22, user="u")
    assert host_key_failure("root@h: Permission denied (publickey).", "h", settings) is None


def test_known_hosts_comes_from_the_flag_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    monkeypatch.setenv(constants.ENV_KNOWN_HOSTS, str(known_hosts))
    assert parse_launch(["--hosts", "a"]).session.ssh.known_hosts == str(known_hosts)
    other = tmp_path / "other"
    other.write_text("")
    flag = parse_launch(["--hosts", "a", "--known-hosts", str(other)])
    assert flag.session.ssh.known_hosts == str(other)
    monkeypatch.delenv(constants.ENV_KNOWN_HOSTS)
    assert parse_launch(["--hosts", "a"]).session.ssh.known_hosts is None


def test_missing_known_hosts_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hosts", "192.0.2.1", "--known-hosts", "/nonexistent/kh"]) == 2
    assert "--known-hosts /nonexistent/kh: no such file" in capsys.readouterr().err


def test_missing_ssh_key_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hosts", "192.0.2.1", "--ssh-key", "/nonexistent/key"]) == 2
    assert "--ssh-key /nonexistent/key: no such file" in capsys.readouterr().err


def test_quiet_dry_run_still_prints_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    # Documentation addresses (RFC 5737): a dry run dials nothing.
    code = main(["--hosts", "192.0.2.1,192.0.2.2", "--dry-run", "--quiet"])

    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "hosts: --hosts"
    assert "mesh trainer: hosts=192.0.2.1 procs/host=1" in out
    assert out[-1] == "monarch-launch: dry run: plan only, nothing started"
