"""``monarch-operator``: run the kopf operator for MonarchJobs (``python -m`` works too)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import threading

import kopf

from monarch_operator.controller.leader import settings as election


def main(argv: list[str] | None = None) -> None:
    """Run the operator until interrupted.

    Flags: ``--namespace NS`` (repeatable; default: all namespaces), ``--verbose``,
    ``--liveness URL`` (kopf health endpoint, e.g. ``http://0.0.0.0:8080/healthz``),
    ``--metrics HOST:PORT`` (Prometheus ``/metrics``, see :mod:`.metrics`; default: off),
    ``--leader-elect`` with its Lease and timings (:mod:`.leader`, docs/ha.md; default: off,
    the process acts alone).
    Exits with status 2 and a message naming the flag when the metrics address is malformed or
    cannot be bound, or when the leader election settings are invalid (lease duration > renew
    deadline > 1.2 x retry period; a namespace for the Lease); with status
    :data:`.leader.run.EXIT_LOST` when this replica lost leadership.
    """
    parser = argparse.ArgumentParser(
        prog="monarch-operator",
        description="Reconcile MonarchJob resources (kopf). Uses in-cluster credentials, "
        "else $KUBECONFIG.",
    )
    parser.add_argument("--namespace", action="append", default=[],
                        help="watch only this namespace (repeatable; kopf's globs such as "
                        "'team-*' and exclusions such as '!ci-*' work too); default: all")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument("--liveness", default=None, help="kopf liveness endpoint URL")
    parser.add_argument("--metrics", default=None, metavar="HOST:PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics; default: off")
    add_election_flags(parser)
    args = parser.parse_args(argv)
    elect = election_settings(parser, args)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from monarch_operator.controller import handlers  # noqa: F401  (registers the handlers)
    from monarch_operator.controller.engine import metrics

    if args.metrics:
        try:
            host, port = metrics.serve(args.metrics)
        except (ValueError, OSError) as error:
            parser.error(f"--metrics {args.metrics}: {error}")
        logging.getLogger("monarch_operator").info("metrics at http://%s:%d/metrics", host, port)

    settings = kopf.OperatorSettings()
    # Watching listed namespaces needs no cluster-scoped permission (the chart's Roles): kopf's
    # scans of namespaces and CRDs (list/watch, cluster-wide) are off, and the listed names are
    # taken as given. Cluster-wide, or with kopf's patterns (`!ci-*`, `team-*`), it keeps them.
    settings.scanning.disabled = bool(args.namespace) and not any(
        set(pattern) & set("!*?,") for pattern in args.namespace)

    async def operate(stop_flag: threading.Event | None) -> None:
        stop = asyncio.Event()

        async def bridge(flag: threading.Event) -> None:
            # kopf waits for a threading.Event in a thread of the default executor, which
            # asyncio.run then waits for at its end: a flag never set would hang the stop.
            while not flag.is_set():
                await asyncio.sleep(0.1)
            stop.set()

        # Created before kopf starts: kopf cancels the loop's tasks created after its start.
        bridging = asyncio.create_task(bridge(stop_flag)) if stop_flag is not None else None
        try:
            await kopf.operator(
                settings=settings,
                # kopf's peering is a pause protocol without fencing: one process acts,
                # alone or as the Lease's holder (leader/).
                standalone=True,
                identity=kopf_identity(),
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                liveness_endpoint=args.liveness,
                stop_flag=stop if stop_flag is not None else None,
            )
        finally:
            if bridging is not None:
                bridging.cancel()

    def run_kopf(stop_flag: threading.Event | None = None) -> None:
        try:
            asyncio.run(operate(stop_flag))
        finally:
            # kopf cancels the wait for a pass, not the pass's thread: let the passes in flight
            # end (queued ones are dropped), so that nothing writes once the Lease is released.
            handlers._PASS_THREADS.shutdown(wait=True, cancel_futures=True)

    if elect is None:
        run_kopf()
        return
    from monarch_operator.controller import k8s
    from monarch_operator.controller.leader.run import run_elected

    k8s.load_config()
    sys.exit(run_elected(elect, run_kopf, liveness=args.liveness))


def kopf_identity() -> str:
    """The identity kopf gives this process (its peering, unused when standalone):
    ``<host name>/<pid>``, the pod's name in a pod.

    kopf's own (``detect_own_id``) asks ``getpass.getuser()``, which raises ``KeyError`` for a
    uid without a passwd entry: OpenShift's restricted-v2 runs the pod as an arbitrary uid of
    the namespace's range, which the image's /etc/passwd does not know, and kopf would exit
    before its first watch (seen on the local cluster's agent with the chart's uid 65532).
    """
    return f"{socket.gethostname()}/{os.getpid()}"


def add_election_flags(parser: argparse.ArgumentParser) -> None:
    """The ``--leader-elect*`` flags (defaults: client-go's and controller-runtime's)."""
    group = parser.add_argument_group("leader election (docs/ha.md)")
    group.add_argument("--leader-elect", action="store_true",
                       help="run kopf only while holding a coordination.k8s.io Lease (two or "
                       "more replicas: one acts, the others stand by); default: off")
    group.add_argument("--leader-elect-namespace", default=None, metavar="NS",
                       help="namespace of the Lease; default: $POD_NAMESPACE, else the "
                       "ServiceAccount's namespace")
    group.add_argument("--leader-elect-name", default=election.LEASE_NAME, metavar="NAME",
                       help=f"name of the Lease; default: {election.LEASE_NAME}")
    group.add_argument("--leader-elect-identity", default="", metavar="ID",
                       help="this replica's holder identity; default: <hostname>_<8 hex>")
    for flag, default, what in (
            ("lease-duration", election.LEASE_DURATION,
             "how long a standby waits after the Lease last changed before taking it over"),
            ("renew-deadline", election.RENEW_DEADLINE,
             "how long the leader tries to renew before it stops and exits"),
            ("retry-period", election.RETRY_PERIOD, "interval between tries")):
        group.add_argument(f"--leader-elect-{flag}", type=float, default=default,
                           metavar="SECONDS", help=f"{what}; default: {default:g}")


def election_settings(parser: argparse.ArgumentParser,
                      args: argparse.Namespace) -> election.ElectionSettings | None:
    """The leader election settings of ``args``; ``None`` without ``--leader-elect``. Invalid
    settings end the process with status 2 and the rule they break (``parser.error``)."""
    try:
        election.validate(args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
                          args.leader_elect_retry_period)
    except ValueError as error:
        parser.error(str(error))
    if not args.leader_elect:
        return None
    namespace = args.leader_elect_namespace or election.default_namespace()
    if not namespace:
        parser.error("--leader-elect needs --leader-elect-namespace outside a pod (no "
                     "$POD_NAMESPACE, no ServiceAccount namespace file)")
    return election.ElectionSettings(
        namespace=namespace, name=args.leader_elect_name, identity=args.leader_elect_identity,
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period)


if __name__ == "__main__":
    main()
