"""Checkpoint before a node drain on the local control plane (issue 21 item 4): a running job
with ``runPolicy.checkpointGracePeriodSeconds`` has worker 0 evicted by ``kubectl drain``. The
launcher is asked to stop first (deleted with the grace period) while worker 0, terminating,
keeps the rank's open ssh session (its entrypoint waits after SIGTERM); the program saves its
state through that session and names it; the attempt ends as a lost worker (Infrastructure),
and the next attempt, on a recreated worker 0, resumes from the checkpoint.

The launcher's program stands for a Monarch controller: it holds one ssh session to worker 0
(as SSHJob does for each rank), with the launcher pod's own key, known_hosts and addresses.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.cluster.helpers import (
    LABEL_JOB,
    apply_manifest,
    get_json,
    job_manifest,
    job_status,
    running_attempt,
    wait_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster

GRACE = 40

RANK_SESSION_PROGRAM = textwrap.dedent("""
    import os, pwd, subprocess, sys, time
    from monarch_operator.job import checkpoint_saved, on_stop, resume_checkpoint, stop_requested
    from monarch_operator.launcher.session.dnswait import host_address_lines, parse_host_addresses
    from monarch_operator.launcher.session.ssh import SshSettings, ssh_args
    on_stop()
    if resume_checkpoint():
        print("resumed from", resume_checkpoint(), flush=True)
        sys.exit(0)
    hosts = [line.split()[0] for line in open(os.environ["MONARCH_HOSTFILE"]) if line.strip()]
    host = hosts[0]
    listing = open(os.environ["MONARCH_HOST_ADDRESSES"]).read()
    address = parse_host_addresses(host_address_lines(listing, "addresses"), hosts)[host]
    settings = SshSettings(port=int(os.environ["MONARCH_SSH_PORT"]),
                           user=pwd.getpwuid(os.getuid()).pw_name,
                           key=os.environ["MONARCH_SSH_KEY"],
                           known_hosts=os.environ["MONARCH_KNOWN_HOSTS"])
    rank = subprocess.Popen(
        ["ssh", *ssh_args(settings, host, tty=False), address,
         'echo up; read step; echo "saved-$step-on-$(hostname)"'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if rank.stdout.readline() != "up\\n":
        print("rank failed:", settings, address, rank.communicate()[1], flush=True)
        sys.exit(3)
    print("rank up", flush=True)
    step = 0
    while not stop_requested():
        time.sleep(0.1)
        step += 1
    time.sleep(3)  # saving takes a while: the drained worker must still be there
    answer, _ = rank.communicate(f"{step}\\n", timeout=30)
    print("rank answered", answer.strip(), flush=True)
    checkpoint_saved("/ckpt/drain/" + answer.strip())
""")


def test_a_drained_worker_lets_the_program_checkpoint_and_the_next_attempt_resumes(
        kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest(
        "drain", runPolicy={"checkpointGracePeriodSeconds": GRACE},
        launcher={"command": ["python3", "-c", RANK_SESSION_PROGRAM]}))
    running_attempt(kubectl, namespace, "drain", 1)

    def session_open() -> bool:
        log = kubectl("logs", "drain-launcher", "-n", namespace)
        assert "rank failed" not in log, log
        return "rank up" in log

    try:
        wait_until(session_open, 60, "the rank's session open")
    except (AssertionError, RuntimeError) as error:
        raise AssertionError(f"{error}: job status {job_status(kubectl, namespace, 'drain')}; "
                             f"pods {kubectl('get', 'pods', '-n', namespace)}") from None
    worker = get_json(kubectl, "pod", "drain-worker-0", "-n", namespace)
    assert worker["spec"]["terminationGracePeriodSeconds"] == GRACE + 15
    node = worker["spec"]["nodeName"]
    try:
        # Only this job's workers on that node: the cluster is shared with other tests.
        kubectl("drain", node, "--pod-selector",
                f"{LABEL_JOB}=drain,monarch-operator.dev/role=worker", "--ignore-daemonsets",
                "--delete-emptydir-data", "--timeout=120s")
        status = wait_until(
            lambda: (s := job_status(kubectl, namespace, "drain")).get("lastCheckpoint") and s,
            90, "the checkpoint recorded")
    finally:
        kubectl("uncordon", node)
    where = status["lastCheckpoint"]["location"]
    # Saved by the rank on worker 0, through its session, after the launcher was asked to stop.
    assert where.startswith("/ckpt/drain/saved-") and where.endswith("-on-drain-worker-0"), where
    events = kubectl("get", "events", "-n", namespace, "--field-selector",
                     "involvedObject.name=drain", "-o", "jsonpath={.items[*].reason}")
    assert "CheckpointRequested" in events.split(), events
    done = wait_phase(kubectl, namespace, "drain", "Succeeded", timeout=150)
    first = done["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", "WorkerEvicted"), first
    assert "drain-worker-0" in first["message"] and first["checkpoint"] == where
    assert done["attempt"] == 2
    assert f"resumed from {where}" in kubectl("logs", "drain-launcher-2", "-n", namespace)
