"""The node agent's container sandbox on this machine (root, unshare; no control plane): it
starts whatever descriptors the agent holds, says when the sandbox itself failed, stopping a
container ends all of its processes and lets go of its namespace, and no_new_privs and the
capability bounding set (allowPrivilegeEscalation, capabilities) hold in the process."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.localcluster import identity, sandbox

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
    # sh and its two sleeps; while sh forks, a short-lived extra process can show (a loaded
    # machine once caught 4), so wait for the steady state rather than the first count >= 3.
    deadline = time.monotonic() + 5
    while len(container.pids()) != 3 and time.monotonic() < deadline:
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


def status_fields(text: str) -> dict[str, str]:
    """``Name: value`` lines of ``/proc/<pid>/status`` as a dict."""
    return {key: value.strip() for key, _, value in
            (line.partition(":") for line in text.splitlines()) if value}


@pytest.fixture
def setuid_id() -> Iterator[Path]:
    """A setuid-root copy of ``id`` in a directory every user can enter."""
    directory = Path(tempfile.mkdtemp(prefix="sandbox-setuid-"))
    directory.chmod(0o755)
    tool = directory / "id"
    shutil.copy2(shutil.which("id") or "/usr/bin/id", tool)
    os.chown(tool, 0, 0)
    tool.chmod(0o4755)
    try:
        yield tool
    finally:
        shutil.rmtree(directory)


@pytest.mark.parametrize("restricted", [True, False], ids=["restricted", "unrestricted"])
def test_no_new_privs_and_dropped_capabilities_hold_in_the_process(tmp_path, setuid_id,
                                                                   restricted):
    """allowPrivilegeEscalation: false and capabilities.drop [ALL], as the agent passes them
    to a non-root container: NoNewPrivs 1 and no capabilities in any set, and a setuid-root
    binary no longer raises the process to root (without them it does)."""
    context = ({"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
               if restricted else {})
    container = start(tmp_path, ["sh", "-c", f"cat /proc/self/status; echo euid=$({setuid_id} -u)"],
                      user=(65534, 65534, ()), working_dir="/",
                      privileges=identity.privilege_options({"securityContext": context}))
    assert wait_exit(container) == 0, (tmp_path / "main.log").read_text()
    seen = status_fields((tmp_path / "main.log").read_text().replace("euid=", "euid:"))
    assert seen["Uid"].split()[:2] == ["65534", "65534"]
    if restricted:
        assert seen["NoNewPrivs"] == "1"
        assert {seen[key] for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {
            "0000000000000000"}
        assert seen["euid"] == "65534"
    else:
        assert seen["NoNewPrivs"] == "0"
        assert int(seen["CapBnd"], 16) != 0
        assert seen["euid"] == "0"


def test_a_root_container_without_capabilities_cannot_chown(tmp_path):
    """Root with capabilities.drop [ALL] keeps uid 0 but loses CAP_CHOWN: chown fails; with
    only NET_RAW dropped it still works."""
    owned = tmp_path / "owned"
    owned.write_text("x")
    results = {}
    for name, drop in (("all", ["ALL"]), ("raw", ["NET_RAW"])):
        container = start(tmp_path, ["sh", "-c", "grep -E '^(Uid|CapEff)' /proc/self/status; "
                                     f"chown 65534 {owned}"],
                          name=name, privileges=identity.privilege_options(
                              {"securityContext": {"capabilities": {"drop": drop}}}))
        results[name] = wait_exit(container)
        log = (tmp_path / f"{name}.log").read_text()
        assert status_fields(log)["Uid"].split()[0] == "0"
        if name == "all":
            assert status_fields(log)["CapEff"] == "0000000000000000", log
            assert "Operation not permitted" in log
    assert results["all"] != 0 and results["raw"] == 0
    assert owned.stat().st_uid == 65534
