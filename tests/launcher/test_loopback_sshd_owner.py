"""The loopback sshd daemons end with the process that started them, teardown or not: a test
run stopped with SIGINT (pytest-xdist then ends its workers without their fixtures' teardown)
or SIGKILL used to leave `sshd -D -e -f /tmp/pytest-of-root/...` running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from monarch_operator.testing.loopback_sshd import SshdUnavailable, check_prerequisites
from tests.launcher.conftest import _unavailable

# The owner: starts one loopback host, prints its sshd's pid, then waits to be killed.
OWNER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from monarch_operator.testing.loopback_sshd import LoopbackSshd
    daemons = LoopbackSshd(1, Path(sys.argv[1]))
    daemons.start()
    print(*daemons.daemon_pids.values(), flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_daemons_end_when_their_owner_is_killed(tmp_path: Path) -> None:
    try:
        check_prerequisites()
    except SshdUnavailable as error:
        _unavailable(str(error))
    with subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE,
                          text=True) as owner:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line.strip(), f"the owner printed no sshd pid (exit {owner.poll()})"
        sshd = int(line)
        assert _alive(sshd)
        owner.kill()  # no teardown runs
    deadline = time.monotonic() + 20
    while _alive(sshd) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(sshd), f"sshd {sshd} outlived the process that started it"
    finally:
        if _alive(sshd):
            os.kill(sshd, signal.SIGKILL)
