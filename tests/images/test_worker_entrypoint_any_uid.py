"""A uid nobody knows (field cases C36, C38): images/worker/entrypoint.sh started as uid
1000680000 with no passwd entry and ``HOME=/`` (what runc gives such a uid), as OpenShift's
restricted-v2 runs it, with ``runAsGroup`` 0 or 1000680000 and ``fsGroup`` 1000680000. The
entrypoint names the uid ``monarch`` through nss_wrapper, keeps every file in the pod's runtime
emptyDir, runs a real non-root sshd that accepts the job's key; the session's program gets a
name from ``getpass.getuser()`` and ``pwd.getpwuid()`` and a writable ``~``. The launcher side
(launcher/userentry.py, then ``ssh`` with the launcher's own options) works under that uid too.
Without nss_wrapper the worker stops at once and says why.

Needs root (to drop to the uid), sshd, setpriv and libnss-wrapper (scripts/setup.sh installs
them): without them the test fails when ``CI`` is set and skips otherwise. Starts sshd on
127.0.0.250, as test_worker_entrypoint_sshd.py does (each on a free port).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch_operator import constants, names
from monarch_operator.launcher import userentry
from monarch_operator.testing.loopback_sshd import free_port
from tests.images import test_worker_entrypoint_sshd
from tests.images.test_worker_entrypoint_sshd import (
    ADDRESS,
    ENTRYPOINT,
    SETTINGS,
    _unavailable,
    make_job,
    mount_like_a_kubelet,
    runtime_dir,
    secret_files,
    wait_listening,
)

UNKNOWN_UID = 1000680000
world_dir = test_worker_entrypoint_sshd.world_dir  # the fixture: a folder any uid can traverse
OPERATOR_DIR = Path(__file__).resolve().parents[2] / "operator"
# What a rank (or the launcher's own program) asks (C36), printed as JSON.
WHO_AM_I = textwrap.dedent("""
    import getpass, json, os, pwd
    home = os.path.expanduser("~")
    with open(os.path.join(home, "written-by-a-rank"), "w") as out:
        out.write("ok")
    print(json.dumps({"getuser": getpass.getuser(), "pwd": pwd.getpwuid(os.getuid()).pw_name,
                      "home": home, "uid": os.getuid()}))
""")


@pytest.fixture
def unknown_uid() -> int:
    if os.geteuid() != 0:
        _unavailable("needs root to run the entrypoint as an arbitrary uid")
    if not Path("/usr/sbin/sshd").is_file() or not subprocess.run(
            ["sh", "-c", "command -v setpriv"], capture_output=True, check=False).stdout:
        _unavailable("needs /usr/sbin/sshd (openssh-server) and setpriv (util-linux)")
    if userentry.find_library({}) is None:
        _unavailable("needs libnss_wrapper.so: apt-get install libnss-wrapper (scripts/setup.sh)")
    if userentry.has_entry(UNKNOWN_UID):
        _unavailable(f"uid {UNKNOWN_UID} has a passwd entry on this machine")
    return UNKNOWN_UID


def readable_package(world_dir: Path) -> Path:
    """A copy of this checkout's ``monarch_operator`` that the uid can read, as a PYTHONPATH
    folder: the checkout may be where it cannot (a clean clone under root's 0700 home, as in
    CI; stop 40's run failed there with ModuleNotFoundError)."""
    target = world_dir / "pythonpath"
    if not (target / "monarch_operator").is_dir():
        shutil.copytree(OPERATOR_DIR / "monarch_operator", target / "monarch_operator",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for path in [target, *target.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def python_for_the_uid() -> str:
    """A Python the uid can run and run again (``userentry`` re-executes it): this one unless
    its path crosses a folder the uid cannot enter (a pyenv under root's 0700 home)."""
    for python in (sys.executable, "/usr/bin/python3"):
        # Through sh: setpriv itself may still exec where the uid could not.
        tried = subprocess.run([*as_unknown_uid(0), "sh", "-c", '"$0" -c pass', python],
                               capture_output=True, check=False)
        if tried.returncode == 0:
            return python
    _unavailable(f"uid {UNKNOWN_UID} can run neither {sys.executable} nor /usr/bin/python3")
    raise AssertionError("unreachable")


def as_unknown_uid(gid: int) -> list[str]:
    """setpriv options for the uid with ``runAsGroup: gid`` and ``fsGroup`` 1000680000."""
    return ["setpriv", f"--reuid={UNKNOWN_UID}", f"--regid={gid}",
            f"--groups={UNKNOWN_UID}", "--"]


def start_worker(world_dir: Path, gid: int, listening: bool = True, **extra_env: str,
                 ) -> tuple[subprocess.Popen[bytes], int, Path]:
    """The entrypoint as the uid, the Secret mounted under fsGroup: (process, port, log);
    ``listening``: wait until sshd accepts connections."""
    files = secret_files(make_job("demo"))
    mount_like_a_kubelet(world_dir / "worker-ssh", files,
                         (constants.SSH_AUTHORIZED_KEYS, constants.SSH_HOST_KEY),
                         UNKNOWN_UID, 0o440)
    for key, name in ((constants.SSH_PRIVATE_KEY, "id_ed25519"),
                      (constants.SSH_KNOWN_HOSTS, "known_hosts")):
        (world_dir / name).write_bytes(files[key])
        os.chown(world_dir / name, UNKNOWN_UID, gid)  # the launcher's copy, as fsGroup gives
        (world_dir / name).chmod(0o600)
    port = free_port((ADDRESS,))
    log = world_dir / "entrypoint.log"
    env = {"PATH": os.environ["PATH"], "HOME": "/", "LANG": "C.UTF-8",
           constants.ENV_RUNTIME_DIR: str(runtime_dir(world_dir)),
           "SSH_PORT": str(port), "SSH_LISTEN_ADDRESS": ADDRESS,
           "SSH_AUTHORIZED_KEYS": str(world_dir / "worker-ssh" / constants.SSH_AUTHORIZED_KEYS),
           "SSH_HOST_KEY": str(world_dir / "worker-ssh" / constants.SSH_HOST_KEY), **extra_env}
    with log.open("wb") as log_file:
        process = subprocess.Popen([*as_unknown_uid(gid), "sh", str(world_dir / ENTRYPOINT.name)],
                                   env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    if listening:
        try:
            wait_listening(port, process, log)
        except BaseException:
            stop(process)  # never leave an sshd behind
            raise
    return process, port, log


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.parametrize("gid", [0, UNKNOWN_UID], ids=["runAsGroup-0", "runAsGroup-uid"])
def test_sshd_runs_as_an_unknown_uid_and_its_sessions_know_their_user(unknown_uid, world_dir,
                                                                       gid):
    process, port, log = start_worker(world_dir, gid)
    try:
        alias = f"[{names.worker_fqdn('demo', 'team-a', 0, SETTINGS.cluster_domain)}]:2222"
        session = subprocess.run(
            ["ssh", "-p", str(port), "-i", str(world_dir / "id_ed25519"), "-l", "monarch",
             "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={world_dir / 'known_hosts'}",
             "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"HostKeyAlias={alias}",
             "-o", "CheckHostIP=no", "-o", "ConnectTimeout=5", ADDRESS,
             f"python3 -c '{WHO_AM_I}'"],
            capture_output=True, text=True, timeout=60, check=False)
        assert session.returncode == 0, session.stderr + log.read_text()
        seen = json.loads(session.stdout.splitlines()[-1])
        runtime = world_dir / "runtime"
        assert seen == {"getuser": "monarch", "pwd": "monarch", "home": str(runtime / "home"),
                        "uid": unknown_uid}, seen
        assert (runtime / "home" / "written-by-a-rank").read_text() == "ok"
        # Everything the entrypoint made is in the runtime emptyDir; nothing under "/".
        assert sorted(path.name for path in runtime.iterdir()) == [
            "group", "home", "passwd", "sshd"]
        assert (runtime / "sshd" / constants.SSH_HOST_KEY).stat().st_uid == unknown_uid
        assert not Path("/.sshd").exists() and not Path("/written-by-a-rank").exists()
        assert "uid 1000680000 has no passwd entry: named monarch" in log.read_text()
    finally:
        stop(process)
    assert "Accepted publickey for monarch" in log.read_text(), log.read_text()


def test_the_launcher_as_an_unknown_uid_logs_in_with_its_own_options(unknown_uid, world_dir):
    """launcher/userentry.py re-runs the program under nss_wrapper; then getpass, pwd and ``~``
    work in the launcher, and its ssh (the launcher's options, login = getpass.getuser())
    reaches the worker's sshd running as the same uid."""
    process, port, log = start_worker(world_dir, 0)
    # The launcher pins worker keys under "[name]:2222"; this sshd listens on another port.
    known_hosts = world_dir / "known_hosts"
    known_hosts.write_text(known_hosts.read_text().replace("]:2222 ", f"]:{port} "))
    launcher_runtime = world_dir / "launcher-runtime"
    launcher_runtime.mkdir(mode=0o777)
    launcher_runtime.chmod(0o777)
    host = names.worker_fqdn("demo", "team-a", 0, SETTINGS.cluster_domain)
    program = "from monarch_operator.launcher import userentry\n" \
        "userentry.reexec_with_entry()\n" + WHO_AM_I + textwrap.dedent(f"""
        import getpass, subprocess
        from monarch_operator.launcher.session.ssh import SshSettings, ssh_args
        settings = SshSettings(port={port}, user=getpass.getuser(),
                               key={str(world_dir / "id_ed25519")!r},
                               known_hosts={str(world_dir / "known_hosts")!r})
        done = subprocess.run(["ssh", *ssh_args(settings, {host!r}, tty=False), {ADDRESS!r},
                               "id -u; echo $HOME"], capture_output=True, text=True)
        print(json.dumps({{"ssh": done.returncode, "out": done.stdout.split(),
                          "err": done.stderr}}))
    """)
    try:
        launcher = subprocess.run(
            [*as_unknown_uid(0), python_for_the_uid(), "-c", program],
            env={"PATH": os.environ["PATH"], "HOME": "/", "PYTHONPATH": str(readable_package(world_dir)),
                 constants.ENV_RUNTIME_DIR: str(launcher_runtime)},
            capture_output=True, text=True, timeout=60, check=False)
    finally:
        stop(process)
    assert launcher.returncode == 0, launcher.stderr + log.read_text()
    lines = launcher.stdout.splitlines()
    seen = json.loads(lines[0])
    assert seen == {"getuser": "monarch", "pwd": "monarch",
                    "home": str(launcher_runtime / "home"), "uid": unknown_uid}, seen
    login = json.loads(lines[1])
    assert login["ssh"] == 0, login["err"] + log.read_text()
    assert login["out"] == [str(unknown_uid), str(world_dir / "runtime" / "home")], login


def test_without_nss_wrapper_the_worker_stops_and_says_why(unknown_uid, world_dir):
    process, _, log = start_worker(world_dir, 0, listening=False,
                                   NSS_WRAPPER_LIB="/nonexistent/libnss.so")
    assert process.wait(timeout=30) == 1
    text = log.read_text()
    assert "uid 1000680000 has no passwd entry and there is no libnss_wrapper.so" in text, text
    assert "sshd cannot log in a user without a name" in text, text
    assert sorted(path.name for path in (world_dir / "runtime").iterdir()) == []
    assert not Path("/.sshd").exists()


def test_a_tmp_folder_another_uid_made_first_is_refused(unknown_uid, world_dir):
    """Run by hand (no MONARCH_RUNTIME_DIR) the entrypoint uses $TMPDIR/monarch-<uid>, and
    refuses one that another uid made there first (it could read or replace sshd's files)."""
    tmp = world_dir / "tmp"
    tmp.mkdir(mode=0o777)
    tmp.chmod(0o1777)
    planted = tmp / f"monarch-{unknown_uid}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    result = subprocess.run(
        [*as_unknown_uid(0), "sh", str(world_dir / ENTRYPOINT.name)],
        env={"PATH": os.environ["PATH"], "HOME": "/", "TMPDIR": str(tmp), "SSHD": "/bin/false"},
        capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1
    assert f"{planted} belongs to another uid than {unknown_uid}" in result.stderr, result.stderr
    assert list(planted.iterdir()) == []
