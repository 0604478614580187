"""``monarch-localcluster``: start, stop and inspect the local control plane.

Examples::

    monarch-localcluster up              # build binaries if needed, start, wait for nodes
    eval "$(monarch-localcluster env)"    # KUBECONFIG and kubectl on PATH for this shell
    monarch-localcluster logs team-a/demo-launcher-abcde
    monarch-localcluster logs team-a/demo-worker-0 -c prep --previous
    monarch-localcluster down            # stop every process it started
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from monarch_operator.localcluster.cluster import LocalCluster

DEFAULT_STATE_DIR = Path(os.environ.get("MONARCH_LOCALCLUSTER_DIR", ".localcluster"))


def pod_log_path(state_dir: Path, namespace: str, pod: str, container: str | None = None,
                 previous: bool = False) -> Path | None:
    """Log file of the pod's container (default: the newest one written), or ``None`` if it
    never ran here; ``previous``: the instance before the current one (after a restart)."""
    suffix = ".previous.log" if previous else ".log"
    logs = sorted((path for path in (state_dir / "pods" / namespace / pod).glob(
                       f"*/{container or '*'}{suffix}")
                   if previous or not path.name.endswith(".previous.log")),
                  key=lambda path: path.stat().st_mtime)
    return logs[-1] if logs else None


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="monarch-localcluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_STATE_DIR,
                        help="state directory (default: $MONARCH_LOCALCLUSTER_DIR or .localcluster)")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the cluster")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--gpus-per-node", type=int, default=8)
    sub.add_parser("down", help="stop the cluster")
    sub.add_parser("env", help="print shell exports for KUBECONFIG and PATH")
    logs = sub.add_parser("logs", help="print a pod's container output (NAMESPACE/POD)")
    logs.add_argument("pod")
    logs.add_argument("-c", "--container", help="container name (default: the newest log)")
    logs.add_argument("-p", "--previous", action="store_true",
                      help="the container's previous instance (before its last restart)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir, nodes=getattr(args, "nodes", 3),
                           gpus_per_node=getattr(args, "gpus_per_node", 8))
    if args.command == "up":
        cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
    elif args.command == "down":
        cluster.down()
    elif args.command == "env":
        for key, value in cluster.env().items():
            print(f"export {key}={shlex.quote(value)}")
    else:
        namespace, _, pod = args.pod.rpartition("/")
        path = pod_log_path(cluster.state_dir, namespace or "default", pod, args.container,
                            args.previous)
        if path is None:
            print(f"no local process ran for pod {args.pod}", file=sys.stderr)
            return 1
        sys.stdout.write(path.read_text(errors="replace"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
