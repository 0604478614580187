"""``kubectl monarch``'s pure parts (issue 22 item 4): where each rank runs, the tables, and
the launcher output of one role or rank. The plugin itself runs against the local cluster in
tests/cluster/test_kubectl_plugin.py."""

from __future__ import annotations

import pytest

from monarch_operator.plugin import views


def body(**spec) -> dict:
    return {"metadata": {"name": "demo", "namespace": "team-a", "uid": "u1", "generation": 1},
            "spec": {"image": "img", **spec}, "status": {}}


def test_separate_roles_put_ranks_host_by_host():
    job = body(workers={"replicas": 3, "gpusPerWorker": 2},
               meshes={"trainer": {"hosts": 2}, "ref": {"hosts": 1}})
    places = [(p.role, p.rank, p.ordinal, p.local_rank, p.gpu) for p in views.rank_places(job)]
    assert places == [("trainer", 0, 0, 0, 0), ("trainer", 1, 0, 1, 1), ("trainer", 2, 1, 0, 0),
                      ("trainer", 3, 1, 1, 1), ("ref", 0, 2, 0, 0), ("ref", 1, 2, 1, 1)]
    assert views.find_rank(views.rank_places(job), 3, None).ordinal == 1
    assert views.find_rank(views.rank_places(job), 1, "ref").ordinal == 2
    with pytest.raises(LookupError, match="ref has no rank 2 .ranks 0..1."):
        views.find_rank(views.rank_places(job), 2, "ref")


def test_colocated_roles_split_each_hosts_gpus():
    job = body(workers={"replicas": 2, "gpusPerWorker": 4},
               meshes={"trainer": {"hosts": 2, "gpus": 3}, "ref": {"hosts": 2},
                       "colocate": True})
    ref = [(p.rank, p.ordinal, p.gpu) for p in views.rank_places(job) if p.role == "ref"]
    assert ref == [(0, 0, 3), (1, 1, 3)]


def test_spmd_ranks_follow_the_ordinals():
    job = body(workers={"replicas": 2, "gpusPerWorker": 4},
               spmd={"script": "/train.py", "nprocPerNode": 2})
    assert [(p.rank, p.ordinal, p.local_rank) for p in views.rank_places(job)] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]


def test_hosts_table_names_pod_and_node():
    job = body(workers={"replicas": 2, "gpusPerWorker": 1},
               meshes={"trainer": {"hosts": 1}, "ref": {"hosts": 1}})
    pods = [{"metadata": {"name": "demo-worker-0"}, "spec": {"nodeName": "node-a"}}]
    rows = views.hosts_table(job, pods)
    assert rows[0] == ["ROLE", "RANK", "LOCAL", "HOST", "POD", "NODE", "GPU"]
    assert rows[1][:3] == ["trainer", "0", "0"] and rows[1][4:] == ["demo-worker-0", "node-a", "0"]
    assert rows[1][3].startswith("demo-worker-0.demo-worker.team-a.svc.")
    assert rows[2][4:6] == ["demo-worker-1 (missing)", "-"]
    job["status"] = {"phase": "Succeeded",  # released, not missing
                     "conditions": [{"type": "Succeeded", "status": "True"}]}
    assert views.hosts_table(job, [])[1][4] == "demo-worker-0 (released)"
    # Still there once finished: releasing (its StatefulSet deleted, the pod follows), the
    # node still named; kept by KeepAll: plain, unless the deadline released everything.
    assert views.hosts_table(job, pods)[1][4:6] == ["demo-worker-0 (releasing)", "node-a"]
    job["spec"]["cleanupPolicy"] = "KeepAll"
    assert views.hosts_table(job, pods)[1][4] == "demo-worker-0"
    job["status"] = {"phase": "Failed", "conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}
    assert views.hosts_table(job, pods)[1][4] == "demo-worker-0 (releasing)"
    # Being deleted while the job runs: terminating.
    job["status"] = {}
    pods[0]["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    assert views.hosts_table(job, pods)[1][4] == "demo-worker-0 (terminating)"


def test_attempts_table_and_logs_filter():
    status = {"attempt": 2, "attempts": [
        {"number": 1, "class": "Application", "reason": "LauncherFailed", "exitCode": 3,
         "role": "trainer", "rank": 3, "host": "demo-worker-1.demo-worker.team-a.svc",
         "startTime": "t0", "endTime": "t1"},
        {"number": 2, "startTime": "t2", "launcherPod": "demo-launcher-2"}]}
    rows = views.attempts_table(status)
    assert rows[1][:5] == ["1", "Application", "LauncherFailed", "3", "trainer 3 on demo-worker-1"]
    assert rows[2][1] == "running"
    assert views.launcher_pod_name({"metadata": {"name": "demo"}, "status": status}, None) == \
        "demo-launcher-2"
    assert views.launcher_pod_name({"metadata": {"name": "demo"}, "status": status}, 1) == \
        "demo-launcher"
    lines = ["monarch-launch: pre-flight ok\n", "[worker/demo-worker-0/0] loss 1.0\n",
             "[worker/demo-worker-1/1] loss 2.0\n", "trainer rank 1/2 host=h pid=1\n",
             "placement ref rank=0 host=h\n"]
    assert list(views.filter_lines(lines, None, 1)) == [lines[2], lines[3]]
    assert list(views.filter_lines(lines, "ref", None)) == [lines[4]]
    assert list(views.filter_lines(lines, None, None)) == lines
    assert views.table([["A", "BB"], ["ccc", "d"]]) == "A     BB\nccc   d"


def test_status_shows_the_programs_last_report():
    body = {"metadata": {"name": "demo", "namespace": "team-a"}, "status": {
        "phase": "Running", "attempt": 2, "progress": {
            "attempt": 2, "step": 250, "totalSteps": 1000, "percent": "25%",
            "stepsPerSecond": 2.5, "eta": "5m00s", "lastUpdatedTime": "2026-12-02T03:00:00Z",
            "metrics": [{"name": "loss", "value": "0.31"}], "runURL": "https://wandb.ai/r/1"},
        "attempts": [{"number": 1, "class": "Application", "lastStep": 120}]}}
    lines = views.status_lines(body)
    assert ("progress: step 250/1000 (attempt 2, reported 2026-12-02T03:00:00Z); 25%; "
            "2.5 steps/s; ETA 5m00s; loss=0.31") in lines, lines
    assert "run https://wandb.ai/r/1" in lines
    assert views.attempts_table(body["status"])[1][7] == "120"


@pytest.mark.parametrize(("status", "said"), [
    ({"phase": "Queued", "attempt": 1, "message": "waiting in LocalQueue user-queue",
      "attempts": [{"number": 1, "startTime": "t0"}]},
     "kubectl monarch logs: job demo has no launcher pod yet: phase Queued (waiting in "
     "LocalQueue user-queue), see kubectl monarch status demo"),
    ({"phase": "Succeeded", "attempt": 1, "attempts": [
        {"number": 1, "launchTime": "t1", "launcherPod": "demo-launcher", "class": "Succeeded"}]},
     "kubectl monarch logs: launcher pod demo-launcher of job demo (attempt 1) no longer "
     "exists: phase Succeeded"),
])
def test_logs_of_a_job_without_its_launcher_pod_say_why(monkeypatch, capsys, status, said):
    """Not kubectl's raw NotFound (issue 32 item 7)."""
    from monarch_operator.plugin import cli

    def kubectl_get(self, *args):
        if args[0] == cli.RESOURCE:
            return {**body(), "status": status}
        raise cli.KubectlError(f'Error from server (NotFound): pods "{args[1]}" not found', 1)

    monkeypatch.setattr(cli.Kube, "json", kubectl_get)
    monkeypatch.setattr(cli.Kube, "run", lambda self, *args: pytest.fail(f"kubectl {args}"))
    assert cli.main(["logs", "demo", "-n", "team-a"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(said), err
    assert "NotFound" not in err


def test_stacks_shows_the_kept_dump_or_the_last_recorded_rank_lines():
    from monarch_operator import constants
    from monarch_operator.controller.builders import launcher
    from monarch_operator.plugin import cli, stacks

    assert cli.LAUNCHER_CONTAINER == launcher.LAUNCHER_CONTAINER
    dump = f"{constants.STACKS_DUMP_HEADER} attempt=2 time=T (on request)\nrank 0 ...\n"
    assert stacks.stored_dump({"data": {constants.STACKS_DUMP_KEY: dump}}) == dump
    assert stacks.dump_header(dump) == (f"{constants.STACKS_DUMP_HEADER} attempt=2 time=T "
                                        "(on request)")
    assert stacks.stored_dump({"data": {"progress.json": "{}"}}) == ""
    assert stacks.stored_dump(None) == "" and stacks.dump_header("") == ""
    job = body()
    assert stacks.recorded_lines(job) == []
    job["status"] = {"attempts": [
        {"number": 1, "message": "ProgressStalled: rank 2 on h is not in all_reduce #3",
         "stacks": ["rank 0 on h: in all_reduce #3 at train.py:20 main"]},
        {"number": 2, "message": "running"}]}
    assert stacks.recorded_lines(job) == [
        "attempt 1: ProgressStalled: rank 2 on h is not in all_reduce #3",
        "  rank 0 on h: in all_reduce #3 at train.py:20 main"]


def test_the_request_signals_the_pid_the_launcher_wrote(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import uuid

    from monarch_operator import constants
    from monarch_operator.launcher.programs import spmdstacks
    from monarch_operator.plugin import stacks

    environ = {constants.ENV_JOB_UID: uuid.uuid4().hex, constants.ENV_ATTEMPT: "3"}
    assert spmdstacks.pid_file_path({}) is None
    path = spmdstacks.pid_file_path(environ)
    assert path == f"/tmp/monarch-launcher-{environ[constants.ENV_JOB_UID]}-3.pid"
    waiter = subprocess.Popen([sys.executable, "-c", "import signal, sys; "
                               "signal.sigwait([signal.SIGUSR1]); sys.exit(7)"],
                              preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK,
                                                                        [signal.SIGUSR1]))
    try:
        with open(path, "w") as out:
            out.write(str(waiter.pid))
        subprocess.run(stacks.REQUEST_COMMAND, env={**os.environ, **environ}, check=True,
                       timeout=10)
        assert waiter.wait(10) == 7
    finally:
        os.unlink(path)
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
