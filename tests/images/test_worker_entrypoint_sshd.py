"""images/worker/entrypoint.sh starts a real sshd as a non-root user, with the job's Secret files
mounted as a kubelet mounts them under ``fsGroup`` (root-owned, group-readable 0440 or 0640):
it installs the job's host key (mode 0600, its own copy), a client logs in with the job's key,
and strict host key checking against the Secret's known_hosts accepts it and refuses another
job's (field case C4 with pinned host keys, issue 10 items 5 and 6).

Needs root (to mount the files as root:fsGroup and drop to the user), sshd, and the non-root
login user ``monarch`` that scripts/setup.sh creates: without them the test fails when ``CI`` is
set and skips otherwise. Starts sshd on 127.0.0.250: run it under the tests' lock.
"""

from __future__ import annotations

import base64
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator import constants, names
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.sshkeys import generate_job_keys
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.testing.loopback_sshd import SSHD, free_port

ENTRYPOINT = Path(__file__).resolve().parents[2] / "images" / "worker" / "entrypoint.sh"
LOGIN_USER = "monarch"
ADDRESS = "127.0.0.250"
SETTINGS = Settings()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def login_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        _unavailable("needs root to mount files as root:fsGroup and to drop to the login user")
    if not Path(SSHD).is_file() or not shutil.which("setpriv"):
        _unavailable(f"needs {SSHD} (openssh-server) and setpriv (util-linux)")
    try:
        return pwd.getpwnam(LOGIN_USER)
    except KeyError:
        _unavailable(f"no user {LOGIN_USER!r}: run scripts/setup.sh")
        raise


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory the login user can traverse (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="monarch-entrypoint-"))
    path.chmod(0o755)
    # The login user runs the image's entrypoint from here: the checkout may be where it
    # cannot read (a clone under root's 0700 home).
    shutil.copy(ENTRYPOINT, path / ENTRYPOINT.name)
    (path / ENTRYPOINT.name).chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_job(name: str) -> JobSpec:
    return JobSpec.from_body({
        "metadata": {"name": name, "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                 "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}},
    })


def secret_files(job: JobSpec) -> dict[str, bytes]:
    secret = build_ssh_secret(job, SETTINGS, generate_job_keys(job.namespace, job.name))
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def mount_like_a_kubelet(directory: Path, files: dict[str, bytes], keys: tuple[str, ...],
                         fs_group: int, mode: int) -> None:
    """Secret volume files under fsGroup: owned by root, group fsGroup, group-readable."""
    directory.mkdir()
    for key in keys:
        path = directory / key
        path.write_bytes(files[key])
        os.chown(path, 0, fs_group)
        path.chmod(mode)
    os.chown(directory, 0, fs_group)
    directory.chmod(0o750)


def runtime_dir(world_dir: Path) -> Path:
    """The pod's runtime emptyDir as a kubelet makes one: root's, mode 0777."""
    path = world_dir / "runtime"
    path.mkdir(exist_ok=True)
    path.chmod(0o777)
    return path


def wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"entrypoint exited {process.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection((ADDRESS, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"sshd not listening on {ADDRESS}:{port} after 10 s:\n{log.read_text()}")


def ssh(client_key: Path, known_hosts: Path, port: int, command: str,
        ) -> subprocess.CompletedProcess[str]:
    # The launcher checks a worker's key under its hostfile name (HostKeyAlias), whatever
    # address it connects to; here worker 0 of job "demo" is served on 127.0.0.250.
    alias = f"[{names.worker_fqdn('demo', 'team-a', 0, SETTINGS.cluster_domain)}]:2222"
    return subprocess.run(
        ["ssh", "-p", str(port), "-i", str(client_key), "-l", LOGIN_USER,
         "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", f"HostKeyAlias={alias}", "-o", "CheckHostIP=no", "-o", "ConnectTimeout=5",
         ADDRESS, command],
        capture_output=True, text=True, timeout=30, check=False,
    )


@pytest.mark.parametrize("mode", [0o440, 0o640], ids=["defaultMode-0400", "defaultMode-0600"])
def test_non_root_sshd_presents_the_jobs_pinned_host_key(login_user, world_dir, mode):
    files = secret_files(make_job("demo"))
    uid = login_user.pw_uid
    other_job_known_hosts = world_dir / "other_known_hosts"
    other_job_known_hosts.write_bytes(
        secret_files(make_job("demo"))[constants.SSH_KNOWN_HOSTS])  # same names, new key
    process, port, client_key, known_hosts, log = start_worker(
        login_user, world_dir, files=files, mode=mode, POD_MARKER="from-the-pod")
    try:
        installed = world_dir / "runtime" / "sshd" / constants.SSH_HOST_KEY
        info = installed.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uid, 0o600)
        assert installed.read_bytes() == files[constants.SSH_HOST_KEY]

        logged_in = ssh(client_key, known_hosts, port,
                        'id -u; python3 -c "import json, os; print(json.load(open('
                        "os.environ['MONARCH_POD_ENV_FILE']))['POD_MARKER'])\"")
        assert logged_in.returncode == 0, logged_in.stderr + log.read_text()
        assert logged_in.stdout.split() == [str(uid), "from-the-pod"]

        refused = ssh(client_key, other_job_known_hosts, port, "true")
        assert refused.returncode == 255, refused.stdout
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr
        assert "Host key verification failed." in refused.stderr

        # Readiness probes (a TCP connect and close, as wait_listening did) leave no lines;
        # the login above is still logged.
        for _ in range(3):
            socket.create_connection((ADDRESS, port), timeout=5).close()
        for _ in range(2):  # closed with sshd's banner unread: the prober's kernel resets
            with socket.create_connection((ADDRESS, port), timeout=5):
                time.sleep(0.3)
        wait_until_logged(log, "Received signal", process)
        text = log.read_text()
        assert "Accepted publickey for monarch" in text, text
        assert "kex_exchange_identification" not in text, text
        assert not re.search(r"^Connection (closed|reset) by \S+ port \d+\r?$", text, re.M), text
        # The client that refused the host key (after the handshake began) is still logged.
        assert "[preauth]" in text, text
    finally:
        process.terminate()
        process.wait(timeout=10)


def wait_until_logged(log: Path, line: str, process: subprocess.Popen[bytes]) -> None:
    """Stop the entrypoint (SIGTERM) and wait until sshd's ``line`` reaches ``log`` through the
    entrypoint's log filter, so that everything sshd wrote before is in the file."""
    process.terminate()
    process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while line not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_missing_host_key_stops_the_worker_with_the_path(login_user, world_dir):
    home = world_dir / "home"
    home.mkdir(mode=0o700)
    os.chown(home, login_user.pw_uid, login_user.pw_gid)
    authorized_keys = world_dir / "authorized_keys"
    authorized_keys.write_text("ssh-ed25519 AAAA test\n")
    authorized_keys.chmod(0o644)
    missing = world_dir / "ssh" / constants.SSH_HOST_KEY
    result = subprocess.run(
        ["setpriv", f"--reuid={login_user.pw_uid}", f"--regid={login_user.pw_gid}",
         "--clear-groups", "--", "sh", str(world_dir / ENTRYPOINT.name)],
        env={"PATH": os.environ["PATH"], "HOME": str(home), "SSHD": "/bin/false",
             constants.ENV_RUNTIME_DIR: str(runtime_dir(world_dir)),
             "SSH_AUTHORIZED_KEYS": str(authorized_keys), "SSH_HOST_KEY": str(missing)},
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 1
    assert f"host key file {missing} (SSH_HOST_KEY) is missing" in result.stderr
    assert f"uid {login_user.pw_uid}" in result.stderr


def start_worker(login_user: pwd.struct_passwd, world_dir: Path,
                 files: dict[str, bytes] | None = None, mode: int = 0o440, **extra_env: str,
                 ) -> tuple[subprocess.Popen[bytes], int, Path, Path, Path]:
    """The entrypoint as a worker pod runs it, the job's Secret ``files`` mounted with
    ``mode``, listening: ``(process, port, client key, known_hosts, log)``."""
    files = files or secret_files(make_job("demo"))
    uid, gid = login_user.pw_uid, login_user.pw_gid
    worker_mount = world_dir / "worker-ssh"
    mount_like_a_kubelet(worker_mount, files,
                         (constants.SSH_AUTHORIZED_KEYS, constants.SSH_HOST_KEY), gid, mode)
    home = world_dir / "home"
    home.mkdir(mode=0o700)
    os.chown(home, uid, gid)
    client_key = world_dir / "id_ed25519"
    client_key.write_bytes(files[constants.SSH_PRIVATE_KEY])
    client_key.chmod(0o600)
    known_hosts = world_dir / "known_hosts"
    known_hosts.write_bytes(files[constants.SSH_KNOWN_HOSTS])
    port = free_port((ADDRESS,))
    log = world_dir / "entrypoint.log"
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
           constants.ENV_RUNTIME_DIR: str(runtime_dir(world_dir)),
           "SSH_PORT": str(port), "SSH_LISTEN_ADDRESS": ADDRESS,
           "SSH_AUTHORIZED_KEYS": str(worker_mount / constants.SSH_AUTHORIZED_KEYS),
           "SSH_HOST_KEY": str(worker_mount / constants.SSH_HOST_KEY), **extra_env}
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={gid}", "--",
             "sh", str(world_dir / ENTRYPOINT.name)],
            env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True)
    wait_listening(port, process, log)
    return process, port, client_key, known_hosts, log


def test_with_a_stop_grace_period_an_open_session_outlives_sigterm(login_user, world_dir):
    """Checkpoint before a stop: a drained worker (SIGTERM) stays while a session is open, so
    a rank can still save its state, and goes as soon as the session ends."""
    process, port, client_key, known_hosts, log = start_worker(
        login_user, world_dir, MONARCH_STOP_GRACE_SECONDS="30")
    alias = f"[{names.worker_fqdn('demo', 'team-a', 0, SETTINGS.cluster_domain)}]:2222"
    session = subprocess.Popen(
        ["ssh", "-p", str(port), "-i", str(client_key), "-l", LOGIN_USER,
         "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known_hosts}",
         "-o", f"HostKeyAlias={alias}", "-o", "CheckHostIP=no", ADDRESS,
         'echo open; read line; echo "saved $line"'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert session.stdout is not None and session.stdout.readline() == "open\n"
        process.terminate()
        time.sleep(3)
        assert process.poll() is None, log.read_text()  # it waits for the session
        assert "staying up to 30s" in log.read_text()
        out, err = session.communicate("step-7\n", timeout=20)
        assert out == "saved step-7\n", err + log.read_text()
        started = time.monotonic()
        assert process.wait(timeout=15) == 0
        assert time.monotonic() - started < 20  # went when the session ended, not at 30 s
    finally:
        session.kill()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_with_a_stop_grace_period_and_no_session_sigterm_stops_at_once(login_user, world_dir):
    process, *_ = start_worker(login_user, world_dir, MONARCH_STOP_GRACE_SECONDS="30")
    started = time.monotonic()
    process.terminate()
    assert process.wait(timeout=15) == 0
    assert time.monotonic() - started < 20  # at once, not after the 30 s period
