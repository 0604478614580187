"""``monarch-operator``: run the kopf operator for MonarchJobs (``python -m`` works too)."""

from __future__ import annotations

import argparse
import asyncio
import logging

import kopf


def main(argv: list[str] | None = None) -> None:
    """Run the operator until interrupted.

    Flags: ``--namespace NS`` (repeatable; default: all namespaces), ``--verbose``,
    ``--liveness URL`` (kopf health endpoint, e.g. ``http://0.0.0.0:8080/healthz``).
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
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from monarch_operator.controller import handlers  # noqa: F401  (registers the handlers)

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
