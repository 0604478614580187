"""Attach mode's worker process: Monarch's worker loop on ``MONARCH_PORT`` (docs/attach.md).

The worker container of a MonarchJob with ``spec.mode: attach`` runs
``python -m monarch_operator.launcher.attachworker``. It serves any number of clients one after
another: a client that disconnects (a launcher attempt that ended) leaves it waiting for the
next, so a new attempt attaches to the same pods.

It listens on every interface (on ``MONARCH_WORKER_LISTEN_ADDRESS`` when set) and advertises
``tcp://<name>:<port>``, where ``<name>`` is the pod's name in the job's headless Service
(``<pod>.<service>.<namespace>.svc.<domain>``, from ``MONARCH_WORKER_DOMAIN``), the same name the
hostfile gives it; the Service publishes names before readiness, so other workers resolve it as
soon as the pod has an IP. This is the address form of Monarch's own Kubernetes bootstrap
(``_WORKER_BOOTSTRAP_SCRIPT`` in ``monarch/_src/job/kubernetes.py``, torchmonarch 0.7.0) without
a service proc id, which ``KubernetesJob`` attaching to pods it did not create does not give.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

from monarch_operator.launcher.session.environment import bound_monarch_log
from monarch_operator.launcher.userentry import reexec_with_entry

# Monarch KubernetesJob's default port, used when MONARCH_PORT is unset (as upstream does).
DEFAULT_PORT = 26600
PORT_ENV = "MONARCH_PORT"
DOMAIN_ENV = "MONARCH_WORKER_DOMAIN"
# Where to listen, default every interface. Only for pods without a network namespace of their
# own (the local cluster's node agent sets the pod IP), where every worker shares one port.
LISTEN_ENV = "MONARCH_WORKER_LISTEN_ADDRESS"


def advertised_name(hostname: str, environ: Mapping[str, str]) -> str:
    """The DNS name this worker advertises: ``<hostname>.<MONARCH_WORKER_DOMAIN>``, or the
    resolver's fully qualified name when the domain is not given.

    Args:
        hostname: the pod's host name (its pod name).
        environ: the process environment.

    Returns:
        The name, without a trailing dot.
    """
    domain = environ.get(DOMAIN_ENV, "").strip(".")
    if not domain:
        return socket.getfqdn(hostname)
    return f"{hostname}.{domain}"


def worker_port(environ: Mapping[str, str]) -> int:
    """The port to listen on: ``MONARCH_PORT``, else :data:`DEFAULT_PORT`.

    Raises:
        ValueError: ``MONARCH_PORT`` is not a port number (1-65535).
    """
    text = environ.get(PORT_ENV) or str(DEFAULT_PORT)
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"{PORT_ENV}={text!r} is not a port number (1-65535)")
    return port


def worker_address(name: str, port: int, listen: str = "0.0.0.0") -> str:
    """Monarch's worker address: advertise ``tcp://<name>:<port>``, listen on
    ``tcp://<listen>:<port>`` (``<advertised>@<listen>``, as ``run_worker_loop_forever``
    takes it)."""
    return f"tcp://{name}:{port}@tcp://{listen}:{port}"


def main() -> int:
    """Run the worker loop until the process is stopped; 2 on a bad ``MONARCH_PORT``.
    A uid without a passwd entry first runs itself again with one (launcher/userentry.py)."""
    reexec_with_entry()
    try:
        port = worker_port(os.environ)
    except ValueError as error:
        print(f"monarch-attach-worker: {error}", file=sys.stderr)
        return 2
    address = worker_address(advertised_name(socket.gethostname(), os.environ), port,
                             os.environ.get(LISTEN_ENV) or "0.0.0.0")
    print(f"monarch-attach-worker: serving {address}", file=sys.stderr, flush=True)
    bound_monarch_log(os.environ)  # Monarch's log level and telemetry, read at its first import
    from monarch.actor import run_worker_loop_forever  # only here: tests import the rest

    # No TLS between client and workers yet (Monarch's KubernetesJob passes the same); the
    # job's NetworkPolicy is what keeps other pods out (docs/attach.md).
    run_worker_loop_forever(address=address, ca="trust_all_connections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
