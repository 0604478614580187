"""Prometheus metrics of the operator (``prometheus_client``), served when ``--metrics`` is given.

What is measured, all in the default registry (with the client's process and Python metrics):

- ``monarch_operator_reconcile_total{result}``: reconcile passes by how they ended: ``ok``,
  ``api_error`` (the Kubernetes API answered with an error; the pass is retried with back-off)
  or ``error`` (any other exception; also retried).
- ``monarch_operator_reconcile_duration_seconds``: wall time of each pass (histogram).
- ``monarch_operator_reconcile_wait_seconds``: from a job's wake-up (a watch event or its
  timer) to the start of the pass that serves it (histogram): time spent waiting for one of
  the operator's pass threads (``urgent``: jobs whose workers are all Ready, which go first).
- ``monarch_operator_api_errors_total{code}``: API errors that ended a pass, by HTTP status
  (``0`` when no response came back). Answers a pass expects (404 on read, 409 on create) are
  not errors and are not counted.
- ``monarch_operator_jobs{phase}``: the MonarchJobs this operator reconciles, by the phase (the
  ``STATUS`` column) their last pass left them in; a deleted job leaves the count.
- ``monarch_operator_leader``: 1 while this replica leads (holds the Lease, its renew deadline
  not passed), else 0 (``--leader-elect``; without it, 0 and the replica acts alone).
- ``monarch_operator_leader_transitions_total``: changes of the Lease's holder this replica
  saw: its own acquisitions, releases and losses, and other replicas taking over.

Naming follows the Prometheus guide "Metric and label naming" (``_total`` counters, base units).
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "monarch_operator"
RESULT_OK, RESULT_API_ERROR, RESULT_ERROR = "ok", "api_error", "error"

RECONCILE_PASSES = Counter(f"{PREFIX}_reconcile", "Reconcile passes by how they ended.",
                           ["result"])
RECONCILE_DURATION = Histogram(
    f"{PREFIX}_reconcile_duration_seconds", "Wall time of one reconcile pass.",
    # A pass makes a few API calls: tens of milliseconds normally, seconds under load.
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
RECONCILE_WAIT = Histogram(
    f"{PREFIX}_reconcile_wait_seconds", "From a job's wake-up to the start of the pass that "
    "serves it.", ["urgent"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
API_ERRORS = Counter(f"{PREFIX}_api_errors", "Kubernetes API errors that ended a pass, by HTTP "
                     "status (0: no response).", ["code"])
LEADER = Gauge(f"{PREFIX}_leader", "1 while this replica leads (holds the leader election "
               "Lease and its renew deadline has not passed), else 0.")
LEADER_TRANSITIONS = Counter(f"{PREFIX}_leader_transitions", "Changes of the leader election "
                             "Lease's holder this replica saw (its own included).")


class JobPhases(Collector):
    """The last phase of each job, collected as one gauge per phase (a job counts once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}

    def set(self, job: tuple[str, str], phase: str | None) -> None:
        """Record the phase of ``(namespace, name)`` after a pass; ``None`` forgets the job
        (deleted, or gone when its pass ran)."""
        with self._lock:
            if phase is None:
                self._phases.pop(job, None)
            else:
                self._phases[job] = phase

    def counts(self) -> dict[str, int]:
        """Number of jobs in each phase seen."""
        with self._lock:
            return dict(Tally(self._phases.values()))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(f"{PREFIX}_jobs", "MonarchJobs by the phase their last "
                                   "reconcile pass left them in.", labels=["phase"])
        for phase, count in sorted(self.counts().items()):
            family.add_metric([phase], count)
        yield family


JOB_PHASES = JobPhases()
REGISTRY.register(JOB_PHASES)


def record_pass(result: str, seconds: float, api_status: int | None = None) -> None:
    """Count one pass that ended with ``result`` (``RESULT_*``) after ``seconds``; for
    ``RESULT_API_ERROR`` also the API error with HTTP status ``api_status``."""
    RECONCILE_PASSES.labels(result).inc()
    RECONCILE_DURATION.observe(seconds)
    if result == RESULT_API_ERROR:
        API_ERRORS.labels(str(api_status or 0)).inc()


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9090`` for IPv6) -> ``(host, port)``.

    Raises:
        ValueError: no port, or a port that is not a number in 0..65535 (0: any free port).
    """
    host, separator, port_text = address.rpartition(":")
    if not separator or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{address!r} is not HOST:PORT with a port in 0..65535")
    return host.strip("[]") or "0.0.0.0", int(port_text)


def serve(address: str) -> tuple[str, int]:
    """Serve ``/metrics`` (Prometheus text format) at ``HOST:PORT`` from a daemon thread.

    Returns the bound ``(host, port)`` (port 0 picks a free one). Raises ``ValueError`` for a
    malformed address and ``OSError`` when the address cannot be bound.
    """
    host, port = parse_address(address)
    server, _thread = start_http_server(port, addr=host)
    bound_host, bound_port = server.server_address[:2]
    return str(bound_host), int(bound_port)
