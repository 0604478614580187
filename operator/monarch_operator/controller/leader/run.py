"""The process under leader election: campaign from the start, run kopf only while leading,
exit when leadership ends (as controller-runtime and the MPI Operator do; docs/ha.md).

- Standby: the elector tries every retry period; ``/healthz`` answers 200 (:mod:`.standby`);
  kopf is not started, so nothing is watched or written. SIGTERM ends the process (status 0).
- Leader: kopf runs in a thread, stopped through its stop flag (SIGTERM sets it); the elector
  renews in a thread of its own; the write fence (:mod:`.fence`) refuses every write past the
  deadline.
- Leadership lost (renew deadline passed, another holder): the elector's thread logs why, asks
  kopf to stop and ends the process with :data:`EXIT_LOST` within :data:`STOP_GRACE` seconds,
  whether kopf has stopped or not (its writes are already refused).
- SIGTERM to the leader: kopf stops its handlers, then the Lease is released (empty holder)
  and the process exits 0; a standby leads within one retry period.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from monarch_operator.controller.leader import fence
from monarch_operator.controller.leader.elector import Elector
from monarch_operator.controller.leader.lease import LeaseApi
from monarch_operator.controller.leader.settings import ElectionSettings

logger = logging.getLogger("monarch_operator.leader")

# Exit status of a replica that lost leadership (the kubelet restarts it as a standby).
EXIT_LOST = 3
# Seconds a losing replica gives kopf to stop before the process ends regardless.
STOP_GRACE = 1.0


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()


def _run_in_thread(function: Callable[[threading.Event], None], flag: threading.Event) -> None:
    """``function(flag)`` in a thread while this (the main) thread stays free for signals;
    its exception is raised here."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            function(flag)
        except BaseException as error:  # noqa: BLE001 (handed to the caller)
            errors.append(error)

    thread = threading.Thread(target=target, name="kopf")
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if errors:
        raise errors[0]


def run_elected(settings: ElectionSettings, run_kopf: Callable[[threading.Event], None],
                liveness: str | None = None, api: LeaseApi | None = None,
                exit_process: Callable[[int], Any] = os._exit) -> int:
    """Campaign for the Lease of ``settings``; once leading, call ``run_kopf(stop_flag)`` in a
    thread, where ``stop_flag`` is set when leadership is lost or a SIGTERM/SIGINT came.

    ``liveness``: kopf's ``--liveness`` URL, served by :mod:`.standby` until kopf starts.
    ``api``: the Lease calls (default: the API server's, :class:`.lease.KubernetesLeaseApi`).
    ``exit_process``: how the elector's thread ends the process on a loss (tests replace it).
    Returns the exit status: 0 after a stop by signal (the Lease released if held),
    :data:`EXIT_LOST` when leadership was lost; kopf's own error is raised (after the
    release).
    """
    from monarch_operator.controller.engine import metrics

    if api is None:
        from monarch_operator.controller.leader.lease import KubernetesLeaseApi

        api = KubernetesLeaseApi(settings.namespace, settings.name)
    elector = Elector(api, settings, on_transition=lambda holder, why:
                      metrics.LEADER_TRANSITIONS.inc())
    metrics.LEADER.set_function(lambda: float(elector.may_write()))
    fence.install(elector.may_write)
    logger.info("leader election: %s campaigns for Lease %s/%s (lease duration %gs, renew "
                "deadline %gs, retry period %gs)", settings.identity, settings.namespace,
                settings.name, settings.lease_duration, settings.renew_deadline,
                settings.retry_period)

    def on_signal(signum: int, _frame: Any) -> None:
        logger.info("leader election: %s received, stopping", signal.Signals(signum).name)
        elector.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    standby = None
    if liveness:
        from monarch_operator.controller.leader.standby import StandbyHealth

        standby = StandbyHealth(liveness, lambda: {
            "leader": elector.may_write(), "identity": settings.identity,
            "holder": elector.holder, "lease": f"{settings.namespace}/{settings.name}"})
    kopf_stop = threading.Event()
    acquired = False
    try:
        acquired = elector.acquire()
        if not acquired:
            logger.info("leader election: stopped while standing by")
            return 0
    finally:
        if standby is not None:
            standby.close()
        if not acquired:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    # kopf runs in a thread of its own, where it sets no signal handlers: SIGTERM and SIGINT
    # set its stop flag here. (In the main thread kopf would take them itself, and then wait
    # 5 s for its stop flag's waiter, a task it never cancels: the hand-over would take 5 s.)
    for sig in previous:
        signal.signal(sig, lambda signum, _frame: (
            logger.info("leader election: %s received, stopping the operator",
                        signal.Signals(signum).name), kopf_stop.set()))
    if elector.stop_requested():
        # A signal came as the Lease was won (before the handlers above): nothing ran yet.
        # Without this check kopf would start with no renewer and no stop flag, and write
        # until the renew deadline, then hang until SIGKILL (short chaos soak, 2026-12-05).
        logger.info("leader election: stopped as the Lease was won; releasing it")
        elector.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        return 0
    kopf_done = threading.Event()
    lost: list[str] = []

    def lead() -> None:
        why = elector.lead()
        if why is None:
            return
        lost.append(why)
        kopf_stop.set()
        kopf_done.wait(STOP_GRACE)
        logger.error("leader election lost: exiting (status %d) so that a fresh process "
                     "stands by: %s", EXIT_LOST, why)
        _flush_logs()
        exit_process(EXIT_LOST)

    renewer = threading.Thread(target=lead, name="leader-election", daemon=True)
    renewer.start()
    try:
        _run_in_thread(run_kopf, kopf_stop)
    finally:
        kopf_done.set()
        if not lost:
            elector.stop()
            renewer.join(settings.request_timeout + 1)
            if not lost:
                elector.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if lost:
        logger.error("leader election lost: %s", lost[0])
        return EXIT_LOST
    return 0
