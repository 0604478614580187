"""Pure parts of the node agent's kubelet API: where ``--tail`` starts, the exec command line,
the exit status sent to kubectl, the identity an exec takes from the container, and its wait for
the container's command."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import time
from pathlib import Path

import pytest

from monarch_operator.localcluster import podexec, sandbox
from monarch_operator.localcluster.kubeletapi import tail_start
from monarch_operator.localcluster.podexec import Identity, exec_argv, exit_status

TAIL_CASES = {
    "whole file without --tail": (b"a\nb\nc\n", None, b"a\nb\nc\n"),
    "last line": (b"a\nb\nc\n", 1, b"c\n"),
    "last two lines": (b"a\nb\nc\n", 2, b"b\nc\n"),
    "more lines than the file has": (b"a\nb\n", 10, b"a\nb\n"),
    "zero lines": (b"a\nb\n", 0, b""),
    "a last line without newline counts": (b"a\nb\nc", 1, b"c"),
    "two with a partial last line": (b"a\nb\nc", 2, b"b\nc"),
    "empty lines count": (b"a\n\n\n", 2, b"\n\n"),
    "empty file": (b"", 3, b""),
}


@pytest.mark.parametrize("content, lines, expected", TAIL_CASES.values(), ids=TAIL_CASES.keys())
def test_tail_start(content, lines, expected):
    file = io.BytesIO(content)
    assert content[tail_start(file, lines):] == expected


def test_tail_start_across_blocks():
    content = b"".join(f"line {i}\n".encode() for i in range(1000))
    start = tail_start(io.BytesIO(content), 300, block_size=7)
    assert content[start:].decode().splitlines() == [f"line {i}" for i in range(700, 1000)]


def test_exit_status_as_the_kubelet_sends_it():
    assert exit_status(0) == {"metadata": {}, "status": "Success"}
    failure = exit_status(7)
    assert (failure["status"], failure["reason"]) == ("Failure", "NonZeroExitCode")
    assert failure["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]


def test_exec_argv_enters_the_namespaces_and_takes_the_identity():
    identity = Identity(uid=1000, gid=1000, groups=(1000, 2000), env={})
    argv = exec_argv(42, identity, ["cat", "/etc/hostname"], tty=False)
    assert argv[0].endswith("nsenter")
    assert argv[1:6] == ["--target=42", "--mount", "--uts", "--wd", "--"]
    assert argv[6].endswith("setpriv")
    assert argv[7:] == ["--reuid=1000", "--regid=1000", "--groups=1000,2000", "--",
                        "cat", "/etc/hostname"]
    root = exec_argv(42, Identity(uid=0, gid=0, groups=(), env={}), ["id"], tty=True)
    assert root[0].endswith("setsid") and root[1:3] == ["--ctty", "--wait"]
    assert "--clear-groups" in root


def test_identity_of_a_process():
    identity = Identity.of(os.getpid())
    assert (identity.uid, identity.gid) == (os.geteuid(), os.getegid())
    assert set(identity.groups) == set(os.getgroups())
    assert identity.env.get("PATH") == os.environ.get("PATH")



def test_exec_takes_the_containers_no_new_privs_and_bounding_set():
    # As a runtime's exec runs with the container's process spec (noNewPrivileges, caps).
    identity = Identity(uid=1000, gid=1000, groups=(), env={}, no_new_privs=True,
                        bounding_set=(1 << 10) | 1)
    argv = exec_argv(42, identity, ["id"], tty=False)
    setpriv = argv.index(next(arg for arg in argv if arg.endswith("setpriv")))
    assert argv[setpriv + 1:setpriv + 5] == [
        "--nnp", "--bounding-set=-all,+cap_0,+cap_10", "--inh-caps=-all", "--ambient-caps=-all"]
    empty = exec_argv(42, Identity(uid=1000, gid=1000, groups=(), env={}, bounding_set=0),
                      ["id"], tty=False)
    assert "--bounding-set=-all" in empty and "--nnp" not in empty


def test_identity_of_a_process_with_the_agents_own_privileges():
    identity = Identity.of(os.getpid())
    assert identity.no_new_privs is False and identity.bounding_set is None


def looks_like_the_sandbox(script: str) -> subprocess.Popen[bytes]:
    """``sh -c SCRIPT pod-sandbox``, once it is ``sh`` (what ``sandbox.start`` returns is past
    ``unshare``'s exec; a process just forked is still this Python)."""
    process = subprocess.Popen(["sh", "-c", script, sandbox.SCRIPT_NAME])
    deadline = time.monotonic() + 5
    while not Path(f"/proc/{process.pid}/cmdline").read_bytes().startswith(b"sh\0"):
        assert time.monotonic() < deadline, "sh never started"
        time.sleep(0.005)
    return process


def test_an_exec_waits_until_the_sandbox_runs_the_containers_command():
    """The agent reports a container Running once it holds its namespace, while the sandbox
    script may still be making the mounts; an exec that joined it then saw them half made
    (``kubectl cp`` wrote under a volume mounted over it a moment later: a clean-clone CI run,
    2026-12-06). Here a process that looks like the sandbox for 0.5 s, then execs a command."""
    process = looks_like_the_sandbox("sleep 0.5; exec sleep 30")
    try:
        assert not sandbox.command_started(process.pid), "still the sandbox script"
        started = time.monotonic()
        assert asyncio.run(podexec.wait_for_command(process.pid, timeout=10))
        assert time.monotonic() - started >= 0.3
        assert sandbox.command_started(process.pid)
    finally:
        process.kill()
        process.wait()
    assert not sandbox.command_started(process.pid), "gone"


def test_an_exec_waits_for_a_sandbox_that_never_gets_there_only_until_its_timeout():
    process = looks_like_the_sandbox("sleep 30; true")
    try:
        started = time.monotonic()
        assert not asyncio.run(podexec.wait_for_command(process.pid, timeout=0.3))
        assert 0.3 <= time.monotonic() - started < 5
    finally:
        process.kill()
        process.wait()
