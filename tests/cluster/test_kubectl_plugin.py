"""``kubectl monarch`` against the local control plane (issue 22 item 4): a running job's
status, hosts, one rank's launcher lines, a command in the worker of a rank, describe, and a
finished job's attempts; every subcommand again once the job Succeeded (its workers released);
kubectl finds the plugin on PATH as ``kubectl monarch``."""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig

import pytest

from tests.cluster.helpers import (apply_manifest, job_manifest, running_attempt, wait_phase,
                                   wait_until)

pytestmark = pytest.mark.cluster

LAUNCHER = ("echo 'trainer rank 0/1 host=h pid=1'; echo 'placement ref rank=0 host=h'; "
            "echo '[worker/demo-worker-1/1] from rank one'; sleep 600")


def plugin(local_cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl monarch ARGS`` as a user runs it after ``eval "$(monarch-localcluster env)"``:
    kubectl resolves the plugin on that PATH."""
    exports = subprocess.run(
        [os.path.join(sysconfig.get_path("scripts"), "monarch-localcluster"), "--dir",
         str(local_cluster.state_dir), "env"], capture_output=True, text=True, check=True,
        env={**os.environ}).stdout
    env = {**os.environ}
    for line in exports.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0]
    # Only what `env` put on PATH (kubectl's folder, this environment's scripts) and the
    # system's folders: kubectl must find the plugin there.
    env["PATH"] = os.pathsep.join([*env["PATH"].split(os.pathsep)[:2], "/usr/bin", "/bin"])
    return subprocess.run(["kubectl", "monarch", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_plugin_shows_status_hosts_logs_and_runs_in_a_ranks_worker(
        local_cluster, kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest(
        "plug", launcher={"command": ["sh", "-c", LAUNCHER.replace("demo-", "plug-")]}))
    running_attempt(kubectl, namespace, "plug", 1)

    status = plugin(local_cluster, "status", "plug", "-n", namespace)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"{namespace}/plug: Running"), status.stdout
    assert "ATTEMPT" in status.stdout and "running" in status.stdout, status.stdout

    hosts = plugin(local_cluster, "hosts", "plug", "-n", namespace)
    assert hosts.returncode == 0, hosts.stderr
    rows = [line.split() for line in hosts.stdout.splitlines()[1:]]
    assert [(row[0], row[1], row[4]) for row in rows] == [("trainer", "0", "plug-worker-0"),
                                                          ("ref", "0", "plug-worker-1")]
    assert all(row[5].startswith("kwok-") for row in rows), hosts.stdout  # the nodes

    logs = plugin(local_cluster, "logs", "plug", "-n", namespace, "--role", "ref")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == ["placement ref rank=0 host=h"], logs.stdout
    one = plugin(local_cluster, "logs", "plug", "-n", namespace, "--rank", "1")
    assert one.stdout.splitlines() == ["[worker/plug-worker-1/1] from rank one"], one.stdout

    ran = plugin(local_cluster, "exec", "plug", "-n", namespace, "--role", "ref", "--rank", "0",
                 "--", "hostname")
    assert (ran.returncode, ran.stdout.strip()) == (0, "plug-worker-1"), ran.stderr
    missing = plugin(local_cluster, "exec", "plug", "-n", namespace, "--rank", "5", "--", "true")
    assert missing.returncode == 1 and "trainer has no rank 5" in missing.stderr, missing.stderr

    described = plugin(local_cluster, "describe", "plug", "-n", namespace)
    assert described.returncode == 0, described.stderr
    assert "LauncherStarted" in described.stdout and "plug-worker-1" in described.stdout

    kubectl("delete", "pod", "plug-launcher", "-n", namespace, "--wait=false")
    running_attempt(kubectl, namespace, "plug", 2)
    after = plugin(local_cluster, "status", "plug", "-n", namespace)
    assert "Infrastructure" in after.stdout and "LauncherLost" in after.stdout, after.stdout

    gone = plugin(local_cluster, "status", "no-such-job", "-n", namespace)
    assert gone.returncode != 0 and "not found" in gone.stderr, gone.stderr


def test_every_subcommand_answers_for_a_finished_job(local_cluster, kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest("plugdone", launcher={"command": [
        "sh", "-c", "echo 'trainer rank 0/1 host=h pid=1'; echo 'placement ref rank=0 host=h'"]}))
    wait_phase(kubectl, namespace, "plugdone", "Succeeded", timeout=120)

    status = plugin(local_cluster, "status", "plugdone", "-n", namespace)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"{namespace}/plugdone: Succeeded"), status.stdout
    assert "Succeeded" in status.stdout.split("ATTEMPT", 1)[1], status.stdout

    # Succeeded comes first, then the workers are deleted (each within its grace period):
    # meanwhile a worker shows as releasing, then as released.
    def host_pods() -> list[list[str]]:
        hosts = plugin(local_cluster, "hosts", "plugdone", "-n", namespace)
        assert hosts.returncode == 0, hosts.stderr
        rows = [line.split()[4:6] for line in hosts.stdout.splitlines()[1:]]
        assert all(row[1] in ("(releasing)", "(released)") for row in rows), hosts.stdout
        return rows

    wait_until(lambda: host_pods() == [["plugdone-worker-0", "(released)"],
                                       ["plugdone-worker-1", "(released)"]],
               60, "both workers released")

    # The ended launcher's pod is kept for its output.
    logs = plugin(local_cluster, "logs", "plugdone", "-n", namespace, "--role", "ref")
    assert (logs.returncode, logs.stdout.splitlines()) == (
        0, ["placement ref rank=0 host=h"]), logs.stderr

    ran = plugin(local_cluster, "exec", "plugdone", "-n", namespace, "--rank", "0", "--", "true")
    assert ran.returncode == 1 and "plugdone is Succeeded: its workers were released" in \
        ran.stderr, ran.stderr

    described = plugin(local_cluster, "describe", "plugdone", "-n", namespace)
    assert described.returncode == 0, described.stderr
    assert "LauncherSucceeded" in described.stdout and "(released)" in described.stdout
