"""Nothing of a run outlives it (issue 20, item 2), over real ssh on the loopback hosts.

Ranks leave processes outside their process group and session (``setsid``, ``nohup`` that
ignores SIGTERM, a double-forked daemon that ignores SIGTERM and SIGHUP and holds the
rendezvous port): a run that ends stops them all and names them; a run whose launcher was
killed leaves them, and the next run's pre-flight names each one (host, pid, command) and stops
it before its own ranks need the port. Processes of a run still in progress, of another job and
of another user are never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.launcher.session.ssh import SshSettings, ssh_args
from monarch_operator.testing.loopback_sshd import SshCluster, free_port
from tests.launcher.launching import Launch, run_launch
from tests.launcher.test_spmd import assert_no_script_left, copy_script

pytestmark = pytest.mark.ssh

MARK = "MONARCH_RUN_MARK"
KINDS = ("setsid", "nohup", "daemon")
# Another user on every Linux machine; the launcher logs in as root, which could signal it.
OTHER_UID = 65534


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait_gone(pids: list[int], limit_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + limit_s
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _recorded(folder: Path) -> dict[str, int]:
    """``{"<kind>-<rank>": pid}`` written by leave_stragglers.py."""
    return {path.stem: int(path.read_text()) for path in sorted(folder.glob("*.pid"))}


def _orphan(command: list[str], mark: str, uid: int | None = None) -> int:
    """Start ``command`` with ``MONARCH_RUN_MARK=mark`` as an orphan (a double fork: its parent
    is init, as for a process whose run's ssh sessions are gone); return its pid."""
    prefix = [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}",
                                     "--clear-groups"]
    shell = f'{" ".join(prefix + command)} </dev/null >/dev/null 2>&1 & echo $!'
    env = {**os.environ, MARK: mark}
    return int(subprocess.check_output(["setsid", "sh", "-c", shell], env=env, text=True))


@pytest.fixture
def planted() -> Iterator[list[int]]:
    """Pids the test started itself; killed afterwards, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _stragglers_run(
    tmp_path: Path, cluster: SshCluster, monarch_port: int, master_port: int, mode: str,
    **options: object,
) -> Launch:
    a, b, _ = cluster.hosts
    script = copy_script(tmp_path, "leave_stragglers.py")
    (tmp_path / "pids").mkdir()
    return run_launch(
        tmp_path, cluster, f"{a} slots=1\n{b} slots=1\n", monarch_port,
        "--master-port", str(master_port), str(script), str(tmp_path / "pids"), mode,
        spmd=True, **options,  # type: ignore[arg-type]
    )


def test_a_run_that_ends_stops_every_process_its_ranks_left_and_names_them(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int, planted: list[int]
) -> None:
    launch = _stragglers_run(
        tmp_path, ssh_cluster, monarch_port, free_port(ssh_cluster.hosts), "exit"
    )
    recorded = _recorded(tmp_path / "pids")
    planted.extend(recorded.values())

    assert launch.returncode == 0, launch.describe()
    assert sorted(recorded) == sorted(f"{kind}-{rank}" for kind in KINDS for rank in (0, 1))
    alive = _wait_gone(list(recorded.values()), limit_s=2.0)
    assert not alive, f"processes of the run still alive after it: {alive}\n{launch.describe()}"
    named = "\n".join(line for line in launch.lines if "left by this run" in line)
    for key, pid in recorded.items():
        assert f"pid {pid} " in named, f"{key} (pid {pid}) not named:\n{launch.describe()}"
    assert_no_script_left(tmp_path)


def test_the_next_run_stops_what_a_killed_run_left_and_nothing_else(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int, planted: list[int]
) -> None:
    a, b, _ = ssh_cluster.hosts
    master_port = free_port(ssh_cluster.hosts)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = _stragglers_run(
        tmp_path / "first", ssh_cluster, monarch_port, master_port, "sleep",
        sigterm_after=f"[spmd/{a}/0] stragglers started", stop_signal=signal.SIGKILL,
        # The launcher proper, as the OOM killer would: a SIGKILL for the stop guard hands it
        # SIGTERM, and its teardown stops the stragglers itself (this test raced that teardown
        # until the runs waited for it).
        to_launcher_proper=True,
    )
    left = _recorded(tmp_path / "first" / "pids")
    planted.extend(left.values())
    assert len(left) == 6, first.describe()
    time.sleep(1.0)
    # Processes still under a worker (setsid, nohup) may already have been ended by the
    # worker's session guard when run 1's ssh sessions closed (launcher/session/guard.py);
    # the double-forked daemons left every process tree: only the next pre-flight finds them.
    daemons = {key for key in left if key.startswith("daemon-")}
    assert daemons, left
    gone = [key for key in daemons if not _alive(left[key])]
    assert not gone, f"these should have outlived the killed run 1: {gone}"

    # A process of a standalone run still in progress (inside an ssh session), one of another
    # MonarchJob, one of another user and one of an ended run of this user.
    login = SshSettings(ssh_cluster.port, "root", str(ssh_cluster.key),
                        str(ssh_cluster.known_hosts))
    live_other = subprocess.Popen(
        ["ssh", *ssh_args(login, a, tty=False), a, f"env {MARK}=-/0/liveother sleep 1000"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        other_job = _orphan(["sleep", "1000"], "0a1b2c3d-job/1/otherjob")
        other_user = _orphan(["sleep", "1000"], "-/0/otheruser", uid=OTHER_UID)
        ended_run = _orphan(["sleep", "1000"], "-/0/endedrun")
        planted.extend([other_job, other_user, ended_run])
        live_pid = _wait_marked("-/0/liveother")
        planted.append(live_pid)

        second = run_launch(
            tmp_path / "second", ssh_cluster, f"{a} slots=1\n{b} slots=1\n", monarch_port,
            "--master-port", str(master_port),
            str(copy_script(tmp_path, "bind_master_port.py")), spmd=True,
        )

        assert second.returncode == 0, second.describe()
        assert any("rendezvous port bound" in line for line in second.lines), second.describe()
        alive = _wait_gone([*left.values(), ended_run], limit_s=2.0)
        assert not alive, f"survivors of run 1 not stopped: {alive}\n{second.describe()}"
        named = [line for line in second.lines if "of an earlier run on" in line]
        for key, pid in left.items():
            line = next((n for n in named if f"pid {pid} " in n), None)
            if line is None and key not in daemons:
                continue  # ended with run 1's sessions, before run 2 (all are gone: above)
            assert line is not None, f"{key} (pid {pid}) not named:\n{second.describe()}"
            assert f" on {a}," in line or f" on {b}," in line, line
            assert "sleep 1000" in line or "leave_stragglers" in line, line
            assert "stopped (SIG" in line, line
        for what, pid in [("a live run's", live_pid), ("another job's", other_job),
                          ("another user's", other_user)]:
            assert _alive(pid), f"{what} process {pid} was stopped:\n{second.describe()}"
            assert all(f"pid {pid} " not in line for line in second.lines), second.describe()
    finally:
        live_other.kill()
        live_other.wait()


def _wait_marked(mark: str, limit_s: float = 10.0) -> int:
    """The pid of the process started with ``MONARCH_RUN_MARK=mark`` (over ssh)."""
    needle = f"{MARK}={mark}".encode()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no process with {MARK}={mark} appeared")
