"""A program written against Monarch's own ``KubernetesJob`` and nothing of monarch-operator's:
it attaches to the trainer and reference meshes of a MonarchJob in attach mode (docs/attach.md),
asks every proc where it runs and for a number, and prints what each mesh answered.

Run by the job's launcher pod (examples/attach_demo/monarchjob.yaml), or from any pod of the
namespace that has the Role and the ``monarch-operator.dev/attach-to: <job>`` label the docs
name::

    python3 -m attach_demo.main --job attach-demo

``--mesh NAME=HOSTS`` (repeated) names the meshes to attach to, e.g. the roles of a job with
worker groups (``--mesh generator=2 --mesh trainer=1``); without it, the trainer and ref meshes
(``--trainer-hosts``, ``--ref-hosts``). ``--fail-on-attempt N`` exits 3 after attaching when the operator's ``MONARCH_ATTEMPT`` is N:
the next attempt attaches to the same worker pods.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from monarch.actor import Actor, current_rank, endpoint
from monarch.job.kubernetes import KubernetesJob

# Where Kubernetes puts the pod's namespace (the ServiceAccount token's projected volume).
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class Where(Actor):
    """Says which pod it runs in and its rank in the mesh."""

    @endpoint
    def where(self) -> tuple[str, int]:
        return socket.gethostname(), current_rank().rank


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", required=True, help="the MonarchJob's name")
    parser.add_argument("--namespace", default=None,
                        help="the job's namespace (default: this pod's)")
    parser.add_argument("--trainer-hosts", type=int, default=2)
    parser.add_argument("--ref-hosts", type=int, default=1)
    parser.add_argument("--mesh", action="append", default=[], metavar="NAME=HOSTS",
                        help="a mesh to attach to and its hosts (repeat; default trainer, ref)")
    parser.add_argument("--timeout", type=int, default=300,
                        help="seconds to wait for the workers (default 300)")
    parser.add_argument("--fail-on-attempt", type=int, default=None)
    args = parser.parse_args()
    namespace = args.namespace or NAMESPACE_FILE.read_text().strip()

    meshes = [(name, int(hosts)) for name, _, hosts in (item.partition("=")
                                                         for item in args.mesh)]
    if not meshes:
        meshes = [("trainer", args.trainer_hosts), ("ref", args.ref_hosts)]
    job = KubernetesJob(namespace=namespace, timeout=args.timeout)
    for mesh, hosts in meshes:
        job.add_mesh(mesh, hosts, pod_rank_label=f"monarch-operator.dev/{mesh}-rank",
                     label_selector=f"monarch-operator.dev/job={args.job},"
                                    f"monarch-operator.dev/role=worker,"
                                    f"monarch-operator.dev/{mesh}-rank")
    state = job.state(cached_path=None)
    for mesh, _ in meshes:
        procs = getattr(state, mesh).spawn_procs(per_host={"procs": 1})
        try:
            answers = procs.spawn("where", Where).where.call().get().values()
            hosts = [host for host, _ in sorted(answers, key=lambda answer: answer[1])]
            print(f"attached {mesh}: {','.join(hosts)}", flush=True)
        finally:
            procs.stop().get()  # never HostMesh.shutdown(): the worker loops must stay
    if args.fail_on_attempt is not None and os.environ.get("MONARCH_ATTEMPT") == str(
            args.fail_on_attempt):
        print(f"attach_demo: failing attempt {args.fail_on_attempt} on purpose", flush=True)
        return 3
    print("attach_demo: done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
