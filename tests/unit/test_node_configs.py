"""Configuration of the real nodes (localcluster/node): addresses, CNI, kubelet, kube-proxy,
containerd and CoreDNS, as pure data (the running cluster is tested in tests/e2e)."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

from monarch_operator.localcluster.node import addons, configs, network
from monarch_operator.localcluster.node.network import NodeAddresses

NODES = [NodeAddresses(f"node-{i}", i) for i in range(3)]


def test_node_addresses_are_distinct_and_inside_our_ranges():
    assert len({n.ip for n in NODES}) == len({n.pod_cidr for n in NODES}) == 3
    for node in NODES:
        assert node.ip in network.NODE_RANGE and node.ip != network.HOST_IP
        assert node.pod_cidr.subnet_of(network.POD_RANGE)
        assert node.pod_gateway in node.pod_cidr
        assert node.netns.startswith(network.PREFIX) and node.host_veth.startswith(network.PREFIX)
    ranges = (network.NODE_RANGE, network.POD_RANGE, network.SERVICE_RANGE)
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1:])
    assert network.DNS_SERVICE_IP in network.SERVICE_RANGE


def test_cni_gives_pods_routes_to_our_ranges_only_never_a_default_route():
    config = configs.cni_config(NODES[1])
    bridge = config["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    routes = [ipaddress.ip_network(r["dst"]) for r in bridge["ipam"]["routes"]]
    assert ipaddress.ip_network("0.0.0.0/0") not in routes
    assert set(routes) == {network.POD_RANGE, network.SERVICE_RANGE, network.NODE_RANGE}
    assert bridge["ipam"]["ranges"][0][0]["subnet"] == str(NODES[1].pod_cidr)


def test_kubelet_config_fits_this_machine_kind(tmp_path: Path):
    config = configs.kubelet_config(NODES[0], tmp_path, "/mlc-node-0")
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["oomScoreAdj"] == 0 and config["resolvConf"] == ""
    assert config["clusterDNS"] == [str(network.DNS_SERVICE_IP)]
    assert config["address"] == str(NODES[0].ip) and config["cgroupRoot"] == "/mlc-node-0"
    assert config["authentication"]["anonymous"]["enabled"] is False


def test_kube_proxy_leaves_conntrack_alone_and_masquerades_outside_traffic(tmp_path: Path):
    config = configs.kube_proxy_config(NODES[0], tmp_path / "kubeconfig")
    assert config["clusterCIDR"] == str(network.POD_RANGE)
    assert all(not value or value == "0s" for value in config["conntrack"].values())
    assert config["nodePortAddresses"] == [f"{NODES[0].ip}/32"]


def test_containerd_config_serves_on_the_node_socket_with_our_sandbox_image(tmp_path: Path):
    text = configs.containerd_config(tmp_path / "root", tmp_path / "state", tmp_path / "cni",
                                     "localhost/monarch-pause:1")
    config = tomllib.loads(text)
    assert config["version"] == 4 and config["imports"] == []
    plugins = config["plugins"]
    assert plugins["io.containerd.server.v1.grpc"]["address"] == configs.CONTAINERD_SOCKET
    assert "grpc" not in config  # ignored at the top level in version 4
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == \
        "localhost/monarch-pause:1"
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["cni"]["conf_dir"] == str(tmp_path / "cni")


def test_coredns_serves_the_cluster_domain_and_forwards_nothing():
    assert "forward" not in addons.COREFILE
    manifests = addons.coredns_manifests("localhost/monarch-coredns:v1")
    service = next(m for m in manifests if m["kind"] == "Service")
    assert service["metadata"]["name"] == "kube-dns"
    assert service["spec"]["clusterIP"] == str(network.DNS_SERVICE_IP)
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["imagePullPolicy"] == "Never"
    # Two replicas on two nodes: losing a node never loses cluster DNS.
    assert deployment["spec"]["replicas"] == 2
    [term] = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
