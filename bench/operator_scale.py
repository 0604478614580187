"""Performance at scale: our operator and Kubeflow's MPI Operator on the same local cluster.

Starts the local control plane with ``--nodes`` kwok nodes of ``--gpus-per-node`` GPUs, the
API server's audit log recording every request of the operators and no node agent: every
benchmark pod is *simulated* (label ``localcluster.monarch-operator.dev/simulate``, kwok Stages
in ``localcluster/kwok-stages.yaml``):
workers become Ready ``--ready-after`` after they get an IP, launchers Succeed
``--succeed-after`` after they are Ready, the same for both operators. Then, for each operator
in turn (ours; the MPI Operator v0.8.2 at its default client and work-queue rate limits; and at
raised ones), each in its own namespace and with its own client certificate (its user name in
the audit log):

1. start the operator and wait until it watches its jobs;
2. for each batch size in ``--batches`` (default 1, 50, 200): submit that many jobs of
   ``--workers`` one-GPU workers at once, wait until every launcher pod Succeeded, every job says
   so in its status and every worker pod is gone (GPUs released), then delete the jobs and wait
   until their children are gone too; a batch of fewer than 10 jobs is run ``--small-repeats``
   times (default 5), one round after another, and its rounds pooled;
3. submit ``--idle-jobs`` jobs whose launcher never ends, wait until they run, and count the
   operator's requests over ``--idle-seconds`` of nobody touching them.

Per batch it prints, with percentiles over the batch's jobs: submit -> all workers Ready; last
worker Ready -> launcher pod created (what the issue's target is on: ours creates the pod itself;
the MPI Operator creates a batch Job, also shown, whose pod the Job controller creates); API
requests per job lifecycle from the audit log (writes and reads, and by verb and resource in
the JSON); operator CPU seconds. Per operator: requests per minute for
untouched running jobs, peak RSS (``VmHWM``), and the TCP peers the operator process had (all
must be on 127.0.0.0/8). Times are taken by this script's watches on pods and batch Jobs.

Run (as root, under the cluster-test lock; on 2 cores a full run of ours and both MPI Operator
configurations takes about 19 minutes, 24 with ``monarch-before``)::

    flock /tmp/monarch-tests.lock .venv/bin/python bench/operator_scale.py
    flock /tmp/monarch-tests.lock .venv/bin/python bench/operator_scale.py --batches 1 5 \\
        --nodes 10 --idle-jobs 3 --idle-seconds 20 --operators monarch mpi   # quick look

The table goes to stdout, then the JSON (``--json FILE`` writes it there instead).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_mpi_operator as mpi  # noqa: E402  (sits beside this script)

from monarch_operator.localcluster.agent import LABEL_SIMULATE  # noqa: E402
from monarch_operator.localcluster.cluster import GPU_RESOURCE, LocalCluster  # noqa: E402
from monarch_operator.localcluster.demo import Kubectl, install_crds, wait_established  # noqa: E402
from monarch_operator.testing import apiaudit  # noqa: E402

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
READY_AFTER = "localcluster.monarch-operator.dev/simulate-ready-after"
SUCCEED_AFTER = "localcluster.monarch-operator.dev/simulate-succeed-after"
# Batches smaller than this are run --small-repeats times.
SMALL_BATCH = 10
# Set on both operators' pod templates, so that this script tells pods apart the same way.
LABEL_JOB, LABEL_ROLE = "bench.monarch-operator.dev/job", "bench.monarch-operator.dev/role"


@dataclass
class Contender:
    """One operator under test: how to run it and what its jobs look like."""

    key: str          # monarch, mpi, mpi-raised
    title: str        # shown in the table
    user: str         # client certificate CN: its name in the audit log
    namespace: str
    group: str
    version: str
    plural: str
    command: Callable[[Path], list[str]]       # kubeconfig -> argv
    job: Callable[[str, int, dict[str, Any], dict[str, Any]], dict[str, Any]]
    finished: Callable[[dict[str, Any]], bool]  # job object -> Succeeded per its status
    running: Callable[[dict[str, Any]], bool]


def pod_metadata(job: str, role: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Template metadata of a simulated pod: ``mode`` ``ready`` or ``succeed`` (kwok Stages)."""
    return {"labels": {LABEL_SIMULATE: mode, LABEL_JOB: job, LABEL_ROLE: role},
            "annotations": {READY_AFTER: args.ready_after, SUCCEED_AFTER: args.succeed_after}}


def monarch_job(name: str, workers: int, worker_meta: dict[str, Any],
                launcher_meta: dict[str, Any]) -> dict[str, Any]:
    """A MonarchJob of ``workers`` one-GPU workers (trainer on all but one, ref on one)."""
    return {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": name},
            "spec": {"image": IMAGE,
                     "workers": {"replicas": workers, "gpusPerWorker": 1,
                                 "template": {"metadata": worker_meta}},
                     "meshes": {"trainer": {"hosts": max(workers - 1, 1)}, "ref": {"hosts": 1}},
                     "launcher": {"template": {"metadata": launcher_meta}},
                     "startupTimeoutSeconds": 3600}}


def contenders(args: argparse.Namespace, mpi_binary: Path | None) -> list[Contender]:
    """The operators named by ``--operators``, in that order."""
    def condition(kind: str) -> Callable[[dict[str, Any]], bool]:
        return lambda job: any(c.get("type") == kind and c.get("status") == "True"
                               for c in (job.get("status") or {}).get("conditions") or [])

    def mpijob(name: str, workers: int, worker_meta: dict[str, Any],
               launcher_meta: dict[str, Any]) -> dict[str, Any]:
        return mpi.mpijob(name, workers, worker_meta, launcher_meta, IMAGE, GPU_RESOURCE)

    def mpi_contender(key: str, qps: int, queue_rate: int, how: str) -> Contender:
        namespace = f"bench-{key}"
        assert mpi_binary is not None
        burst, queue_burst = 2 * qps, 10 * queue_rate
        return Contender(key, f"MPI Operator {mpi.MPI_OPERATOR_VERSION}, {how}: qps {qps}/{burst}"
                         f", queue {queue_rate}/{queue_burst}", f"mpi-operator-{how}", namespace,
                         "kubeflow.org", "v2beta1", "mpijobs",
                         lambda kc: mpi.command(mpi_binary, kc, namespace, qps, burst, queue_rate,
                                                queue_burst),
                         mpijob, condition("Succeeded"), condition("Running"))

    def monarch_contender(key: str, source: Path | None) -> Contender:
        namespace = f"bench-{key}"
        # An older checkout's operator/ (e.g. from `git archive`) goes first on the path.
        prefix = ["env", f"PYTHONPATH={source / 'operator'}"] if source else []
        return Contender(
            key, f"monarch-operator ({source.name})" if source else "monarch-operator",
            f"{key}-operator", namespace, "monarch-operator.dev", "v1alpha1", "monarchjobs",
            lambda kc: [*prefix, sys.executable, "-m", "monarch_operator.controller",
                        "--namespace", namespace],
            # Finished: Succeeded and READY 0/N written (the workers released), so that a
            # status write that comes with the release is counted in the job's lifecycle.
            monarch_job, lambda job: (job.get("status") or {}).get("phase") == "Succeeded"
            and (job.get("status") or {}).get("readyWorkers", "").startswith("0/"),
            lambda job: (job.get("status") or {}).get("phase") == "Running")

    every = {
        "monarch": lambda: monarch_contender("monarch", None),
        "monarch-before": lambda: monarch_contender("monarch-before", args.monarch_before),
        "mpi": lambda: mpi_contender("mpi", mpi.DEFAULT_QPS, mpi.DEFAULT_QUEUE_RATE, "default"),
        "mpi-raised": lambda: mpi_contender("mpi-raised", args.mpi_raised_qps,
                                            args.mpi_raised_queue_rate, "raised"),
    }
    return [every[key]() for key in args.operators]


@dataclass
class Seen:
    """What this script's watches saw, with ``time.time()`` when each event arrived."""

    worker_ready: dict[str, dict[str, float]] = field(default_factory=dict)  # job -> pod -> t
    launcher_pod: dict[str, float] = field(default_factory=dict)      # job -> created
    launcher_ready: dict[str, float] = field(default_factory=dict)
    launcher_done: dict[str, float] = field(default_factory=dict)     # job -> Succeeded
    launcher_job: dict[str, float] = field(default_factory=dict)      # job -> batch Job created
    lock: threading.Lock = field(default_factory=threading.Lock)


def watch(list_call: Callable[..., Any], namespace: str, on_event: Callable[[str, dict[str, Any],
          float], None], stop: threading.Event) -> None:
    """List, then watch from that resourceVersion on until ``stop``; relist after 410 Gone."""
    version = None
    while not stop.is_set():
        if version is None:
            body = json.loads(list_call(namespace, _preload_content=False).data)
            for item in body["items"]:
                on_event("ADDED", item, time.time())
            version = body["metadata"]["resourceVersion"]
        stream = kubernetes.watch.Watch()
        try:
            for event in stream.stream(list_call, namespace, resource_version=version,
                                       timeout_seconds=10, deserialize=False):
                now = time.time()
                if event["type"] == "ERROR":  # 410 Gone: the version is too old
                    version = None
                    break
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    on_event(event["type"], event["object"], now)
                if stop.is_set():
                    stream.stop()
        except (ApiException, KeyError):  # the client raises KeyError on raw ERROR events
            version = None


def on_pod(seen: Seen) -> Callable[[str, dict[str, Any], float], None]:
    """Record worker readiness, launcher pod creation, readiness and success."""
    def record(kind: str, pod: dict[str, Any], now: float) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        labels = meta.get("labels") or {}
        job, role, name = labels.get(LABEL_JOB), labels.get(LABEL_ROLE), meta["name"]
        if job is None:
            return
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        with seen.lock:
            if role == "worker" and kind != "DELETED":
                if ready:
                    seen.worker_ready.setdefault(job, {}).setdefault(name, now)
            elif role == "launcher" and kind != "DELETED":
                seen.launcher_pod.setdefault(job, now)
                if ready:
                    seen.launcher_ready.setdefault(job, now)
                if status.get("phase") == "Succeeded":
                    seen.launcher_done.setdefault(job, now)
    return record


def on_batch_job(seen: Seen) -> Callable[[str, dict[str, Any], float], None]:
    """Record when each launcher Job (``<job>-launcher``, the MPI Operator's) appears; ours
    creates its launcher pod directly and has none."""
    def record(kind: str, job: dict[str, Any], now: float) -> None:
        name = job["metadata"]["name"]
        if kind != "DELETED" and name.endswith("-launcher"):
            with seen.lock:
                seen.launcher_job.setdefault(name.removesuffix("-launcher"), now)
    return record


class Process:
    """CPU seconds, peak RSS and TCP peers of one running process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peers: set[str] = set()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def sample_peers(self) -> None:
        """Add the remote addresses of this process's TCP sockets (``ss``) to ``peers``."""
        out = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if f"pid={self.pid}," in line:
                self.peers.add(line.split()[4].rsplit(":", 1)[0])


class Bench:
    """One run: the cluster, the audit log read so far, and the results."""

    def __init__(self, cluster: LocalCluster, args: argparse.Namespace) -> None:
        self.cluster, self.args = cluster, args
        kubernetes.config.load_kube_config(str(cluster.kubeconfig))
        self.core = kubernetes.client.CoreV1Api()
        self.batch = kubernetes.client.BatchV1Api()
        self.apps = kubernetes.client.AppsV1Api()
        self.networking = kubernetes.client.NetworkingV1Api()
        self.custom = kubernetes.client.CustomObjectsApi()
        self.requests: list[apiaudit.Request] = []
        self.audit_offset = 0
        self.runs_of_size: Counter[int] = Counter()  # job names stay unique across batches

    def audit(self) -> list[apiaudit.Request]:
        """Every request logged so far (reads what was added since the last call)."""
        new, self.audit_offset = apiaudit.read_log(self.cluster.audit_log, self.audit_offset)
        self.requests.extend(new)
        return self.requests

    def run(self, who: Contender) -> dict[str, Any]:
        """Start ``who``, run every batch and the idle phase; returns its results."""
        self.core.create_namespace({"metadata": {"name": who.namespace}})
        kubeconfig = self.cluster.user_kubeconfig(who.user)
        if who.key.startswith("mpi"):
            _check_port_free(mpi.HEALTH_PORT)
        log = open(self.cluster.logs / f"{who.user}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(who.command(kubeconfig), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, "KUBECONFIG": str(kubeconfig)})
        log.close()
        proc = Process(process.pid)
        seen, stop = Seen(), threading.Event()
        watchers = [threading.Thread(target=watch, args=(call, who.namespace, record, stop),
                                     daemon=True)
                    for call, record in ((self.core.list_namespaced_pod, on_pod(seen)),
                                         (self.batch.list_namespaced_job, on_batch_job(seen)))]
        for thread in watchers:
            thread.start()
        result: dict[str, Any] = {"operator": who.title, "user": who.user, "batches": []}
        try:
            self._wait_watching(who, process)
            for size in self.args.batches:
                if who.key == "mpi" and size > self.args.mpi_default_max_batch:
                    # ~30 writes per job at 5 requests/s: 200 jobs would take ~20 minutes.
                    result.setdefault("skipped_batches", []).append(size)
                    continue
                repeats = self.args.small_repeats if size < SMALL_BATCH else 1
                result["batches"].append(self._batch(who, seen, proc, size, repeats))
                proc.sample_peers()
            if self.args.idle_jobs:  # 0: batches only (e.g. a before/after of peak RSS)
                result["idle"] = self._idle(who, seen, proc)
            result["peak_rss_mib"] = round(proc.peak_rss_mib(), 1)
            result["tcp_peers"] = sorted(proc.peers)
            result["off_loopback_peers"] = [p for p in proc.peers
                                            if not p.strip("[]").startswith("127.")]
        finally:
            stop.set()
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return result

    def _wait_watching(self, who: Contender, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 120
        while not any(r.user == who.user and r.verb == "watch" and r.resource == who.plural
                      for r in self.audit()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{who.title} did not start watching {who.plural}; see "
                                   f"{self.cluster.logs / (who.user + '.log')}")
            time.sleep(0.5)

    def _submit(self, who: Contender, names: list[str], mode: str) -> dict[str, float]:
        def create(name: str) -> tuple[str, float]:
            body = who.job(name, self.args.workers,
                           pod_metadata(name, "worker", "ready", self.args),
                           pod_metadata(name, "launcher", mode, self.args))
            submitted = time.time()
            self.custom.create_namespaced_custom_object(who.group, who.version, who.namespace,
                                                        who.plural, body)
            return name, submitted
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return dict(pool.map(create, names))

    def _jobs(self, who: Contender) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(who.group, who.version, who.namespace,
                                                         who.plural)["items"]

    def _pods(self, who: Contender, role: str | None = None) -> list[dict[str, Any]]:
        """The namespace's pods (of that bench role) that are not being deleted."""
        selector = f"{LABEL_ROLE}={role}" if role else ""
        response = self.core.list_namespaced_pod(who.namespace, label_selector=selector,
                                                 _preload_content=False)
        return [pod for pod in json.loads(response.data)["items"]
                if not pod["metadata"].get("deletionTimestamp")]

    def _wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.args.batch_timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {self.args.batch_timeout}s waiting for {what}")
            time.sleep(0.5)

    def _batch(self, who: Contender, seen: Seen, proc: Process, size: int,
               repeats: int) -> dict[str, Any]:
        """``size`` jobs at once, ``repeats`` times one round after another (each round's jobs
        deleted before the next); latencies and per-job requests over every round."""
        names: list[str] = []
        submitted: dict[str, float] = {}
        windows: list[tuple[float, float]] = []
        seconds = cpu = 0.0
        for _ in range(repeats):
            run = self.runs_of_size[size]
            self.runs_of_size[size] += 1
            batch = [f"b{size}-{index}" + (f"-r{run}" if run else "") for index in range(size)]
            cpu_before, start = proc.cpu_seconds(), time.time()
            submitted.update(self._submit(who, batch, "succeed"))

            def finished(batch: list[str] = batch) -> bool:
                with seen.lock:
                    launched = all(name in seen.launcher_done for name in batch)
                return (launched and not self._pods(who, "worker")
                        and sum(1 for job in self._jobs(who) if who.finished(job)) == size)
            self._wait(f"{size} {who.plural} to succeed", finished)
            end = time.time()
            cpu += proc.cpu_seconds() - cpu_before
            seconds += end - start
            names += batch
            windows.append((start, end))
            time.sleep(1)  # the audit log is written as responses complete; let the last land
            self.audit()
            self._delete_all(who)
        counts = per_job(self.audit(), who.user, windows, len(names))
        times = {}
        if self.args.per_job:  # when each job's steps were seen (time.time()), for digging
            with seen.lock:
                times = {"per_job": {name: {
                    "submitted": submitted[name], "workers_ready": seen.worker_ready.get(name),
                    "launcher_job": seen.launcher_job.get(name),
                    "launcher_pod": seen.launcher_pod.get(name)} for name in names}}
        return {"jobs": size, "rounds": repeats, "seconds": round(seconds / repeats, 1),
                "cpu_seconds": round(cpu / repeats, 2),
                **latencies(names, submitted, seen, self.args.workers), **counts, **times}

    def _idle(self, who: Contender, seen: Seen, proc: Process) -> dict[str, Any]:
        size = self.args.idle_jobs
        names = [f"idle-{index}" for index in range(size)]
        self._submit(who, names, "ready")

        def running() -> bool:
            with seen.lock:
                ready = all(name in seen.launcher_ready for name in names)
            return ready and sum(1 for job in self._jobs(who) if who.running(job)) == size
        self._wait(f"{size} idle {who.plural} to run", running)
        time.sleep(5)  # let the operator finish reacting to the launchers' start
        cpu_before, start = proc.cpu_seconds(), time.time()
        time.sleep(self.args.idle_seconds)
        end, cpu = time.time(), proc.cpu_seconds() - cpu_before
        time.sleep(1)
        counts = apiaudit.count_by_verb_resource(self.audit(), who.user, _utc(start), _utc(end))
        minutes = (end - start) / 60
        job_related = sum(n for (_, resource), n in counts.items() if resource not in OPERATOR_WIDE)
        self._delete_all(who)
        return {"jobs": size, "seconds": round(end - start, 1),
                "requests_per_minute": round(sum(counts.values()) / minutes, 1),
                "job_requests_per_minute": round(job_related / minutes, 1),
                "job_requests_per_minute_per_job": round(job_related / minutes / size, 2),
                "cpu_seconds_per_minute": round(cpu / minutes, 2),
                "by_verb_resource_per_minute": {f"{verb} {resource}": round(n / minutes, 1)
                                                for (verb, resource), n in counts.most_common()}}

    def _delete_all(self, who: Contender) -> None:
        """Delete every job and wait until they and all their children are gone, then a little
        longer: requests an operator sends about a deleted job (deletes of its children, some
        answered 404 after garbage collection got there first) fall in no batch's window."""
        self.custom.delete_collection_namespaced_custom_object(
            who.group, who.version, who.namespace, who.plural)
        self._wait(f"{who.plural} and their children to go",
                   lambda: not self._jobs(who) and not self._children(who))
        time.sleep(1)

    def _children(self, who: Contender) -> list[str]:
        """What the namespace holds besides what Kubernetes puts in every namespace: pods,
        Services, StatefulSets, batch Jobs, Secrets, ConfigMaps, NetworkPolicies."""
        namespace = who.namespace
        lists = [("pod", self.core.list_namespaced_pod),
                 ("service", self.core.list_namespaced_service),
                 ("secret", self.core.list_namespaced_secret),
                 ("configmap", self.core.list_namespaced_config_map),
                 ("statefulset", self.apps.list_namespaced_stateful_set),
                 ("job", self.batch.list_namespaced_job),
                 ("networkpolicy", self.networking.list_namespaced_network_policy)]
        left = []
        for kind, list_call in lists:
            response = list_call(namespace, _preload_content=False)
            left += [f"{kind}/{item['metadata']['name']}"
                     for item in json.loads(response.data)["items"]
                     if item["metadata"]["name"] != "kube-root-ca.crt"]
        return left


def latencies(names: list[str], submitted: dict[str, float], seen: Seen,
              workers: int) -> dict[str, Any]:
    """Percentiles (seconds) over the jobs of a batch: submit -> all workers Ready, and last
    worker Ready -> launcher Job / launcher pod created."""
    to_ready, to_job, to_pod = [], [], []
    with seen.lock:
        for name in names:
            ready = seen.worker_ready.get(name, {})
            if len(ready) < workers:
                continue
            last = max(ready.values())
            to_ready.append(last - submitted[name])
            if name in seen.launcher_job:
                to_job.append(seen.launcher_job[name] - last)
            if name in seen.launcher_pod:
                to_pod.append(seen.launcher_pod[name] - last)

    def spread(values: list[float]) -> dict[str, float]:
        return {f"p{q}": round(apiaudit.percentile(values, q), 3) for q in (50, 95, 99)}
    return {"submit_to_workers_ready": spread(to_ready),
            "last_ready_to_launcher_job": spread(to_job),
            "last_ready_to_launcher_pod": spread(to_pod)}


# Operator-wide, not per job: the MPI Operator's leader-election lease renewals.
OPERATOR_WIDE = frozenset({"leases"})


def per_job(requests: list[apiaudit.Request], user: str, windows: list[tuple[float, float]],
            jobs: int) -> dict[str, Any]:
    """Requests of ``user`` in the ``[start, end)`` windows (``time.time()``) per job: writes
    (events among them), reads, failed ones (HTTP >= 400, e.g. 409 on a create that lost a
    race), and each ``verb resource``; leader-election leases are counted apart
    (``operator_wide``)."""
    window = [r for r in requests if r.user == user
              and any(_utc(start) <= r.time < _utc(end) for start, end in windows)]
    counts = apiaudit.count_by_verb_resource(window, user, _utc(min(s for s, _ in windows)),
                                             _utc(max(e for _, e in windows)))
    wide = Counter({key: n for key, n in counts.items() if key[1] in OPERATOR_WIDE})
    counts -= wide
    writes, reads = apiaudit.split_writes(counts)
    events = sum(n for (verb, resource), n in counts.items()
                 if resource == "events" and verb in apiaudit.WRITE_VERBS)
    failed = Counter(f"{r.verb} {r.resource} {r.code}" for r in window
                     if r.code >= 400 and r.resource not in OPERATOR_WIDE)
    return {"writes_per_job": round(writes / jobs, 2), "reads_per_job": round(reads / jobs, 2),
            "event_writes_per_job": round(events / jobs, 2),
            "failed_per_job": round(sum(failed.values()) / jobs, 2),
            "failed": dict(failed.most_common()),
            "operator_wide": {f"{verb} {resource}": n for (verb, resource), n in wide.items()},
            "by_verb_resource_per_job": {f"{verb} {resource}": round(n / jobs, 2)
                                         for (verb, resource), n in counts.most_common()}}


def table(results: list[dict[str, Any]]) -> str:
    """The results as Markdown tables: batches, idle jobs, memory."""
    def cell(spread: dict[str, float], keys: tuple[str, ...] = ("p50", "p95", "p99")) -> str:
        if all(math.isnan(spread[k]) for k in keys):
            return "none"  # our operator creates the launcher pod itself, with no batch Job
        return " / ".join(f"{spread[k]:.2f}" for k in keys)
    lines = ["| operator | jobs | submit -> workers Ready p50/p95/p99 s | last Ready -> launcher "
             "Job p50/p95/p99 s | last Ready -> launcher pod p50/p95/p99 s | writes/job (events) | "
             "reads/job | failed/job | batch s | CPU s |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for result in results:
        for batch in result["batches"]:
            rounds = batch.get("rounds", 1)
            jobs = f"{batch['jobs']}" + (f" (x{rounds})" if rounds > 1 else "")
            lines.append(f"| {result['operator']} | {jobs} | "
                         f"{cell(batch['submit_to_workers_ready'])} | "
                         f"{cell(batch['last_ready_to_launcher_job'])} | "
                         f"{cell(batch['last_ready_to_launcher_pod'])} | "
                         f"{batch['writes_per_job']:.1f} ({batch['event_writes_per_job']:.1f}) | "
                         f"{batch['reads_per_job']:.1f} | {batch['failed_per_job']:.1f} | "
                         f"{batch['seconds']:.0f} | {batch['cpu_seconds']:.1f} |")
        for size in result.get("skipped_batches", []):
            lines.append(f"| {result['operator']} | {size} | skipped (--mpi-default-max-batch) "
                         "| | | | | | | |")
    lines += ["", "| operator | untouched running jobs | requests/min (leader lease "
              "excluded) | per job | CPU s/min | peak RSS MiB | TCP peers |",
              "|---|---:|---|---:|---:|---:|---|"]
    for result in results:
        idle = result.get("idle")
        if idle is None:  # --idle-jobs 0
            lines.append(f"| {result['operator']} | 0 | | | | {result['peak_rss_mib']:.0f} | "
                         f"{', '.join(result['tcp_peers'])} |")
            continue
        lines.append(f"| {result['operator']} | {idle['jobs']} | {idle['requests_per_minute']} "
                     f"({idle['job_requests_per_minute']}) | "
                     f"{idle['job_requests_per_minute_per_job']} | "
                     f"{idle['cpu_seconds_per_minute']} | "
                     f"{result['peak_rss_mib']:.0f} | {', '.join(result['tcp_peers'])} |")
    return "\n".join(lines)


def _utc(timestamp: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC)


def _check_port_free(port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104  (the MPI Operator binds all interfaces)
        except OSError as error:
            raise RuntimeError(f"port {port} is in use; the MPI Operator serves its health "
                               f"check there (no flag changes it): {error}") from error


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the benchmark, print the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operators", nargs="+", default=["monarch", "mpi", "mpi-raised"],
                        choices=["monarch", "monarch-before", "mpi", "mpi-raised"])
    parser.add_argument("--monarch-before", type=Path, default=None,
                        help="a checkout (or `git archive`) of an earlier commit: its operator "
                        "runs as contender monarch-before, for before/after numbers")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 50, 200])
    parser.add_argument("--workers", type=int, default=4, help="workers per job (1 GPU each)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--ready-after", default="1s", help="worker IP -> Ready (Go duration)")
    parser.add_argument("--succeed-after", default="2s", help="launcher Ready -> Succeeded")
    parser.add_argument("--idle-jobs", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--mpi-raised-qps", type=int, default=100,
                        help="the raised client rate limit (burst: twice this; default 5/10)")
    parser.add_argument("--mpi-raised-queue-rate", type=int, default=100,
                        help="the raised work-queue rate limit (burst: ten times this; "
                        "default 10/100)")
    parser.add_argument("--mpi-default-max-batch", type=int, default=50,
                        help="larger batches are skipped for the MPI Operator at its default "
                        "rate limit (5 qps)")
    parser.add_argument("--batch-timeout", type=float, default=600)
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="keep the cluster's files (logs, audit log) here")
    parser.add_argument("--json", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--controller-manager-qps", type=int, default=None,
                        help="the controller manager's client rate limit (burst: twice "
                        "this); default Kubernetes' own, 20/30, shared by the StatefulSet and "
                        "Job controllers that create both operators' launcher pods")
    parser.add_argument("--small-repeats", type=int, default=5,
                        help=f"a batch of fewer than {SMALL_BATCH} jobs is run this many times, "
                        "one round after another, and its latencies pooled (one job's one "
                        "sample is mostly noise)")
    parser.add_argument("--per-job", action="store_true",
                        help="also put in the JSON when each job's steps were seen")
    args = parser.parse_args(argv)
    mpi_binary = (mpi.ensure_mpi_operator()[0] if any(k.startswith("mpi") for k in args.operators)
                  else None)
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="operator-scale-"))
    who_runs = contenders(args, mpi_binary)
    cluster = LocalCluster(state, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                           node_agent=False, audit_users=tuple(who.user for who in who_runs),
                           controller_manager_qps=args.controller_manager_qps)
    results = []
    try:
        cluster.up(progress=lambda line: print(line, file=sys.stderr))
        kubectl = Kubectl(cluster.env())
        install_crds(kubectl)
        if mpi_binary is not None:
            kubectl("apply", "--server-side", "-f", str(mpi_binary.with_name(
                "kubeflow.org_mpijobs.yaml")))
            wait_established(kubectl, "mpijobs.kubeflow.org")
        bench = Bench(cluster, args)
        for who in who_runs:
            print(f"== {who.title}", file=sys.stderr)
            results.append(bench.run(who))
    except BaseException:
        print(f"cluster state and logs kept in {state}", file=sys.stderr)
        raise
    finally:
        cluster.down(quiet=True)
    if args.state_dir is None:  # a temporary state dir (about 150 MB a run) goes once it ran
        shutil.rmtree(state, ignore_errors=True)
    report = {"machine": {"cpus": os.cpu_count(), "memory_gib": round(
                  os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
              "settings": {k: str(v) for k, v in vars(args).items()}, "results": results}
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"JSON: {args.json}")
    else:
        print(json.dumps(report, indent=2))
    return 1 if any(r["off_loopback_peers"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
