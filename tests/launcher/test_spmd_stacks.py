"""Every rank's stack over real ssh (issue 35 items 3 and 4, field case C35 standalone).

``monarch-torchrun`` (``monarch-launch spmd``) on two loopback hosts of two slots: rank 2
sleeps in native code before ``all_reduce`` #3 while ranks 0, 1 and 3 wait in it. A SIGUSR1
prints every rank's stack and the run goes on; at the progress deadline (lowered to a few
seconds) every rank's stack is taken before anything is stopped and the final line names rank
2, its host, its frame and the collective the others wait in.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from monarch_operator.launcher.programs.spmdstacks import BEGIN, END
from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import Launch, run_launch
from tests.launcher.test_spmd import assert_no_script_left, copy_script

pytestmark = pytest.mark.ssh

DEADLINE_S = 8  # the stall deadline of this test (runPolicy.progressDeadlineSeconds)


def block(lines: list[str], heading: str) -> tuple[list[str], list[str]]:
    """The summary lines after the first line starting with ``heading``, and the full dump
    between BEGIN and END after it."""
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    begin = lines.index(BEGIN, start)
    return lines[start:begin], lines[begin + 1:lines.index(END, begin)]


def line_of(script: Path, text: str) -> int:
    """The 1-based number of the script's line holding ``text``."""
    return next(number for number, line in enumerate(script.read_text().splitlines(), 1)
                if text in line)


def test_c35_stuck_rank_named_on_sigusr1_and_at_the_deadline(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    script = copy_script(tmp_path, "c35_stuck_rank.py")
    sleep_line = line_of(script, "time.sleep(3600)")
    wait_line = line_of(script, "# all_reduce #3")
    odd = re.compile(rf"rank 2 on {re.escape(b)} is not in all_reduce #3 where 3 ranks wait: "
                     rf"c35_stuck_rank\.py:{sleep_line} load_batch")

    # SIGUSR1 once rank 2 is in load_batch and the others in all_reduce #3 (they print the
    # same line just before it): a dump on request; the run goes on until the deadline.
    launch: Launch = run_launch(
        tmp_path, ssh_cluster, f"{a} slots=2\n{b} slots=2\n", monarch_port, str(script),
        spmd=True, extra_env={"MONARCH_PROGRESS_DEADLINE_SECONDS": str(DEADLINE_S)},
        sigterm_after=f"[spmd/{b}/2] rank 2 pid", stop_signal=signal.SIGUSR1,
        signal_delay_s=1.5)

    text = launch.describe()
    for heading in ("(on request)", "(the run stalled)"):
        summary, dump = block(launch.lines, f"monarch-launch: stacks of every rank {heading}")
        assert odd.search(summary[0]), text
        for rank, host in ((0, a), (1, a), (3, b)):
            assert (f"monarch-launch:   rank {rank} on {host}: in all_reduce #3 at "
                    f"c35_stuck_rank.py:{wait_line} main") in summary, text
        assert (f"monarch-launch:   rank 2 on {b}: not in a collective (last all_reduce #2) "
                f"at c35_stuck_rank.py:{sleep_line} load_batch") in summary, text
        assert any(f'c35_stuck_rank.py", line {sleep_line} in load_batch' in line
                   for line in dump), text
    # The dump on request stopped nothing: the run went on until the deadline stopped it.
    stall = [line for line in launch.lines if "ProgressStalled: no progress report" in line]
    assert stall and odd.search(stall[-1]), text
    assert f"threads: rank 0 on {a}: in all_reduce #3" in stall[-1], text
    assert launch.returncode != 0, text
    assert_no_script_left(tmp_path)
