"""The Kueue Workload of a MonarchJob and Kueue's verdict on it (controller/kueue/workload.py),
and that Kueue's labels stay on the job (field case C23)."""

from __future__ import annotations

import datetime as dt

import pytest

from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.spec.rules import InvalidSpecError
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import deadlines
from monarch_operator.controller.state import status as st

NOW = "2026-12-01T12:00:00Z"


def job(**labels: str) -> JobSpec:
    return JobSpec.from_body({
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "u-1",
                     "labels": {"kueue.x-k8s.io/queue-name": "user-queue", "team": "a",
                                **labels}},
        "spec": {"image": "img", "workers": {"replicas": 2, "gpusPerWorker": 2},
                 "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}, "colocate": True}}})


def test_kueue_labels_stay_on_the_job_not_its_pods():
    spec = job(**{"kueue.x-k8s.io/priority-class": "high"})
    assert spec.queue_name == "user-queue" and spec.priority_class == "high"
    labels = build_worker_statefulset(spec, Settings())["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "a"
    assert not [key for key in labels if key.startswith("kueue.x-k8s.io/")]


@pytest.mark.parametrize("key", ["kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"])
@pytest.mark.parametrize("value", ["ZB", "-q", "q_1", "a..b", "q" * 254])
def test_a_kueue_label_that_cannot_name_a_kueue_object_is_refused_naming_it(key, value):
    # A generated spec labelled queue-name 'ZB' was admitted, then its Workload was refused by
    # the API server (Kueue's queueName pattern): refuse before any child, naming the label.
    with pytest.raises(InvalidSpecError) as refused:
        job(**{key: value})
    assert f"metadata.labels[{key!r}]" in str(refused.value)
    assert "DNS-1123 subdomain" in str(refused.value)


@pytest.mark.parametrize("value", ["q", "user-queue", "team.a-1", "0q"])
def test_a_kueue_label_that_names_an_object_is_taken(value):
    assert job(**{"kueue.x-k8s.io/queue-name": value}).queue_name == value


def test_one_workload_with_a_pod_set_for_the_workers_and_one_for_the_launcher():
    body = wl.build_workload(job(), Settings(), "user-queue", ("high", 1000))
    assert body["metadata"]["ownerReferences"][0]["kind"] == "MonarchJob"
    assert body["metadata"]["labels"][wl.LABEL_JOB_UID] == "u-1"
    spec = body["spec"]
    assert spec["queueName"] == "user-queue" and spec["priority"] == 1000
    assert spec["priorityClassRef"] == {"group": "kueue.x-k8s.io",
                                        "kind": "WorkloadPriorityClass", "name": "high"}
    # Colocated roles live in the same pods: one pod set for all workers.
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("workers", 2), ("launcher", 1)]
    worker = spec["podSets"][0]["template"]
    assert worker == build_worker_statefulset(job(), Settings())["spec"]["template"]
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert spec["podSets"][1]["template"]["spec"]["restartPolicy"] == "Never"


def conditions(**statuses: str) -> list[dict[str, str]]:
    return [{"type": kind, "status": value, "reason": f"R{kind}", "message": f"m {kind}"}
            for kind, value in statuses.items()]


ADMISSION = {"clusterQueue": "cq", "podSetAssignments": [
    {"name": "workers", "flavors": {"nvidia.com/gpu": "a100"}}, {"name": "launcher"}]}


def test_kueue_verdicts():
    pending = wl.admission({"status": {"conditions": conditions(QuotaReserved="False")}})
    assert (pending.state, pending.reason, pending.message) == (
        wl.STATE_PENDING, "RQuotaReserved", "m QuotaReserved")
    assert wl.admission({}).state == wl.STATE_PENDING
    admitted = wl.admission({"status": {"admission": ADMISSION, "conditions": conditions(
        QuotaReserved="True", Admitted="True")}})
    assert admitted.state == wl.STATE_ADMITTED and admitted.cluster_queue == "cq"
    assert admitted.flavors["workers"] == {"nvidia.com/gpu": "a100"}
    evicted = wl.admission({"status": {"admission": ADMISSION, "conditions": conditions(
        QuotaReserved="True", Admitted="True", Evicted="True")}})
    assert evicted.state == wl.STATE_EVICTED and evicted.reason == "REvicted"
    checks = wl.admission({"status": {"conditions": conditions(QuotaReserved="True"),
                                      "admissionChecks": [{"name": "prov", "state": "Pending"}]}})
    assert checks.state == wl.STATE_PENDING and "prov: Pending" in checks.message


def test_flavors_and_admission_checks_go_into_the_pod_templates():
    workload = {"metadata": {"name": "demo-abc"}, "status": {
        "admission": ADMISSION, "admissionChecks": [{
        "name": "prov", "state": "Ready", "podSetUpdates": [
            {"name": "workers", "labels": {"x": "1"}, "nodeSelector": {"zone": "z1"}}]}]}}
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    updates = wl.pod_set_updates(workload, {"a100": {"nodeLabels": {"pool": "a100"},
                                                     "tolerations": [toleration]}})
    template = {"spec": {"nodeSelector": {"mine": "y"}, "tolerations": [{"key": "own"}]}}
    merged = wl.with_updates(template, updates["workers"])
    assert merged["spec"]["nodeSelector"] == {"mine": "y", "pool": "a100", "zone": "z1"}
    assert merged["spec"]["tolerations"] == [{"key": "own"}, toleration]
    # Kueue's pod set label and Workload annotation, as its own integrations put them.
    assert merged["metadata"]["labels"] == {"x": "1", "kueue.x-k8s.io/podset": "workers"}
    assert merged["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": "demo-abc"}
    assert "schedulingGates" not in merged["spec"]  # no topology assigned
    assert template == {"spec": {"nodeSelector": {"mine": "y"}, "tolerations": [{"key": "own"}]}}
    assert wl.with_updates({}, updates["launcher"]) == {"spec": {}, "metadata": {
        "labels": {"kueue.x-k8s.io/podset": "launcher"},
        "annotations": {"kueue.x-k8s.io/workload": "demo-abc"}}}


def test_topology_annotations_become_the_pod_sets_topology_request():
    from monarch_operator.controller.kueue import topology

    def with_annotations(**annotations: str) -> JobSpec:
        body = {"metadata": {"name": "demo", "namespace": "team-a", "uid": "u-1",
                             "labels": {"kueue.x-k8s.io/queue-name": "q"}},
                "spec": {"image": "img", "workers": {"replicas": 4, "gpusPerWorker": 8,
                                                     "template": {"metadata": {
                                                         "annotations": annotations}}}}}
        return JobSpec.from_body(body)

    def request(**annotations: str) -> dict:
        pod_sets = wl.build_workload(with_annotations(**annotations), Settings(), "q")[
            "spec"]["podSets"]
        assert "topologyRequest" not in pod_sets[1]  # the launcher asked for nothing
        return pod_sets[0]["topologyRequest"]

    index = {"podIndexLabel": "apps.kubernetes.io/pod-index"}
    assert request() == index  # ranked by ordinal, placed by a TAS flavor if there is one
    rack = "cloud.example.com/rack"
    assert request(**{topology.ANNOTATION_REQUIRED: rack,
                      topology.ANNOTATION_GROUP_NAME: "g"}) == {
        "required": rack, "podSetGroupName": "g", **index}
    assert request(**{topology.ANNOTATION_PREFERRED: rack}) == {"preferred": rack, **index}
    assert request(**{topology.ANNOTATION_UNCONSTRAINED: "true"}) == {
        "unconstrained": True, **index}
    assert request(**{topology.ANNOTATION_SLICE_REQUIRED: rack,
                      topology.ANNOTATION_SLICE_SIZE: "2"}) == {
        "podSetSliceRequiredTopology": rack, "podSetSliceSize": 2, **index}
    for bad, rule in (({topology.ANNOTATION_UNCONSTRAINED: "yes"}, "must be true or false"),
                      ({topology.ANNOTATION_SLICE_REQUIRED: rack,
                        topology.ANNOTATION_SLICE_SIZE: "0"}, "positive integer")):
        try:
            request(**bad)
        except topology.TopologyRequestError as error:
            assert "spec.workers.template.metadata.annotations[" in str(error) and rule in str(
                error)
        else:
            raise AssertionError(f"{bad} accepted")


def test_a_topology_assignment_gates_the_pods_for_kueues_ungater():
    workload = wl.build_workload(job(), Settings(), "user-queue")
    workload["metadata"]["name"] = "demo-abc"
    workload["status"] = {"admission": {"clusterQueue": "cq", "podSetAssignments": [
        {"name": "workers", "flavors": {"nvidia.com/gpu": "tas"},
         "topologyAssignment": {"levels": ["kubernetes.io/hostname"], "slices": []}},
        {"name": "launcher"}]}}
    updates = wl.pod_set_updates(workload, {})
    merged = wl.with_updates({"spec": {"schedulingGates": [{"name": "mine"}]}},
                             updates["workers"])
    assert merged["spec"]["schedulingGates"] == [{"name": "mine"},
                                                 {"name": "kueue.x-k8s.io/topology"}]
    # No level asked for: placed by the flavor's topology alone, as "unconstrained".
    assert merged["metadata"]["annotations"] == {
        "kueue.x-k8s.io/workload": "demo-abc",
        "kueue.x-k8s.io/podset-unconstrained-topology": "true"}
    assert "schedulingGates" not in wl.with_updates({}, updates["launcher"])["spec"]


def test_an_evicted_workload_gives_its_quota_back_and_is_requeued():
    workload = {"metadata": {"generation": 2}, "status": {"admission": ADMISSION, "conditions": [
        *conditions(QuotaReserved="True", Admitted="True"),
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by high"}]}}
    status = wl.released_status(workload, NOW)
    assert "admission" not in status
    by_type = {c["type"]: c for c in status["conditions"]}
    assert (by_type["QuotaReserved"]["status"], by_type["QuotaReserved"]["reason"]) == (
        "False", "Pending")
    assert by_type["Admitted"]["status"] == "False"
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == ("True", "Preempted")
    assert by_type["Evicted"]["status"] == "True"  # Kueue's own to clear


def test_pods_ready_and_finished():
    workload: dict = {"status": {}}
    waiting = wl.pods_ready_status(workload, False, NOW)
    assert waiting["conditions"][0]["reason"] == "WaitForStart"
    started = wl.pods_ready_status({"status": waiting}, True, NOW)
    assert (started["conditions"][0]["status"], started["conditions"][0]["reason"]) == (
        "True", "Started")
    assert wl.pods_ready_status({"status": started}, True, NOW) is None  # no write
    lost = wl.pods_ready_status({"status": started}, False, NOW)
    assert lost["conditions"][0]["reason"] == "WaitForRecovery"
    assert wl.pods_ready_status({"status": lost}, True, NOW)["conditions"][0]["reason"] == \
        "Recovered"
    finished = wl.finished_status(workload, True, "launcher exited 0", NOW)
    assert finished["conditions"][0]["reason"] == "Succeeded"
    assert wl.finished_status({"status": finished}, True, "", NOW) is None


def test_queued_is_a_phase_and_its_time_is_not_startup_time():
    status = st.set_condition({"startTime": NOW, "attempt": 1,
                               "attempts": [{"number": 1, "startTime": NOW}]},
                              st.QUEUED, True, "Queued", "waiting in LocalQueue user-queue", 1,
                              NOW)
    assert st.summarize_phase(status) == "Queued"
    assert st.summarize_message(status) == "waiting in LocalQueue user-queue"
    later = dt.datetime(2026, 12, 1, 13, tzinfo=dt.UTC)
    assert deadlines.seconds_until_next_deadline(job(), status, later) is None


def test_a_labelled_job_waits_saying_kueue_is_missing_when_no_workloads_are_served(
        monkeypatch):
    """A job with the queue label on a cluster that serves no Workloads (Kueue not installed):
    never run past its admission, never left without a status (found by the generated specs):
    Queued, naming the queue and how to run without Kueue, one Warning, a look every minute."""
    from kubernetes.client.rest import ApiException

    from monarch_operator.controller.kueue import admission, client
    from monarch_operator.controller.state import attempts
    from monarch_operator.controller.state.passstate import Pass

    def not_served(desired, owner_uid):
        raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(client, "read_workload", lambda namespace, name: None)
    monkeypatch.setattr(client, "create_workload", not_served)
    job = JobSpec.from_body({
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "u1", "generation": 1,
                     "labels": {wl.LABEL_QUEUE_NAME: "user-queue"}},
        "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1}}})
    state = Pass(job=job, status=attempts.begin({}, 1, "t0"),
                 now=dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC))
    queue = admission.gate(state, Settings())
    assert queue is not None and not queue.admitted
    queued = st.get_condition(state.status, st.QUEUED)
    assert (queued["status"], queued["reason"]) == ("True", "KueueNotInstalled"), queued
    assert "user-queue" in queued["message"] and wl.LABEL_QUEUE_NAME in queued["message"]
    assert [event.reason for event in state.events] == ["KueueNotInstalled"]
    assert state.wake_after == admission.NOT_SERVED_RETRY_SECONDS
    admission.gate(state, Settings())  # the next look: still missing, no second Warning
    assert [event.reason for event in state.events] == ["KueueNotInstalled"]


def test_a_requeued_job_says_why_it_stopped_running_while_it_waits_again():
    """After a preemption Kueue's own message says only what the job waits for ("insufficient
    unused quota"); the Queued message keeps what ended the last attempt until it is admitted
    again (seen in CI: the eviction's words were gone by the time the pods had stopped)."""
    from monarch_operator.controller.kueue import admission
    from monarch_operator.controller.state import attempts
    from monarch_operator.controller.state.passstate import Pass

    status = attempts.update_current(attempts.begin({}, 1, "t0"), **{
        "class": admission.EVICTED, "reason": "EvictedPreempted",
        "message": "Preempted to accommodate a workload (UID: u-2)"})
    state = Pass(job=job(), status={**attempts.begin(status, 2, "t1"), "queue": {}},
                 now=dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC))
    pending = wl.Admission(wl.STATE_PENDING, reason="Pending",
                           message="insufficient unused quota for nvidia.com/gpu")
    admission._queued(state, "user-queue", pending, 0)
    message = st.get_condition(state.status, st.QUEUED)["message"]
    assert message.startswith("requeued after attempt 1 was preempted by Kueue; "), message
    assert message.endswith("waiting in LocalQueue user-queue for admission: Pending: "
                            "insufficient unused quota for nvidia.com/gpu"), message
    # Right after the eviction Kueue's pending message still names it, UIDs and all: left out.
    admission._queued(state, "user-queue", wl.Admission(
        wl.STATE_PENDING, reason="Pending", message=(
            "Preempted to accommodate a workload (UID: 8de81e1b-de68-4c9e-b24b-f5e60ea8aa01, "
            "JobUID: 1f1c675a-711f-4a13-a3bd-da3d50e6f893) due to prioritization in the "
            "ClusterQueue")), 0)
    message = st.get_condition(state.status, st.QUEUED)["message"]
    assert message.endswith("for admission: Pending: Preempted to accommodate a workload due "
                            "to prioritization in the ClusterQueue"), message
    # A job that was never evicted: Kueue's words alone.
    fresh = Pass(job=job(), status={**attempts.begin({}, 1, "t0"), "queue": {}}, now=state.now)
    admission._queued(fresh, "user-queue", pending, 0)
    assert st.get_condition(fresh.status, st.QUEUED)["message"].startswith("waiting in")


def test_a_spec_changed_while_queued_replaces_the_workload(monkeypatch):
    """More GPUs per worker while the job waits: its Workload asks Kueue for the old amount,
    so it is deleted (one Event) and a pass soon makes the new one; a Workload holding quota,
    or one that asks for the same, is kept."""
    from monarch_operator.controller.kueue import admission, client
    from monarch_operator.controller.state import attempts
    from monarch_operator.controller.state.passstate import Pass

    def spec(gpus: int) -> JobSpec:
        return JobSpec.from_body({
            "metadata": {"name": "demo", "namespace": "team-a", "uid": "u1", "generation": 2,
                         "labels": {wl.LABEL_QUEUE_NAME: "user-queue"}},
            "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": gpus}}})

    stored = wl.build_workload(spec(1), Settings(), "user-queue")
    stored["metadata"]["uid"] = "w-1"
    stored["status"] = {"conditions": conditions(QuotaReserved="False")}
    deleted: list[str] = []
    monkeypatch.setattr(client, "read_workload", lambda namespace, name: stored)
    monkeypatch.setattr(client, "delete_workload",
                        lambda workload: deleted.append(workload["metadata"]["uid"]))
    monkeypatch.setattr(client, "create_workload", lambda desired, owner_uid: stored)
    from monarch_operator.controller.k8s import deletes, reads
    monkeypatch.setattr(reads, "list_pods", lambda *args, **kwargs: [])  # nothing runs yet
    monkeypatch.setattr(deletes, "delete_if_present", lambda *args, **kwargs: False)
    now = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)

    same = Pass(job=spec(1), status=attempts.begin({}, 1, "t0"), now=now)
    assert not admission.gate(same, Settings()).admitted and deleted == []

    changed = Pass(job=spec(2), status=attempts.begin({}, 1, "t0"), now=now)
    queue = admission.gate(changed, Settings())
    assert not queue.admitted and deleted == ["w-1"]
    assert [event.reason for event in changed.events] == [admission.REASON_WORKLOAD_REPLACED]
    assert changed.wake_after == admission.REPLACE_RECHECK_SECONDS
    new = wl.build_workload(spec(2), Settings(), "user-queue")
    assert new["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"][
        "limits"]["nvidia.com/gpu"] == "2"
    assert wl.outdated(stored, new) and not wl.outdated(new, new)

    stored["status"] = {"conditions": conditions(QuotaReserved="True")}  # admitted: kept
    assert not wl.outdated(stored, new)
    legacy = {**stored, "metadata": {**stored["metadata"], "annotations": {}}}
    legacy["status"] = {}
    assert not wl.outdated(legacy, new)  # made before the hash existed: left alone


def test_a_launcher_without_a_flavor_under_a_tas_only_queue_is_explained():
    from monarch_operator.controller.kueue import admission
    from monarch_operator.controller.state import attempts
    from monarch_operator.controller.state.passstate import Pass

    state = Pass(job=job(), status={**attempts.begin({}, 1, "t0"), "queue": {}},
                 now=dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC))
    admission._queued(state, "user-queue", wl.Admission(
        wl.STATE_PENDING, reason="Pending",
        message="failed to assign flavors to pod set launcher: no TAS flavor assigned"), 0)
    message = st.get_condition(state.status, st.QUEUED)["message"]
    assert "no TAS flavor assigned; the launcher requests no resource" in message, message
    assert "spec.launcher.template" in message
