"""Every Monarch proc's stack in role mode and the job API (issue 35): the collector's output
read per role, the odd one out of each role, bounded lines, the pid check (a pid that does not
hold its stack file is never signalled, in both collectors), the flight recorder variable, and
the proc side run for real in a child interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monarch_operator.launcher import stopsignal
from monarch_operator.launcher.programs import jobstacks
from monarch_operator.launcher.programs.rankside import RankInfo
from monarch_operator.launcher.session import procstacks, rankstacks, stackdumps
from monarch_operator.launcher.session.procstacks import ProcTarget
from monarch_operator.launcher.session.workerloss import WorkerLost

VENV = "/opt/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
OURS = "/work/operator/monarch_operator/launcher"


def proc_dump(user_frames: list[str]) -> str:
    """A Monarch proc as faulthandler dumps it: the stack server of procstacks, the thread
    running the user's endpoint (none when idle; innermost frame first), the main thread in
    Monarch's bootstrap."""
    frames = "\n".join(f"  {line}" for line in user_frames)
    endpoint = f"""Thread 0x00007f00000002c0 (most recent call first):
{frames}
  File "{VENV}/monarch/_src/actor/actor_mesh.py", line 948 in handle

""" if user_frames else ""
    return f"""Thread 0x00007f00000003c0 (most recent call first):
  File "{OURS}/session/procstacks.py", line 104 in _serve_flight_recorder
  File "{STDLIB}/threading.py", line 982 in run
  File "{STDLIB}/threading.py", line 1045 in _bootstrap_inner
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

{endpoint}Current thread 0x00007f00000001c0 (most recent call first):
  File "{VENV}/monarch/_src/actor/bootstrap_main.py", line 57 in invoke_main
  File "{VENV}/monarch/_src/actor/bootstrap_main.py", line 88 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""


WAITING = proc_dump([
    f'File "{VENV}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce',
    'File "/job/stuckrole.py", line 52 in step'])
SLEEPING = proc_dump(['File "/job/stuckrole.py", line 32 in load_batch',
                      'File "/job/stuckrole.py", line 50 in step'])
IDLE = proc_dump([])


def flight_recorder(enqueued: int, completed: int) -> str:
    entries = [{"collective_seq_id": seq, "p2p_seq_id": 0, "pg_id": 0,
                "profiling_name": "gloo:all_reduce", "state": "scheduled"}
               for seq in range(1, enqueued + 1)]
    return json.dumps({"entries": entries, "pg_status": {"0": {
        "last_completed_collective": str(completed), "last_enqueued_collective": str(enqueued)}}})


def block(role: str, rank: int, stack: str, fr: str) -> str:
    mark = f"@@monarch-stacks rank={rank} pid={100 + rank} part="
    return f"{mark}stack role={role}\n{stack}\n{mark}fr role={role}\n{fr}\n"


def job_dumps() -> list[stackdumps.RankDump]:
    """Trainer ranks 0 and 1 on h1, 2 and 3 on h2; rank 2 in load_batch, the others in
    all_reduce #3; ref ranks 0 and 1 on h3, idle."""
    hosts = {
        "h1": block("trainer", 0, WAITING, flight_recorder(3, 2))
        + block("trainer", 1, WAITING, flight_recorder(3, 2)),
        "h2": block("trainer", 2, SLEEPING, flight_recorder(2, 2))
        + block("trainer", 3, WAITING, flight_recorder(3, 2)),
        "h3": block("ref", 0, IDLE, "{}") + block("ref", 1, IDLE, "{}"),
    }
    dumps = [dump for host, text in hosts.items()
             for dump in stackdumps.parse_host_output(host, text)]
    for dump in dumps:
        dump.order = 0 if dump.role == "trainer" else 1
    return dumps


def test_role_markers_are_read_and_the_endpoint_threads_user_frame_is_found():
    dumps = job_dumps()
    assert [(d.role, d.rank, d.host, d.pid) for d in dumps] == [
        ("trainer", 0, "h1", 100), ("trainer", 1, "h1", 101), ("trainer", 2, "h2", 102),
        ("trainer", 3, "h2", 103), ("ref", 0, "h3", 100), ("ref", 1, "h3", 101)]
    # Not Monarch's main thread, not our stack server: the thread running the user's endpoint.
    assert dumps[2].user_frame() == stackdumps.Frame("/job/stuckrole.py", 32, "load_batch")
    assert dumps[0].user_frame() == stackdumps.Frame("/job/stuckrole.py", 52, "step")
    assert stackdumps.rank_line(dumps[2]) == (
        "trainer rank 2 on h2: not in a collective (last all_reduce #2) at stuckrole.py:32 "
        "load_batch")
    assert stackdumps.rank_line(dumps[4]).startswith("ref rank 0 on h3: no collective known at "
                                                     "bootstrap_main.py:57 invoke_main")


def test_the_odd_one_out_is_named_per_role():
    dumps = job_dumps()
    assert jobstacks.odd_per_role(dumps) == (
        "trainer rank 2 on h2 is not in all_reduce #3 where 3 ranks wait: stuckrole.py:32 "
        "load_batch")
    # A second role with an odd one of its own: both named, in the roles' order.
    ref = next(dump for dump in dumps if (dump.role, dump.rank) == ("ref", 1))
    ref.threads = stackdumps.parse_faulthandler(SLEEPING)
    dumps.append(stackdumps.parse_host_output("h3", block("ref", 2, IDLE, "{}"))[0])
    dumps[-1].order = 1
    assert jobstacks.odd_per_role(dumps).split("; ") == [
        "trainer rank 2 on h2 is not in all_reduce #3 where 3 ranks wait: stuckrole.py:32 "
        "load_batch",
        "ref rank 1 on h3 is not at bootstrap_main.py:57 invoke_main where 2 ranks are: "
        "stuckrole.py:32 load_batch"]
    # Ranks of different roles never make each other odd: each role alone is even.
    even = [d for d in job_dumps() if d.rank != 2 or d.role != "trainer"]
    assert jobstacks.odd_per_role(even) == ""


def test_lines_are_bounded_and_ordered_by_role_then_rank():
    dumps = []
    for order, role in enumerate(("trainer", "x" * 300)):
        for rank in range(30):
            text = block(role[:64], rank, WAITING, flight_recorder(3, 2))
            (dump,) = stackdumps.parse_host_output("host-" + "y" * 200, text)
            dump.order = order
            dumps.append(dump)
    lines = stackdumps.summary_lines(list(reversed(dumps)))
    assert len(lines) == stackdumps.MAX_RANK_LINES
    assert all(len(line) <= stackdumps.MAX_LINE for line in lines)
    assert lines[0].startswith("trainer rank 0 on host-") and lines[1].startswith("trainer rank 1")
    assert lines[-1] == f"... and {60 - stackdumps.MAX_RANK_LINES + 1} more ranks"


def test_targets_group_procs_by_host_address_and_leave_lost_hosts_out():
    def info(role: str, rank: int, host: str, pid: int) -> RankInfo:
        return RankInfo(role, rank, 4, host, 0, rank % 2, pid, host, "-", 1, "0")

    ranks = {"trainer": [info("trainer", 0, "a", 10), info("trainer", 1, "a", 11),
                         info("trainer", 2, "b", 12)],
             "ref": [info("ref", 0, "a", 20), info("ref", 1, "c", 21)]}
    addresses = {"a": "10.244.0.11", "b": "10.244.0.12", "c": "10.244.0.13"}
    targets = jobstacks.proc_targets("run1", ranks, addresses, left_out={"b"})
    assert list(targets) == ["10.244.0.11", "10.244.0.13"]
    host, procs = targets["10.244.0.11"]
    assert host == "a" and [(p.role, p.rank, p.pid) for p in procs] == [
        ("trainer", 0, 10), ("trainer", 1, 11), ("ref", 0, 20)]
    assert procs[2].path == "/tmp/monarch-stacks-run1/ref-rank-0.stack"
    assert procstacks.stack_path("r/1", "a b", 3) == "/tmp/monarch-stacks-r_1/a_b-rank-3.stack"


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, {"TORCH_FR_BUFFER_SIZE": "2000"}),
    ({"TORCH_FR_BUFFER_SIZE": "50"}, {}),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, {}),  # the user's, under the older name
])
def test_the_flight_recorder_buffer_is_set_by_its_current_name_unless_the_user_set_one(
        environ, expected):
    assert procstacks.flight_recorder_env(environ) == expected


def test_stacks_are_taken_before_a_stop_from_outside_or_after_a_lost_host_only():
    stopsignal.reset()
    try:
        assert jobstacks.stop_reason(None) is None
        assert jobstacks.stop_reason(RuntimeError("a rank failed")) is None
        assert jobstacks.stop_reason(WorkerLost({"b": 255})) == ("host b lost",
                                                                 frozenset({"b"}))
        stopsignal.record(signal.SIGTERM)
        assert jobstacks.stop_reason(None) == (
            "stopped: terminated by signal 15 (SIGTERM)", frozenset())
        stopsignal.record_stall("ProgressStalled: ...")  # taken at the stall already
        assert jobstacks.stop_reason(None) is None
    finally:
        stopsignal.reset()


PROC = """import sys, time
from monarch_operator.launcher.session import procstacks

def wait_here():
    print(procstacks.register(sys.argv[1]), flush=True)
    time.sleep(60)

wait_here()
"""


def start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def stop(*children: subprocess.Popen[str]) -> None:
    for child in children:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_real_proc_dumps_on_signal_and_a_pid_without_the_file_is_never_signalled(
        tmp_path: Path):
    script = tmp_path / "proc.py"
    script.write_text(PROC)
    path = str(tmp_path / "stacks" / "trainer-rank-2.stack")
    proc = start([sys.executable, str(script), path])
    # A process that does not hold the file, as one that got a dead proc's pid would be:
    # SIGUSR2 would end it (its default action).
    stranger = start(["sleep", "60"])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "None"
        targets = [ProcTarget("trainer", 2, proc.pid, path),
                   ProcTarget("trainer", 3, stranger.pid, path)]
        out = subprocess.run(["sh", "-c", procstacks.collect_script(targets)],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        assert proc.poll() is None and stranger.poll() is None  # nothing stopped or killed
    finally:
        stop(proc, stranger)
    dumps = {dump.rank: dump for dump in stackdumps.parse_host_output("h", out)}
    assert dumps[2].role == "trainer" and dumps[2].pid == proc.pid and not dumps[2].gone
    assert dumps[2].user_frame() == stackdumps.Frame(str(script), 6, "wait_here")
    assert dumps[2].collective is None and dumps[2].fr_error == ""  # no torch.distributed
    assert dumps[3].gone and dumps[3].pid == stranger.pid
    # The proc is gone now: its pid holds nothing, so nothing is signalled.
    again = subprocess.run(["sh", "-c", procstacks.collect_script(targets[:1])],
                           capture_output=True, text=True, timeout=30, check=True).stdout
    assert stackdumps.parse_host_output("h", again)[0].gone


def test_the_spmd_collector_checks_the_pid_too(tmp_path: Path):
    folder = tmp_path / "stacks"
    folder.mkdir()
    stranger = start(["sleep", "60"])
    try:
        (folder / "rank-1.pid").write_text(str(stranger.pid))
        (folder / "rank-1.stack").write_text("")
        out = subprocess.run(["sh", "-c", rankstacks.collect_script(str(folder))],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        time.sleep(0.2)
        assert stranger.poll() is None, "a pid that does not hold the stack file was signalled"
    finally:
        stop(stranger)
    (dump,) = stackdumps.parse_host_output("h", out)
    assert dump.gone and dump.rank == 1 and os.path.exists(folder / "rank-1.stack")


# A rank whose dump comes in two parts with a pause between (as a rank descheduled in the
# middle of faulthandler's many writes does); its flight recorder part is there at once.
SLOW_RANK = """import os, signal, sys, time
folder = sys.argv[1]
out = open(os.path.join(folder, "rank-0.stack"), "a")

def slow_dump(signum, frame):
    out.write("Current thread 0x0000000000000001 (most recent call first):\\n")
    out.flush()
    with open(os.path.join(folder, "rank-0.fr"), "w") as fr:
        fr.write("{}")
    time.sleep(0.1)
    out.write('  File "/job/train.py", line 7 in main\\n')
    out.flush()

signal.signal(signal.SIGUSR2, slow_dump)
with open(os.path.join(folder, "rank-0.pid"), "w") as pid:
    pid.write(str(os.getpid()))
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def test_the_collector_waits_for_a_dump_written_in_parts(tmp_path: Path):
    folder = tmp_path / "stacks"
    folder.mkdir()
    script = tmp_path / "slow.py"
    script.write_text(SLOW_RANK)
    rank = start([sys.executable, str(script), str(folder)])
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        out = subprocess.run(["sh", "-c", rankstacks.collect_script(str(folder))],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        stop(rank)
    (dump,) = stackdumps.parse_host_output("h", out)
    assert dump.user_frame() == stackdumps.Frame("/job/train.py", 7, "main"), out
