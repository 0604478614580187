"""The real nodes themselves (issue 19): every packet kept on this machine, GPUs as a device
plugin allocates them, seccomp applied by runc, DNS from CoreDNS, and ``down`` leaving the
machine as it found it.

Needs root (namespaces, iptables, cgroups), as the whole real-node cluster does.
"""

from __future__ import annotations

import ipaddress
import json
import uuid

import pytest

from monarch_operator.localcluster.demo import install_crds
from monarch_operator.localcluster.node import addons, network
from monarch_operator.localcluster.node import node as node_mod

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

WORKER_IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"


def _ip_json(*args: str, netns: str | None = None) -> list[dict]:
    return json.loads(network.run("ip", "-j", *args, netns=netns).stdout or "[]")


def _probe_pod(kubectl, namespace: str, name: str, gpus: int = 0, node: str | None = None) -> str:
    """A pod of the worker image that sleeps (restricted securityContext), Running; its name."""
    container = {
        "name": "probe", "image": WORKER_IMAGE, "command": ["sleep", "3600"],
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
    }
    spec = {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container], "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeName"] = node
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}))
    kubectl("wait", "-n", namespace, f"pod/{name}", "--for=condition=Ready", "--timeout=120s")
    return name


def test_host_network_keeps_every_packet_on_this_machine(local_cluster):
    routes = _ip_json("route", "show")
    by_dst = {r["dst"]: r for r in routes}
    # The pod range is a blackhole but for each node's /24, routed to that node on our bridge.
    assert by_dst[str(network.POD_RANGE)].get("type") == "blackhole", routes
    for index in range(local_cluster.real_nodes):
        node = network.NodeAddresses(f"node-{index}", index)
        route = by_dst[str(node.pod_cidr)]
        assert (route["dev"], route["gateway"]) == (network.BRIDGE, str(node.ip)), route
    assert by_dst[str(network.SERVICE_RANGE)]["dev"] == network.BRIDGE
    # Whatever the address in our ranges, the host never sends it out of another interface.
    for range_ in (network.POD_RANGE, network.SERVICE_RANGE, network.NODE_RANGE):
        for address in (range_[2], range_[-2]):
            got = network.run("ip", "route", "get", str(address), check=False)
            assert network.BRIDGE in got.stdout or "blackhole" in (got.stdout + got.stderr) \
                or got.returncode != 0, f"{address}: {got.stdout}{got.stderr}"
    # FORWARD drops both ways between our bridge and every other interface.
    rules = network.run("iptables", "-S", "FORWARD").stdout
    uplinks = [link["ifname"] for link in _ip_json("link", "show")
               if link["ifname"] != "lo" and not link["ifname"].startswith(network.PREFIX)]
    assert uplinks
    for uplink in uplinks:
        assert f"-A FORWARD -i {network.BRIDGE} -o {uplink}" in rules, rules
        assert f"-A FORWARD -i {uplink} -o {network.BRIDGE}" in rules, rules


def test_nodes_and_pods_have_no_default_route(local_cluster, kubectl, namespace):
    for index in range(local_cluster.real_nodes):
        ns = f"{network.PREFIX}node-{index}"
        routes = _ip_json("route", "show", netns=ns)
        assert routes and all(r["dst"] != "default" for r in routes), routes
    pod = _probe_pod(kubectl, namespace, "routes")
    table = kubectl("exec", "-n", namespace, pod, "--", "cat", "/proc/net/route")
    destinations = [line.split()[1] for line in table.splitlines()[1:] if line.strip()]
    assert destinations and "00000000" not in destinations, table
    # Pod routes: exactly the pod, service and node ranges and the pod's own /24.
    nets = {str(ipaddress.ip_network((int.from_bytes(bytes.fromhex(line.split()[1]), "little"),
                                      bin(int.from_bytes(bytes.fromhex(line.split()[7]),
                                                         "little")).count("1"))))
            for line in table.splitlines()[1:] if line.strip()}
    assert {str(network.POD_RANGE), str(network.SERVICE_RANGE), str(network.NODE_RANGE)} <= nets


def test_cluster_dns_answers_names_of_the_cluster_and_nothing_else(kubectl, namespace):
    corefile = kubectl("get", "configmap", "-n", addons.NAMESPACE, addons.NAME,
                       "-o", "jsonpath={.data.Corefile}")
    assert "kubernetes cluster.local" in corefile
    assert "forward" not in corefile, corefile
    pod = _probe_pod(kubectl, namespace, "dns")
    resolve = ("import socket, sys\n"
               "try:\n print(socket.gethostbyname(sys.argv[1]))\n"
               "except OSError as error:\n print('error', error)\n")
    inside = kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", resolve,
                     "kubernetes.default.svc.cluster.local")
    assert inside.strip() == str(network.KUBERNETES_SERVICE_IP)
    outside = kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", resolve,
                      "pypi.org")
    assert outside.startswith("error"), outside


def test_gpus_are_allocated_per_container_as_the_device_plugin_says(local_cluster, kubectl,
                                                                    namespace):
    nodes = kubectl.json("nodes")["items"]
    assert {n["metadata"]["name"]: n["status"]["allocatable"]["nvidia.com/gpu"]
            for n in nodes} == {f"node-{i}": str(local_cluster.gpus_per_node)
                                for i in range(local_cluster.real_nodes)}
    seen = []
    for name in ("gpus-a", "gpus-b"):
        pod = _probe_pod(kubectl, namespace, name, gpus=2, node="node-0")
        ids = kubectl("exec", "-n", namespace, pod, "--", "sh", "-c",
                      "echo $NVIDIA_VISIBLE_DEVICES").strip().split(",")
        assert len(ids) == 2 and len(set(ids)) == 2, ids
        seen.append(set(ids))
    # Two containers on one node never share a device.
    assert not seen[0] & seen[1], seen


def test_runtime_default_seccomp_refuses_a_blocked_syscall(kubectl, namespace):
    pod = _probe_pod(kubectl, namespace, "seccomp")
    status = kubectl("exec", "-n", namespace, pod, "--", "grep", "Seccomp:", "/proc/self/status")
    assert status.split() == ["Seccomp:", "2"], status
    # add_key(2) is not in containerd's RuntimeDefault profile: refused with EPERM by the
    # filter (without one the bad arguments would give EINVAL or EFAULT).
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.syscall(248, b'user', b'k', None, 0, -1)\n"
            "print(r, os.strerror(ctypes.get_errno()))\n")
    out = kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", code).strip()
    assert out == "-1 Operation not permitted", out


def test_down_leaves_the_machine_as_it_found_it(local_cluster, kubectl, namespace,
                                                operator_process):
    """After ``down`` (with pods running, one holding a GPU) the host's sysctls, links,
    routes, mounts, iptables rules, ipsets, cgroups, bind folders and network namespaces equal
    what ``LocalCluster.up`` recorded before it changed anything; then the cluster comes up
    again (a new one: CRDs and operator too) for the tests after this one."""
    before = json.loads((local_cluster.state_dir / "host-before.json").read_text())
    _probe_pod(kubectl, namespace, f"busy-{uuid.uuid4().hex[:4]}", gpus=1)
    operator_process.stop()
    local_cluster.down(quiet=True)
    try:
        after = json.loads(json.dumps(node_mod.host_state()))
        assert set(after) == set(before)
        for key in before:
            if isinstance(before[key], list):
                gone = sorted(set(before[key]) - set(after[key]))
                left = sorted(set(after[key]) - set(before[key]))
                assert not gone and not left, f"{key} after down: {left} left, {gone} gone"
            assert after[key] == before[key], f"{key} differs after down"
    finally:
        local_cluster.up(progress=print)
        install_crds(kubectl)
        operator_process.start()
