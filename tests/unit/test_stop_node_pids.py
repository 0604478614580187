"""``stop_node`` (localcluster/node/node.py) kills its recorded pids through pidfds taken at its
start: a recorded process that ended during its rounds leaves its pid free, and a process that
takes it (another test's, on a machine where ``pid_max`` 32768 wraps in minutes) must live.

The reuse is forced: the scenario runs as the first process of a new pid namespace
(``unshare --pid``), where writing ``ns_last_pid`` picks the next pid. The node has no cgroup
or network namespace; its own processes (found by membership each round) are stood in for by
one process for two rounds, so that the loop goes on after the recorded one died.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

SCENARIO = textwrap.dedent("""
    import json, subprocess
    from monarch_operator.localcluster.node import node
    recorded = subprocess.Popen(["sleep", "1000"])
    member = subprocess.Popen(["sleep", "1000"])
    rounds, bystander = [], []
    def processes_of(name):
        rounds.append(name)
        return {member.pid} if len(rounds) <= 2 else set()
    reap_round = node._reap_round
    def reap_then_take_the_pid(pids):
        reap_round(pids)
        if not bystander:
            recorded.wait()
            with open("/proc/sys/kernel/ns_last_pid", "w") as last:
                last.write(str(recorded.pid - 1))
            bystander.append(subprocess.Popen(["sleep", "1000"]))
    node.processes_of = processes_of
    node._reap_round = reap_then_take_the_pid
    node.stop_node("absent", [recorded.pid], keep={1})
    taker = bystander[0]
    print(json.dumps({"recorded": recorded.pid, "taker": taker.pid, "rounds": len(rounds),
                      "taker_alive": taker.poll() is None}))
    taker.kill()
""")


def test_stop_node_spares_a_process_that_took_a_recorded_pid_meanwhile() -> None:
    unshare = shutil.which("unshare")
    assert unshare, "util-linux's unshare is a set-up requirement (scripts/setup.sh)"
    run = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                          SCENARIO], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["taker"] == result["recorded"], result  # the pid really was taken
    assert result["rounds"] >= 3, result  # the loop went on after the recorded one died
    assert result["taker_alive"], result
