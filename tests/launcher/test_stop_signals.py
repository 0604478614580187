"""A launcher stopped from outside never ends in exit 0 (issue 20, item 1, standalone).

SIGTERM (kill, a pod's deletion), SIGINT (Ctrl-C) and SIGHUP (the terminal closing) give
``128 + signal`` and a last line naming the signal, whatever the user's program does with it:
ranks that trap the signal and exit 0, a program that catches the exception and exits 0.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster, processes_mentioning
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

STOP_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]

# A program run in-process by `monarch-launch run` that swallows whatever stops it and exits 0.
SWALLOWING_PROGRAM = """\
import signal, sys, time
print("waiting", flush=True)
try:
    time.sleep(120)
except BaseException as caught:
    print("caught", type(caught).__name__, flush=True)
sys.exit(0)
"""


@pytest.mark.parametrize("number", STOP_SIGNALS, ids=lambda n: signal.Signals(n).name)
def test_ranks_that_exit_0_on_the_signal_still_give_128_plus_it(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int, number: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    needle = "sleep 281.9"
    name = signal.Signals(number).name

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--no-python",
        "sh",
        "-c",
        f"trap 'echo trapped; exit 0' TERM INT HUP; echo started; {needle} & wait",
        spmd=True,
        sigterm_after=f"[spmd/{b}/1] started",
        stop_signal=number,
    )

    assert launch.returncode == 128 + number, launch.describe()
    assert launch.lines[-1] == (
        f"monarch-launch: failed: terminated by signal {number} ({name})"
    ), launch.describe()
    deadline = time.monotonic() + 10
    while (left := processes_mentioning(needle)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"ranks left: {left}"


@pytest.mark.parametrize("number", STOP_SIGNALS, ids=lambda n: signal.Signals(n).name)
def test_a_program_that_swallows_the_signal_and_exits_0_is_not_a_success(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int, number: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    program = tmp_path / "swallow.py"
    program.write_text(SWALLOWING_PROGRAM)

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        str(program),
        program=True,
        sigterm_after="waiting",
        stop_signal=number,
    )

    assert launch.returncode == 128 + number, launch.describe()
    assert "caught" in " ".join(launch.lines), "the program did swallow it"
    assert launch.lines[-1].startswith(
        f"monarch-launch: failed: terminated by signal {number} ({signal.Signals(number).name})"
    ), launch.describe()
