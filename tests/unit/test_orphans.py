"""A killed owner takes its children with it (localcluster.orphans): what keeps a SIGKILLed
test run from leaving its local cluster and operator running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

# The owner: starts one child with (or without) stop_with_parent, prints its pid, then waits.
OWNER = textwrap.dedent("""
    import subprocess, sys, time
    from monarch_operator.localcluster.orphans import stop_with_parent
    bound = sys.argv[1] == "bound"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             start_new_session=True,
                             preexec_fn=stop_with_parent() if bound else None)
    print(child.pid, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _child_after_owner_killed(mode: str, wait: float) -> tuple[int, bool]:
    """Start an owner, SIGKILL it, and return (child pid, whether the child is still alive
    after waiting up to ``wait`` seconds for it to go)."""
    with subprocess.Popen([sys.executable, "-c", OWNER, mode], stdout=subprocess.PIPE,
                          text=True) as owner:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        assert _alive(child)
        owner.kill()
    deadline = time.monotonic() + wait
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    return child, _alive(child)


def test_a_bound_child_gets_sigterm_when_its_owner_is_killed() -> None:
    _child, alive = _child_after_owner_killed("bound", wait=20)
    assert not alive


def test_an_unbound_child_outlives_its_owner_as_monarch_localcluster_up_needs() -> None:
    # The control: without the hook the child survives (what `monarch-localcluster up` wants).
    child, alive = _child_after_owner_killed("unbound", wait=2)
    try:
        assert alive
    finally:
        os.kill(child, signal.SIGKILL)
