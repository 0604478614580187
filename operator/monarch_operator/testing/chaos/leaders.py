"""The operator under test as replicas under leader election (issue 34 item 6): the soak's
leader faults (the leader killed by SIGKILL or SIGTERM, partitioned by SIGSTOP past its renew
deadline, the standby killed, a rolling update) and what is judged of them (exit statuses, and
that one replica acts at a time: :func:`.tenure.leader_problems` over the API server's audit
log: each replica's writes against its tenures of the Lease, from the Lease's own audited
writes).

Each replica is a ``monarch-operator --leader-elect`` process with its own identity
(``r0``, ``r1``, ...) and client certificate (``chaos-op-<identity>``, the user its writes carry
in the audit log; group ``AUDIT_LEASES_GROUP``, so that its Lease writes are logged with their
bodies). A replica that ends (killed, stopped, exited) is replaced by a new one, as a
Deployment's ReplicaSet would.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes

from monarch_operator.localcluster.cluster import AUDIT_LEASES_GROUP, LocalCluster
from monarch_operator.localcluster.orphans import stop_with_parent
from monarch_operator.localcluster.ports import free_port
from monarch_operator.testing.chaos import checks, faults, tenure

LEASE = "monarch-operator"
# The elector's timings (its defaults, controller-runtime's): lease duration, renew deadline,
# retry period, seconds.
LD, RD, RP = 15.0, 10.0, 2.0
USER_PREFIX = "chaos-op-"
# Audited writes are checked against the Lease's tenures at most this often (seconds), and at
# the end.
AUDIT_EVERY_S = 15.0
# Between two checks, writes received in the last this many seconds before the newest audited
# event are left to the next check (or the last): their replica's Lease write may be logged
# just after them (the audit log is in the order requests complete).
AUDIT_SETTLE_S = 2.0
# A replica must answer /healthz within this many seconds of its start (a rolling update
# waits for it, as a Deployment waits for readiness).
READY_S = 45.0
# A partitioned (SIGSTOPped) leader must exit this many seconds after SIGCONT at the latest.
EXIT_AFTER_RESUME_S = 15.0

Judge = Callable[[str, str, list[checks.Problem]], None]


@dataclass
class Replica:
    """One operator process: its identity, process, /healthz and when (epoch) it must have
    stopped writing (SIGKILL, SIGSTOP, its exit), with why."""

    name: str
    process: subprocess.Popen[bytes]
    health_url: str
    ended_at: float | None = None
    ended_why: str = ""
    resumed_at: float | None = None  # epoch just before SIGCONT (a partitioned replica)

    @property
    def user(self) -> str:
        return USER_PREFIX + self.name

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as reply:
                return bool(reply.status == 200)
        except urllib.error.HTTPError as error:
            error.close()
            return False
        except OSError:
            return False

    def end(self, why: str) -> None:
        if self.ended_at is None:
            self.ended_at, self.ended_why = time.time(), why


@dataclass
class Pending:
    """Something due later: a SIGCONT, an exit to wait for, a replacement to start, a new
    replica of a rolling update to become ready."""

    at: float
    action: str
    replica: Replica | None = None


@dataclass
class ReplicatedOperator:
    """``replicas`` operator processes electing a leader on the Lease ``LEASE`` in
    ``lease_namespace``; the soak's operator when it injects leader faults.

    Args:
        cluster: the running local cluster (its audit log is read).
        lease_namespace: where the Lease lives (it must exist before :meth:`start`).
        namespaces: the replicas' ``--namespace`` patterns (none: every namespace).
        env: extra environment for the replicas.
        replicas: how many run in the steady state (2, as the chart).
    """

    cluster: LocalCluster
    lease_namespace: str
    namespaces: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    replicas: int = 2
    started: list[Replica] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    holders: list[tuple[float, str | None]] = field(default_factory=list)
    writes: list[tenure.AuditWrite] = field(default_factory=list)
    lease_writes: list[tenure.LeaseWrite] = field(default_factory=list)
    leader_faults: dict[str, int] = field(default_factory=lambda: dict(faults.LEADER_FAULTS))

    def __post_init__(self) -> None:
        self.log_dir = self.cluster.state_dir / "logs"
        self.log_path: Path = self.log_dir / "operator-r*.log"
        self._audit_offset = (self.cluster.audit_log.stat().st_size
                              if self.cluster.audit_log.exists() else 0)
        self._audit_checked = 0.0
        self._rolling: list[Replica] = []  # the old replicas a rolling update has yet to stop
        api = kubernetes.config.new_client_from_config(str(self.cluster.kubeconfig))
        self._api = api
        self._leases = kubernetes.client.CoordinationV1Api(api)

    # -- processes ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start replicas up to ``replicas`` (the first one leads, once it has the Lease)."""
        while len(self.live()) < self.replicas:
            self.start_one()
            if len(self.live()) == 1:
                self._wait(lambda: self.holder() is not None, 60)

    def start_one(self) -> Replica:
        """Start one more replica (a standby unless the Lease is free); returns it."""
        name = f"r{len(self.started)}"
        kubeconfig = self.cluster.user_kubeconfig(USER_PREFIX + name, (AUDIT_LEASES_GROUP,))
        health = f"http://127.0.0.1:{free_port()}/healthz"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"operator-{name}.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "monarch_operator.controller", "--leader-elect",
                 f"--leader-elect-namespace={self.lease_namespace}",
                 f"--leader-elect-name={LEASE}", f"--leader-elect-identity={name}",
                 f"--liveness={health}",
                 *(f"--namespace={namespace}" for namespace in self.namespaces)],
                env={**os.environ, **self.cluster.env(), **self.env,
                     "KUBECONFIG": str(kubeconfig)},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=stop_with_parent())
        replica = Replica(name, process, health)
        self.started.append(replica)
        return replica

    def live(self) -> list[Replica]:
        return [replica for replica in self.started if replica.alive()]

    def alive(self) -> bool:
        """Some replica runs."""
        return bool(self.live())

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        """Stop every replica (SIGCONT first, then ``signum``; SIGKILL after ``timeout``
        seconds); returns the last one's exit status, None when none ran."""
        code = None
        self.pending.clear()
        for replica in self.live():
            os.kill(replica.process.pid, signal.SIGCONT)
            code = self._signal(replica, signum, timeout, "stopped at the end")
        return code

    def close(self) -> None:
        """Stop every replica and the API client."""
        self.stop()
        self._api.close()

    def _signal(self, replica: Replica, signum: int, timeout: float, why: str) -> int:
        if signum == signal.SIGKILL:
            replica.end(why)
        replica.process.send_signal(signum)
        try:
            replica.process.wait(timeout)
        except subprocess.TimeoutExpired:
            replica.process.kill()
            replica.process.wait()
        replica.end(why)
        return int(replica.process.returncode)

    # -- the Lease ---------------------------------------------------------------------------
    def holder(self) -> str | None:
        """The Lease's holder as a user name (``chaos-op-<identity>``), None when it has none,
        does not exist or cannot be read now; each reading is kept (which replica to fault,
        and its role; the leader check uses the audited Lease writes instead)."""
        try:
            lease = self._leases.read_namespaced_lease(LEASE, self.lease_namespace,
                                                       _request_timeout=5)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                return None
            self.holders.append((time.time(), None))
            return None
        except Exception:  # noqa: BLE001 (a paused API server)
            return None
        identity = lease.spec.holder_identity
        user = USER_PREFIX + identity if identity else None
        self.holders.append((time.time(), user))
        return user

    def leader(self) -> Replica | None:
        """The live replica that holds the Lease, None when none does (or it is unknown)."""
        user = self.holder()
        return next((r for r in self.live() if r.user == user), None)

    # -- faults ------------------------------------------------------------------------------
    def inject(self, kind: str, rng: random.Random, judge: Judge) -> bool:
        """Inject leader fault ``kind`` (a :data:`.faults.LEADER_FAULTS` name); returns False
        when it cannot be now (no live leader known, no standby, a fault still under way)."""
        leader = self.leader()
        standbys = [r for r in self.live() if r is not leader]
        if leader is None or not standbys or self.pending:
            return False
        if kind == faults.LEADER_SIGKILL:
            self._signal(leader, signal.SIGKILL, 5, "SIGKILL")
            self.pending.append(Pending(time.monotonic() + rng.uniform(0.5, 4), "start"))
        elif kind == faults.STANDBY_SIGKILL:
            self._signal(rng.choice(standbys), signal.SIGKILL, 5, "SIGKILL")
            self.pending.append(Pending(time.monotonic() + rng.uniform(0.5, 4), "start"))
        elif kind == faults.LEADER_SIGTERM:
            self._term(leader, judge)
            self.pending.append(Pending(time.monotonic() + rng.uniform(0.5, 4), "start"))
        elif kind == faults.LEADER_PARTITION:
            # Past the renew deadline (and for the longer draws past the lease duration, so
            # the standby takes over while it is frozen).
            os.kill(leader.process.pid, signal.SIGSTOP)
            leader.end("SIGSTOP (partitioned)")
            self.pending.append(Pending(time.monotonic() + rng.uniform(RD + RP, LD + 2 * RP),
                                        "resume", leader))
        elif kind == faults.ROLLING_UPDATE:
            self._rolling = [*standbys, leader]
            self._surge()
        else:
            raise ValueError(f"leader fault: unknown kind {kind!r}")
        return True

    def _term(self, replica: Replica, judge: Judge) -> None:
        role = "leader" if self.holders and replica.user == self.holders[-1][1] else "standby"
        code = self._signal(replica, signal.SIGTERM, 20, "SIGTERM (exited)")
        judge(checks.OPERATOR_STOP, f"operator {replica.name} ({role})",
              [] if code == 0 else [("exit 0 within 20 s of SIGTERM", f"exit {code}")])

    def _surge(self) -> None:
        """The rolling update's next step, as a Deployment with maxSurge 1 and maxUnavailable
        0 does it: a new replica; once it is ready (:meth:`tick`) the next old one
        (standbys first, the leader last) gets SIGTERM."""
        self.pending.append(Pending(time.monotonic() + READY_S, "surge", self.start_one()))

    def _surged(self, due: Pending, judge: Judge) -> None:
        assert due.replica is not None
        self.pending.remove(due)
        if not due.replica.ready():
            judge(checks.LEADER_EXIT, f"operator {due.replica.name}",
                  [(f"/healthz ready within {READY_S:g} s", "not ready")])
        self._term(self._rolling.pop(0), judge)
        if self._rolling:
            self._surge()

    def tick(self, judge: Judge) -> None:
        """One soak step: read the Lease, do what is due (SIGCONT a partitioned leader and
        judge its exit, start replacements), and every ``AUDIT_EVERY_S`` judge the writes."""
        self.holder()
        now = time.monotonic()
        for due in [p for p in self.pending if p.at <= now and p.action != "surge"]:
            self.pending.remove(due)
            if due.action == "start":
                if len(self.live()) < self.replicas:
                    self.start_one()
            elif due.action == "resume" and due.replica is not None:
                due.replica.resumed_at = time.time()
                os.kill(due.replica.process.pid, signal.SIGCONT)
                self.pending.append(Pending(now + EXIT_AFTER_RESUME_S, "exited", due.replica))
            elif due.action == "exited" and due.replica is not None:
                self._judge_partition_exit(due.replica, judge)
        for waiting in [p for p in self.pending if p.action == "exited" and p.replica]:
            assert waiting.replica is not None
            if not waiting.replica.alive():
                self.pending.remove(waiting)
                self._judge_partition_exit(waiting.replica, judge)
        for surge in [p for p in self.pending if p.action == "surge" and p.replica]:
            assert surge.replica is not None
            if surge.at <= now or surge.replica.ready():
                self._surged(surge, judge)
        if now - self._audit_checked >= AUDIT_EVERY_S:
            self.judge_writes(judge)

    def _judge_partition_exit(self, replica: Replica, judge: Judge) -> None:
        code = replica.process.poll()
        if code is None:
            replica.process.kill()
            replica.process.wait()
        judge(checks.LEADER_EXIT, f"operator {replica.name} (partitioned)",
              [] if code == checks.EXIT_LOST else [
                  (f"exit {checks.EXIT_LOST} within {EXIT_AFTER_RESUME_S:g} s of SIGCONT",
                   f"exit {code}")])
        self.pending.append(Pending(time.monotonic() + 1, "start"))

    def finish(self, judge: Judge) -> None:
        """At the soak's end: what is still due, then the whole audit log judged."""
        deadline = time.monotonic() + 2 * READY_S + LD + 2 * RP + EXIT_AFTER_RESUME_S
        while self.pending and time.monotonic() < deadline:
            self.tick(judge)
            time.sleep(0.5)
        self.judge_writes(judge, final=True)

    def judge_writes(self, judge: Judge, final: bool = False) -> None:
        """Read the audit log on from where the last call stopped; judge every write of a
        replica so far against its tenures of the Lease (from the Lease writes so far: a
        replica's acquisition is in the log before any write it makes as the leader) and the
        replicas' ends. Unless ``final``, writes of the last ``AUDIT_SETTLE_S`` before the
        newest audited one wait for the next check."""
        self._audit_checked = time.monotonic()
        self._read_audit()
        ends = {r.user: (r.ended_at, r.ended_why) for r in self.started
                if r.ended_at is not None}
        resumed = {r.user: r.resumed_at for r in self.started if r.resumed_at is not None}
        held = tenure.tenures(self.lease_writes, RD)
        newest = max([w.at for w in self.writes] + [w.at for w in self.lease_writes],
                     default=0.0)
        writes = self.writes if final else [w for w in self.writes
                                            if w.at <= newest - AUDIT_SETTLE_S]
        judge(checks.LEADER_ALONE, "operator replicas",
              tenure.leader_problems(writes, held, ends, resumed=resumed))

    def _read_audit(self) -> None:
        """Add the replicas' writes and the Lease's writes in the audit log from where the last
        read stopped (at the end of the last whole line)."""
        path = self.cluster.audit_log
        if not path.exists():
            return
        with open(path, "rb") as log:
            if log.seek(0, 2) < self._audit_offset:
                self._audit_offset = 0  # rotated
            log.seek(self._audit_offset)
            data = log.read()
        complete = data.rfind(b"\n") + 1
        self._audit_offset += complete
        needle = f'"username":"{USER_PREFIX}'.encode()
        for line in data[:complete].splitlines():
            if needle not in line:
                continue
            event = json.loads(line)
            write = tenure.audit_write(event)
            if write is not None:
                self.writes.append(write)
            lease = tenure.lease_write(event, self.lease_namespace, LEASE, USER_PREFIX)
            if lease is not None:
                self.lease_writes.append(lease)

    def _wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.3)
        return False

