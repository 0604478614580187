"""Start and stop the local control plane: processes, certificates, kubeconfig, GPU nodes.

Two kinds of nodes:

- **real nodes** (``real_nodes=N``): upstream kubelet, containerd with runc, kube-proxy, the CNI
  bridge, CoreDNS and a fake GPU device plugin, each node in namespaces of its own
  (:mod:`localcluster.node`), running the images built from ``images/``; the API server then
  listens on the node network's host address, and the service range is the nodes' own;
- **kwok nodes** (``nodes=N``, the default): simulated nodes whose pods the node agent runs as
  host processes on 127/8 addresses (the scale benchmarks use them).

Otherwise every component binds 127.0.0.1 on a free port. ``down`` stops every process it
started (by process group), removes the real nodes' network, cgroups and folders, and leaves
nothing running.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from monarch_operator.localcluster import certs, nodestate
from monarch_operator.localcluster.binaries import ensure_binaries, ensure_node_binaries
from monarch_operator.localcluster.kueue import PID_FILE as KUEUE_PID_FILE
from monarch_operator.localcluster.kueue import running_pid as kueue_running_pid
from monarch_operator.localcluster.node import configs as node_configs
from monarch_operator.localcluster.node import network as node_network
from monarch_operator.localcluster.node import nodes as real_nodes_mod
from monarch_operator.localcluster.orphans import stop_with_parent
from monarch_operator.localcluster.ports import free_port

# Pod IPs (kwok --cidr), inside 127.0.0.0/8. MONARCH_LOCALCLUSTER_POD_CIDR moves them, so that two
# local clusters on one machine (parallel test workers) never hand out the same pod IP.
POD_CIDR_ENV = "MONARCH_LOCALCLUSTER_POD_CIDR"
DEFAULT_POD_CIDR = "127.100.0.0/16"
SERVICE_CIDR = "127.96.0.0/16"
STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
NODE_NAME = "kwok-gpu-{index}"
GPU_RESOURCE = "nvidia.com/gpu"
# Node heartbeats, shortened for tests (kubelet/KCM defaults: lease 40 s renewed every 10 s,
# node-monitor-grace-period 50 s, node-monitor-period 5 s): kwok renews each node's Lease every
# NODE_LEASE_SECONDS / 4 = 2.5 s, and a node whose Lease went NODE_MONITOR_GRACE_SECONDS without
# renewal is marked Ready=Unknown by the node-lifecycle controller, which looks every
# NODE_MONITOR_PERIOD_SECONDS: a node that goes down is NotReady after 20-22 s.
NODE_LEASE_SECONDS = 10
NODE_MONITOR_GRACE_SECONDS = 20
NODE_MONITOR_PERIOD_SECONDS = 2

Progress = Callable[[str], None]

# The API server's audit policy: every write request at Metadata level (who, verb, object,
# user agent, response code), nothing else. Reads are not logged (they are most of the
# traffic), nor node leases (renewed every few seconds by kwok). Tests read <logs>/audit.log,
# e.g. to show that the operator writes nothing to a running job while nothing changes (C5).
# Clients in group AUDIT_LEASES_GROUP (user_kubeconfig(groups=...)) have their writes to Leases
# logged with bodies (the chaos soak's replicas: who took and gave up the operator's Lease when).
AUDIT_LEASES_GROUP = "monarch-operator.dev:audit-leases"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "RequestResponse", "userGroups": [AUDIT_LEASES_GROUP],
         "verbs": ["create", "update", "patch", "delete"],
         "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None", "resources": [{"group": "coordination.k8s.io",
                                         "resources": ["leases"]}]},
        {"level": "Metadata",
         "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}
AUDIT_LOG = "audit.log"


def audit_policy(users: tuple[str, ...] = ()) -> dict[str, object]:
    """``AUDIT_POLICY``, plus every request (reads and leases too) of ``users`` at Metadata
    level when any are given (the first matching rule wins)."""
    if not users:
        return AUDIT_POLICY
    everything = {"level": "Metadata", "users": list(users)}
    return {**AUDIT_POLICY, "rules": [everything, *AUDIT_POLICY["rules"]]}  # type: ignore[list-item]


class LocalCluster:
    """The local control plane whose files live in ``state_dir``.

    Args:
        state_dir: certificates, kubeconfig, etcd data, logs, pod files and ``cluster.json``.
        nodes: number of kwok nodes, each advertising ``gpus_per_node`` ``nvidia.com/gpu``;
            0: a control plane without nodes and without kwok (a MultiKueue manager,
            :mod:`.multikueue`).
        node_agent: run the node agent (real pod processes). Benchmarks that only use simulated
            pods (label ``localcluster.monarch-operator.dev/simulate``, see kwok-stages.yaml)
            turn it off; without it other pods never run, and once deleted stay Terminating.
        audit_users: user names (client certificate CNs) whose every request, reads and leases
            included, the audit log records too (``audit_policy``); e.g. benchmarked operators.
        stop_with_owner: every component gets SIGTERM when the process that called ``up``
            dies, even by SIGKILL (:mod:`localcluster.orphans`); the test fixtures set it so a
            killed test run leaves no cluster behind. ``monarch-localcluster up`` does not.
        controller_manager_qps: the controller manager's client rate limit (requests per
            second; burst twice that); None keeps Kubernetes' default (20, burst 30), which the
            StatefulSet, Job and other controllers share. Benchmarks raise it as large
            clusters do.
        real_nodes: number of real nodes (``node-0``, ...), each with ``gpus_per_node`` fake
            GPUs; when set, no kwok node and no node agent run (``nodes`` is ignored).
        images: with real nodes, the images (names of :mod:`localcluster.images`) imported
            into every node besides the pause and CoreDNS images; built first if needed.
    """

    def __init__(self, state_dir: Path, nodes: int = 3, gpus_per_node: int = 8,
                 node_agent: bool = True, audit_users: tuple[str, ...] = (),
                 stop_with_owner: bool = False,
                 controller_manager_qps: int | None = None, real_nodes: int = 0,
                 images: tuple[str, ...] = ("worker",)) -> None:
        # Read when the cluster is made (not at import): a test worker sets its own range.
        self.pod_cidr = os.environ.get(POD_CIDR_ENV, DEFAULT_POD_CIDR)
        if not ipaddress.ip_network(self.pod_cidr).subnet_of(ipaddress.ip_network("127.0.0.0/8")):
            raise ValueError(f"{POD_CIDR_ENV}={self.pod_cidr!r} must lie inside "
                             "127.0.0.0/8: the local cluster never uses other addresses")
        self.state_dir = Path(state_dir).resolve()
        self.controller_manager_qps = controller_manager_qps
        self.real_nodes = real_nodes
        self.images = tuple(images)
        self.nodes = 0 if real_nodes else nodes
        self.gpus_per_node = gpus_per_node
        self.node_agent = node_agent and not real_nodes
        # Where the API server listens: the node network's host address when real nodes must
        # reach it (and advertise it as the ``kubernetes`` Service's endpoint), else loopback.
        self.host = str(node_network.HOST_IP) if real_nodes else "127.0.0.1"
        self.service_cidr = str(node_network.SERVICE_RANGE) if real_nodes else SERVICE_CIDR
        self.audit_users = tuple(audit_users)
        # Components get SIGTERM when this process dies (orphans.stop_with_parent): for tests.
        self.stop_with_owner = stop_with_owner
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.logs = self.state_dir / "logs"
        # Write requests seen by the API server, one JSON audit event per line (AUDIT_POLICY).
        self.audit_log = self.logs / AUDIT_LOG
        self._record = self.state_dir / "cluster.json"
        # Popen objects of the components this instance started (kept so that they are reaped).
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self, progress: Progress = print) -> None:
        """Build binaries if needed, start every component of an empty cluster (etcd data of
        an earlier run is removed) and wait until nodes are Ready.

        Raises:
            RuntimeError: a component exited or did not become healthy in time; its log is named.
        """
        if self.is_running():
            progress(f"local cluster already running ({self.kubeconfig})")
            return
        started = time.monotonic()
        wait_s = float(os.environ.get(real_nodes_mod.WAIT_ENV, "0"))
        if self.real_nodes:  # before the images are built: minutes lost to a refusal otherwise
            real_nodes_mod.check_unclaimed(self.state_dir, wait_s)
        bin_dir = ensure_binaries()
        node_bin, archives = self._real_node_inputs(progress)
        self.down(quiet=True)
        # A new cluster every time: the certificates, ports and node agent are new, so objects
        # kept from an earlier run (nodes advertising its kubelet port, its pods, tokens signed
        # by its keys) would only mislead. Logs and pod files stay until then, for reading.
        shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
        for sub in ("pki", "logs", "etcd"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        certs.write_pki(self.state_dir / "pki", server_names=(
            (self.host, str(node_network.KUBERNETES_SERVICE_IP)) if self.real_nodes else ()))
        (self.state_dir / "audit-policy.json").write_text(
            json.dumps(audit_policy(self.audit_users), indent=2))
        ports = {name: free_port() for name in ("etcd", "etcd_peer", "apiserver", "kcm",
                                                  "scheduler", "kwok", "kubelet")}
        self._write_kubeconfig(ports["apiserver"])
        pids: dict[str, int] = {}
        self._save(pids, ports)
        real = self._real_nodes(node_bin)
        try:
            if real is not None:
                real.prepare_host(progress, wait_s)
            pids["etcd"] = self._start("etcd", self._etcd_args(bin_dir, ports))
            self._save(pids, ports)
            self._wait_http(f"http://127.0.0.1:{ports['etcd']}/health", "etcd", pids)
            progress("etcd up")
            pids["kube-apiserver"] = self._start("kube-apiserver", self._apiserver_args(bin_dir, ports))
            self._save(pids, ports)
            self._wait_http(f"https://{self.host}:{ports['apiserver']}/readyz", "kube-apiserver",
                            pids)
            progress("kube-apiserver up")
            components = [
                ("kube-controller-manager", self._kcm_args(bin_dir, ports)),
                ("kube-scheduler", self._scheduler_args(bin_dir, ports)),
            ]
            if real is None and self.nodes:  # nodes=0: a control plane alone
                components.append(("kwok", self._kwok_args(bin_dir, ports)))
            if self.node_agent:
                components.append(("agent", self._agent_args(ports)))
            for name, args in components:
                pids[name] = self._start(name, args)
                self._save(pids, ports)
            if real is not None:
                from monarch_operator.localcluster import images

                def kubectl(*args: str, stdin: str | None = None) -> str:
                    return self._kubectl(bin_dir, *args, stdin=stdin)

                def record(new: dict[str, int]) -> None:
                    pids.update(new)
                    self._save(pids, ports)

                real.bring_up(f"https://{self.host}:{ports['apiserver']}", kubectl, self._start,
                              archives, images.IMAGES["pause"].ref, images.IMAGES["coredns"].ref,
                              lambda: self._check_alive(pids), record, progress)
            else:
                self._create_nodes(bin_dir)
                self._wait_ready(bin_dir, pids)
        except BaseException:
            self.down(quiet=True)
            raise
        kind = "real nodes" if self.real_nodes else "nodes"
        progress(f"local cluster up in {time.monotonic() - started:.0f}s: "
                 f"{self.real_nodes or self.nodes} {kind} x {self.gpus_per_node} GPUs; "
                 f"export KUBECONFIG={self.kubeconfig}")

    # -- real nodes (localcluster/node) --------------------------------------------------------
    def _real_node_inputs(self, progress: Progress) -> tuple[Path | None, dict[str, Path]]:
        """With real nodes: the node binaries' folder and image ref -> docker-archive for
        every image the nodes get (built first if needed); else ``(None, {})``."""
        if not self.real_nodes:
            return None, {}
        from monarch_operator.localcluster import images  # buildah: only for real nodes

        node_bin = ensure_node_binaries()
        names = ("pause", "coredns", *self.images)
        archives = {images.IMAGES[name].ref: images.ensure_image(name, progress=progress)
                    for name in names}
        return node_bin, archives

    def _real_nodes(self, node_bin: Path | None) -> real_nodes_mod.RealNodes | None:
        if not self.real_nodes or node_bin is None:
            return None
        return real_nodes_mod.RealNodes(self.state_dir, self.real_nodes, self.gpus_per_node,
                                        node_bin, images_cache())

    def down(self, quiet: bool = False) -> None:
        """Stop every process of the cluster (an operator, then a Kueue, started for it by the
        demo, the tests or ``monarch-localcluster multikueue up`` first, then the agent, ...,
        etcd last) and wait for them."""
        pid = self.operator_pid()
        if pid is not None:
            _stop_group(pid)
            if not quiet:
                print("stopped monarch-operator")
        (self.state_dir / "operator.pid").unlink(missing_ok=True)
        pid = kueue_running_pid(self.state_dir)
        if pid is not None:
            _stop_group(pid)
            if not quiet:
                print("stopped kueue")
        (self.state_dir / KUEUE_PID_FILE).unlink(missing_ok=True)
        self._stop_real_nodes(quiet)
        if not self._record.exists():
            return
        record = json.loads(self._record.read_text())
        for name, pid in reversed(list(record.get("pids", {}).items())):
            _stop_group(pid)
            process = self._processes.pop(pid, None)
            if process is not None:
                process.poll()
            if not quiet:
                print(f"stopped {name}")
        self._record.unlink(missing_ok=True)

    def _stop_real_nodes(self, quiet: bool) -> None:
        """Remove this cluster's real nodes, or what a killed run of it left. A cluster that
        never had real nodes leaves the machine's alone (another cluster's may be starting)."""
        recorded = 0
        if self._record.exists():
            recorded = json.loads(self._record.read_text()).get("real_nodes", 0)
        if not (self.real_nodes or recorded or (self.state_dir / "nodes").exists()):
            return
        removed = real_nodes_mod.stop_unless_owned_by_another(self.state_dir)
        if removed and not quiet:
            print(f"stopped real nodes; removed {len(removed)} items of theirs")

    def operator_pid(self) -> int | None:
        """The pid of the operator the demo or the tests started for this cluster
        (``<state_dir>/operator.pid``), when that process still runs it; else None (pids are
        reused: the process's command line must still be the operator's)."""
        try:
            pid = int((self.state_dir / "operator.pid").read_text().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                return pid if b"monarch_operator.controller" in cmdline.read() else None
        except (OSError, ValueError):
            return None

    def is_running(self) -> bool:
        """Whether every recorded process of this state dir is alive."""
        if not self._record.exists():
            return False
        pids = json.loads(self._record.read_text()).get("pids", {})
        return bool(pids) and all(_alive(pid) for pid in pids.values())

    def record(self) -> dict[str, Any]:
        """What ``up`` recorded: ``{"pids": {component: pid}, "ports": {name: port},
        "real_nodes": N, "gpus_per_node": G}``, or ``{}`` when no cluster was started in this
        state dir."""
        if not self._record.exists():
            return {}
        return dict(json.loads(self._record.read_text()))

    def alive(self, component: str) -> bool:
        """Whether the recorded process of ``component`` still runs."""
        pid = self.pid(component)
        return pid is not None and _alive(pid)

    def pid(self, component: str) -> int | None:
        """Process id of a running component (``"agent"``, ``"kwok"``, ...), or ``None``."""
        if not self._record.exists():
            return None
        pid = json.loads(self._record.read_text()).get("pids", {}).get(component)
        return int(pid) if pid is not None else None

    # -- node loss (nodestate.py) --------------------------------------------------------------
    def node_down(self, node: str, mode: str = nodestate.CRASH) -> None:
        """Take the node's kubelet away: nothing heartbeats for it any more, so the
        node-lifecycle controller marks it ``Ready=Unknown`` after about
        ``NODE_MONITOR_GRACE_SECONDS`` (see ``wait_node_ready``).

        Args:
            mode: ``"crash"`` (its pods' processes are killed at once) or ``"partition"``
                (they keep running, unseen, until the node is up again).

        Raises:
            ValueError: ``mode`` is neither.
            RuntimeError: kubectl failed (e.g. no such node); the message is kubectl's.
        """
        if mode not in nodestate.MODES:
            raise ValueError(f"node down mode must be one of {', '.join(nodestate.MODES)}, "
                             f"not {mode!r}")
        real = self._recorded_real_nodes()
        if real is not None:
            record = self.record()
            for key in real.lose(node, mode):
                record["pids"].pop(key, None)
            self._save(record["pids"], record["ports"])
            return
        self._kubectl(ensure_binaries(), "label", "node", node, "--overwrite",
                      f"{nodestate.LABEL_NODE_DOWN}={mode}")

    def node_up(self, node: str) -> None:
        """Bring the node's kubelet back (see ``node_down``); kwok marks the node Ready again
        and the node-lifecycle controller lifts its taints (see ``wait_node_ready``).

        Raises:
            RuntimeError: kubectl failed (e.g. no such node); the message is kubectl's.
        """
        real = self._recorded_real_nodes()
        if real is not None:
            record = self.record()
            record["pids"].update(real.restore(node, self._start))
            self._save(record["pids"], record["ports"])
            return
        self._kubectl(ensure_binaries(), "label", "node", node, f"{nodestate.LABEL_NODE_DOWN}-")

    def _recorded_real_nodes(self) -> real_nodes_mod.RealNodes | None:
        """The running cluster's real nodes, with their recorded pids; None with kwok nodes."""
        record = self.record()
        count = record.get("real_nodes", 0)
        if not count:
            return None
        real = real_nodes_mod.RealNodes(self.state_dir, int(count), int(record["gpus_per_node"]),
                                        ensure_node_binaries(), images_cache())
        real.adopt(record.get("pids", {}))
        return real

    def set_unhealthy_gpus(self, node: str, ids: list[str]) -> None:
        """Have real node ``node``'s fake GPU plugin report its devices ``ids`` Unhealthy and
        every other one Healthy (``[]``: all Healthy); see
        :meth:`.node.RealNode.set_unhealthy_gpus`.

        Raises:
            ValueError: the cluster has no real nodes.
            KeyError: it has none named ``node``.
        """
        real = self._recorded_real_nodes()
        if real is None:
            raise ValueError("set_unhealthy_gpus: this cluster has no real nodes")
        real.node(node).set_unhealthy_gpus(ids)

    @contextlib.contextmanager
    def node_lost(self, node: str, mode: str = nodestate.CRASH, wait: bool = True
                  ) -> Iterator[None]:
        """``with cluster.node_lost("kwok-gpu-1"):`` the node is down inside the block (and,
        with ``wait``, already ``Ready=Unknown`` when it starts) and up again after it, even
        on an exception (then, with ``wait``, Ready and untainted). See ``node_down``."""
        self.node_down(node, mode)
        try:
            if wait:
                self.wait_node_ready(node, "Unknown")
            yield
        finally:
            self.node_up(node)
            if wait:
                self.wait_node_ready(node, "True")

    def wait_node_ready(self, node: str, status: str, timeout: float = 90) -> dict[str, object]:
        """Wait until the node's ``Ready`` condition has ``status`` (``"True"``, ``"False"``
        or ``"Unknown"``); for ``"True"`` also until no ``node.kubernetes.io/`` taint is left.
        Returns the node object.

        Raises:
            TimeoutError: not so after ``timeout`` seconds; the message shows the condition.
        """
        deadline = time.monotonic() + timeout
        while True:
            item = json.loads(self._kubectl(ensure_binaries(), "get", "node", node, "-o", "json"))
            ready = nodestate.condition(item)
            taints = [t["key"] for t in (item.get("spec") or {}).get("taints") or []
                      if t["key"].startswith("node.kubernetes.io/")]
            if ready.get("status") == status and (status != "True" or not taints):
                return dict(item)
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node}: Ready={ready.get('status')} "
                                   f"({ready.get('reason', '')}), taints {taints}, after "
                                   f"{timeout:.0f}s waiting for Ready={status}")
            time.sleep(0.5)

    def env(self) -> dict[str, str]:
        """Environment for clients: ``KUBECONFIG`` and kubectl's directory on ``PATH``."""
        bin_dir = ensure_binaries()
        return {"KUBECONFIG": str(self.kubeconfig),
                "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for the running cluster whose client certificate names ``user`` (group
        ``system:masters``, and ``groups``: e.g. :data:`AUDIT_LEASES_GROUP`), so that this
        client's requests carry its own name in the audit log.

        Returns:
            ``<state_dir>/kubeconfig-<user>``.
        Raises:
            RuntimeError: the cluster is not up (no recorded API server port).
        """
        if not self._record.exists():
            raise RuntimeError(f"no local cluster in {self.state_dir}")
        port = json.loads(self._record.read_text())["ports"]["apiserver"]
        pki = self.state_dir / "pki"
        certs.write_client_cert(pki, user, ("system:masters", *groups))
        path = self.state_dir / f"kubeconfig-{user}"
        self._write_kubeconfig(port, path, pki / f"{user}.crt", pki / f"{user}.key")
        return path

    # -- component arguments -----------------------------------------------------------------
    def _etcd_args(self, bin_dir: Path, ports: dict[str, int]) -> list[str]:
        client, peer = f"http://127.0.0.1:{ports['etcd']}", f"http://127.0.0.1:{ports['etcd_peer']}"
        return [str(bin_dir / "etcd"), "--name=local", f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=local={peer}", "--unsafe-no-fsync=true",
                "--quota-backend-bytes=2147483648", "--log-level=warn"]

    def _apiserver_args(self, bin_dir: Path, ports: dict[str, int]) -> list[str]:
        pki = self.state_dir / "pki"
        return [str(bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                f"--bind-address={self.host}", f"--advertise-address={self.host}",
                f"--secure-port={ports['apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--authorization-mode=Node,RBAC", "--allow-privileged=true",
                # On top of the defaults, as OpenShift has it: blockOwnerDeletion needs update
                # on the owner's finalizers (field case C24).
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                # The kubelet API (logs, exec) is the node agent's, at the node's InternalIP
                # (127.0.0.1) and the port its status advertises; TLS both ways with our CA.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                # Endpoint validation refuses 127/8 addresses; nothing here routes to them anyway.
                # Real nodes' pods reach the API server through the ``kubernetes`` Service.
                *(() if self.real_nodes else ("--endpoint-reconciler-type=none",)),
                "--enable-priority-and-fairness=false",
                node_configs.feature_gates_flag(),
                f"--audit-policy-file={self.state_dir / 'audit-policy.json'}",
                f"--audit-log-path={self.audit_log}", "--audit-log-format=json",
                "--audit-log-maxsize=200", "--audit-log-maxbackup=1"]

    def _kcm_args(self, bin_dir: Path, ports: dict[str, int]) -> list[str]:
        pki = self.state_dir / "pki"
        return [str(bin_dir / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={ports['kcm']}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                "--leader-elect=false", "--controllers=*,-nodeipam,-service-lb-controller",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
                f"--node-monitor-period={NODE_MONITOR_PERIOD_SECONDS}s",
                *((f"--kube-api-qps={self.controller_manager_qps}",
                   f"--kube-api-burst={2 * self.controller_manager_qps}")
                  if self.controller_manager_qps else ())]

    def _scheduler_args(self, bin_dir: Path, ports: dict[str, int]) -> list[str]:
        return [str(bin_dir / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={ports['scheduler']}",
                "--leader-elect=false"]

    def _kwok_args(self, bin_dir: Path, ports: dict[str, int]) -> list[str]:
        return [str(bin_dir / "kwok"), f"--kubeconfig={self.kubeconfig}",
                # every node that is not down (nodestate.py)
                f"--manage-nodes-with-label-selector={nodestate.KWOK_NODE_SELECTOR}",
                f"--cidr={self.pod_cidr}", "--node-ip=127.0.0.1",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                # What the node status advertises as the kubelet port: the node agent's.
                f"--node-port={ports['kubelet']}",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}", f"--config={STAGES_FILE}"]

    def _agent_args(self, ports: dict[str, int]) -> list[str]:
        return [sys.executable, "-m", "monarch_operator.localcluster.agent",
                f"--state-dir={self.state_dir}", f"--kubeconfig={self.kubeconfig}",
                f"--kubelet-port={ports['kubelet']}"]

    # -- helpers -----------------------------------------------------------------------------
    def _start(self, name: str, args: list[str]) -> int:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   cwd=self.state_dir, env=_component_env(),
                                   preexec_fn=self._stop_with_owner_hook(name))
        log.close()
        self._processes[process.pid] = process
        return process.pid

    def _stop_with_owner_hook(self, name: str) -> Callable[[], None] | None:
        """The ``preexec_fn`` tying component ``name`` to this process (``stop_with_owner``):
        SIGTERM for the node agent, which stops its pods; SIGKILL for the Go binaries."""
        if not self.stop_with_owner:
            return None
        return stop_with_parent(signal.SIGTERM if name == "agent" else signal.SIGKILL)

    def _write_kubeconfig(self, apiserver_port: int, path: Path | None = None,
                          cert: Path | None = None, key: Path | None = None) -> None:
        pki = self.state_dir / "pki"
        path = path or self.kubeconfig
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {
                "server": f"https://{self.host}:{apiserver_port}",
                "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(cert or pki / "admin.crt"),
                "client-key": str(key or pki / "admin.key")}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def _save(self, pids: dict[str, int], ports: dict[str, int]) -> None:
        self._record.write_text(json.dumps({"pids": pids, "ports": ports,
                                            "real_nodes": self.real_nodes,
                                            "gpus_per_node": self.gpus_per_node}, indent=2))

    def _check_alive(self, pids: dict[str, int]) -> None:
        for name, pid in pids.items():
            if not _alive(pid):
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited during start-up; end of "
                                   f"{self.logs / (name + '.log')}:\n{tail}")

    def _wait_http(self, url: str, name: str, pids: dict[str, int], timeout: float = 90) -> None:
        pki = self.state_dir / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(pids)
            try:
                with urllib.request.urlopen(url, timeout=3, context=context
                                            if url.startswith("https") else None) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not healthy at {url} after {timeout:.0f}s; "
                                   f"see {self.logs / (name + '.log')}")
            time.sleep(0.3)

    def _kubectl(self, bin_dir: Path, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run([str(bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                                input=stdin, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _create_nodes(self, bin_dir: Path) -> None:
        if not self.nodes:
            return
        nodes = []
        for index in range(self.nodes):
            resources = {"cpu": "64", "memory": "512Gi", "pods": "110",
                         GPU_RESOURCE: str(self.gpus_per_node)}
            nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE_NAME.format(index=index),
                             # kubernetes.io/hostname as a kubelet sets it (Kueue's
                             # topology-aware scheduling uses it as the lowest level).
                             "labels": {"type": "kwok", "kubernetes.io/os": "linux",
                                        "kubernetes.io/hostname": NODE_NAME.format(index=index),
                                        "nvidia.com/gpu.present": "true"},
                             "annotations": {"kwok.x-k8s.io/node": "fake"}},
                "status": {"capacity": resources, "allocatable": resources},
            })
        self._kubectl(bin_dir, "apply", "-f", "-",
                      stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))

    def _wait_ready(self, bin_dir: Path, pids: dict[str, int], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(pids)
            nodes = json.loads(self._kubectl(bin_dir, "get", "nodes", "-o", "json"))["items"]
            ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                              for c in n.get("status", {}).get("conditions", []))
                     and not n.get("spec", {}).get("taints")]
            accounts = self._kubectl(bin_dir, "get", "serviceaccounts", "-n", "default",
                                     "-o", "name")
            if len(ready) == self.nodes and "serviceaccount/default" in accounts:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(ready)}/{self.nodes} nodes Ready and untainted after "
                                   f"{timeout:.0f}s; see {self.logs}")
            time.sleep(0.5)


def images_cache() -> Path:
    """Where real nodes keep containerd's images between runs (one folder per node):
    ``~/.cache/monarch-operator/containerd`` (or under ``$MONARCH_OPERATOR_CACHE``)."""
    base = os.environ.get("MONARCH_OPERATOR_CACHE") or str(Path.home() / ".cache" /
                                                           "monarch-operator")
    return Path(base) / "containerd"


def _component_env() -> dict[str, str]:
    # No proxy for loopback or node-network traffic, nothing from the caller's kube context.
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env.pop("KUBECONFIG", None)
    local = f"127.0.0.1,localhost,{node_network.NODE_RANGE},{node_network.SERVICE_RANGE}"
    env["NO_PROXY"] = env["no_proxy"] = local
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still answers kill(0); look at its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stop_group(pid: int, grace: float = 10) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL whatever is left after ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not _alive(pid):
                return
            time.sleep(0.1)
