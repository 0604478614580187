"""Every Monarch proc's stack in role mode and the job API, over real ssh (issue 35 items 3 and 4).

``monarch-launch run stuckrole:main`` (tests/data/roles): a trainer role of 4 ranks on two
loopback hosts of two slots and a ref role of one on a third; trainer rank 2 sleeps in
``load_batch`` before ``all_reduce`` #3 while ranks 0, 1 and 3 wait in it. A SIGUSR1 prints
every proc's stack and the run goes on; at the progress deadline, on SIGTERM and after a lost
host every proc's stack (of the hosts still there) is taken before anything is stopped, and
the odd one out of the trainer role is named with its host, frame and the collective the others
wait in. The built-in example (``monarch-launch`` in role mode) answers SIGUSR1 and goes on.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from monarch_operator.launcher.programs.spmdstacks import END
from monarch_operator.testing.loopback_sshd import SshCluster, processes_mentioning
from tests.launcher.launching import Launch, run_launch
from tests.launcher.test_spmd_stacks import block, line_of

pytestmark = pytest.mark.ssh

DATA = Path(__file__).resolve().parents[1] / "data" / "roles"
PROGRAM = DATA / "stuckrole.py"
DEADLINE_S = 8  # the stall deadline of the first test (runPolicy.progressDeadlineSeconds)
SLEEP_LINE = line_of(PROGRAM, "time.sleep(3600)")
WAIT_LINE = line_of(PROGRAM, "dist.all_reduce(self.tensor)")
HEADING = "monarch-launch: stacks of every rank"


def run_stuck(tmp_path: Path, cluster: SshCluster, monarch_port: int, **options) -> Launch:
    """The stuck program on hosts a, b (trainer, 2 slots each) and c (ref, 1 slot); the
    options go to :func:`run_launch`, which acts once step 2 is done (1.5 s later)."""
    a, b, c = cluster.hosts
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(DATA),
                                                       os.environ.get("PYTHONPATH")]))}
    env.update(options.pop("extra_env", {}))
    return run_launch(
        tmp_path, cluster, f"{a} slots=2\n{b} slots=2\n{c} slots=1\n", monarch_port,
        "--trainer-hosts", "2", "--ref-hosts", "1", "stuckrole:main", "--steps", "5",
        program=True, extra_env=env, sigterm_after="step 2/5 done", signal_delay_s=1.5,
        **options)


def odd_pattern(b: str) -> re.Pattern[str]:
    return re.compile(rf"trainer rank 2 on {re.escape(b)} is not in all_reduce #3 where 3 ranks "
                      rf"wait: stuckrole\.py:{SLEEP_LINE} load_batch")


def assert_every_proc(summary: list[str], dump: list[str], hosts: dict[int, str],
                      ref_host: str | None, text: str) -> None:
    """Trainer ranks of ``hosts`` (rank -> host) and the ref rank (on ``ref_host``, None: not
    shown) in the summary, rank 2's frame in the whole dump."""
    for rank, host in hosts.items():
        if rank == 2:
            assert (f"monarch-launch:   trainer rank 2 on {host}: not in a collective (last "
                    f"all_reduce #2) at stuckrole.py:{SLEEP_LINE} load_batch") in summary, text
        else:
            assert (f"monarch-launch:   trainer rank {rank} on {host}: in all_reduce #3 at "
                    f"stuckrole.py:{WAIT_LINE} step") in summary, text
    refs = [line for line in summary if line.startswith("monarch-launch:   ref rank 0 on ")]
    assert len(refs) == (ref_host is not None), text
    if ref_host is not None:
        assert refs[0].startswith(f"monarch-launch:   ref rank 0 on {ref_host}: "), text
    assert any(f'stuckrole.py", line {SLEEP_LINE} in load_batch' in line for line in dump), text


def test_stuck_trainer_rank_named_on_sigusr1_and_at_the_deadline(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts
    launch = run_stuck(tmp_path, ssh_cluster, monarch_port, stop_signal=signal.SIGUSR1,
                       extra_env={"MONARCH_PROGRESS_DEADLINE_SECONDS": str(DEADLINE_S)})

    text = launch.describe()
    for heading in ("(on request)", "(the run stalled)"):
        summary, dump = block(launch.lines, f"{HEADING} {heading}")
        assert odd_pattern(b).search(summary[0]), text
        assert_every_proc(summary, dump, {0: a, 1: a, 2: b, 3: b}, c, text)
    # The dump on request stopped nothing: the run went on until the deadline stopped it.
    stall = [line for line in launch.lines if "ProgressStalled: no progress report" in line]
    assert stall and odd_pattern(b).search(stall[-1]), text
    assert f"threads: trainer rank 0 on {a}: in all_reduce #3" in stall[-1], text
    assert launch.returncode == 128 + signal.SIGTERM, text


def test_a_stop_from_outside_takes_every_procs_stack_first(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts
    launch = run_stuck(tmp_path, ssh_cluster, monarch_port, stop_signal=signal.SIGTERM)

    text = launch.describe()
    summary, dump = block(
        launch.lines, f"{HEADING} (stopped: terminated by signal 15 (SIGTERM))")
    assert odd_pattern(b).search(summary[0]), text
    assert_every_proc(summary, dump, {0: a, 1: a, 2: b, 3: b}, c, text)
    assert launch.lines.index(summary[0]) < next(
        i for i, line in enumerate(launch.lines) if line.startswith("monarch-launch: torn down"))
    assert launch.returncode == 128 + signal.SIGTERM, text


def test_after_a_lost_host_the_stacks_of_the_hosts_still_there_are_taken(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts

    def kill_worker_on_c() -> None:  # the ref's host: the trainer ranks keep waiting
        for pid, args in processes_mentioning(f"tcp://{c}:{monarch_port}"):
            worker = "run_worker_loop_forever" in args and "monarch-session-guard" not in args
            if worker and not args.startswith("ssh "):
                os.kill(pid, signal.SIGKILL)

    launch = run_stuck(tmp_path, ssh_cluster, monarch_port, then=kill_worker_on_c)

    text = launch.describe()
    summary, dump = block(launch.lines, f"{HEADING} (host {c} lost)")
    assert odd_pattern(b).search(summary[0]), text
    assert_every_proc(summary, dump, {0: a, 1: a, 2: b, 3: b}, None, text)
    assert launch.returncode == 1, text
    failure = [line for line in launch.lines if line.startswith("monarch-launch: failed:")]
    assert failure and "Monarch worker lost mid-run" in failure[-1] and c in failure[-1], text


def test_the_built_in_example_prints_every_procs_stack_on_sigusr1_and_goes_on(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts
    log = tmp_path / "launch.log"

    def ask_then_stop() -> None:
        # monarch-launch: its stop guard (the first process, which passes SIGUSR1 on) and the
        # launcher under it; signalled as a user would, at the first.
        launcher = sorted(pid for pid, args in processes_mentioning(str(tmp_path / "hostfile"))
                          if "monarch-launch" in args and not args.startswith("ssh "))
        assert launcher, "monarch-launch should be running"
        os.kill(launcher[0], signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a step done after the dump: the run went on
            lines = log.read_text(errors="replace").splitlines()
            if END in lines and any(line.startswith("step ")
                                    for line in lines[lines.index(END):]):
                break
            time.sleep(0.2)
        os.kill(launcher[0], signal.SIGTERM)

    launch = run_launch(tmp_path, ssh_cluster, f"{a} slots=2\n{b} slots=1\n", monarch_port,
                        "--trainer-hosts", "1", "--ref-hosts", "1", "--steps", "1000000",
                        sigterm_after="step 2/", then=ask_then_stop)

    text = launch.describe()
    summary, dump = block(launch.lines, f"{HEADING} (on request)")
    for role, rank, host in (("trainer", 0, a), ("trainer", 1, a), ("ref", 0, b)):
        assert any(line.startswith(f"monarch-launch:   {role} rank {rank} on {host}: ")
                   for line in summary), text
    end = launch.lines.index(END)
    assert any(line.startswith("step ") for line in launch.lines[end:]), text
    assert any("monarch_operator/launcher/programs/rankside.py" not in line
               and "Thread 0x" in line for line in dump), text
    stopped, _ = block(launch.lines, f"{HEADING} (stopped: terminated by signal 15 (SIGTERM))")
    assert len([line for line in stopped if line.startswith("monarch-launch:   ")]) == 3, text
    assert launch.returncode == 128 + signal.SIGTERM, text
