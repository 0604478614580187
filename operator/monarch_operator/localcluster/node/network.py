"""The real nodes' network: every packet stays on this machine.

Layout (``../shared/notes/real-node.md``, checked on this machine kind):

- one host bridge, :data:`BRIDGE`, with no uplink, holding the API server's address
  (:data:`HOST_IP`, the first address of :data:`NODE_RANGE`) and one veth per node;
- each node is a network namespace (``mlc-<node>``) whose ``eth0`` (the veth's other end) has
  the node's address, routes to the other nodes' pod /24s via their node addresses, the service
  range onto ``eth0`` and no default route; its pods live on its own CNI bridge;
- on the host: each node's pod /24 via its node address, and blackholes for the rest of the pod
  range, the node range's unused part is the bridge's own /24, and the service range is routed
  onto the bridge (a locally sent packet is routed before kube-proxy's DNAT); FORWARD drops
  between the bridge and any other interface, both ways.

Everything made here is marked so that a later run can tell it from anything else on the
machine and remove it after a run that was killed before its teardown: names start with
:data:`PREFIX`, iptables rules carry the comment :data:`MARK`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

PREFIX = "mlc-"
MARK = "monarch-localcluster"
BRIDGE = f"{PREFIX}br0"
NODE_RANGE = ipaddress.ip_network("10.243.0.0/24")
POD_RANGE = ipaddress.ip_network("10.244.0.0/16")
SERVICE_RANGE = ipaddress.ip_network("10.96.0.0/16")
HOST_IP = NODE_RANGE[1]
# The first service address is the ``kubernetes`` Service's; the tenth is kube-dns (kubeadm's).
KUBERNETES_SERVICE_IP = SERVICE_RANGE[1]
DNS_SERVICE_IP = SERVICE_RANGE[10]
CLUSTER_DOMAIN = "cluster.local"
# Host-wide sysctls that a kubelet (the first three) changes; saved before the first node starts
# and restored when the last one is gone.
SAVED_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
RUN_DIR = Path("/run/monarch-localcluster")
SYSCTL_RECORD = RUN_DIR / "sysctls.json"
# Host folders we had to create (bind targets, /run/netns): removed again by teardown.
CREATED_DIRS = RUN_DIR / "created-dirs.json"


@dataclass(frozen=True)
class NodeAddresses:
    """Where node number ``index`` lives on the node network.

    Attributes:
        name: the Node's name, also its network namespace's after :data:`PREFIX`.
        index: 0, 1, ...
        ip: the node's address on :data:`BRIDGE` (its InternalIP).
        pod_cidr: the node's pod /24 (its ``spec.podCIDR``), the CNI bridge's subnet.
    """

    name: str
    index: int

    @property
    def ip(self) -> ipaddress.IPv4Address:
        return NODE_RANGE[10 + self.index]  # type: ignore[return-value]

    @property
    def pod_cidr(self) -> ipaddress.IPv4Network:
        return list(POD_RANGE.subnets(new_prefix=24))[1 + self.index]  # type: ignore[return-value]

    @property
    def pod_gateway(self) -> ipaddress.IPv4Address:
        return self.pod_cidr[1]  # type: ignore[return-value]

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def host_veth(self) -> str:
        return f"{PREFIX}v{self.index}"


def run(*args: str, check: bool = True,
        netns: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (inside network namespace ``netns`` when given), capturing its output.

    Raises:
        RuntimeError: it failed and ``check``; the message has the command and its stderr.
    """
    command = ["ip", "netns", "exec", netns, *args] if netns else list(args)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()}")
    return result


def _uplinks() -> list[str]:
    """Every host interface that is not ours and not loopback: where nothing may go."""
    links = json.loads(run("ip", "-j", "link", "show").stdout)
    return [link["ifname"] for link in links
            if link["ifname"] != "lo" and not link["ifname"].startswith(PREFIX)]


def host_rules() -> list[list[str]]:
    """The iptables rules (``-A`` specs of chain FORWARD, without the chain) that keep node and
    pod traffic off every other interface: dropped both ways between :data:`BRIDGE` and the rest."""
    mark = ["-m", "comment", "--comment", MARK]
    rules = []
    for uplink in _uplinks():
        rules.append(["-i", BRIDGE, "-o", uplink, *mark, "-j", "DROP"])
        rules.append(["-i", uplink, "-o", BRIDGE, *mark, "-j", "DROP"])
    return rules


def host_up(nodes: list[NodeAddresses]) -> None:
    """Create the host side: bridge, address, routes, blackholes, FORWARD drops, and save the
    sysctls a kubelet changes (:data:`SAVED_SYSCTLS`).

    Raises:
        RuntimeError: an ``ip``/``iptables`` command failed (its stderr in the message).
    """
    ensure_host_dirs(["/run/netns"])
    if not SYSCTL_RECORD.exists():
        saved = {name: Path("/proc/sys", *name.split(".")).read_text().strip()
                 for name in SAVED_SYSCTLS}
        SYSCTL_RECORD.write_text(json.dumps(saved))
    # Blackholes first: no window in which these ranges follow the default route.
    for network in (POD_RANGE, SERVICE_RANGE):
        run("ip", "route", "replace", "blackhole", str(network))
    for rule in host_rules():
        if run("iptables", "-C", "FORWARD", *rule, check=False).returncode != 0:
            run("iptables", "-I", "FORWARD", "1", *rule)
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{HOST_IP}/{NODE_RANGE.prefixlen}", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    # The service range onto the bridge (not a blackhole): the host reaches ClusterIPs through
    # the node whose kube-proxy answers (any node: every kube-proxy has every service).
    if nodes:
        run("ip", "route", "replace", str(SERVICE_RANGE), "via", str(nodes[0].ip),
            "dev", BRIDGE, "src", str(HOST_IP))


def node_up(node: NodeAddresses, others: list[NodeAddresses]) -> None:
    """Create node ``node``'s network namespace with its veth into :data:`BRIDGE`, its address,
    routes to ``others``' pod /24s and the service range, ``lo`` up and no default route; and
    the host's route to its pod /24.

    Raises:
        RuntimeError: an ``ip`` command failed (its stderr in the message).
    """
    run("ip", "netns", "add", node.netns)
    run("ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", "eth0",
        "netns", node.netns)
    run("ip", "link", "set", node.host_veth, "master", BRIDGE, "up")
    ns = node.netns
    run("ip", "link", "set", "lo", "up", netns=ns)
    run("ip", "addr", "add", f"{node.ip}/{NODE_RANGE.prefixlen}", "dev", "eth0", netns=ns)
    run("ip", "link", "set", "eth0", "up", netns=ns)
    for other in others:
        run("ip", "route", "add", str(other.pod_cidr), "via", str(other.ip), netns=ns)
    run("ip", "route", "add", str(SERVICE_RANGE), "dev", "eth0", "src", str(node.ip), netns=ns)
    # Traffic between pods of different nodes is routed by the nodes (not by the host, whose
    # ip_forward stays as it was): the node forwards from its CNI bridge to eth0.
    run("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=ns)
    run("ip", "route", "replace", str(node.pod_cidr), "via", str(node.ip), "dev", BRIDGE)


def netns_inode(name: str) -> int | None:
    """The inode of network namespace ``name`` (``/run/netns/<name>``), None if absent."""
    try:
        return Path("/run/netns", name).stat().st_ino
    except OSError:
        return None


def leftover_namespaces() -> list[str]:
    """Network namespaces of ours (:data:`PREFIX`) that exist now."""
    directory = Path("/run/netns")
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(PREFIX)) \
        if directory.is_dir() else []


def teardown() -> list[str]:
    """Remove everything :func:`host_up` and :func:`node_up` made (also what a killed run left):
    our network namespaces, veths, the bridge, our routes in the node, pod and service ranges,
    our FORWARD rules; restore the saved sysctls. Processes inside the namespaces must be gone
    first (``node.processes``). Returns what was removed, for the log."""
    removed = []
    for name in leftover_namespaces():
        run("ip", "netns", "delete", name, check=False)
        removed.append(f"netns {name}")
    links = json.loads(run("ip", "-j", "link", "show").stdout)
    for link in links:
        if link["ifname"].startswith(PREFIX):
            run("ip", "link", "delete", link["ifname"], check=False)
            removed.append(f"link {link['ifname']}")
    routes = json.loads(run("ip", "-j", "route", "show").stdout)
    ours = (POD_RANGE, SERVICE_RANGE, NODE_RANGE)
    for route in routes:
        dst = route.get("dst", "")
        if dst == "default" or "/" not in dst and dst.count(".") != 3:
            continue
        network = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
        if any(network.subnet_of(range_) for range_ in ours):  # type: ignore[arg-type]
            kind = [route["type"]] if route.get("type") == "blackhole" else []
            run("ip", "route", "delete", *kind, dst, check=False)
            removed.append(f"route {' '.join(kind + [dst])}")
    removed += _remove_marked_rules()
    if SYSCTL_RECORD.exists():
        for name, value in json.loads(SYSCTL_RECORD.read_text()).items():
            Path("/proc/sys", *name.split(".")).write_text(value)
        SYSCTL_RECORD.unlink()
        removed.append("sysctls restored")
    return removed


def _remove_marked_rules() -> list[str]:
    """Delete every host iptables rule carrying our comment, in any table and chain."""
    removed = []
    for table in ("filter", "nat", "mangle", "raw"):
        listing = run("iptables", "-t", table, "-S", check=False).stdout
        for line in listing.splitlines():
            if line.startswith("-A ") and f"--comment {MARK}" in line.replace('"', ""):
                spec = line.split()[1:]
                run("iptables", "-t", table, "-D", *spec, check=False)
                removed.append(f"iptables -t {table} {line}")
    return removed


def ensure_host_dirs(paths: object) -> None:
    """Create each of ``paths`` that does not exist on the host, recording the topmost folder
    created so that :func:`remove_created_dirs` removes it again."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    created = json.loads(CREATED_DIRS.read_text()) if CREATED_DIRS.exists() else []
    for target in paths:  # type: ignore[attr-defined]
        path = Path(target)
        if not path.exists():
            missing = path
            while not missing.parent.exists():
                missing = missing.parent
            path.mkdir(parents=True)
            created.append(str(missing))
    CREATED_DIRS.write_text(json.dumps(sorted(set(created))))


def remove_created_dirs() -> list[str]:
    """Remove the folders :func:`ensure_host_dirs` created (deepest first); what was removed."""
    if not CREATED_DIRS.exists():
        return []
    removed = []
    for path in sorted(json.loads(CREATED_DIRS.read_text()), key=len, reverse=True):
        # Empty folders only: a file found there (another tool's network namespace in
        # /run/netns, say) is not ours to delete, and keeps its folder.
        for folder in sorted((p for p in Path(path).rglob("*") if p.is_dir()),
                             key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        # /run/netns: `ip netns` binds it over itself, which os.path.ismount cannot see (same
        # file system); mountinfo can.
        for _ in range(5):
            if not _mounted(path):
                break
            run("umount", path, check=False)
        with contextlib.suppress(OSError):
            Path(path).rmdir()
            removed.append(f"folder {path}")
    CREATED_DIRS.unlink()
    return removed


def _mounted(path: str) -> bool:
    """Whether ``path`` is a mount point in this mount namespace (``/proc/self/mountinfo``)."""
    return any(line.split()[4] == path
               for line in Path("/proc/self/mountinfo").read_text().splitlines())
