"""images/worker/entrypoint.sh on this machine with a fake sshd: the pod's environment is saved
for the ranks (field case C16). The local cluster's node agent runs this same file for workers."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from monarch_operator import constants

ENTRYPOINT = Path(__file__).resolve().parents[2] / "images" / "worker" / "entrypoint.sh"

# The entrypoint makes host keys with ssh-keygen: scripts/setup.sh installs openssh-client, so
# it is never skipped in CI (a missing ssh-keygen fails there).
pytestmark = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None and not os.environ.get("CI"),
    reason="the entrypoint makes host keys with ssh-keygen (apt install openssh-client)",
)


def run_entrypoint(
    tmp_path: Path, extra_env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    home = tmp_path / "home"
    home.mkdir()
    state_dir = tmp_path / "sshd-state"
    authorized_keys = tmp_path / "authorized_keys"
    authorized_keys.write_text("ssh-ed25519 AAAA test\n")
    fake_sshd = tmp_path / "fake-sshd"
    fake_sshd.write_text('#!/bin/sh\necho "fake-sshd $*"\nexit 0\n')
    fake_sshd.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "xterm",
        "HOSTNAME": "demo-worker-0",
        "MONARCH_RUNTIME_DIR": str(tmp_path / "runtime"),
        "SSHD_STATE_DIR": str(state_dir),
        "SSHD": str(fake_sshd),
        "SSH_PORT": "2299",
        "SSH_LISTEN_ADDRESS": "127.0.0.1",
        "SSH_AUTHORIZED_KEYS": str(authorized_keys),
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
        **extra_env,
    }
    result = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True,
                            timeout=60)
    return result, state_dir


def test_pod_environment_is_saved_as_json_and_named_by_setenv(tmp_path):
    result, state_dir = run_entrypoint(tmp_path, {
        "FOO": "bar", "NCCL_SOCKET_IFNAME": "eth7",
        "QUOTED": "a \"b\" 'c' $HOME\nsecond line", "EMPTY": "",
    })
    assert result.returncode == 0, result.stderr
    pod_env_file = state_dir / constants.POD_ENV_FILE_NAME
    assert f"fake-sshd -D -e -f {state_dir}/sshd_config" in result.stdout
    saved = json.loads(pod_env_file.read_text())
    assert saved["FOO"] == "bar" and saved["NCCL_SOCKET_IFNAME"] == "eth7"
    assert saved["QUOTED"] == "a \"b\" 'c' $HOME\nsecond line", "values kept byte for byte"
    assert saved["EMPTY"] == ""
    assert saved["PATH"] == os.environ["PATH"] and saved["LANG"] == "C.UTF-8"
    for left_out in ("HOME", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "_", "TERM", "SSHD",
                     "SSHD_STATE_DIR", "SSH_PORT", "SSH_LISTEN_ADDRESS", "SSH_AUTHORIZED_KEYS",
                     "SSH_AUTH_SOCK"):
        assert left_out not in saved, left_out
    assert stat.S_IMODE(pod_env_file.stat().st_mode) == 0o600
    assert not list(state_dir.glob("*.partial"))
    config_lines = (state_dir / "sshd_config").read_text().splitlines()
    assert f"SetEnv {constants.ENV_POD_ENV_FILE}={pod_env_file}" in config_lines
    assert "ListenAddress 127.0.0.1:2299" in config_lines


def test_a_restarted_container_rewrites_the_file(tmp_path):
    result, state_dir = run_entrypoint(tmp_path, {"FOO": "old"})
    assert result.returncode == 0, result.stderr
    pod_env_file = state_dir / constants.POD_ENV_FILE_NAME
    pod_env_file.chmod(0o644)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"),
           "MONARCH_RUNTIME_DIR": str(tmp_path / "runtime"),
           "SSHD_STATE_DIR": str(state_dir), "SSHD": str(tmp_path / "fake-sshd"),
           "SSH_AUTHORIZED_KEYS": str(tmp_path / "authorized_keys"), "FOO": "new"}
    again = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads(pod_env_file.read_text())["FOO"] == "new"
    assert stat.S_IMODE(pod_env_file.stat().st_mode) == 0o600


def test_a_given_host_key_that_is_not_a_private_key_is_refused(tmp_path):
    bad_key = tmp_path / "ssh_host_ed25519_key"
    bad_key.write_text("ssh-ed25519 AAAA a public key, not a private one\n")
    bad_key.chmod(0o440)
    result, state_dir = run_entrypoint(tmp_path, {"SSH_HOST_KEY": str(bad_key)})
    assert result.returncode == 1
    assert f"host key file {bad_key} (SSH_HOST_KEY) is not an unencrypted OpenSSH private key" \
        in result.stderr
    assert "fake-sshd" not in result.stdout
