"""Bring the real nodes of a local cluster up and down (:class:`RealNodes`).

``LocalCluster`` (``cluster.py``) starts the control plane, then hands over here: the host
network, per node its certificates, Node object, namespaces, containerd (with the images
imported), kubelet, kube-proxy and fake GPU plugin, then CoreDNS; and waits until every node is
Ready with its GPUs allocatable and DNS answers. One cluster with real nodes runs on a machine
at a time (the addresses and interface names are fixed); ``up`` first removes what a killed
run left behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from monarch_operator.localcluster import certs
from monarch_operator.localcluster.node import addons, imports, network
from monarch_operator.localcluster.node import node as nodemod
from monarch_operator.localcluster.node.network import NodeAddresses

NODE_NAME = "node-{index}"
GPU_RESOURCE = "nvidia.com/gpu"
OWNER = network.RUN_DIR / "owner.json"

Progress = Callable[[str], None]
Start = Callable[[str, list[str]], int]
Kubectl = Callable[..., str]


WAIT_ENV = "MONARCH_LOCALCLUSTER_WAIT_S"
# Outside RUN_DIR, which ``down`` removes to leave the machine as it found it.
CLAIM_LOCK = Path(os.environ.get("MONARCH_OPERATOR_CACHE",
                                 Path.home() / ".cache/monarch-operator")) / "real-nodes.lock"


@contextlib.contextmanager
def _claim_lock() -> Iterator[None]:
    """Hold the machine-wide lock under which a cluster checks for and claims real nodes."""
    CLAIM_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(CLAIM_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def owner() -> dict[str, object] | None:
    """The running cluster with real nodes on this machine (``{"state_dir", "pid"}``: its
    first node's holder), or None when none runs (a record whose holder is gone is stale)."""
    try:
        record = json.loads(OWNER.read_text())
        os.kill(int(record["pid"]), 0)
        return dict(record)
    except (OSError, ValueError, KeyError):
        return None


def held_message(running: dict[str, object]) -> str:
    """Why a cluster with real nodes cannot start while ``running`` (:func:`owner`) holds them."""
    return (f"a local cluster with real nodes already runs on this machine (state dir "
            f"{running['state_dir']}, held by pid {running['pid']}); one fits a machine. If it "
            f"is yours, stop it: monarch-localcluster --dir {running['state_dir']} down; if it "
            f"is someone else's (a test run, a benchmark), wait for it, or set {WAIT_ENV}="
            f"SECONDS to wait here")


def check_unclaimed(state_dir: Path, wait_s: float) -> None:
    """Refuse at once, before anything is built, when another live cluster holds the real
    nodes and nobody asked to wait (``wait_s`` 0); :meth:`RealNodes.prepare_host` claims them
    later under the lock.

    Raises:
        RuntimeError: :func:`held_message`.
    """
    running = owner()
    if wait_s <= 0 and running is not None and Path(str(running["state_dir"])) != state_dir:
        raise RuntimeError(held_message(running))


class RealNodes:
    """The real nodes of one local cluster.

    Args:
        state_dir: the cluster's state folder; nodes live in ``nodes/<name>``.
        count: how many nodes (``node-0``, ``node-1``, ...).
        gpus_per_node: ``nvidia.com/gpu`` devices each node's fake plugin advertises.
        bin_dir: the node binaries (``build-binaries.sh node``).
        images_cache: containerd roots kept between runs, one folder per node.
    """

    def __init__(self, state_dir: Path, count: int, gpus_per_node: int, bin_dir: Path,
                 images_cache: Path) -> None:
        self.state_dir = state_dir
        self.pki = state_dir / "pki"
        self.logs = state_dir / "logs"
        self.nodes = [
            nodemod.RealNode(addresses, state_dir / "nodes" / addresses.name,
                             images_cache / addresses.name, self.logs, bin_dir, gpus_per_node)
            for addresses in (NodeAddresses(NODE_NAME.format(index=i), i) for i in range(count))]
        self.gpus_per_node = gpus_per_node

    @property
    def addresses(self) -> list[NodeAddresses]:
        return [n.addresses for n in self.nodes]

    def node(self, name: str) -> nodemod.RealNode:
        """The node called ``name``.

        Raises:
            KeyError: no such node (the message lists the nodes).
        """
        for candidate in self.nodes:
            if candidate.name == name:
                return candidate
        raise KeyError(f"no real node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    def prepare_host(self, progress: Progress, wait_s: float = 0.0) -> None:
        """Claim the machine's real nodes for this cluster, remove what an earlier run left,
        and create the host network and the nodes' network namespaces.

        One cluster with real nodes fits a machine (its bridge, addresses and node names are
        fixed). While another live cluster holds it, wait up to ``wait_s`` seconds for it to
        go (default 0: raise at once; ``$MONARCH_LOCALCLUSTER_WAIT_S`` sets it for tests and
        benchmarks that take turns), printing progress every 30 s. The check and the claim
        are one step under a file lock, so two clusters starting together never both win.

        Raises:
            RuntimeError: another cluster with real nodes still runs on this machine.
        """
        deadline = time.monotonic() + wait_s
        next_note = time.monotonic()
        while True:
            with _claim_lock():
                running = owner()
                if running is None or Path(str(running["state_dir"])) == self.state_dir:
                    removed = nodemod.teardown_all()
                    (self.state_dir / "host-before.json").write_text(
                        json.dumps(nodemod.host_state()))
                    network.RUN_DIR.mkdir(parents=True, exist_ok=True)
                    # This process until the first node's holder takes over (see start).
                    OWNER.write_text(json.dumps({"state_dir": str(self.state_dir),
                                                 "pid": os.getpid()}))
                    break
            if time.monotonic() >= deadline:
                raise RuntimeError(held_message(running))
            if time.monotonic() >= next_note:
                progress(f"waiting for the cluster with real nodes in {running['state_dir']} "
                         f"to go ({deadline - time.monotonic():.0f} s left)")
                next_note = time.monotonic() + 30
            time.sleep(2)
        if removed:
            progress(f"removed what an earlier run left: {len(removed)} items "
                     f"({', '.join(removed[:4])}{', ...' if len(removed) > 4 else ''})")
        addresses = self.addresses
        network.host_up(addresses)
        for address in addresses:
            network.node_up(address, [o for o in addresses if o != address])

    def write_certs(self) -> None:
        """Per node a client certificate (``CN=system:node:<name>``, ``O=system:nodes``: the
        Node authorizer needs that exact name) and a serving certificate for its address; and
        kube-proxy's (``CN=system:kube-proxy``, bound to ``system:node-proxier`` by default)."""
        for node in self.nodes:
            certs.write_client_cert(self.pki, node.name, "system:nodes",
                                    common_name=f"system:node:{node.name}")
            certs.write_client_cert(self.pki, f"{node.name}-serving", "system:nodes",
                                    common_name=f"system:node:{node.name}",
                                    server_names=(node.name, str(node.addresses.ip)))
        certs.write_client_cert(self.pki, "kube-proxy", common_name="system:kube-proxy")
        certs.write_client_cert(self.pki, "kube-router", common_name=addons.KUBE_ROUTER_USER)

    def node_objects(self) -> list[dict[str, object]]:
        """The Node objects, created before the kubelets register: ``spec.podCIDR`` must be
        the node's CNI subnet (the range allocator is off; a policy engine reads it)."""
        return [{
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name,
                         "labels": {"kubernetes.io/os": "linux", "kubernetes.io/hostname":
                                    node.name, "nvidia.com/gpu.present": "true",
                                    "localcluster.monarch-operator.dev/real-node": "true"}},
            "spec": {"podCIDR": str(node.addresses.pod_cidr),
                     "podCIDRs": [str(node.addresses.pod_cidr)]},
        } for node in self.nodes]

    def start(self, server: str, start: Start, images: dict[str, Path], pause_image: str,
              progress: Progress) -> dict[str, int]:
        """Start every node: holder, containerd, images imported (one thread per node, or one
        node at a time where the disk is short: :func:`.imports.plan`), kubelet, kube-proxy and
        the GPU plugin (the firewall comes in :meth:`bring_up`). Returns
        ``{"<node>-<component>": pid}``.

        Args:
            server: the API server's URL as the nodes reach it.
            images: image ref -> docker-archive to import (the pause image among them).

        Raises:
            RuntimeError: a component did not start or an import failed (with the reason).
        """
        network.RUN_DIR.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            node.write_files(self.pki, server, pause_image)
            node.make_cgroups()
            node.start_holder(start)
            if node is self.nodes[0]:
                OWNER.write_text(json.dumps({"state_dir": str(self.state_dir),
                                             "pid": node.pids["holder"]}))
            node.start_components(start)
        # One thread per node, each importing the archives in turn: images share layers, and
        # one containerd ingests a shared blob once (a second writer waits on its lock). On a
        # disk with room for one node's import at a time, the nodes take turns.
        def import_all(node: nodemod.RealNode) -> None:
            for archive in images.values():
                node.import_image(archive, progress)

        together = imports.plan([node.imports_to_come(list(images.values()))
                                 for node in self.nodes])
        if together:
            with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
                for future in [pool.submit(import_all, node) for node in self.nodes]:
                    future.result()
        else:
            progress("importing the images into one node at a time: the disk has no room for "
                     "both imports at once (docs/development.md#disk)")
            for node in self.nodes:
                import_all(node)
        pids = {}
        for node in self.nodes:
            node.start_kubelet(start)
            pids.update({f"{node.name}-{name}": pid for name, pid in node.pids.items()})
        return pids

    def bring_up(self, server: str, kubectl: Kubectl, start: Start, images: dict[str, Path],
                 pause_image: str, coredns_image: str, check_alive: Callable[[], None],
                 started: Callable[[dict[str, int]], None], progress: Progress) -> None:
        """Everything after the control plane: certificates, Node objects, the nodes
        (:meth:`start`; their pids go to ``started`` at once, for the cluster's record), the
        add-ons; then wait until every node is Ready with its GPUs and DNS answers.

        Args:
            kubectl: runs kubectl with the admin kubeconfig (``*args, stdin=...``), returns
                its output, raises RuntimeError on failure.
            check_alive: raises RuntimeError naming a component that exited.

        Raises:
            RuntimeError: a component failed, or not ready in time (the reasons named).
        """
        self.write_certs()
        kubectl("apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": self.node_objects()}))
        started(self.start(server, start, images, pause_image, progress))
        kubectl("apply", "-f", "-", stdin=addon_manifests(coredns_image, len(self.nodes)))

        def nodes_problems() -> list[str]:
            check_alive()
            return self.ready_problems(json.loads(kubectl("get", "nodes", "-o", "json"))["items"])

        def dns_problems() -> list[str]:
            check_alive()
            deployment = json.loads(kubectl("get", "deployment", "-n", addons.NAMESPACE,
                                            addons.NAME, "-o", "json"))
            ready = (deployment.get("status") or {}).get("readyReplicas") or 0
            if ready < deployment["spec"]["replicas"]:
                return [f"coredns {ready}/{deployment['spec']['replicas']} Ready"]
            accounts = kubectl("get", "serviceaccounts", "-n", "default", "-o", "name")
            return [] if "serviceaccount/default" in accounts else ["no default ServiceAccount"]

        wait(nodes_problems, "real nodes", 180, progress)
        # The NetworkPolicy firewall needs the node's registered addresses; before any job.
        for node in self.nodes:
            node.start_firewall(start)
            started({f"{node.name}-kube-router": node.pids["kube-router"]})
        wait(dns_problems, "cluster DNS", 120, progress)

    def ready_problems(self, nodes: list[dict[str, object]]) -> list[str]:
        """Why the nodes are not ready for jobs yet (empty when they are): each node Ready,
        untainted, with its GPUs allocatable (a pod created earlier fails scheduling)."""
        problems = []
        by_name = {n["metadata"]["name"]: n for n in nodes}  # type: ignore[index]
        for node in self.nodes:
            item = by_name.get(node.name)
            if item is None:
                problems.append(f"{node.name}: no Node object")
                continue
            status = item.get("status") or {}
            conditions = {c["type"]: c for c in status.get("conditions") or []}  # type: ignore[union-attr]
            ready = conditions.get("Ready", {})
            if ready.get("status") != "True":
                problems.append(f"{node.name}: Ready={ready.get('status', 'unknown')} "
                                f"{ready.get('message', '')}".strip())
            elif (item.get("spec") or {}).get("taints"):  # type: ignore[union-attr]
                problems.append(f"{node.name}: tainted")
            gpus = (status.get("allocatable") or {}).get(GPU_RESOURCE, "0")  # type: ignore[union-attr]
            if str(gpus) != str(self.gpus_per_node):
                problems.append(f"{node.name}: {gpus}/{self.gpus_per_node} GPUs allocatable")
        return problems

    def adopt(self, pids: dict[str, int]) -> None:
        """Take over the running nodes' pids from a record (``{"<node>-<component>": pid}``)."""
        for node in self.nodes:
            prefix = f"{node.name}-"
            node.pids = {key[len(prefix):]: pid for key, pid in pids.items()
                         if key.startswith(prefix)}

    def lose(self, name: str, mode: str) -> list[str]:
        """Take node ``name`` away. ``"crash"``: every process of the node dies (containerd,
        kubelet, kube-proxy, GPU plugin, every container) as in a machine crash; its network
        namespace and folders stay for :meth:`restore`. ``"partition"``: its link to the rest
        is cut (the host end of its veth down): it runs on, unseen. Returns the record keys
        of the components that died.

        Raises:
            KeyError: no such node.
            ValueError: ``mode`` is neither.
        """
        node = self.node(name)
        if mode == "partition":
            network.run("ip", "link", "set", node.addresses.host_veth, "down")
            return []
        if mode != "crash":
            raise ValueError(f"node down mode must be crash or partition, not {mode!r}")
        holder = node.pids.get("holder")
        dead = [f"{name}-{component}" for component in node.pids if component != "holder"]
        nodemod.stop_node(name, [pid for component, pid in node.pids.items()
                                 if component != "holder"], keep={holder} if holder else set())
        node.pids = {"holder": holder} if holder else {}
        return dead

    def restore(self, name: str, start: Start) -> dict[str, int]:
        """Bring node ``name`` back after :meth:`lose`: its link up, and after a crash its
        components started again (images are still in containerd's kept root). Returns the
        new ``{"<node>-<component>": pid}``."""
        node = self.node(name)
        network.run("ip", "link", "set", node.addresses.host_veth, "up")
        if "kubelet" in node.pids:
            return {}
        node.make_cgroups()
        node.start_components(start)
        node.start_kubelet(start)
        node.start_firewall(start)  # the Node object keeps its addresses while the node is lost
        return {f"{name}-{component}": pid for component, pid in node.pids.items()}

    def stop(self, progress: Progress | None = None) -> list[str]:
        """Stop every node and remove the host network (also a killed run's leftovers)."""
        for node in self.nodes:
            node.stop()
        OWNER.unlink(missing_ok=True)
        removed = nodemod.teardown_all()
        if progress:
            progress(f"real nodes stopped; host network removed ({len(removed)} items)")
        return removed


def stop_unless_owned_by_another(state_dir: Path) -> list[str]:
    """Remove the real nodes of the cluster in ``state_dir``, or those a killed run left that
    no live cluster owns (processes, cgroups, network, folders); leave another live cluster's
    alone. Returns what was removed."""
    running = owner()
    if running is not None and Path(str(running["state_dir"])) != state_dir:
        return []
    OWNER.unlink(missing_ok=True)  # first: teardown removes the run folder once it is empty
    removed = nodemod.teardown_all()
    shutil.rmtree(state_dir / "nodes", ignore_errors=True)
    return removed


def addon_manifests(coredns_image: str, nodes: int) -> str:
    """The add-ons' objects (CoreDNS, one replica per node up to two; the API server's kubelet
    access) as one JSON List."""
    return json.dumps({"apiVersion": "v1", "kind": "List",
                       "items": [addons.kubelet_api_access(certs.KUBELET_CLIENT_NAME),
                                 *addons.kube_router_access(),
                                 *addons.coredns_manifests(coredns_image,
                                                           replicas=min(2, nodes))]})


def wait(check: Callable[[], list[str]], what: str, timeout: float, progress: Progress,
         every: float = 15) -> None:
    """Poll ``check`` (the reasons it is not so yet) until it returns none, printing what it
    waits for every ``every`` seconds.

    Raises:
        RuntimeError: still not so after ``timeout`` seconds; the message has the reasons.
    """
    started = time.monotonic()
    said = started
    while True:
        problems = check()
        if not problems:
            return
        now = time.monotonic()
        if now - started > timeout:
            raise RuntimeError(f"{what} not ready after {timeout:.0f}s: {'; '.join(problems)}")
        if now - said > every:
            progress(f"waiting for {what} ({now - started:.0f}s): {'; '.join(problems)}")
            said = now
        time.sleep(0.5)
