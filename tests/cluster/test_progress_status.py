"""Progress in status on the local control plane (issue 22 item 1): a program's reports reach
``status.progress`` and ``kubectl get monarchjobs`` while it runs, at most once per
``spec.progress.reportIntervalSeconds``, the last one kept once it ended; a torchrun script's
``MONARCH_PROGRESS`` lines from a rank do the same; the launcher may write its own job's
progress and nothing else."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import (
    apply_manifest,
    job_manifest,
    job_status,
    table_row,
    wait_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster

REPO_OPERATOR = Path(__file__).resolve().parents[2] / "operator"
STEPS = 40
INTERVAL = 2
REPORTING_PROGRAM = textwrap.dedent(f"""
    import time
    from monarch_operator.job import report
    for step in range(1, {STEPS} + 1):
        time.sleep(0.3)
        report(step, total_steps={STEPS}, metrics={{"loss": round(1 / step, 4)}})
    print("done", flush=True)
""")


class ConfigMapWatch:
    """Every MODIFIED event of one ConfigMap, with when it arrived (monotonic seconds)."""

    def __init__(self, kubectl, namespace: str, name: str) -> None:
        self.events: list[tuple[float, dict]] = []
        self._process = subprocess.Popen(
            ["kubectl", "get", "configmap", name, "-n", namespace, "--watch",
             "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=kubectl.env)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self._process.stdout is not None
        for line in self._process.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break
                buffer = buffer.lstrip()[end:]
                if event.get("type") == "MODIFIED":
                    self.events.append((time.monotonic(), event["object"]))

    def stop(self) -> list[tuple[float, dict]]:
        if self._process.poll() is None:
            self._process.terminate()
        self._process.wait(10)
        self._thread.join(10)
        assert self._process.stdout is not None
        self._process.stdout.close()
        return self.events



def test_reports_reach_status_and_kubectl_get_at_the_configured_rate(kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest(
        "prog", progress={"reportIntervalSeconds": INTERVAL},
        launcher={"command": ["python3", "-c", REPORTING_PROGRAM]}))
    watch = wait_until(lambda: kubectl("get", "configmap", "prog-progress", "-n", namespace,
                                       check=False) and ConfigMapWatch(kubectl, namespace,
                                                                       "prog-progress"),
                       60, "the progress ConfigMap")
    try:
        running = wait_until(lambda: (status := job_status(kubectl, namespace, "prog")).get(
            "progress", {}).get("step", STEPS) < STEPS and status, 90, "progress while running")
        progress = running["progress"]
        assert progress["totalSteps"] == STEPS and progress["attempt"] == 1, progress
        assert progress["mainMetric"].startswith("loss="), progress
        table = kubectl("get", "monarchjobs", "prog", "-n", namespace, "-o", "wide")
        assert table.split()[:8] == ["NAME", "STATUS", "READY", "RESTARTS", "STEP", "PROGRESS",
                                     "ETA", "METRIC"], table
        cells = table_row(table)
        # ETA may still be empty: the rate needs two reports.
        assert cells["STEP"].isdigit() and cells["PROGRESS"].endswith("%"), table
        assert cells["METRIC"].startswith("loss="), table

        done = wait_phase(kubectl, namespace, "prog", "Succeeded", timeout=120)
    finally:
        writes = watch.stop()
    # The last report is written when the launcher ends, not lost.
    assert done["progress"]["step"] == STEPS and done["progress"]["percent"] == "100%", done
    assert done["attempts"][0]["lastStep"] == STEPS
    steps = [json.loads(event["data"]["progress.json"])["step"] for _, event in writes]
    assert steps and steps[-1] == STEPS, steps
    # Not faster than configured: every write but the final flush waited for the interval
    # (the arrival times of watch events: 0.5 s of slack for their delivery).
    gaps = [later - earlier for (earlier, _), (later, _) in zip(writes, writes[1:], strict=False)]
    assert all(gap >= INTERVAL - 0.5 for gap in gaps[:-1]), (gaps, steps)
    assert len(writes) < STEPS / 4, f"{len(writes)} writes for {STEPS} reports: not coalesced"


def test_the_launcher_may_write_its_own_jobs_progress_and_nothing_else(kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest("least", launcher={"command": ["true"]}))
    wait_until(lambda: kubectl("get", "rolebinding", "least-progress", "-n", namespace,
                               check=False), 60, "the launcher's RoleBinding")
    account = f"system:serviceaccount:{namespace}:least-launcher"

    def can(*what: str) -> str:
        return kubectl("auth", "can-i", *what, "-n", namespace, f"--as={account}",
                       check=False).strip()

    assert can("patch", "configmap/least-progress") == "yes"
    assert can("get", "configmap/least-progress") == "yes"
    assert can("patch", "configmap/least-hostfile") == "no"
    assert can("list", "configmaps") == "no"
    assert can("patch", "monarchjobs/least", "--subresource=status") == "no"
    assert can("get", "secrets") == "no"


SPMD_SCRIPT = textwrap.dedent("""
    import json, os, time
    for step in range(1, 6):
        time.sleep(0.2)
        if os.environ["RANK"] == "0":
            print("MONARCH_PROGRESS " + json.dumps({"step": step, "totalSteps": 5,
                                                   "metrics": {"reward": step * 1.5}}),
                  flush=True)
""")


def test_a_torchrun_scripts_progress_lines_reach_status(kubectl, namespace, scripts):
    script = scripts / "train.py"
    script.write_text(SPMD_SCRIPT)
    script.chmod(0o644)
    apply_manifest(kubectl, namespace, job_manifest(
        "spmdprog", spmd={"script": str(script), "nprocPerNode": 1},
        # This tree's launcher, not the one installed in the environment the pods run from.
        launcher={"env": [{"name": "PYTHONPATH", "value": str(REPO_OPERATOR)}]}))
    done = wait_phase(kubectl, namespace, "spmdprog", "Succeeded", timeout=180)
    progress = done.get("progress") or {}
    assert (progress.get("step"), progress.get("percent")) == (5, "100%"), done
    assert progress["mainMetric"] == "reward=7.5", progress


STALLING_PROGRAM = textwrap.dedent("""
    import os, signal, sys, threading, time
    from monarch_operator.job import report
    if os.environ.get("EXIT_0_ON_SIGTERM"):  # the stall still decides (issue 32 item 2)
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))

    def wait_for_a_dead_peer():
        threading.Event().wait()

    if os.environ["MONARCH_ATTEMPT"] == "1":
        for step in range(1, 4):
            report(step, total_steps=10)
            time.sleep(0.2)
        wait_for_a_dead_peer()
    report(10, total_steps=10)
""")


@pytest.mark.parametrize("exits_0_on_sigterm", [False, True], ids=["default", "exit-0"])
def test_a_stalled_attempt_is_detected_with_its_stacks_and_the_next_attempt_starts(
        kubectl, namespace, exits_0_on_sigterm):
    deadline = 30
    env = [{"name": "EXIT_0_ON_SIGTERM", "value": "1"}] if exits_0_on_sigterm else []
    apply_manifest(kubectl, namespace, job_manifest(
        "stall", progress={"reportIntervalSeconds": 1},
        runPolicy={"progressDeadlineSeconds": deadline},
        launcher={"command": ["python3", "-c", STALLING_PROGRAM], "env": env}))
    done = wait_phase(kubectl, namespace, "stall", "Succeeded", timeout=240)
    first, second = done["attempts"]
    assert (first["class"], first["reason"]) == ("Infrastructure", "ProgressStalled"), first
    assert any("wait_for_a_dead_peer" in line for line in first.get("stacks", [])), first
    assert first["lastStep"] == 3 and second["class"] == "Succeeded", done
    # Detected within the deadline (plus the time to stop and judge it).
    launched = dt.datetime.fromisoformat(first["launchTime"].replace("Z", "+00:00"))
    ended = dt.datetime.fromisoformat(first["endTime"].replace("Z", "+00:00"))
    assert (ended - launched).total_seconds() < deadline + 20, first
    assert done["progress"]["step"] == 10 and done["progress"]["attempt"] == 2


CRASHING_PROGRAM = textwrap.dedent("""
    import os, sys
    from monarch_operator.job import report
    attempt = int(os.environ["MONARCH_ATTEMPT"])
    report({1: 5, 2: 10, 3: 10}.get(attempt, 0), total_steps=100)
    sys.exit(1)
""")


def test_failures_after_progress_spend_no_budget_and_a_loop_without_it_stops(
        kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest(
        "budget", runPolicy={"backoffLimit": 0, "progressResetsBackoff": True},
        launcher={"command": ["python3", "-c", CRASHING_PROGRAM]}))
    done = wait_phase(kubectl, namespace, "budget", "Failed", timeout=240)
    records = done["attempts"]
    assert [(record["class"], record.get("lastStep"), record.get("budgetSpent", True))
            for record in records] == [("Application", 5, False), ("Application", 10, False),
                                       ("Application", 10, True)], records
    assert (done.get("failureCounts") or {}).get("application", 0) == 0, done
