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


# Programs that take SIGTERM away from the launcher (issue 32 item 1): each prints "waiting"
# once it has, then waits to be stopped. Without the stop guard (launcher/stopguard.py) every
# one of them ended `succeeded`, exit 0.
TAKES_SIGTERM = {
    "script_handler_exits_0": """\
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("waiting", flush=True)
time.sleep(120)
""",
    "handler_inside_job_from_env": """\
import signal, sys, time
from monarch_operator.job import Job
with Job.from_env():
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("waiting", flush=True)
    time.sleep(120)
""",
    "asyncio_add_signal_handler": """\
import asyncio, signal
async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("waiting", flush=True)
    await stop.wait()
asyncio.run(main())
""",
    "thread_calls_os_exit_0": """\
import os, signal, threading, time
signal.signal(signal.SIGTERM,
              lambda *a: threading.Thread(target=os._exit, args=(0,)).start())
print("waiting", flush=True)
time.sleep(120)
""",
}

# A module:function target: the function gets the entered job and takes SIGTERM inside it.
FUNCTION_MODULE = """\
import signal, sys, time

def main(job):
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("waiting", flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("variant", [*sorted(TAKES_SIGTERM), "function_target_handler"])
def test_a_program_that_takes_sigterm_away_still_ends_143(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int, variant: str
) -> None:
    if variant == "function_target_handler":
        (tmp_path / "takes_sigterm.py").write_text(FUNCTION_MODULE)
        target = "takes_sigterm:main"
    else:
        (tmp_path / "program.py").write_text(TAKES_SIGTERM[variant])
        target = str(tmp_path / "program.py")
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(tmp_path, ssh_cluster, f"{a} slots=1\n{b} slots=1\n", monarch_port,
                        "--env", f"PYTHONPATH={tmp_path}",  # the hosts import the target too
                        target, program=True, sigterm_after="waiting")

    assert launch.returncode == 143, launch.describe()
    assert not any(line.endswith("succeeded") for line in launch.lines), launch.describe()
    assert launch.lines[-1].startswith(
        "monarch-launch: failed: terminated by signal 15 (SIGTERM)"), launch.describe()
