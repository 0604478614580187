"""The session guard's SIGKILL after a hangup reaches only the processes it found then
(launcher/session/guard.py), never one that took the pid of one of them that ended meanwhile.

CI, 2026-12-05: on loopback hosts that start ~160 processes a second, ``pid_max`` 32768 wraps
every few minutes; a session that closed at the end of one run SIGKILLed, 5 s later, a worker
of the next run that had taken the pid of one of its ranks ("the worker on 127.0.0.7 exited
(ssh exit status 137)"). Here the reuse is forced: the scenario runs as the first process of a
new pid namespace (``unshare --pid``), where writing ``ns_last_pid`` picks the next pid.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from monarch_operator.launcher.session.guard import GUARD_CODE

# The worker: ignores SIGTERM (so it is still there for the SIGKILL), starts a child that
# ends on SIGTERM, reaps it, and sleeps.
WORKER = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(1000)"],
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    with open(sys.argv[1], "w") as out:
        out.write(str(child.pid))
    child.wait()
    time.sleep(1000)
""")

# Runs as pid 1 of a new pid namespace: the guard, a hangup, the child's pid given to a
# bystander once the child has ended, then the guard's grace runs out.
SCENARIO = textwrap.dedent("""
    import json, os, subprocess, sys, time
    guard_code, worker_code, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    pid_file = os.path.join(folder, "child.pid")
    guard = subprocess.Popen(
        [sys.executable, "-c", guard_code, "2", sys.executable, "-c", worker_code, pid_file],
        stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (os.path.exists(pid_file) and open(pid_file).read()):
        assert time.monotonic() < deadline, "the worker's child did not start"
        time.sleep(0.05)
    child = int(open(pid_file).read())
    worker = [int(p) for p in os.listdir("/proc") if p.isdigit()
              and worker_code in open("/proc/%s/cmdline" % p).read().replace(chr(0), " ")
              and guard_code not in open("/proc/%s/cmdline" % p).read()][0]
    guard.stdin.close()  # the hangup: the guard SIGTERMs the worker and the child
    while os.path.exists("/proc/%d" % child):
        assert time.monotonic() < deadline, "the child did not end on SIGTERM"
        time.sleep(0.01)
    with open("/proc/sys/kernel/ns_last_pid", "w") as last:
        last.write(str(child - 1))
    bystander = subprocess.Popen(["sleep", "1000"])
    code = guard.wait(30)
    time.sleep(0.2)
    result = {"guard": code, "child": child, "bystander_pid": bystander.pid,
              "bystander_alive": bystander.poll() is None,
              "worker_alive": os.path.exists("/proc/%d" % worker)
                  and open("/proc/%d/stat" % worker).read().rsplit(")", 1)[1].split()[0] != "Z"}
    bystander.kill()
    print(json.dumps(result))
""")


# The guard runs in the worker's own Python (3.8 on): with pidfds (3.9 on, Linux 5.3 on) and
# with the start-time check alone.
WITHOUT_PIDFD = "import os\ndel os.pidfd_open\n"


@pytest.mark.parametrize("prefix", ["", WITHOUT_PIDFD], ids=["pidfd", "start-time"])
def test_the_sigkill_after_a_hangup_spares_a_process_that_took_an_ended_ranks_pid(
        tmp_path, prefix: str) -> None:
    unshare = shutil.which("unshare")
    assert unshare, "util-linux's unshare is a set-up requirement (scripts/setup.sh)"
    run = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", SCENARIO,
         prefix + GUARD_CODE, WORKER, str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # The scenario really reused the pid (else it proves nothing).
    assert result["bystander_pid"] == result["child"], result
    assert result["bystander_alive"], result
    assert not result["worker_alive"], result  # the worker, still there, got the SIGKILL
    assert result["guard"] == 129, result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
