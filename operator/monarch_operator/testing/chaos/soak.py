"""The soak loop: keep a few chaos jobs running for a set time, inject faults, check every
invariant after every step, then let every job finish, delete it, and check nothing is left.

One step (about a second): create jobs up to the concurrency, read the jobs, their pods and the
host's processes, move each job's aimed fault on (inject it once its attempt runs), maybe inject
a global fault, bring a lost node back when due, and judge (:mod:`.checks`). Jobs are deleted a
few seconds after they finish; each must then leave nothing behind.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.testing.chaos import checks, faults, judge, leaders, plan, procs
from monarch_operator.testing.chaos.checks import Ledger
from monarch_operator.testing.chaos.plan import JobPlan, Verdict

GROUP, VERSION, PLURAL = "monarch-operator.dev", "v1alpha1", "monarchjobs"
# A node lost is back after this many seconds (uniform); nodes down at once: at most one.
NODE_DOWN_S = (35.0, 60.0)
# Seconds between global faults (uniform).
GLOBAL_EVERY_S = (15.0, 45.0)
REQUEST_TIMEOUT = 20
# Seconds after the window within which first faults not yet injected still are.
FIRST_GRACE_S = 120.0


@dataclass
class Track:
    """One chaos job as the soak follows it."""

    plan: JobPlan
    created: float
    uid: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    strict: dict[int, Verdict] = field(default_factory=dict)
    extra: dict[int, set[Verdict]] = field(default_factory=dict)
    judged: set[int] = field(default_factory=set)
    fault_state: str = "armed"
    fault_at: float | None = None
    spans: list[tuple[float, float]] = field(default_factory=list)
    excluded_s: float = 0.0  # suspended: not counted in the bound
    final_at: float | None = None
    delete_at: float | None = None
    deleted_at: float | None = None
    done: bool = False
    exists: bool = True
    ended_launchers: dict[int, float] = field(default_factory=dict)

    def accepted(self, attempt: int) -> set[Verdict]:
        """The endings accepted for attempt ``attempt``: the aimed fault's verdict in place of
        the natural one (a hang ends by nothing else, but a job's deadline may still come
        first), and, either way, what overlapping faults widened it by (:meth:`widen`): a node
        lost under the job while its launcher was deleted may be judged by either fault."""
        widened = self.extra.get(attempt, set())
        if attempt in self.strict:
            return {self.strict[attempt]} | widened | (
                self.plan.natural(attempt) if self.plan.deadline is not None else set())
        return self.plan.natural(attempt) | widened

    def widen(self, attempt: int, *verdicts: Verdict) -> None:
        self.extra.setdefault(attempt, set()).update(verdicts)

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 1)

    def record(self) -> dict[str, Any]:
        records = self.status.get("attempts") or []
        return dict(records[-1]) if records and records[-1].get("number") == self.attempt else {}

    def running_hang(self) -> bool:
        """Its current attempt hangs by plan, its launcher started and its pod runs."""
        record = self.record()
        if not (record.get("launchTime") and not record.get("class")
                and self.plan.action(self.attempt).hangs):
            return False
        return any(judge.role_of(pod) == "launcher" and judge.attempt_of(pod) == self.attempt
                   and (pod.get("status") or {}).get("phase") == "Running" for pod in self.pods)


@dataclass
class Report:
    """What the soak did and found."""

    seed: int
    minutes: float
    jobs: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    ledger: Ledger = field(default_factory=Ledger)
    steps: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False

    def table(self) -> str:
        """The soak's table: faults by kind, invariants checked and broken, each violation."""
        lines = [f"chaos soak: seed {self.seed}, {self.elapsed_s / 60:.1f} min "
                 f"({self.minutes:g} min of faults), {sum(self.jobs.values())} jobs, "
                 f"{self.steps} steps" + (" (interrupted)" if self.interrupted else ""), "",
                 f"{'fault injected':<28}{'count':>7}"]
        lines += [f"{kind:<28}{count:>7}" for kind, count in sorted(self.faults.items())]
        lines += [f"{'total':<28}{sum(self.faults.values()):>7}", "",
                  f"{'invariant':<40}{'checked':>9}{'violations':>12}"]
        for name in checks.INVARIANTS:
            lines.append(f"{name:<40}{self.ledger.checks[name]:>9}"
                         f"{self.ledger.failed[name]:>12}")
        lines += ["", f"{'jobs by scenario':<28}{'count':>7}"]
        lines += [f"{kind:<28}{count:>7}" for kind, count in sorted(self.jobs.items())]
        lines += ["", f"violations: {len(self.ledger.violations)}"]
        for found in self.ledger.violations:
            attempt = "-" if found.attempt is None else str(found.attempt)
            lines.append(f"  +{found.at:.0f}s {found.job} attempt {attempt}: {found.invariant}"
                         f"\n      expected: {found.expected}\n      seen:     {found.seen}")
        return "\n".join(lines)


class Soak:
    """One soak over a running local cluster.

    Args:
        cluster: the local cluster (kwok nodes with the node agent), up.
        operator: the operator under test, started by the soak and restarted as a fault.
        namespace: where the jobs go (created if missing).
        seed: every random choice (scenarios, faults, timing) comes from it.
        minutes: how long faults are injected and jobs created; then every job finishes.
        concurrency: jobs running at once.
        scenarios: only these (``plan.SCENARIOS`` names); None: all.
        global_faults: only these (``faults.GLOBAL_FAULTS`` names, and with a replicated
            operator ``faults.LEADER_FAULTS`` names instead of the operator's restarts);
            None: all.
        first_faults: the first global faults, in this order (then drawn by weight); each is
            injected even if the window ends first.
        global_every_s: seconds between global faults (uniform in this range).
        progress: prints one line per job, fault and violation.
    """

    def __init__(self, cluster: LocalCluster,
                 operator: faults.OperatorControl | leaders.ReplicatedOperator, namespace: str,
                 seed: int, minutes: float, concurrency: int = 4,
                 scenarios: tuple[str, ...] | None = None,
                 global_faults: tuple[str, ...] | None = None,
                 first_faults: tuple[str, ...] = (),
                 global_every_s: tuple[float, float] = GLOBAL_EVERY_S,
                 progress: Callable[[str], None] = print) -> None:
        self.cluster, self.operator, self.namespace = cluster, operator, namespace
        self.rng = random.Random(seed)
        self.minutes, self.concurrency, self.scenarios = minutes, concurrency, scenarios
        self.global_faults = {name: weight for name, weight in {
            **faults.GLOBAL_FAULTS, **self.leader_faults()}.items()
            if global_faults is None or name in global_faults}
        if self.leader_faults():  # replicas: the leader faults stand for the restarts
            for name in (faults.OPERATOR_SIGTERM, faults.OPERATOR_SIGKILL):
                self.global_faults.pop(name, None)
        self.first_faults, self.global_every_s = first_faults, global_every_s
        self.global_injected = 0
        if set(first_faults) - set(self.global_faults):
            raise ValueError(f"first_faults: {sorted(set(first_faults) - set(self.global_faults))}"
                             f" not among the global faults {sorted(self.global_faults)}")
        self.progress = progress
        self.report = Report(seed, minutes)
        self.tracks: list[Track] = []
        self.down: dict[str, tuple[float, float]] = {}  # node -> (down since, back at)
        self.recently_down: dict[str, float] = {}  # node -> back since
        self.start = time.monotonic()
        api = kubernetes.config.new_client_from_config(str(cluster.kubeconfig))
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.api = api
        self.env = cluster.env()
        self.torchrun = str(Path(sys.executable).parent / "monarch-torchrun")
        self.pythonpath = str(Path(plan.__file__).resolve().parents[3])
        self.last_leftover_look = 0.0
        self._processes: list[procs.JobProcess] = []

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> Report:
        """Run the soak; returns its report (``report.ledger.violations`` empty: none)."""
        self._ensure_namespace()
        if not self.operator.alive():
            self.operator.start()
        inject_until = self.start + self.minutes * 60
        next_global = self.start + self.rng.uniform(*self.global_every_s)
        try:
            while True:
                now = time.monotonic()
                injecting = now < inject_until
                if injecting:
                    self._create_jobs()
                if not self._observe():
                    time.sleep(1)
                    continue
                self._aimed_faults()
                # The first faults are each injected even when the window ends first (a
                # loaded machine): while jobs finish, for at most FIRST_GRACE_S after it.
                first_left = (self.global_injected < len(self.first_faults)
                              and now < inject_until + FIRST_GRACE_S)
                if (injecting or first_left) and now >= next_global:
                    # Not possible now (no leader known): try again in 2 s.
                    next_global = time.monotonic() + (self.rng.uniform(*self.global_every_s)
                                                      if self._global_fault() else 2)
                self.operator.tick(self._judge_operator)
                # Back when due, after the window too: a job's own node loss may come after
                # it (forced back at once, its pods' crash went unseen: run 6 of the short soak).
                self._nodes_back(force=False)
                self._judge()
                self.report.steps += 1
                if not injecting and not first_left and all(t.done for t in self.tracks):
                    self.operator.finish(self._judge_operator)
                    break
                time.sleep(1)
        except KeyboardInterrupt:
            self.report.interrupted = True
            self.say("interrupted: the table shows what was done so far")
        finally:
            for node in list(self.down):
                faults.restore_node(self.cluster, node)
            self.report.elapsed_s = time.monotonic() - self.start
            self.api.close()
        return self.report

    def elapsed(self) -> float:
        """Seconds since the soak started."""
        return time.monotonic() - self.start

    def say(self, line: str) -> None:
        """One progress line, stamped with the soak's time."""
        self.progress(f"[chaos +{self.elapsed():.0f}s] {line}")

    def _ensure_namespace(self) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": self.namespace}})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise

    def _create_jobs(self) -> None:
        active = [t for t in self.tracks if t.deleted_at is None and t.final_at is None]
        for _ in range(self.concurrency - len(active)):
            scenario = plan.pick_scenario(self.rng, self.scenarios)
            name = f"c{len(self.tracks):03d}-{scenario.replace('_', '-')}"[:45]
            job = plan.make_plan(name, scenario, self.rng)
            body = job.manifest(self.torchrun, sys.executable, self.pythonpath)
            created = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body, _request_timeout=REQUEST_TIMEOUT)
            self.tracks.append(Track(job, time.monotonic(), uid=created["metadata"]["uid"]))
            self.report.jobs[scenario] += 1
            self.say(f"job {name} created")

    def _observe(self) -> bool:
        """Read the jobs and their pods; False when the API did not answer."""
        try:
            jobs = self._list_json(self.custom.list_namespaced_custom_object, GROUP, VERSION,
                                   self.namespace, PLURAL)
            pods = self._list_json(self.core.list_namespaced_pod, self.namespace)
        except Exception as error:  # noqa: BLE001 (a paused or restarting API server)
            self.say(f"observe failed: {type(error).__name__}: {str(error)[:120]}")
            return False
        by_name = {job["metadata"]["name"]: job for job in jobs}
        pods_of: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            job_name = (pod["metadata"].get("labels") or {}).get(judge.LABEL_JOB)
            if job_name:
                pods_of.setdefault(job_name, []).append(pod)
        for track in self.tracks:
            job = by_name.get(track.plan.name)
            track.exists = job is not None and job["metadata"]["uid"] == track.uid
            if track.exists and job is not None:
                track.status = job.get("status") or {}
            track.pods = pods_of.get(track.plan.name, [])
        self._mark_node_losses()
        return True

    def _list_json(self, call: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
        response = call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        return list(json.loads(response.data)["items"])

    # -- faults ------------------------------------------------------------------------------
    def _aimed_faults(self) -> None:
        """Move each job's own fault on (also after the fault window: it is part of the job)."""
        for track in self.tracks:
            if track.deleted_at is not None or track.final_at is not None:
                continue
            if track.fault_state == "suspending":
                self._hold_suspension(track)
            elif track.fault_state == "armed" and track.plan.fault and self._fault_due(track):
                self._inject(track)

    def _fault_due(self, track: Track) -> bool:
        """The aimed fault's moment: its attempt runs (for the flip: a few seconds in), then
        a random 0-4 s more."""
        now = time.monotonic()
        if track.fault_at is not None:
            return now >= track.fault_at
        fault = track.plan.fault
        if fault == plan.SUSPEND_FLIP:
            ready = now - track.created >= 3 and bool(track.status)
        elif fault == plan.NODE_LOST and self.down:
            ready = False  # one node down at a time
        else:
            ready = track.running_hang()
            if ready and track.plan.torchrun:  # its stragglers started on the workers
                ready = any(not p.launcher and p.attempt == track.attempt
                            and "sleep 1000" in p.command for p in self.processes(track))
        if ready:
            track.fault_at = now + self.rng.uniform(0, 4)
        return False

    def _inject(self, track: Track) -> None:
        fault, name, attempt = track.plan.fault, track.plan.name, track.attempt
        if fault != plan.SUSPEND_FLIP and not track.running_hang():
            track.fault_at = None  # the attempt ended meanwhile (a global fault): wait again
            return
        cls, reasons = plan.FAULT_VERDICTS.get(str(fault), ("", frozenset()))
        if cls:
            track.strict[attempt] = Verdict(cls, None, reasons)
        if fault == plan.WORKER_DELETED:
            pod = f"{name}-worker-{self.rng.randint(0, 1)}"
            self._delete_pod(pod)
        elif fault == plan.WORKER_KILLED:
            pod = f"{name}-worker-{self.rng.randint(0, 1)}"
            error = faults.kill_worker_container(self.env, self.namespace, pod)
            if error:
                self.say(f"kill in {pod} failed: {error}")
        elif fault == plan.LAUNCHER_DELETED:
            self._delete_pod(str(track.record().get("launcherPod")))
        elif fault == plan.NODE_LOST:
            nodes = sorted({str(p["spec"]["nodeName"]) for p in track.pods
                            if (p.get("spec") or {}).get("nodeName")})
            self._lose_node(self.rng.choice(nodes))
        elif fault == plan.SUSPEND:
            self._patch_suspend(name, True)
            track.spans.append((time.time(), 0.0))
            track.fault_state, track.fault_at = "suspending", time.monotonic()
            self.report.faults[str(fault)] += 1
            self.say(f"fault {fault} -> {name} attempt {attempt}")
            return
        elif fault == plan.SUSPEND_FLIP:
            began = time.time()
            self._patch_suspend(name, True)
            time.sleep(self.rng.uniform(0, 1))
            self._patch_suspend(name, False)
            track.spans.append((began, time.time()))
            track.widen(attempt, Verdict(plan.SUSPENDED))
            track.widen(attempt + 1, Verdict(plan.SUSPENDED))
        elif fault == plan.JOB_DELETED:
            self.delete_job(track)
        track.fault_state = "done"
        self.report.faults[str(fault)] += 1
        self.say(f"fault {fault} -> {name} attempt {attempt}")

    def _hold_suspension(self, track: Track) -> None:
        """A held suspension: once the job is Suspended with no pod left, a few seconds more,
        then resume; pods still there after a minute are a violation (then resume anyway)."""
        assert track.fault_at is not None
        now = time.monotonic()
        suspended = track.status.get("phase") == "Suspended" and not track.pods
        if not suspended and now - track.fault_at < 60:
            return
        if not suspended:
            names = ", ".join(p["metadata"]["name"] for p in track.pods)
            self.report.ledger.judge(checks.NO_PHANTOM, track.plan.name, track.attempt,
                                     [("Suspended with no pod within 60 s",
                                       f"phase {track.status.get('phase')}, pods {names}")],
                                     self.elapsed())
        elif self.report.ledger.judge(checks.NO_PHANTOM, track.plan.name, track.attempt, [],
                                      self.elapsed()) and now - track.fault_at < 3:
            return
        time.sleep(self.rng.uniform(0, 3))
        self._patch_suspend(track.plan.name, False)
        began = track.spans[-1][0]
        track.spans[-1] = (began, time.time())
        track.excluded_s += time.time() - began
        track.fault_state = "done"
        self.say(f"resumed {track.plan.name}")

    def leader_faults(self) -> dict[str, int]:
        """The operator's leader faults and their weights ({} for a single operator)."""
        return dict(getattr(self.operator, "leader_faults", {}))

    def _judge_operator(self, invariant: str, subject: str,
                        problems: list[checks.Problem]) -> None:
        clean = self.report.ledger.judge(invariant, subject, None, problems, self.elapsed())
        if not clean:
            self.say(f"violation: {invariant}: {subject}: {problems[0][1][:200]}")

    def _global_fault(self) -> bool:
        """Inject the next global fault; False when it cannot be now."""
        if not self.global_faults:
            return True
        kind = faults.pick_global(self.rng, self.global_faults, self.first_faults,
                                  self.global_injected)
        if kind in self.leader_faults():
            assert isinstance(self.operator, leaders.ReplicatedOperator)
            if not self.operator.inject(kind, self.rng, self._judge_operator):
                return False
        elif kind == faults.NODE_LOST_ANY:
            if self.down:
                return True  # skipped (one node down at a time), as drawn
            self._lose_node(self.rng.choice([f"kwok-gpu-{i}" for i in range(self.cluster.nodes)]))
        elif kind == faults.APISERVER_PAUSED:
            seconds = self.rng.uniform(2, 6)
            faults.pause_apiserver(self.cluster, seconds)
            kind = f"{kind}"
        else:
            signum = signal.SIGTERM if kind == faults.OPERATOR_SIGTERM else signal.SIGKILL
            code = self.operator.stop(signum)
            time.sleep(self.rng.uniform(0, 4))
            self.operator.start()
            if signum == signal.SIGTERM:
                self.report.ledger.judge(checks.OPERATOR_STOP, "operator", None, [] if code in (
                    0, -15) else [("exit 0 within 20 s of SIGTERM", f"exit {code}")],
                    self.elapsed())
        self.report.faults[kind] += 1
        self.global_injected += 1
        self.say(f"fault {kind}")
        return True

    def _lose_node(self, node: str) -> None:
        faults.lose_node(self.cluster, node)
        now = time.monotonic()
        self.down[node] = (now, now + self.rng.uniform(*NODE_DOWN_S))
        for track in self.tracks:
            if not any((p.get("spec") or {}).get("nodeName") == node for p in track.pods):
                continue
            if track.running_hang() and track.attempt not in track.strict:
                cls, reasons = plan.FAULT_VERDICTS[plan.NODE_LOST]
                track.strict[track.attempt] = Verdict(cls, None, reasons)
        self._mark_node_losses()
        self.say(f"node {node} lost")

    def _mark_node_losses(self) -> None:
        """A job with a pod on a node that is down (or was, in the last 30 s) may lose its
        current attempt, or the next, to it: Infrastructure is accepted for both."""
        now = time.monotonic()
        nodes = set(self.down) | {n for n, back in self.recently_down.items() if now - back < 30}
        for track in self.tracks:
            if any((p.get("spec") or {}).get("nodeName") in nodes for p in track.pods):
                infra = Verdict(plan.INFRASTRUCTURE)
                track.widen(track.attempt, infra)
                track.widen(track.attempt + 1, infra)

    def _nodes_back(self, force: bool) -> None:
        now = time.monotonic()
        for node, (_, back_at) in list(self.down.items()):
            if now >= back_at or force:
                faults.restore_node(self.cluster, node)
                del self.down[node]
                self.recently_down[node] = now
                self.say(f"node {node} back")

    def _delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, _request_timeout=REQUEST_TIMEOUT)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise

    def _patch_suspend(self, name: str, value: bool) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": {"suspend": value}},
            _request_timeout=REQUEST_TIMEOUT)

    def delete_job(self, track: Track) -> None:
        """Delete the job (its children go by owner reference); 404 counts as done."""
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, track.plan.name,
                _request_timeout=REQUEST_TIMEOUT)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
        track.deleted_at = time.monotonic()

    def processes(self, track: Track) -> list[procs.JobProcess]:
        """The job's host processes as the last step's scan found them."""
        return [p for p in self._processes if p.uid == track.uid]

    def list_children(self, kind: str) -> list[dict[str, Any]]:
        """Every object of ``kind`` (a :data:`.judge.CHILD_KINDS` name) in the namespace; []
        when the API does not serve the kind (404: Workloads without Kueue's CRDs)."""
        apps = kubernetes.client.AppsV1Api(self.api)
        networking = kubernetes.client.NetworkingV1Api(self.api)
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.api)
        calls: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
            "ConfigMap": (self.core.list_namespaced_config_map, (self.namespace,)),
            "Secret": (self.core.list_namespaced_secret, (self.namespace,)),
            "Service": (self.core.list_namespaced_service, (self.namespace,)),
            "StatefulSet": (apps.list_namespaced_stateful_set, (self.namespace,)),
            "NetworkPolicy": (networking.list_namespaced_network_policy, (self.namespace,)),
            "ServiceAccount": (self.core.list_namespaced_service_account, (self.namespace,)),
            "Role": (rbac.list_namespaced_role, (self.namespace,)),
            "RoleBinding": (rbac.list_namespaced_role_binding, (self.namespace,)),
            "Workload": (self.custom.list_namespaced_custom_object,
                         ("kueue.x-k8s.io", "v1beta1", self.namespace, "workloads")),
        }
        call, args = calls[kind]
        try:
            return self._list_json(call, *args)
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return []
            raise

    # -- judging -----------------------------------------------------------------------------
    def _judge(self) -> None:
        self._processes = procs.scan({t.uid for t in self.tracks if not t.done})
        try:
            judge.judge_all(self)
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError) as error:
            self.say(f"judging stopped by the API: {type(error).__name__}: {str(error)[:120]}")

