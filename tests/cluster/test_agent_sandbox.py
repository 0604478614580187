"""The node agent's container sandbox on this machine (root, unshare; no control plane): it
starts whatever descriptors the agent holds, says when the sandbox itself failed, and stopping a
container ends all of its processes and lets go of its namespace."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from monarch_operator.localcluster import sandbox

pytestmark = pytest.mark.cluster


def wait_exit(process: sandbox.ContainerProcess, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while (code := process.poll()) is None:
        assert time.monotonic() < deadline, "container did not exit"
        time.sleep(0.01)
    return code


def start(tmp_path: Path, command: list[str], name: str = "main",
          **options) -> sandbox.ContainerProcess:
    return sandbox.start(command, hostname="pod-a", env={"PATH": os.environ["PATH"]},
                         workdir=tmp_path, log_path=tmp_path / f"{name}.log", name=name,
                         **{"mounts": [], **options})


def test_starts_with_many_descriptors_open(tmp_path):
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(40)]  # fd numbers well past 9
    try:
        container = start(tmp_path, ["sh", "-c", "hostname; exit 3"])
        assert wait_exit(container) == 3
        assert container.exec_started()
        assert (tmp_path / "main.log").read_text() == "pod-a\n"
        assert container.release()
    finally:
        for fd in held:
            os.close(fd)


def test_missing_command_is_the_sandboxs_failure_not_an_exit_code(tmp_path):
    container = start(tmp_path, ["no-such-command-here"])
    assert wait_exit(container) == 127
    assert not container.exec_started()
    assert sandbox.tail_text(tmp_path / "main.log") == (
        'exec: "no-such-command-here": executable file not found in $PATH')


def test_stop_ends_background_processes_and_releases_the_namespace(tmp_path):
    fds_before = len(os.listdir("/proc/self/fd"))
    container = start(tmp_path, ["sh", "-c", "sleep 300 & trap '' TERM; sleep 300"])
    deadline = time.monotonic() + 5
    while len(container.pids()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(container.pids()) == 3
    assert len(os.listdir("/proc/self/fd")) == fds_before + 1, "one fd: the namespace"
    sandbox.stop_all([container], grace=0.5, kill_wait=5)
    assert container.poll() is not None and container.pids() == []
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_mounts_and_working_dir_inside_the_container_only(tmp_path):
    volume, target, working = tmp_path / "vol", tmp_path / "mnt", tmp_path / "wd"
    volume.mkdir()
    (volume / "greeting").write_text("hello")
    container = start(tmp_path, ["sh", "-c", f"pwd; cat {target}/greeting"],
                      mounts=[(volume, str(target))], working_dir=str(working))
    assert wait_exit(container) == 0
    assert (tmp_path / "main.log").read_text() == f"{working}\nhello"
    assert not (target / "greeting").exists(), "the machine's view is unchanged"


def test_a_mount_over_a_sources_parent_does_not_hide_the_later_sources(tmp_path):
    """As in the chart's operator pod: an emptyDir at /tmp comes before the ServiceAccount
    token's volume, whose directory on the machine lies under /tmp. Every source is bound before
    any mount, so the token is still there, read-only, and the staging leaves no trace."""
    empty, token = tmp_path / "empty", tmp_path / "token"
    empty.mkdir()
    token.mkdir()
    (token / "token").write_text("secret")
    target = tmp_path / "serviceaccount"
    container = start(tmp_path, ["sh", "-c", f"cat {target}/token; echo; "
                                 f"touch {target}/x 2>/dev/null || echo read-only; "
                                 "ls -A /dev | grep -c sandbox; "
                                 "grep -c /dev/.sandbox /proc/self/mountinfo"],
                      mounts=[(empty, str(tmp_path)), sandbox.Mount(token, str(target), True)])
    assert wait_exit(container) == 1  # grep -c counted 0
    assert (tmp_path / "main.log").read_text() == "secret\nread-only\n0\n0\n"
