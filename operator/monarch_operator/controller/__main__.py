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
                        help="watch only this namespace (repeatable); default: all")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument("--liveness", default=None, help="kopf liveness endpoint URL")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from monarch_operator.controller import handlers  # noqa: F401  (registers the handlers)

    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
        )
    )


if __name__ == "__main__":
    main()
