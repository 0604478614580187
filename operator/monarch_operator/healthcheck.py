"""``python -m monarch_operator.healthcheck``: the chart's ``helm test`` check.

Finds the operator's pods through the API server and asks each running one's kopf health
endpoint (``http://<pod IP>:<port>/healthz``); exits 0 when one answers 200, 1 otherwise, with
one line per pod saying what it found. Pod IPs, not a Service, so that it works without
kube-proxy or cluster DNS too.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

import kubernetes


def probe(url: str, timeout: float) -> str:
    """GET ``url``; returns ``"200"`` (the status code as text) or the reason it failed."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http only)
            return str(response.status)
    except urllib.error.HTTPError as error:
        return str(error.code)
    except (urllib.error.URLError, OSError) as error:
        return f"unreachable ({getattr(error, 'reason', error)})"


def main(argv: list[str] | None = None) -> int:
    """Check the operator's health; returns the exit status (0 healthy, 1 not)."""
    parser = argparse.ArgumentParser(prog="python -m monarch_operator.healthcheck",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True, help="namespace of the operator's pods")
    parser.add_argument("--selector", required=True, help="label selector of the operator's pods")
    parser.add_argument("--port", type=int, default=8080, help="kopf health endpoint port")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per request")
    args = parser.parse_args(argv)
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    pods = kubernetes.client.CoreV1Api().list_namespaced_pod(
        args.namespace, label_selector=args.selector).items
    healthy = 0
    for pod in pods:
        name, ip, phase = pod.metadata.name, pod.status.pod_ip, pod.status.phase
        if phase != "Running" or not ip:
            print(f"{name}: {phase}, not probed")
            continue
        host = f"[{ip}]" if ":" in ip else ip  # an IPv6 pod IP
        url = f"http://{host}:{args.port}/healthz"
        answer = probe(url, args.timeout)
        print(f"{name}: GET {url} -> {answer}")
        healthy += answer == "200"
    if not pods:
        print(f"no pod in {args.namespace} matches {args.selector}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
