"""A verdict is stored before its evidence goes (a 30-minute leader-fault soak's finding),
without a cluster: a pass that judged an attempt deletes nothing the judging read (a finished
job's launcher and workers, the previous attempt's ended launcher, the launcher of an attempt
judged Infrastructure, a suspended attempt's pods) before its status write; a pass right after
the write deletes. The story the soak found: a new leader judged the
attempt Succeeded, deleted its launcher and workers in the same pass, and was cut off before
its status write (the fence refused it); the next leader found no launcher and judged the
attempt lost, an extra attempt. Here each leader's pass runs over a view of what the one
before it left behind."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from monarch_operator import names
from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.k8s import client, deletes, nodes, reads, writes
from monarch_operator.controller.leader.fence import FencedError
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state import timestamps
from tests.unit.test_launch_pass import (
    NAME,
    job_body,
    launcher_pod,
    make_view,
    ready_worker,
    running_status,
    stored,
)


@dataclass
class Cluster:
    """What the API server holds besides the job's standing children: the launcher pods;
    what passes deleted and created; whether a status write goes through (a partitioned
    leader's is refused by its fence)."""

    launchers: list[dict[str, Any]]
    deleted: list[str] = field(default_factory=list)
    partitioned: bool = False
    workers: list[dict[str, Any]] | None = None  # the worker pods, when not the default Ready

    def view(self, settings: Settings, body: dict[str, Any]) -> Any:
        """The next pass's view: the job as stored, minus what was deleted."""
        pods = [pod for pod in self.launchers if f"Pod {pod['metadata']['name']}"
                not in self.deleted]
        workers = f"StatefulSet {names.worker_set(NAME)}" not in self.deleted
        return make_view(settings, body["status"], pods, workers=workers, body=body,
                         worker_pods=None if self.workers is None else [
                             self._as_deleted(pod) for pod in self.workers])

    def _as_deleted(self, pod: dict[str, Any]) -> dict[str, Any]:
        """A worker pod a pass deleted (by its uid) shows, from the next view on, as being
        deleted (gracefully)."""
        metadata = pod["metadata"]
        if f"Pod {metadata['name']} {metadata['uid']}" not in self.deleted:
            return pod
        # Its grace period not over within these tests (else it is force-deleted: stuck).
        return {**pod, "metadata": {**metadata, "deletionTimestamp": "2030-01-01T00:00:00Z"}}


@pytest.fixture()
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    world = Cluster([])

    def post(desired: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        made = stored(desired, f"uid-{desired['metadata']['name']}")
        if desired["kind"] == "Pod":
            world.launchers.append(made)
        return made

    def patch_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if world.partitioned:
            raise FencedError("PATCH .../status refused: not the leader")
        return job_body(status)

    def delete_if_present(api_version: str, kind: str, namespace: str, name: str) -> bool:
        world.deleted.append(f"{kind} {name}")
        view = client._view(api_version, kind)
        if view is not None:  # as deletes.delete tells the pass's view
            view.deleted((api_version, kind), name)
        return True

    def stop_pod(pod: dict[str, Any] | None, grace_seconds: int | None = None) -> bool:
        if pod is None:
            return False
        world.deleted.append(f"Pod {pod['metadata']['name']}")
        return True

    def delete_pod(namespace: str, name: str, uid: str, force: bool = False,
                   grace_seconds: int | None = None) -> bool:
        world.deleted.append(f"Pod {name} {uid}")
        return True

    monkeypatch.setattr(writes, "_post", post)
    monkeypatch.setattr(deletes, "delete_pod", delete_pod)
    monkeypatch.setattr(writes, "patch_job_status", patch_status)
    monkeypatch.setattr(deletes, "delete_if_present", delete_if_present)
    monkeypatch.setattr(deletes, "stop_pod", stop_pod)
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: None)
    monkeypatch.setattr(nodes, "node_heartbeats", lambda: None)
    monkeypatch.setattr(nodes, "node_readiness", lambda: None)
    monkeypatch.setattr(reads, "pod_log_tail", lambda *args, **kwargs: "")
    return world


def ended_launcher(settings: Settings, launched: dt.datetime, exit_code: int) -> dict[str, Any]:
    """Attempt 1's launcher pod, ended with ``exit_code`` 60 s after ``launched``."""
    pod = launcher_pod(settings)
    pod["spec"]["nodeName"] = "node-9"
    pod["status"] = {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [
        {"name": "launcher", "restartCount": 0, "state": {"terminated": {
            "exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
            "startedAt": st.format_time(launched),
            "finishedAt": st.format_time(launched + dt.timedelta(seconds=60))}}}]}
    return pod


def launched_job(settings: Settings, **spec: Any) -> tuple[dict[str, Any], dt.datetime]:
    """The job with attempt 1's launch stored, ``spec`` added; and the launch time."""
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    return {**job_body(status), "spec": {**job_body()["spec"], **spec}}, launched


def one_pass(settings: Settings, world: Cluster, body: dict[str, Any],
             now: dt.datetime) -> reconcile.Outcome:
    """One pass over what ``world`` holds; the job is stored as the pass left it."""
    with client.reading_from(world.view(settings, body)):
        return reconcile.reconcile(body, settings, now)


def test_a_success_is_stored_before_the_launcher_and_workers_go(cluster):
    settings = Settings.from_env()
    body, launched = launched_job(settings, cleanupPolicy="DeleteAll")
    cluster.launchers.append(ended_launcher(settings, launched, exit_code=0))
    later = launched + dt.timedelta(seconds=120)

    # The first leader judges Succeeded and is cut off: its status write is refused.
    cluster.partitioned = True
    with pytest.raises(FencedError):
        one_pass(settings, cluster, body, later)
    assert cluster.deleted == [], "nothing the verdict rests on goes before it is stored"

    # The next leader finds what it left: the same verdict, stored; still nothing deleted.
    cluster.partitioned = False
    judged = one_pass(settings, cluster, body, later + dt.timedelta(seconds=20))
    assert st.is_true(judged.status, st.SUCCEEDED), judged.status["conditions"]
    assert [record.get("class") for record in judged.status["attempts"]] == ["Succeeded"]
    assert judged.status["restartCount"] == 0 and not judged.status.get("failureCounts")
    assert cluster.deleted == []
    assert judged.wake_after == 0.0, "a pass right after the write (it wakes nobody itself)"
    assert judged.status["readyWorkers"] == "0/2", "READY: the workers go with the ending"
    [ending] = [event for event in judged.events if event.reason == st.REASON_LAUNCHER_SUCCEEDED]
    assert ending.message == "job succeeded; launcher pod deleted; worker pods deleted"

    # The pass after the write (the job as stored) deletes, and writes and says nothing more.
    stored_body = {**body, "status": judged.status}
    released = one_pass(settings, cluster, stored_body, later + dt.timedelta(seconds=21))
    assert f"Pod {names.launcher_pod(NAME, 1)}" in cluster.deleted
    assert f"StatefulSet {names.worker_set(NAME)}" in cluster.deleted
    assert released.status == judged.status and released.events == []


def test_the_previous_launcher_goes_once_the_next_attempt_is_stored(cluster):
    """Attempt 1 exits 3 (Application); the pass that judged it begins attempt 2 and starts
    its launcher at once (same Ready workers), then is cut off. The next leader must still
    find attempt 1's launcher to judge it: Application, not a launcher lost."""
    settings = Settings.from_env()
    body, launched = launched_job(settings, runPolicy={"backoffLimit": 2})
    cluster.launchers.append(ended_launcher(settings, launched, exit_code=3))
    later = launched + dt.timedelta(seconds=120)
    first = names.launcher_pod(NAME, 1)

    cluster.partitioned = True
    with pytest.raises(FencedError):
        one_pass(settings, cluster, body, later)
    assert f"Pod {first}" not in cluster.deleted

    cluster.partitioned = False
    judged = one_pass(settings, cluster, body, later + dt.timedelta(seconds=20))
    assert judged.status["attempt"] == 2
    assert judged.status["attempts"][0]["class"] == "Application", judged.status["attempts"]
    assert judged.status["failureCounts"] == {"application": 1}
    assert f"Pod {first}" not in cluster.deleted
    assert judged.wake_after == 0.0

    stored_body = {**body, "status": judged.status}
    one_pass(settings, cluster, stored_body, later + dt.timedelta(seconds=21))
    assert f"Pod {first}" in cluster.deleted, "deleted once attempt 2 is stored"


def suspended(body: dict[str, Any], value: bool = True) -> dict[str, Any]:
    """``body`` with ``spec.suspend`` set to ``value``."""
    return {**body, "spec": {**body["spec"], "suspend": value}}


def test_a_suspension_is_stored_before_the_launcher_and_workers_go(cluster):
    """``spec.suspend`` set on a running attempt: the pass that ends it (``Suspended``)
    deletes nothing; the pass after its status write deletes the launcher, the workers and
    the hostfile."""
    settings = Settings.from_env()
    body, launched = launched_job(settings)
    cluster.launchers.append(launcher_pod(settings))  # attempt 1's, running
    later = launched + dt.timedelta(seconds=60)

    recorded = one_pass(settings, cluster, suspended(body), later)
    assert cluster.deleted == [], "nothing goes before the attempt's ending is stored"
    assert [record.get("class") for record in recorded.status["attempts"]] == ["Suspended", None]
    assert recorded.status["attempt"] == 2 and not recorded.status.get("failureCounts")
    assert recorded.wake_after == 0.0
    assert "deleted next" in st.get_condition(recorded.status, st.SUSPENDED)["message"]

    after = one_pass(settings, cluster, suspended({**body, "status": recorded.status}),
                     later + dt.timedelta(seconds=1))
    assert cluster.deleted == [f"Pod {names.launcher_pod(NAME, 1)}",
                               f"StatefulSet {names.worker_set(NAME)}",
                               f"ConfigMap {names.hostfile_configmap(NAME)}"]
    assert after.status["attempts"] == recorded.status["attempts"]


def test_a_suspend_flipped_back_around_a_cut_off_leader_is_no_failure(cluster):
    """The chaos soak's finding (seed 1: ``suspend_flip`` with a leader SIGKILL at the same
    second): the leader that saw ``spec.suspend`` deleted the launcher and workers and was
    killed before its status write; ``spec.suspend`` was back to false when the next leader
    looked, and it judged the attempt ``Infrastructure`` (``WorkerEvicted``), spending a
    restart on a suspension. Now whichever write the cut-off leader made, the next one tells
    the truth."""
    settings = Settings.from_env()
    body, launched = launched_job(settings)
    cluster.launchers.append(launcher_pod(settings))
    later = launched + dt.timedelta(seconds=60)

    # Cut off before its status write: nothing was deleted, nothing recorded; the attempt
    # simply goes on.
    cluster.partitioned = True
    with pytest.raises(FencedError):
        one_pass(settings, cluster, suspended(body), later)
    assert cluster.deleted == []
    cluster.partitioned = False
    going_on = one_pass(settings, cluster, body, later + dt.timedelta(seconds=5))
    assert going_on.status["attempt"] == 1 and "class" not in going_on.status["attempts"][0]
    assert cluster.deleted == [] and not going_on.status.get("failureCounts")

    # Cut off after its status write (the ending stored), before the next pass deleted:
    # attempt 1 stays Suspended; its launcher is let go of before attempt 2's starts and the
    # workers, still Ready, are kept for attempt 2.
    recorded = one_pass(settings, cluster, suspended(body), later + dt.timedelta(seconds=6))
    assert cluster.deleted == []
    resumed = one_pass(settings, cluster, {**body, "status": recorded.status},
                       later + dt.timedelta(seconds=8))
    assert resumed.status["attempts"][0]["class"] == "Suspended", resumed.status["attempts"]
    assert resumed.status["attempt"] == 2 and not resumed.status.get("failureCounts")
    assert not resumed.status.get("restartCount")
    assert set(cluster.deleted) == {f"Pod {names.launcher_pod(NAME, 1)}"}  # workers kept
    assert [pod["metadata"]["name"] for pod in cluster.launchers] == [names.launcher_pod(NAME, 1)]


def test_an_infrastructure_verdict_keeps_its_launcher_until_stored(cluster):
    """A launcher that failed on a GPU fault (``GPUHardwareError``, Infrastructure): the
    judging pass used to stop its pod at once; cut off before its write, the next leader found
    no launcher and judged ``LauncherLost``, the hardware line gone with the pod. Its pod now
    goes in the pass after the verdict is stored."""
    settings = Settings.from_env()
    body, launched = launched_job(settings, runPolicy={"infrastructureBackoffLimit": 2})
    pod = ended_launcher(settings, launched, exit_code=1)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = (
        "monarch-launch: failed: RuntimeError: CUDA error: uncorrectable ECC error encountered")
    cluster.launchers.append(pod)
    later = launched + dt.timedelta(seconds=120)

    cluster.partitioned = True
    with pytest.raises(FencedError):
        one_pass(settings, cluster, body, later)
    # (The hostfile may go: it is rebuilt from the next attempt's pods, and no verdict reads it.)
    assert f"Pod {names.launcher_pod(NAME, 1)}" not in cluster.deleted, "kept until stored"

    cluster.partitioned = False
    judged = one_pass(settings, cluster, body, later + dt.timedelta(seconds=20))
    first = judged.status["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", "GPUHardwareError"), first
    assert f"Pod {names.launcher_pod(NAME, 1)}" not in cluster.deleted
    assert judged.wake_after == 0.0

    one_pass(settings, cluster, {**body, "status": judged.status},
             later + dt.timedelta(seconds=21))
    assert f"Pod {names.launcher_pod(NAME, 1)}" in cluster.deleted, "gone once it is stored"


def test_a_worker_to_recreate_goes_once_the_verdict_is_stored(cluster):
    """Field case C34 around a cut-off leader: a worker's GPU is reported Unhealthy mid-run.
    The judging pass used to delete its pod at once; cut off before its write, the next leader
    found the pod replaced (or being deleted) and judged the attempt by that (``deleted``),
    the Unhealthy device gone with the pod. Now the ending names the pod (``recreatedWorkers``,
    by uid) and the pass after its write deletes it; the gate of the next attempt never counts
    it, even before its view shows the deletion."""
    settings = Settings.from_env()
    body, launched = launched_job(settings, runPolicy={"infrastructureBackoffLimit": 2})
    cluster.launchers.append(launcher_pod(settings))  # attempt 1's, running
    cluster.workers = [ready_worker(0), ready_worker(1)]
    cluster.workers[1]["status"]["containerStatuses"] = [{
        "name": "worker", "ready": True, "restartCount": 0,
        "state": {"running": {"startedAt": st.format_time(launched)}},
        "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": [
            {"resourceID": "1", "health": "Unhealthy"}]}]}]
    later = launched + dt.timedelta(seconds=60)
    unhealthy = names.worker_pod(NAME, 1)

    cluster.partitioned = True
    with pytest.raises(FencedError):
        one_pass(settings, cluster, body, later)
    assert not [gone for gone in cluster.deleted if gone.startswith(f"Pod {unhealthy}")]

    cluster.partitioned = False
    judged = one_pass(settings, cluster, body, later + dt.timedelta(seconds=5))
    first = judged.status["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", "GPUUnhealthy"), first
    assert first["recreatedWorkers"] == [{"name": unhealthy, "uid": "w1"}]
    assert not [gone for gone in cluster.deleted if gone.startswith(f"Pod {unhealthy}")]
    assert judged.wake_after == 0.0

    # The pass after the write: the pod goes by its uid, and attempt 2 waits for its
    # replacement (its view does not show the deletion yet).
    stored_body = {**body, "status": judged.status}
    after = one_pass(settings, cluster, stored_body, later + dt.timedelta(seconds=6))
    assert f"Pod {unhealthy} w1" in cluster.deleted
    assert after.status["readyWorkers"] == "1/2"
    assert after.status["attempt"] == 2 and "launchTime" not in after.status["attempts"][1]
    assert [pod["metadata"]["name"] for pod in cluster.launchers] == [
        names.launcher_pod(NAME, 1)], "no launcher on the worker being recreated"
    waiting = st.get_condition(after.status, st.WORKERS_READY)["message"]
    assert f"{unhealthy} (lost by attempt 1: its pod is deleted, to be recreated)" in waiting

    # Being deleted (the view caught up): no second DELETE, still not counted.
    again = one_pass(settings, cluster, {**body, "status": after.status},
                     later + dt.timedelta(seconds=8))
    assert again.status["readyWorkers"] == "1/2" and "launchTime" not in again.status[
        "attempts"][1]
    # Its replacement (a new uid) counts; the old pod is never deleted twice.
    cluster.workers[1] = ready_worker(1) | {"metadata": {
        **ready_worker(1)["metadata"], "uid": "w1-new"}}
    relaunched = one_pass(settings, cluster, {**body, "status": after.status},
                          later + dt.timedelta(seconds=20))
    assert relaunched.status["readyWorkers"] == "2/2"
    assert relaunched.status["attempts"][1].get("launchTime"), relaunched.status["attempts"]
    assert [gone for gone in cluster.deleted if gone.startswith(f"Pod {unhealthy}")] == [
        f"Pod {unhealthy} w1"]
