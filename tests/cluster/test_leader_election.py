"""Two operator replicas under leader election against one API server (issue 34, field case
C32): only the Lease's holder reconciles; kill -9 of the leader hands over within lease
duration + retry period, SIGTERM within about 3 s; a leader partitioned from the API server
(TCP proxy) stops before its renew deadline and exits; a leader paused past its lease (SIGSTOP)
and resumed writes nothing. Writes are audited per replica: each runs with a client
certificate of its own (``ha-<name>``), which the API server's audit log names.

The replicas watch a ``chart-*`` namespace, which the shared test operator leaves alone; the
Lease lives there too. Timings are the defaults (15/10/2 s). Measured times are printed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import pytest
import yaml

from monarch_operator import names
from monarch_operator.controller.leader.run import EXIT_LOST
from monarch_operator.localcluster.demo import install_crds
from monarch_operator.localcluster.ports import free_port
from tests.cluster.helpers import (
    apply_manifest,
    job_manifest,
    job_status,
    running_attempt,
    wait_phase,
    wait_until,
)
from tests.cluster.tcpproxy import TcpProxy

pytestmark = pytest.mark.cluster

LEASE = "monarch-operator"
LD, RD, RP = 15.0, 10.0, 2.0
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}




@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    health_url: str
    metrics_url: str

    @property
    def user(self) -> str:
        return f"ha-{self.name}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, url: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=3) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            error.close()
            return error.code, ""
        except OSError as error:
            return 0, repr(error)

    def metric(self, name: str) -> float | None:
        status, text = self.get(self.metrics_url)
        for line in text.splitlines() if status == 200 else []:
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


class Replicas:
    """Operator processes with ``--leader-elect`` on one Lease; all stopped at the end."""

    def __init__(self, local_cluster, namespace: str, tmp_path: Path) -> None:
        self.cluster, self.namespace, self.tmp_path = local_cluster, namespace, tmp_path
        self.started: list[Replica] = []
        api = kubernetes.config.new_client_from_config(str(local_cluster.kubeconfig))
        self.leases = kubernetes.client.CoordinationV1Api(api)

    def start(self, name: str, proxy: TcpProxy | None = None) -> Replica:
        kubeconfig = self.cluster.user_kubeconfig(f"ha-{name}")
        if proxy is not None:
            config = yaml.safe_load(kubeconfig.read_text())
            config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
            kubeconfig = self.tmp_path / f"kubeconfig-{name}-proxy"
            kubeconfig.write_text(yaml.safe_dump(config))
        health = f"http://127.0.0.1:{free_port()}/healthz"
        metrics_port = free_port()
        log_path = self.tmp_path / f"operator-{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "monarch_operator.controller", "--leader-elect",
                 f"--leader-elect-namespace={self.namespace}", f"--leader-elect-name={LEASE}",
                 f"--leader-elect-identity={name}", f"--namespace={self.namespace}",
                 f"--liveness={health}", f"--metrics=127.0.0.1:{metrics_port}"],
                env={**os.environ, **self.cluster.env(), "KUBECONFIG": str(kubeconfig)},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        replica = Replica(name, process, log_path, health,
                          f"http://127.0.0.1:{metrics_port}/metrics")
        self.started.append(replica)
        return replica

    def holder(self) -> str | None:
        try:
            lease = self.leases.read_namespaced_lease(LEASE, self.namespace,
                                                      _request_timeout=5)
        except kubernetes.client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise
        return lease.spec.holder_identity or None

    def wait_holder(self, name: str, timeout: float) -> float:
        """Poll the Lease every 0.1 s until ``name`` holds it; returns the monotonic time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.holder() == name:
                return time.monotonic()
            time.sleep(0.1)
        raise AssertionError(f"{name} does not hold the Lease after {timeout}s (holder "
                             f"{self.holder()})\n" + self.logs())

    def logs(self) -> str:
        return "\n".join(f"--- {replica.name} (exit {replica.process.poll()}):\n"
                         + "\n".join(replica.log().splitlines()[-25:])
                         for replica in self.started)

    def stop_all(self) -> None:
        for replica in self.started:
            if replica.process.poll() is None:
                os.kill(replica.process.pid, signal.SIGCONT)
                replica.process.kill()
                replica.process.wait()


@pytest.fixture
def replicas(local_cluster, kubectl, chart_namespace, tmp_path) -> Iterator[Replicas]:
    install_crds(kubectl)  # as the shared operator's fixture does (that operator is not needed)
    handle = Replicas(local_cluster, chart_namespace, tmp_path)
    try:
        yield handle
    finally:
        handle.stop_all()


def audit_writes(cluster, start: int, namespace: str) -> list[dict]:
    """Write requests to objects in ``namespace`` since byte ``start`` of the audit log, as
    ``{user, verb, resource, name, code, at}`` (``at``: epoch seconds the API server
    received it)."""
    found = []
    with open(cluster.audit_log, "rb") as log:
        log.seek(start)
        for line in log.read().splitlines():
            event = json.loads(line) if line.strip() else {}
            ref = event.get("objectRef") or {}
            if event.get("verb") not in WRITE_VERBS or ref.get("namespace") != namespace:
                continue
            received = dt.datetime.fromisoformat(
                event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            found.append({"user": event["user"]["username"], "verb": event["verb"],
                          "resource": ref.get("resource", "") + (
                              "/" + ref["subresource"] if ref.get("subresource") else ""),
                          "name": ref.get("name"), "code": event.get("responseStatus", {})
                          .get("code"), "at": received})
    return found


def by_user(writes: list[dict], user: str) -> list[dict]:
    return [write for write in writes if write["user"] == user]


def long_job(kubectl, namespace: str, name: str, seconds: int) -> None:
    apply_manifest(kubectl, namespace, job_manifest(
        name, launcher={"command": ["sh", "-c", f"sleep {seconds}"]}))


def reported_holder(replica) -> str | None:
    """The Lease holder a replica's /healthz names (None: no answer, or not read yet)."""
    status, body = replica.get(replica.health_url)
    return json.loads(body).get("holder") if status == 200 else None


def test_c32_one_replica_acts_kill_and_sigterm_hand_over(kubectl, local_cluster, replicas,
                                                        chart_namespace):
    ns = chart_namespace
    audit_start = local_cluster.audit_log.stat().st_size
    a = replicas.start("a")
    replicas.wait_holder("a", 60)
    b = replicas.start("b")
    wait_until(lambda: b.get(b.health_url)[0] == 200, 60, "the standby's /healthz")
    # /healthz answers from the standby's start; "holder" is null until its first read of the
    # Lease (CI, stop 43: read within the same second), then names the leader.
    wait_until(lambda: reported_holder(b) is not None, 30, "the standby's first read of the Lease")
    status, body = b.get(b.health_url)
    assert status == 200
    assert json.loads(body)["leader"] is False and json.loads(body)["holder"] == "a"
    wait_until(lambda: a.metric("monarch_operator_leader") == 1, 30, "a's leader gauge")
    assert b.metric("monarch_operator_leader") == 0

    long_job(kubectl, ns, "demo", 75)
    running_attempt(kubectl, ns, "demo", 1)
    assert by_user(audit_writes(local_cluster, audit_start, ns), "ha-b") == []

    # kill -9 the leader: b leads within lease duration + retry period (plus a poll).
    killed_wall, killed = time.time(), time.monotonic()
    a.process.send_signal(signal.SIGKILL)
    a.process.wait()
    kill_failover = replicas.wait_holder("b", LD + 2 * RP + 5) - killed
    c = replicas.start("c")
    wait_until(lambda: c.get(c.health_url)[0] == 200, 60, "c's /healthz (standby)")
    time.sleep(2 * RP)  # b's kopf settles; c stands by

    # SIGTERM the leader: it stops kopf, releases, exits 0; c leads at its next try.
    termed_wall, termed = time.time(), time.monotonic()
    b.process.send_signal(signal.SIGTERM)
    term_failover = replicas.wait_holder("c", 10) - termed
    assert b.process.wait(30) == 0, replicas.logs()
    d = replicas.start("d")
    wait_until(lambda: d.get(d.health_url)[0] == 200, 60, "d's /healthz (standby)")
    time.sleep(2 * RP)
    termed2_wall, termed2 = time.time(), time.monotonic()
    c.process.send_signal(signal.SIGTERM)
    term_failover2 = replicas.wait_holder("d", 10) - termed2
    assert c.process.wait(30) == 0, replicas.logs()

    final = wait_phase(kubectl, ns, "demo", "Succeeded", timeout=150)
    print(f"C32: kill -9 -> standby leads in {kill_failover:.1f}s; SIGTERM -> "
          f"{term_failover:.1f}s, {term_failover2:.1f}s")
    assert kill_failover <= LD + 2 * RP + 1, replicas.logs()
    assert term_failover <= 3 and term_failover2 <= 3, replicas.logs()

    # One replica acted at a time: the writers, in the order the API server received their
    # writes, come in leadership order, each after its predecessor stopped (a leader with
    # nothing to do writes nothing: C5).
    writes = audit_writes(local_cluster, audit_start, ns)
    leaders = ["ha-a", "ha-b", "ha-c", "ha-d"]
    stopped = {"ha-a": killed_wall, "ha-b": termed_wall, "ha-c": termed2_wall}
    sequence = [w["user"] for w in sorted(writes, key=lambda w: w["at"])
                if w["user"].startswith("ha-")]
    blocks = [user for i, user in enumerate(sequence) if i == 0 or sequence[i - 1] != user]
    assert blocks == sorted(set(blocks), key=leaders.index), blocks  # no interleaving
    assert blocks[0] == "ha-a" and "ha-d" in blocks, blocks  # created; ended
    for before, after in zip(leaders, leaders[1:], strict=False):
        later = by_user(writes, after)
        assert all(w["at"] >= stopped[before] for w in later), (before, after, later[:3])
        assert all(w["at"] <= stopped[before] + 0.5 for w in by_user(writes, before)), before
    # One StatefulSet, one launcher pod (one attempt), no restart: the job never noticed.
    creates = [(w["resource"], w["name"]) for w in writes
               if w["verb"] == "create" and w["code"] in (200, 201)]
    assert [name for kind, name in creates if kind == "statefulsets"] == [
        names.worker_set("demo")], creates
    launchers = [name for kind, name in creates if kind == "pods" and "launcher" in name]
    assert launchers == [names.launcher_pod("demo", 1)], creates
    assert final.get("restartCount", 0) == 0 and final.get("attempt") == 1, final
    assert "acquired Lease" in b.log() and "(released by b)" in b.log()
    assert "did not renew it" in b.log()  # b took over an expired Lease (a was killed)
    assert "no holder (released)" in c.log()


def test_a_partitioned_leader_stops_before_its_renew_deadline_and_exits(
        kubectl, local_cluster, replicas, chart_namespace):
    ns = chart_namespace
    server = yaml.safe_load(local_cluster.kubeconfig.read_text())[
        "clusters"][0]["cluster"]["server"]
    audit_start = local_cluster.audit_log.stat().st_size
    with TcpProxy(int(server.rsplit(":", 1)[1])) as proxy:
        a = replicas.start("a", proxy=proxy)
        replicas.wait_holder("a", 60)
        b = replicas.start("b")
        wait_until(lambda: b.get(b.health_url)[0] == 200, 60, "the standby's /healthz")
        long_job(kubectl, ns, "demo", 600)
        running_attempt(kubectl, ns, "demo", 1)

        stalled_wall, stalled = time.time(), time.monotonic()
        proxy.stall()  # open connections freeze, new ones are accepted and never forwarded
        code = a.process.wait(RD + RP + 10)
        exited = time.monotonic() - stalled
        took_over = replicas.wait_holder("b", LD + 2 * RP + 5) - stalled
        # A job created after the partition is b's to reconcile.
        long_job(kubectl, ns, "late", 600)
        running_attempt(kubectl, ns, "late", 1)
        proxy.forward()
    print(f"partition: the leader exited {exited:.1f}s after it, the standby led after "
          f"{took_over:.1f}s")
    log = a.log()
    assert code == EXIT_LOST, log[-3000:]
    assert "could not renew the Lease within the renew deadline" in log, log[-3000:]
    # The deadline counts from a renewal before the partition; then at most STOP_GRACE (1 s)
    # for kopf, and slack for a loaded machine.
    assert exited <= RD + 3, log[-3000:]
    writes = audit_writes(local_cluster, audit_start, ns)
    a_w, b_w = by_user(writes, "ha-a"), by_user(writes, "ha-b")
    assert a_w and max(w["at"] for w in a_w) <= stalled_wall + 0.5
    assert b_w and min(w["at"] for w in b_w) >= stalled_wall + RD  # after a stopped
    assert not [w for w in a_w if w["name"] and w["name"].startswith("late")]
    late = job_status(kubectl, ns, "late")
    assert late.get("attempt") == 1 and job_status(kubectl, ns, "demo").get("restartCount", 0) == 0


def test_a_leader_paused_past_its_lease_writes_nothing_when_it_resumes(
        kubectl, local_cluster, replicas, chart_namespace):
    """SIGSTOP (a stalled VM, a GC pause): the standby takes over; on SIGCONT the old
    leader's kopf sees the events it missed, but the fence refuses its writes and it exits."""
    ns = chart_namespace
    audit_start = local_cluster.audit_log.stat().st_size
    a = replicas.start("a")
    replicas.wait_holder("a", 60)
    b = replicas.start("b")
    wait_until(lambda: b.get(b.health_url)[0] == 200, 60, "the standby's /healthz")
    long_job(kubectl, ns, "demo", 600)
    running_attempt(kubectl, ns, "demo", 1)

    paused_wall = time.time()
    os.kill(a.process.pid, signal.SIGSTOP)
    try:
        long_job(kubectl, ns, "late", 600)  # a's open watch hears of it when it resumes
        replicas.wait_holder("b", LD + 2 * RP + 5)
        running_attempt(kubectl, ns, "late", 1)
    finally:
        os.kill(a.process.pid, signal.SIGCONT)
    code = a.process.wait(30)
    log = a.log()
    print("paused leader after SIGCONT: " + " | ".join(
        line for line in log.splitlines() if "leader election" in line)[-600:])
    assert code == EXIT_LOST, log[-3000:]
    writes = audit_writes(local_cluster, audit_start, ns)
    late_by_a = [w for w in by_user(writes, "ha-a") if w["at"] > paused_wall + 0.5]
    assert late_by_a == [], late_by_a
    assert job_status(kubectl, ns, "late").get("attempt") == 1
