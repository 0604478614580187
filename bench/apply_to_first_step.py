"""End to end on the real nodes: ``kubectl apply`` to the first training step, ours against the
Kubeflow MPI Operator v0.8.2, the same program from the same image.

Brings up the local cluster with two real nodes (kubelet, containerd, runc, CNI, kube-proxy,
CoreDNS; ``--gpus-per-node`` fake GPUs each) and the images ``worker``, ``examples`` and
``mpi-peer`` (``images/mpi-peer/``: the examples image plus Open MPI). Both operators run as
processes on this machine, each watching its own namespace, at their default settings. Then for
each batch size in ``--jobs`` (default 1 and 8), for each operator in turn, it applies that many
jobs at once (one ``kubectl apply`` of a List), each of ``--workers`` one-GPU workers running
the unchanged torchrun script ``examples/torchrun_demo/train.py`` for one step:

- ours: a MonarchJob with ``spec.spmd`` (the launcher pod runs ``monarch-torchrun`` over the
  hostfile; ranks are children of each worker's sshd);
- the peer: an MPIJob (``kubeflow.org/v2beta1``, ``launcherCreationPolicy:
  WaitForWorkersReady`` as its docs advise) whose launcher runs ``mpirun`` over ssh into worker
  pods running ``sshd -De`` (as root, like the MPI Operator's own images), each rank given
  torchrun's variables by ``torchrun-under-mpi``.

A job's time to first step is from the moment ``kubectl apply`` was started to the container
runtime's timestamp of the launcher's first ``step 1/`` line (``kubectl logs --timestamps``;
the same clock, this machine's). A batch is over when every job finished and its pods are gone;
then the jobs are deleted and the next batch waits for the GPUs to be free.

Run as root (the real nodes need it); about 15 minutes warm on 2 cores::

    .venv/bin/python bench/apply_to_first_step.py              # --jobs 1 8 --workers 2
    .venv/bin/python bench/apply_to_first_step.py --jobs 1     # quick look
    .venv/bin/python bench/apply_to_first_step.py --jobs 1 --roles   # + the four-role GRPO job

The table goes to stdout, the JSON after it (``--json FILE`` writes it there instead).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_mpi_operator as mpi  # noqa: E402  (sits beside this script)
import timeline  # noqa: E402  (sits beside this script)

from monarch_operator.localcluster.cluster import LocalCluster  # noqa: E402
from monarch_operator.localcluster.demo import (  # noqa: E402
    Kubectl,
    install_crds,
    start_operator,
    stop_process,
    wait_established,
)
from monarch_operator.localcluster.images import IMAGES  # noqa: E402

OURS, PEER = "monarch-operator", f"mpi-operator {mpi.MPI_OPERATOR_VERSION}"
# ``--roles``: ours again with the four-role GRPO example (examples/grpo/monarchjob.yaml: worker
# groups of 4, 2, 1 and 0 GPUs), a shape the peer has no way to say; the same namespace.
OURS_ROLES = f"{OURS} grpo 4 roles"
NAMESPACES = {OURS: "bench-monarch", OURS_ROLES: "bench-monarch", PEER: "bench-mpi"}
GRPO_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo" / "monarchjob.yaml"
FIRST_STEP = "step 1/"
PROGRAM = ["-m", "torchrun_demo.train", "--steps", "1"]
# The examples are installed for the image's user (pip --user); the peer's ranks run as root.
USER_SITE = "/home/monarch/.local/lib/python3.11/site-packages"
MPI_LAUNCHER = (
    'MASTER_ADDR="$(awk \'NF {{print $1; exit}}\' "$OMPI_MCA_orte_default_hostfile")" '
    "exec mpirun --allow-run-as-root --bind-to none -np {ranks} -x MASTER_ADDR "
    f"-x PYTHONPATH={USER_SITE} torchrun-under-mpi python3 {' '.join(PROGRAM)}")


def monarch_job(name: str, workers: int, image: str) -> dict[str, Any]:
    """A MonarchJob running the torchrun script on ``workers`` one-GPU workers."""
    return {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": name},
            "spec": {"image": image, "workers": {"replicas": workers, "gpusPerWorker": 1},
                     "spmd": {"module": PROGRAM[1], "args": PROGRAM[2:], "nprocPerNode": 1},
                     "startupTimeoutSeconds": 600}}


def roles_job(name: str, workers: int, image: str) -> dict[str, Any]:
    """The GRPO example's MonarchJob (four worker groups, one role each) for 2 steps;
    ``workers`` is ignored (the example says its groups)."""
    del workers
    body: dict[str, Any] = yaml.safe_load(GRPO_EXAMPLE.read_text())
    body["metadata"]["name"] = name
    body["spec"]["image"] = image
    body["spec"]["launcher"]["args"] = ["--steps", "2"]
    return body


def ours(who: str) -> bool:
    """Whether ``who`` is a row of this operator (the plain or the roles job)."""
    return who in (OURS, OURS_ROLES)


def mpi_job(name: str, workers: int, image: str) -> dict[str, Any]:
    """The same shape as an MPIJob: ``workers`` one-GPU, one-slot workers running sshd as root,
    and a launcher running ``mpirun`` over them."""
    body = mpi.mpijob(name, workers, {}, {}, image, "nvidia.com/gpu")
    replicas = body["spec"]["mpiReplicaSpecs"]
    root = {"runAsUser": 0, "runAsGroup": 0}
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    launcher.update(command=["sh", "-c", MPI_LAUNCHER.format(ranks=workers)],
                    securityContext=root)
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    worker.update(command=["sh", "-c", "mkdir -p /run/sshd && ssh-keygen -A -q && "
                                       "exec /usr/sbin/sshd -De"], securityContext=root,
                  readinessProbe={"tcpSocket": {"port": 22}, "periodSeconds": 1})
    return body


def launcher_pods(kubectl: Kubectl, who: str, namespace: str) -> dict[str, str]:
    """job name -> its launcher pod's name (the newest one)."""
    selector = ("monarch-operator.dev/role=launcher" if ours(who)
                else "training.kubeflow.org/job-role=launcher")
    pods = kubectl.json("pods", "-n", namespace, "-l", selector)["items"]
    found: dict[str, str] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"]):
        labels = pod["metadata"]["labels"]
        job = (labels.get("monarch-operator.dev/job") if ours(who)
               else labels.get("training.kubeflow.org/job-name"))
        if job:
            found[job] = pod["metadata"]["name"]
    return found


def first_step_time(kubectl: Kubectl, namespace: str, pod: str) -> float | None:
    """The runtime's timestamp (Unix seconds) of the pod's first ``step 1/`` line, if any."""
    out = kubectl("logs", "--timestamps", "-n", namespace, pod, check=False)
    for line in out.splitlines():
        stamp, _, text = line.partition(" ")
        if FIRST_STEP in text:
            return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


def finished(kubectl: Kubectl, who: str, namespace: str, name: str) -> str | None:
    """"Succeeded"/"Failed" once the job ended, else None."""
    if ours(who):
        job = kubectl.json("monarchjob", name, "-n", namespace)
        phase = (job.get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None
    job = kubectl.json("mpijob", name, "-n", namespace)
    for condition in (job.get("status") or {}).get("conditions", []):
        if condition["type"] in ("Succeeded", "Failed") and condition["status"] == "True":
            return condition["type"]
    return None


def wait(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(1)


def run_batch(kubectl: Kubectl, who: str, size: int, workers: int, image: str,
              timeout: float, log_dir: Path | None = None, prefix: str = "b") -> dict[str, Any]:
    """Apply ``size`` jobs at once; returns each job's seconds to first step and outcome.
    The launchers' timestamped output is kept in ``log_dir`` when given. Jobs are named
    ``<prefix><size>-<index>``: a warm-up batch takes another prefix, since a job applied again
    under the name of one just deleted waits for cluster DNS to forget the old pods' addresses
    (up to a cache lifetime, then one of the right answers: 30 s each here), which is not what
    this bench times."""
    namespace = NAMESPACES[who]
    names = [f"{prefix}{size}-{index}" for index in range(size)]
    build = {OURS: monarch_job, OURS_ROLES: roles_job, PEER: mpi_job}[who]
    items = [build(name, workers, image) for name in names]
    listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    applied = time.time()
    kubectl("apply", "-n", namespace, "-f", "-", stdin=listing)
    seconds: dict[str, float] = {}
    outcomes: dict[str, str] = {}
    seen = timeline.Seen(kubectl.json)  # pods as they were before the job deleted them

    def progress() -> bool:
        seen.poll(namespace)
        pods = launcher_pods(kubectl, who, namespace)
        for name in names:
            if name not in seconds and name in pods:
                stamp = first_step_time(kubectl, namespace, pods[name])
                if stamp is not None:
                    seconds[name] = stamp - applied
            if name not in outcomes and (outcome := finished(kubectl, who, namespace, name)):
                outcomes[name] = outcome
        return len(outcomes) == len(names)

    wait(f"{who}: {size} jobs", progress, timeout)
    for name in names:  # a step line may land after the status said Succeeded
        if name not in seconds and name in (pods := launcher_pods(kubectl, who, namespace)):
            stamp = first_step_time(kubectl, namespace, pods[name])
            if stamp is not None:
                seconds[name] = stamp - applied
    seen.poll(namespace)
    timelines = {name: timeline.relative(timeline.job_timeline(
        seen.get, lambda ns, pod: kubectl("logs", "--timestamps", "-n", ns, pod, check=False),
        ours(who), namespace, name), applied) for name in names}
    if log_dir is not None:  # each launcher's output with the runtime's timestamps
        for name, pod in launcher_pods(kubectl, who, namespace).items():
            (log_dir / f"{namespace}-{name}.log").write_text(kubectl(
                "logs", "--timestamps", "-n", namespace, pod, check=False))
    kind = "monarchjobs" if ours(who) else "mpijobs"
    kubectl("delete", kind, "--all", "-n", namespace, "--wait=true", "--timeout=300s")
    wait(f"{who}: pods gone", lambda: not kubectl.json("pods", "-n", namespace)["items"], 300)
    return {"who": who, "jobs": size, "seconds": seconds, "outcomes": outcomes,
            "timelines": timelines}


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return (f"{statistics.median(ordered):6.1f} {ordered[-1]:6.1f}")


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'operator':<32} {'jobs':>4} {'p50 s':>6} {'max s':>6} {'stepped':>8} "
             f"{'succeeded':>9}"]
    for result in results:
        seconds = list(result["seconds"].values())
        succeeded = sum(1 for o in result["outcomes"].values() if o == "Succeeded")
        lines.append(f"{result['who']:<32} {result['jobs']:>4} {spread(seconds)} "
                     f"{len(seconds):>8} {succeeded:>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 8],
                        help="batch sizes: jobs applied at once (default 1 8)")
    parser.add_argument("--workers", type=int, default=2, help="one-GPU workers per job")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per batch")
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/monarch-bench-first-step"))
    parser.add_argument("--json", type=Path, help="write the results here, not to stdout")
    parser.add_argument("--roles", action="store_true",
                        help="also one GRPO example job of four roles (7 GPUs) per batch size 1")
    parser.add_argument("--warmup", action="store_true",
                        help="first one job per operator, not reported: the nodes unpack the "
                             "image once before anything is timed")
    args = parser.parse_args(argv)
    if max(args.jobs) * args.workers > 2 * args.gpus_per_node:
        parser.error(f"--jobs {max(args.jobs)} x --workers {args.workers} one-GPU workers do "
                     f"not fit 2 nodes x --gpus-per-node {args.gpus_per_node}")

    def note(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    binary, crd = mpi.ensure_mpi_operator(note)
    cluster = LocalCluster(args.state_dir, real_nodes=2, gpus_per_node=args.gpus_per_node,
                           images=("worker", "examples", "mpi-peer"))
    processes: list[subprocess.Popen[bytes]] = []
    results: list[dict[str, Any]] = []
    try:
        cluster.down(quiet=True)  # a fresh cluster: one left by a killed run would be reused
        cluster.up(progress=note)
        kubectl = Kubectl(cluster.env())
        install_crds(kubectl)
        kubectl("apply", "--server-side", "-f", str(crd))
        # The MPI Operator exits at start when its CRD is not served yet.
        wait_established(kubectl, "mpijobs.kubeflow.org")
        for namespace in sorted(set(NAMESPACES.values())):
            kubectl("create", "namespace", namespace)
        processes.append(start_operator(args.state_dir, cluster.env(),
                                        namespaces=(NAMESPACES[OURS],)))
        peer_log = open(args.state_dir / "logs" / "mpi-operator.log", "ab")  # noqa: SIM115
        processes.append(subprocess.Popen(
            mpi.command(binary, cluster.kubeconfig, NAMESPACES[PEER], mpi.DEFAULT_QPS,
                        mpi.DEFAULT_BURST, mpi.DEFAULT_QUEUE_RATE, mpi.DEFAULT_QUEUE_BURST),
            stdout=peer_log, stderr=subprocess.STDOUT, start_new_session=True))
        image = IMAGES["mpi-peer"].ref
        if args.warmup:
            for who in (OURS, PEER):
                note(f"{who}: warm-up job (not reported)")
                run_batch(kubectl, who, 1, args.workers, image, args.timeout, prefix="warm")
        for size in args.jobs:
            rows = (OURS, PEER, OURS_ROLES) if args.roles and size == 1 else (OURS, PEER)
            for who in rows:
                note(f"{who}: {size} job(s) of {args.workers} workers")
                result = run_batch(kubectl, who, size, args.workers, image, args.timeout,
                                   args.state_dir / "logs")
                note(f"  first step p50/max: {spread(list(result['seconds'].values()))} s; "
                     f"{result['outcomes']}")
                results.append(result)
    finally:
        for process in processes:
            stop_process(process)
        cluster.down(quiet=True)
    print(table(results))
    for size in args.jobs:  # where the seconds went, per batch size (bench/timeline.py)
        batch = {r["who"]: list(r["timelines"].values()) for r in results if r["jobs"] == size}
        print(f"\n{size} job(s) at once:\n{timeline.table(batch)}")
    report = json.dumps(results, indent=2)
    if args.json:
        args.json.write_text(report)
    else:
        print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
