"""The run policy (classes, budgets, exit-code rules) and attempt records, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from monarch_operator.controller.spec import policy
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts
from monarch_operator.controller.state import status as st

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"


def run_policy(**fields) -> policy.RunPolicy:
    return policy.RunPolicy.from_spec(fields)


def test_defaults_match_the_crd():
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]
    properties = schema["openAPIV3Schema"]["properties"]["spec"]["properties"]
    run = properties["runPolicy"]["properties"]
    assert run["backoffLimit"]["default"] == policy.DEFAULT_BACKOFF_LIMIT
    assert (run["infrastructureBackoffLimit"]["default"]
            == policy.DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT)
    rule = run["podFailurePolicy"]["properties"]["rules"]["items"]["properties"]
    assert rule["action"]["enum"] == [policy.ACTION_FAIL_JOB, policy.ACTION_IGNORE,
                                      policy.ACTION_COUNT]
    assert properties["suspend"]["default"] is False
    assert policy.RunPolicy.from_spec(None) == policy.RunPolicy()


@pytest.mark.parametrize(("exit_code", "expected", "rule_index"), [
    (42, policy.FATAL, 0),          # FailJob In [42]
    (137, policy.INFRASTRUCTURE, 1),  # Ignore In [137, 143]
    (1, policy.APPLICATION, 2),      # Count NotIn [42, 137, 143, 7]
    (7, policy.APPLICATION, None),   # no rule
])
def test_first_matching_rule_decides_the_class(exit_code, expected, rule_index):
    rules = run_policy(podFailurePolicy={"rules": [
        {"action": "FailJob", "onExitCodes": {"values": [42]}},
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137, 143]}},
        {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [42, 137, 143, 7]}},
    ]})
    judged = policy.classify_exit_code(rules, exit_code)
    assert (judged.failure_class, judged.rule_index) == (expected, rule_index)


def test_budgets_are_separate_per_class():
    limits = run_policy(backoffLimit=1, infrastructureBackoffLimit=2)
    assert policy.decide(limits, policy.APPLICATION, {}).restart
    assert not policy.decide(limits, policy.APPLICATION, {"application": 1}).restart
    # Infrastructure restarts never spend the application budget, and the other way round.
    assert policy.decide(limits, policy.INFRASTRUCTURE, {"application": 1}).restart
    assert policy.decide(limits, policy.INFRASTRUCTURE, {"infrastructure": 1}).restart
    spent = policy.decide(limits, policy.INFRASTRUCTURE, {"infrastructure": 2})
    assert not spent.restart and "infrastructureBackoffLimit" in spent.budget
    assert spent.budget == ("infrastructure restarts exhausted: 2/2 "
                            "(runPolicy.infrastructureBackoffLimit)")
    for never in (policy.FATAL, policy.STARTUP):
        assert not policy.decide(limits, never, {}).restart


def pod(name: str, uid: str, restarts: int = 0, **status) -> dict:
    return {"metadata": {"name": name, "uid": uid},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "worker", "restartCount": restarts, "state": {"running": {}}}],
                **status}}


def test_lost_workers_named_with_their_cause():
    pods = [pod("j-worker-0", "a"), pod("j-worker-1", "b"), pod("j-worker-2", "c"),
            pod("j-worker-3", "d")]
    snapshot = attempts.worker_snapshot("j", 4, pods)
    assert snapshot[1] == {"name": "j-worker-1", "uid": "b", "restartCount": 0}
    assert attempts.lost_workers(snapshot, pods) == []
    now = [pod("j-worker-0", "a", restarts=1), pod("j-worker-2", "c2"),
           pod("j-worker-3", "d", reason="Evicted", message="node low on memory")]
    lost = {worker.name: worker.cause for worker in attempts.lost_workers(snapshot, now)}
    assert lost == {"j-worker-0": "container restarted", "j-worker-1": "deleted",
                    "j-worker-2": "deleted and recreated",
                    "j-worker-3": "evicted by the kubelet: node low on memory"}
    # Only briefly not Ready (a slow probe) is not a loss.
    not_ready = pod("j-worker-0", "a", conditions=[{"type": "Ready", "status": "False"}])
    assert attempts.lost_workers(snapshot[:1], [not_ready]) == []


@pytest.mark.parametrize(("line", "expected"), [
    ("launcher exited with code 1: trainer rank 3 (host demo-worker-1, local rank 1): raised "
     "ValueError: boom", {"role": "trainer", "rank": 3, "host": "demo-worker-1"}),
    ("rank 2 of 4 (host demo-worker-1, local rank 0) exited with code 3",
     {"rank": 2, "host": "demo-worker-1"}),
    ("monarch-launch: failed: rank 0 of 2 (host h, local rank 0) killed by signal 9",
     {"rank": 0, "host": "h"}),
    ("pre-flight failed: demo-worker-0: SSHUnreachable", {}),
])
def test_failing_rank_from_the_launchers_line(line, expected):
    assert attempts.failing_rank(line) == expected


def test_attempt_records_are_bounded():
    status: dict = {}
    for number in range(1, 15):
        status = attempts.begin(status, number, f"t{number}")
        status = attempts.update_current(status, endTime=f"e{number}", outputTail=["x"] * 3)
    assert status["attempt"] == 14 and status["restartCount"] == 13
    assert [record["number"] for record in status["attempts"]] == list(range(5, 15))
    long_output = "\n".join(f"line {i} " + "x" * 500 for i in range(100))
    tail = attempts.output_tail(long_output)
    assert len(tail) == attempts.OUTPUT_TAIL_LINES and tail[-1].startswith("line 99 ")
    assert max(map(len, tail)) == attempts.OUTPUT_LINE_CHARS
    assert len(attempts.shorten("y" * 5000)) == attempts.MESSAGE_CHARS


def test_phase_shows_restarting_and_suspended():
    status = st.set_condition({}, st.RUNNING, False, st.REASON_RESTARTING, "", 1, "t")
    assert st.summarize_phase(status) == st.PHASE_RESTARTING
    status = st.set_condition(status, st.SUSPENDED, True, st.REASON_SUSPENDED, "", 1, "t")
    assert st.summarize_phase(status) == st.PHASE_SUSPENDED


def test_job_labels_and_annotations_reach_the_pods_but_not_kubectls_own():
    body = {"metadata": {"name": "demo", "namespace": "ns", "uid": "u",
                         "labels": {"kueue.x-k8s.io/queue-name": "team-q",
                                    "team": "rl"},
                         "annotations": {
                             "kubectl.kubernetes.io/last-applied-configuration": "{}",
                             "monarch-operator.dev/last-handled-configuration": "{}",
                             "example.com/owner": "alice"}},
            "spec": {"image": "img", "suspend": True, "runPolicy": {"backoffLimit": 2}}}
    job = JobSpec.from_body(body)
    # Kueue's labels stay on the job (one Workload for it), never on a pod (C23).
    assert job.pod_labels == {"team": "rl"}
    assert job.pod_annotations == {"example.com/owner": "alice"}
    assert job.suspend and job.run_policy.backoff_limit == 2


def test_builders_pass_metadata_on_and_name_each_attempts_launcher():
    from monarch_operator.controller.builders.launcher import build_launcher_pod
    from monarch_operator.controller.builders.statefulset import build_worker_statefulset
    from monarch_operator.controller.spec.settings import Settings

    body = {"metadata": {"name": "demo", "namespace": "ns", "uid": "u",
                         "labels": {"kueue.x-k8s.io/queue-name": "q",
                                    "monarch-operator.dev/role": "mine"},
                         "annotations": {"example.com/owner": "alice"}},
            "spec": {"image": "img", "workers": {"template": {"metadata": {
                "labels": {"extra": "x"}}}}}}
    job = JobSpec.from_body(body)
    worker_meta = build_worker_statefulset(job, Settings())["spec"]["template"]["metadata"]
    assert "kueue.x-k8s.io/queue-name" not in worker_meta["labels"]  # C23
    assert worker_meta["labels"]["extra"] == "x"
    assert worker_meta["labels"]["monarch-operator.dev/role"] == "worker", "ours win"
    assert worker_meta["annotations"] == {"example.com/owner": "alice"}
    launcher = build_launcher_pod(job, Settings(), attempt=3)
    assert launcher["metadata"]["name"] == "demo-launcher-3"
    assert launcher["metadata"]["labels"]["monarch-operator.dev/attempt"] == "3"
    pod_meta = launcher["metadata"]
    assert "kueue.x-k8s.io/queue-name" not in pod_meta["labels"]
    assert pod_meta["labels"]["monarch-operator.dev/role"] == "launcher", "ours win"
    assert pod_meta["annotations"] == {"example.com/owner": "alice"}
    env = {item["name"]: item.get("value")
           for item in launcher["spec"]["containers"][0]["env"]}
    assert env["MONARCH_ATTEMPT"] == "3"
    assert build_launcher_pod(job, Settings())["metadata"]["name"] == "demo-launcher"


def test_a_worker_not_ready_is_lost_only_when_its_node_is_not_ready():
    ready = pod("j-worker-0", "a", conditions=[{"type": "Ready", "status": "True"}])
    snapshot = attempts.worker_snapshot("j", 1, [ready])
    unready = pod("j-worker-0", "a", conditions=[{"type": "Ready", "status": "False"}])
    unready["spec"] = {"nodeName": "node-2"}
    assert attempts.nodes_to_check(snapshot, [unready]) == {"node-2"}
    assert attempts.nodes_to_check(snapshot, [ready]) == set()
    assert attempts.lost_workers(snapshot, [unready]) == []
    (lost,) = attempts.lost_workers(snapshot, [unready], frozenset({"node-2"}))
    assert lost.describe() == "j-worker-0 (node node-2 NotReady)"


def test_every_worker_of_a_lost_node_is_named_even_one_still_shown_ready():
    # The node controller marks a lost node's pods not Ready one by one; the pass that sees
    # the first one names every worker on that node (seen in CI: a job whose two workers shared
    # the lost node named only the one marked first).
    pods = [pod(f"j-worker-{i}", f"u{i}", conditions=[{"type": "Ready", "status": "True"}])
            for i in range(3)]
    snapshot = attempts.worker_snapshot("j", 3, pods)
    for index, node in enumerate(("node-2", "node-2", "node-3")):
        pods[index]["spec"] = {"nodeName": node}
    pods[1]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert attempts.nodes_to_check(snapshot, pods) == {"node-2"}
    lost = attempts.lost_workers(snapshot, pods, frozenset({"node-2"}))
    assert [worker.describe() for worker in lost] == ["j-worker-0 (node node-2 NotReady)",
                                                      "j-worker-1 (node node-2 NotReady)"]


def test_a_suspend_is_not_a_restart():
    """RESTARTS counts restarts after failures; the attempt after a suspend is none of them."""
    status = attempts.begin({}, 1, "t1")
    assert status["restartCount"] == 0
    status = attempts.begin(status, 2, "t2", restart=False)  # suspended while it ran
    assert status["attempt"] == 2 and status["restartCount"] == 0
    status = attempts.begin(status, 3, "t3")  # then an application failure
    assert status["attempt"] == 3 and status["restartCount"] == 1


def test_restart_back_off_grows_from_the_second_restart_and_is_capped():
    delays = [policy.restart_delay_seconds(n) for n in range(1, 9)]
    assert delays == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 360.0]


def test_a_second_restart_waits_out_its_back_off_before_the_launcher_starts():
    import datetime as dt

    from monarch_operator.controller.judge import endings
    from monarch_operator.controller.launch import launching
    from monarch_operator.controller.state.passstate import Pass

    job = JobSpec.from_body({
        "metadata": {"name": "loop", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                 "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
                 "runPolicy": {"backoffLimit": 5}},
    })
    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
    state = Pass(job=job, status=attempts.begin({}, 1, "t0"), now=now)

    # The first failure restarts at once: no back-off in attempt 2's record.
    assert endings.end_attempt(state, policy.APPLICATION, "LauncherFailed", "exit 1") == (
        policy.APPLICATION)
    assert "notBefore" not in attempts.current(state.status)
    assert not launching._backing_off(state, attempts.current(state.status))

    # The second waits 10 s: the record says until when, the pass asks to be woken then.
    assert endings.end_attempt(state, policy.APPLICATION, "LauncherFailed", "exit 1") == (
        policy.APPLICATION)
    record = attempts.current(state.status)
    assert record["number"] == 3 and record["notBefore"] == "2026-11-30T12:00:10Z"
    assert "after a back-off of 10s" in st.get_condition(state.status, st.RUNNING)["message"]
    assert launching._backing_off(state, record)
    assert state.wake_after == 10.0
    assert "starts at 2026-11-30T12:00:10Z" in st.get_condition(
        state.status, st.RUNNING)["message"]

    later = Pass(job=job, status=state.status, now=now + dt.timedelta(seconds=10))
    assert not launching._backing_off(later, record)
