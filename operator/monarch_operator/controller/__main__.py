"""``monarch-operator``: run the kopf operator for MonarchJobs (``python -m`` works too)."""

from __future__ import annotations

import argparse
import asyncio
import logging

import kopf


def main(argv: list[str] | None = None) -> None:
    """Run the operator until interrupted.

    Flags: ``--namespace NS`` (repeatable; default: all namespaces), ``--verbose``,
    ``--liveness URL`` (kopf health endpoint, e.g. ``http://0.0.0.0:8080/healthz``),
    ``--metrics HOST:PORT`` (Prometheus ``/metrics``, see :mod:`.metrics`; default: off).
    Exits with status 2 and a message naming the flag when the metrics address is malformed or
    cannot be bound.
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
    args = parser.parse_args(argv)
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
    asyncio.run(
        kopf.operator(
            settings=settings,
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
        )
    )


if __name__ == "__main__":
    main()
