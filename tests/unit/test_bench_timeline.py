"""bench/timeline.py: the phases of one job's start, read from pods, ConfigMaps and the
launcher's timestamped log, for our MonarchJob and the MPI Operator's MPIJob alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import timeline  # noqa: E402  (bench/ is not a package)

T0 = timeline.api_time("2026-12-05T05:00:00Z")


def stamp(seconds: int) -> str:
    return f"2026-12-05T05:00:{seconds:02d}Z"


def pod(name: str, role: str, job: str, created: int, scheduled: int | None = None,
        started: int | None = None, ready: int | None = None, ours: bool = True) -> dict:
    prefix = "monarch-operator.dev" if ours else "training.kubeflow.org"
    labels = ({f"{prefix}/job": job, f"{prefix}/role": role} if ours
              else {f"{prefix}/job-name": job, f"{prefix}/job-role": role})
    conditions = [{"type": kind, "status": "True", "lastTransitionTime": stamp(at)}
                  for kind, at in (("PodScheduled", scheduled), ("Ready", ready)) if at is not None]
    statuses = ([{"state": {"running": {"startedAt": stamp(started)}}}] if started is not None
                else [{"state": {"waiting": {"reason": "ContainerCreating"}}}])
    return {"metadata": {"name": name, "labels": labels, "creationTimestamp": stamp(created)},
            "status": {"conditions": conditions, "containerStatuses": statuses}}


LAUNCHER_LOG = "\n".join([
    "2026-12-05T05:00:09.250000123Z monarch-launch: hosts from /etc/monarch/hostfile",
    "2026-12-05T05:00:10.5Z monarch-launch: pre-flight ok on 2 hosts (+1.2s)",
    "2026-12-05T05:00:12.000000001Z monarch-launch: mesh spmd attached (+2.8s)",
    "2026-12-05T05:00:13.75Z monarch-launch: 2 ranks ready, MASTER_ADDR=a MASTER_PORT=1 (+4.5s)",
    "2026-12-05T05:00:15.125Z [spmd/a/0] step 1/1 loss=1.0",
    "2026-12-05T05:00:16.5Z [spmd/b/1] step 1/1 loss=1.0",
])


def fake_api(pods: list[dict], configmaps: list[str], log: str):
    def get(kind: str, *args: str) -> dict:
        if kind == "pods":
            selector = args[args.index("-l") + 1]
            key, _, value = selector.partition("=")
            return {"items": [p for p in pods if p["metadata"]["labels"].get(key) == value]}
        assert kind == "configmaps", kind
        return {"items": [{"metadata": {"name": n, "creationTimestamp": stamp(6)}}
                          for n in configmaps]}
    return get, (lambda namespace, name: log if "launcher" in name else "")


def test_a_monarchjob_timeline_takes_the_last_worker_and_the_newest_launcher() -> None:
    pods = [pod("j-worker-0", "worker", "j", 1, 2, 3, 5),
            pod("j-worker-1", "worker", "j", 1, 2, 4, 6),
            pod("j-launcher-old", "launcher", "j", 6, 6, 7),
            pod("j-launcher-new", "launcher", "j", 7, 7, 8),
            pod("k-worker-0", "worker", "k", 30, 30, 30, 30)]  # another job: not counted
    get, logs = fake_api(pods, ["j-hostfile", "j-config"], LAUNCHER_LOG)

    got = timeline.relative(timeline.job_timeline(get, logs, True, "ns", "j"), T0)

    assert got == {
        "workers created": 1.0, "workers scheduled": 2.0, "workers started": 4.0,
        "workers Ready": 6.0, "hostfile written": 6.0, "launcher created": 7.0,
        "launcher scheduled": 7.0, "launcher started": 8.0,
        "launcher's first line": 9.25, "pre-flight done": 10.5, "Monarch workers up": 12.0,
        "ranks spawned": 13.75, "first step": 15.12,
    }


def test_an_mpijob_timeline_has_no_launcher_lines_it_never_prints() -> None:
    pods = [pod("m-worker-0", "worker", "m", 1, 1, 2, 3, ours=False),
            pod("m-launcher", "launcher", "m", 4, 4, 5, ours=False)]
    log = "2026-12-05T05:00:08.5Z step 1/1 loss=1.0\n"
    get, logs = fake_api(pods, ["m-config"], log)

    got = timeline.relative(timeline.job_timeline(get, logs, False, "ns", "m"), T0)

    assert got["hostfile written"] == 6.0 and got["launcher started"] == 5.0
    assert got["launcher's first line"] == got["first step"] == 8.5
    assert got["pre-flight done"] is None and got["Monarch workers up"] is None


def test_a_worker_not_started_yet_leaves_the_phase_empty() -> None:
    phases = timeline.pod_phases([pod("w0", "worker", "j", 1, 2, 3, 4),
                                  pod("w1", "worker", "j", 1, 2)], None)

    assert phases["workers scheduled"] == T0 + 2
    assert phases["workers started"] is None and phases["workers Ready"] is None
    assert "launcher created" not in phases


def test_nanosecond_log_stamps_keep_their_fraction() -> None:
    assert timeline._log_time("2026-12-05T05:00:09.250000123Z") == pytest.approx(T0 + 9.250000123)
    assert timeline._log_time("2026-12-05T05:00:09Z") == T0 + 9


def test_the_table_prints_p50_per_phase_and_a_dash_for_a_phase_nobody_had() -> None:
    rows = {"ours": [{"first step": 3.0}, {"first step": 5.0}, {"first step": 10.0}],
            "peer": [{"first step": 7.0}]}

    text = timeline.table(rows).splitlines()

    first = next(line for line in text if line.startswith("first step"))
    assert first.split()[-2:] == ["5.0", "7.0"]
    preflight = next(line for line in text if line.startswith("pre-flight done"))
    assert preflight.split()[-2:] == ["-", "-"]


def test_seen_keeps_a_pod_as_it_was_before_its_deletion_began_and_after_it_is_gone() -> None:
    live = pod("j-worker-0", "worker", "j", 1, 2, 3, 5)
    terminating = {**live, "metadata": {**live["metadata"], "deletionTimestamp": stamp(20)},
                   "status": {"conditions": [], "containerStatuses": []}}
    listings = iter([[live], [terminating], []])
    seen = timeline.Seen(lambda kind, *args: {"items": next(listings) if kind == "pods" else []})

    for _ in range(3):
        seen.poll("ns")

    [kept] = seen.get("pods", "-n", "ns", "-l", "monarch-operator.dev/job=j")["items"]
    assert kept is live
    assert seen.get("pods", "-n", "ns", "-l", "monarch-operator.dev/job=k")["items"] == []
    assert seen.get("pods", "-n", "other")["items"] == []
