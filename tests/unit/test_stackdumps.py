"""Rank stack dumps read (issue 35): faulthandler text, flight recorder JSON, the per-rank
summary, the odd one out, and the rank bootstrap run for real in a child interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monarch_operator.launcher import progress
from monarch_operator.launcher.session import rankstacks, stackdumps
from monarch_operator.launcher.session.stackdumps import Collective, Frame, RankDump

VENV = "/opt/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"

WAITING_DUMP = f"""Thread 0x00007f8e9a4fc6c0 (most recent call first):
  File "<string>", line 29 in serve
  File "{STDLIB}/threading.py", line 982 in run
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

Current thread 0x00007f8e9b070b80 (most recent call first):
  File "{VENV}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{VENV}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/job/train.py", line 20 in main
  File "/job/train.py", line 30 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<string>", line 52 in <module>
"""

SLEEPING_DUMP = """Current thread 0x00007f465e209b80 (most recent call first):
  File "/job/data.py", line 88 in load_batch
  File "/job/train.py", line 18 in main
  File "<string>", line 52 in <module>

Thread 0x00007f465d6a56c0 (most recent call first):
  File "<string>", line 29 in serve
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap
"""


def flight_recorder(enqueued: int, completed: int, op: str = "gloo:all_reduce") -> str:
    """A flight recorder JSON as torch 2.13's gloo writes it (trimmed)."""
    entries = [{"collective_seq_id": seq, "p2p_seq_id": 0, "pg_id": 0, "profiling_name": op,
                "state": "scheduled"} for seq in range(1, enqueued + 1)]
    return json.dumps({"entries": entries, "pg_status": {"0": {
        "last_completed_collective": str(completed), "last_enqueued_collective": str(enqueued),
        "last_started_collective": "-1"}}, "version": "2.10"})


def host_output(*ranks: tuple[int, str, str | None]) -> str:
    parts = ["some login banner"]
    for rank, stack, fr in ranks:
        parts += [f"@@monarch-stacks rank={rank} pid={100 + rank} part=stack", stack,
                  f"@@monarch-stacks rank={rank} pid={100 + rank} part=fr", fr or ""]
    return "\n".join(parts)


def c35_dumps() -> list[RankDump]:
    """Ranks 0, 1 on host a and 3 on b waiting in all_reduce #3; rank 2 on b in load_batch."""
    a = stackdumps.parse_host_output("a", host_output(
        (0, WAITING_DUMP, flight_recorder(3, 2)), (1, WAITING_DUMP, flight_recorder(3, 2))))
    b = stackdumps.parse_host_output("b", host_output(
        (2, SLEEPING_DUMP, flight_recorder(2, 2)), (3, WAITING_DUMP, flight_recorder(3, 2))))
    return sorted(a + b, key=lambda dump: dump.rank)


def test_faulthandler_threads_put_the_main_thread_first_and_the_user_frame_skips_libraries():
    threads = stackdumps.parse_faulthandler(WAITING_DUMP)
    assert [len(frames) for frames in threads] == [6, 3]
    assert threads[0][0] == Frame(f"{VENV}/torch/distributed/distributed_c10d.py", 3252,
                                  "all_reduce")
    dump = RankDump(0, "a", threads=threads)
    assert dump.user_frame() == Frame("/job/train.py", 20, "main")
    assert stackdumps.parse_faulthandler(SLEEPING_DUMP)[0][0].name == "load_batch"


def test_flight_recorder_says_waiting_in_the_enqueued_collective_or_after_the_completed_one():
    assert stackdumps.parse_flight_recorder(flight_recorder(3, 2)) == (
        Collective("all_reduce", 3, True), "")
    assert stackdumps.parse_flight_recorder(flight_recorder(2, 2, "nccl:broadcast")) == (
        Collective("broadcast", 2, False), "")
    assert stackdumps.parse_flight_recorder("{}") == (None, "")
    assert stackdumps.parse_flight_recorder("") == (None, "no flight recorder dump")
    assert stackdumps.parse_flight_recorder("{not json")[1] == "flight recorder dump is not JSON"
    assert stackdumps.parse_flight_recorder('{"error": "RuntimeError: boom"}') == (
        None, "RuntimeError: boom")


def test_c35_names_rank_2_its_host_and_frame_and_the_collective_three_ranks_wait_in():
    dumps = c35_dumps()
    assert [dump.pid for dump in dumps] == [100, 101, 102, 103]
    assert stackdumps.odd_one_out(dumps) == (
        "rank 2 on b is not in all_reduce #3 where 3 ranks wait: data.py:88 load_batch")
    assert stackdumps.summary_lines(dumps) == [
        "rank 0 on a: in all_reduce #3 at train.py:20 main",
        "rank 1 on a: in all_reduce #3 at train.py:20 main",
        "rank 2 on b: not in a collective (last all_reduce #2) at data.py:88 load_batch",
        "rank 3 on b: in all_reduce #3 at train.py:20 main",
    ]


def test_a_gone_or_silent_rank_is_the_odd_one_and_several_are_listed():
    dumps = c35_dumps()
    dumps[1] = RankDump(1, "a", pid=101, gone=True)
    assert stackdumps.odd_one_out(dumps).startswith(
        "ranks 1, 2 are not in all_reduce #3 where 2 ranks wait; rank 1 on a: no stack")
    assert stackdumps.rank_line(dumps[1]) == "rank 1 on a: its process was gone"
    stopped = RankDump(5, "c")  # a SIGSTOPped rank writes nothing
    assert stackdumps.rank_line(stopped) == (
        "rank 5 on c: no collective known (no Python stack: process stopped or silent)")


def test_without_collectives_the_rank_at_another_frame_is_named_and_equal_ranks_give_nothing():
    sleeping = stackdumps.parse_faulthandler(SLEEPING_DUMP)
    working = stackdumps.parse_faulthandler(WAITING_DUMP)
    dumps = [RankDump(rank, "h", threads=working) for rank in range(3)]
    assert stackdumps.odd_one_out(dumps) == ""
    dumps.append(RankDump(3, "h", threads=sleeping))
    assert stackdumps.odd_one_out(dumps) == (
        "rank 3 on h is not at train.py:20 main where 3 ranks are: data.py:88 load_batch")


def test_summary_is_bounded_in_lines_and_characters():
    dumps = [RankDump(rank, "host-" + "x" * 300, threads=[]) for rank in range(40)]
    lines = stackdumps.summary_lines(dumps, limit=5)
    assert len(lines) == 5 and lines[-1] == "... and 36 more ranks"
    assert all(len(line) <= stackdumps.MAX_LINE for line in lines)


def test_stall_message_names_the_odd_one_before_the_threads_and_fits_a_termination_message():
    dumps = c35_dumps()
    message = progress.stall_message(65, 60, {"step": 2}, stackdumps.summary_lines(dumps) * 10,
                                     stackdumps.odd_one_out(dumps))
    assert message.startswith(
        "ProgressStalled: no progress report for 65s (runPolicy.progressDeadlineSeconds=60; "
        "last step 2); rank 2 on b is not in all_reduce #3 where 3 ranks wait: data.py:88 "
        "load_batch; threads: rank 0 on a: in all_reduce #3")
    assert len(message) <= progress.MAX_STALL_MESSAGE < 4096


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "train.py", "--lr", "1"], ["python", "-c", "B", "train.py", "--lr", "1"]),
    (["/v/bin/python3", "-m", "pkg.train"], ["/v/bin/python3", "-c", "B", "-m", "pkg.train"]),
    (["./train.sh", "x"], ["./train.sh", "x"]),
    (["python", "-u", "train.py"], ["python", "-u", "train.py"]),
])
def test_wrap_argv_puts_the_bootstrap_before_python_scripts_only(argv, expected):
    wrapped = rankstacks.wrap_argv(argv)
    assert [rankstacks.BOOTSTRAP if part == "B" else part for part in expected] == wrapped


def test_folders_are_safe_names_per_run_and_host():
    assert rankstacks.stacks_dir("run 42/../x") == "/tmp/monarch-stacks-run_42_.._x"
    assert rankstacks.host_dir("/tmp/s", "user@host:1") == "/tmp/s/user_host_1"


def test_bootstrap_in_a_real_child_dumps_on_signal_and_the_collector_reads_it(tmp_path: Path):
    script = tmp_path / "sleeper.py"
    script.write_text("import sys, time\n\ndef wait_here():\n    print(sys.argv[1:], flush=True)\n"
                      "    time.sleep(60)\n\nwait_here()\n")
    folder = tmp_path / "stacks"
    child = subprocess.Popen(
        rankstacks.wrap_argv([sys.executable, str(script), "arg"]),
        env={**os.environ, rankstacks.ENV_STACKS_DIR: str(folder), "RANK": "7"},
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "['arg']"
        deadline = time.monotonic() + 10
        while not (folder / "rank-7.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        out = subprocess.run(["sh", "-c", rankstacks.collect_script(str(folder))],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        assert child.poll() is None  # the dump stopped nothing
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    (dump,) = stackdumps.parse_host_output("h", out)
    assert dump.rank == 7 and dump.pid == child.pid
    assert dump.user_frame() == Frame(str(script), 5, "wait_here")
    assert dump.collective is None and dump.fr_error == ""  # no torch.distributed: "{}"
    gone = subprocess.run(["sh", "-c", rankstacks.collect_script(str(folder))],
                          capture_output=True, text=True, timeout=20, check=True).stdout
    assert stackdumps.parse_host_output("h", gone)[0].gone
