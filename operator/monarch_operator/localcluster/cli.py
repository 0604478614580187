"""``monarch-localcluster``: start, stop and inspect the local control plane.

Examples::

    monarch-localcluster up              # build binaries if needed, start, wait for nodes
    monarch-localcluster up --real-nodes 2   # real kubelets + containerd, images built here
    eval "$(monarch-localcluster env)"    # KUBECONFIG and kubectl on PATH for this shell
    monarch-localcluster status          # running or not, where, component pids and ports
    kubectl logs -n team-a demo-launcher         # or, without the kubelet API:
    monarch-localcluster logs team-a/demo-launcher
    monarch-localcluster logs team-a/demo-worker-0 -c prep --previous
    monarch-localcluster node down kwok-gpu-1              # its kubelet gone: NotReady in ~20 s
    monarch-localcluster node down kwok-gpu-1 --partition  # ... but its pods keep running
    monarch-localcluster node up kwok-gpu-1
    monarch-localcluster down            # stop every process it started
    monarch-localcluster multikueue up   # ... with a MultiKueue manager beside it (docs/kueue.md)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import sysconfig
from pathlib import Path

from monarch_operator.localcluster import nodestate
from monarch_operator.localcluster.args import default_state_dir
from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.node.network import HOST_IP

DEFAULT_STATE_DIR = default_state_dir()
# Fake GPUs per node when `up` is not told (docs/local-cluster.md says so; a unit test checks).
DEFAULT_GPUS_PER_NODE = 8


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


def print_status(cluster: LocalCluster) -> int:
    """Print where the cluster lives and whether each component runs; 0 if all run, else 1."""
    record = cluster.record()
    print(f"state dir:   {cluster.state_dir}")
    print(f"kubeconfig:  {cluster.kubeconfig}")
    if not record.get("pids"):
        print("status:      not running (monarch-localcluster up starts it)")
        return 1
    running = cluster.is_running()
    print(f"status:      {'running' if running else 'broken (some components exited)'}")
    ports = record.get("ports", {})
    if "apiserver" in ports:
        host = str(HOST_IP) if record.get("real_nodes") else "127.0.0.1"
        print(f"apiserver:   https://{host}:{ports['apiserver']}")
    if record.get("real_nodes"):
        print(f"real nodes:  {record['real_nodes']} x {record.get('gpus_per_node')} GPUs "
              "(kubectl get nodes -o wide)")
    if "kubelet" in ports:
        print(f"kubelet API: https://127.0.0.1:{ports['kubelet']} (the node agent, every node)")
    for name in record["pids"]:
        pid = cluster.pid(name)
        print(f"  {name:<24} pid {pid} {'running' if cluster.alive(name) else 'exited'}")
    return 0 if running else 1


def _add_up_flags(up: argparse.ArgumentParser) -> None:
    """The flags of ``up``, also those of ``multikueue up`` (its worker is this cluster)."""
    up.add_argument("--nodes", type=int, default=3, help="kwok nodes (default %(default)s)")
    up.add_argument("--real-nodes", type=int, default=0, metavar="N",
                    help="real nodes instead (kubelet, containerd, kube-proxy, CoreDNS; images "
                         "built from images/): node-0 ... node-<N-1>")
    up.add_argument("--gpus-per-node", type=int, default=DEFAULT_GPUS_PER_NODE,
                    help="fake nvidia.com/gpu devices per node (default %(default)s)")
    up.add_argument("--images", default="worker", metavar="NAMES",
                    help="with real nodes: images imported into every node, comma separated "
                         "(worker, operator, examples; default %(default)s)")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="monarch-localcluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"state directory (default: $MONARCH_LOCALCLUSTER_DIR, else "
                             f"{DEFAULT_STATE_DIR})")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_up_flags(sub.add_parser("up", help="start the cluster"))
    sub.add_parser("down", help="stop the cluster")
    sub.add_parser("env", help="print shell exports for KUBECONFIG and PATH (kubectl, kubectl-monarch)")
    sub.add_parser("status", help="whether the cluster runs (exit 0) or not (exit 1), and where")
    logs = sub.add_parser("logs", help="print a pod's container output (NAMESPACE/POD)")
    logs.add_argument("pod")
    logs.add_argument("-c", "--container", help="container name (default: the newest log)")
    logs.add_argument("-p", "--previous", action="store_true",
                      help="the container's previous instance (before its last restart)")
    node = sub.add_parser("node", help="take a node's kubelet away (down) or bring it back (up)",
                          description=nodestate.__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    node.add_argument("action", choices=("down", "up"))
    node.add_argument("name", help="node name, e.g. kwok-gpu-1 or (real nodes) node-1")
    node.add_argument("--partition", action="store_true",
                      help="down: the node's pods keep running (network partition) instead of "
                           "dying with it (crash)")
    node.add_argument("--no-wait", action="store_true",
                      help="return at once instead of waiting for Ready=Unknown (down) or "
                           "Ready=True without taints (up)")
    pair = sub.add_parser("multikueue", help="a Kueue MultiKueue pair: this cluster as the "
                          "worker, a manager without nodes in <dir>/manager",
                          description=MULTIKUEUE_HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    pair_sub = pair.add_subparsers(dest="action", required=True)
    pair_up = pair_sub.add_parser("up", help="start (or complete) both clusters, Kueue and "
                                  "the operator on each, and connect them")
    _add_up_flags(pair_up)
    pair_up.add_argument("--namespace", default="team-a",
                         help="namespace of the LocalQueue user-queue on both (default "
                              "%(default)s)")
    pair_sub.add_parser("down", help="stop both clusters")
    pair_sub.add_parser("status", help="what runs (exit 0: everything, connected)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir, nodes=getattr(args, "nodes", 3),
                           gpus_per_node=getattr(args, "gpus_per_node", DEFAULT_GPUS_PER_NODE),
                           real_nodes=getattr(args, "real_nodes", 0),
                           images=tuple(filter(None, getattr(args, "images", "").split(","))))
    if args.command == "up":
        cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
    elif args.command == "down":
        cluster.down()
    elif args.command == "node":
        return _node(cluster, args)
    elif args.command == "multikueue":
        return _multikueue(cluster, args)
    elif args.command == "env":
        if not cluster.is_running():
            print(f"# no local cluster runs in {cluster.state_dir} "
                  "(monarch-localcluster up starts one)", file=sys.stderr)
        exports = cluster.env()
        # Also this environment's scripts: kubectl finds the kubectl-monarch plugin on PATH.
        kubectl_dir, _, rest = exports["PATH"].partition(os.pathsep)
        exports["PATH"] = os.pathsep.join([kubectl_dir, sysconfig.get_path("scripts"), rest])
        for key, value in exports.items():
            print(f"export {key}={shlex.quote(value)}")
    elif args.command == "status":
        return print_status(cluster)
    else:
        namespace, _, pod = args.pod.rpartition("/")
        path = pod_log_path(cluster.state_dir, namespace or "default", pod, args.container,
                            args.previous)
        if path is None:
            print(f"no local process ran for pod {args.pod}", file=sys.stderr)
            return 1
        sys.stdout.write(path.read_text(errors="replace"))
    return 0


MULTIKUEUE_HELP = """\
monarch-localcluster multikueue up      # worker (this cluster) + manager, Kueue, operators, queues
kubectl --kubeconfig <manager kubeconfig> apply -n team-a -f crds/samples/multikueue.yaml
monarch-localcluster multikueue status  # what runs; exit 0 when all of it does, connected
monarch-localcluster multikueue down    # stop both
"""


def _multikueue(cluster: LocalCluster, args: argparse.Namespace) -> int:
    # Imported here: multikueue_pair uses demo's helpers, and demo imports this module.
    from monarch_operator.localcluster import multikueue_pair

    def progress(message: str) -> None:
        print(f"[multikueue] {message}", flush=True)

    if args.action == "up":
        try:
            manager = multikueue_pair.up(cluster, args.namespace, progress)
        except (RuntimeError, TimeoutError) as error:
            print(f"monarch-localcluster multikueue up: {error}", file=sys.stderr)
            return 1
        sample = multikueue_pair.SAMPLE
        print(f"worker kubeconfig:  {cluster.kubeconfig}\n"
              f"manager kubeconfig: {manager.kubeconfig}\n"
              f"submit to the manager:\n"
              f"  kubectl --kubeconfig {manager.kubeconfig} apply -n {args.namespace} "
              f"-f {sample}\n"
              f"  kubectl --kubeconfig {manager.kubeconfig} get monarchjobs -n "
              f"{args.namespace} -w", flush=True)
    elif args.action == "down":
        multikueue_pair.down(cluster, progress)
    else:
        ok, lines = multikueue_pair.status(cluster)
        print("\n".join(lines))
        return 0 if ok else 1
    return 0


def _node(cluster: LocalCluster, args: argparse.Namespace) -> int:
    try:
        if args.action == "down":
            cluster.node_down(args.name, nodestate.PARTITION if args.partition
                              else nodestate.CRASH)
        else:
            cluster.node_up(args.name)
        if not args.no_wait:
            wanted = "Unknown" if args.action == "down" else "True"
            print(f"node {args.name} {args.action}; waiting for Ready={wanted} ...", flush=True)
            cluster.wait_node_ready(args.name, wanted)
            print(f"node {args.name}: Ready={wanted}")
    except (RuntimeError, TimeoutError) as error:
        print(f"monarch-localcluster node {args.action}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
