"""The demo's command line, checked before any set-up (standard library only).

``scripts/demo.sh`` runs this file with the machine's ``python3`` before ``scripts/setup.sh``
(``python3 .../args.py demo ARGS``: exit 0 and nothing printed when the arguments are good,
argparse's usage and an error naming the flag and its rule otherwise), so that a mistyped flag
costs a second, not a 35-minute first set-up. ``localcluster.demo`` parses with the same
parser; ``localcluster.cli`` takes its default state directory from here.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
# The demo's real nodes: two, so that the sample's three workers spread over both.
DEMO_NODES = 2
DEFAULT_TIMEOUT_SECONDS = 600.0
# A namespace is a DNS-1123 label (Kubernetes' validation.IsDNS1123Label).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL_MAX = 63


def default_state_dir() -> Path:
    """The state directory when ``--dir`` is not given, the same from any working directory:
    ``$MONARCH_LOCALCLUSTER_DIR`` (made absolute), else ``.localcluster`` in this source
    checkout, else (an installed package) ``~/.local/state/monarch-localcluster``."""
    configured = os.environ.get("MONARCH_LOCALCLUSTER_DIR")
    if configured:
        return Path(configured).resolve()
    if (REPO_ROOT / "pyproject.toml").exists():
        return REPO_ROOT / ".localcluster"
    return Path.home() / ".local" / "state" / "monarch-localcluster"


def _real_nodes(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of nodes") from None
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"{count}: at least 1 real node (--simulated runs kwok nodes instead)")
    return count


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 seconds")
    return seconds


def _namespace(text: str) -> str:
    if len(text) > DNS_LABEL_MAX or not DNS_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace name: at most {DNS_LABEL_MAX} lower-case letters, "
            "digits and '-', starting and ending with a letter or digit (RFC 1123 label)")
    return text


def demo_parser() -> argparse.ArgumentParser:
    """The parser of ``scripts/demo.sh``'s arguments; every value is checked as it is parsed
    (``--nodes`` at least 1, ``--timeout`` above 0 seconds, ``--namespace`` a DNS label)."""
    parser = argparse.ArgumentParser(
        prog="scripts/demo.sh",
        description="The sample MonarchJob end to end on the local control plane.")
    parser.add_argument("--dir", type=Path, default=default_state_dir(),
                        help="state directory: kubeconfig, logs, pod output (default %(default)s)")
    parser.add_argument("--namespace", type=_namespace, default="team-a",
                        help="namespace of the sample job (default %(default)s)")
    parser.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_SECONDS,
                        metavar="SECONDS",
                        help="how long to wait for the job to finish (default %(default)s)")
    parser.add_argument("--keep", action="store_true",
                        help="leave cluster and operator running, with the examples image "
                             "imported too (examples/*/monarchjob*.yaml run there)")
    parser.add_argument("--nodes", type=_real_nodes, default=DEMO_NODES, metavar="N",
                        help="real nodes (kubelet, containerd, images built from images/; "
                             "default %(default)s)")
    parser.add_argument("--simulated", action="store_true",
                        help="kwok nodes whose pods the node agent runs as host processes "
                             "instead of real nodes (no images built)")
    return parser


def main(argv: list[str]) -> int:
    """``args.py demo ARGS``: check the demo's arguments; 0 when good, 2 (argparse's) when not."""
    if not argv or argv[0] != "demo":
        print("usage: args.py demo [ARGS...]", file=sys.stderr)
        return 2
    demo_parser().parse_args(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
