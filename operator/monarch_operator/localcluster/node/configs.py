"""Configuration files of a real node's components: containerd, kubelet, kube-proxy and CNI.

Pure functions of the node's addresses and folders (unit-tested); :mod:`.node` writes them.
Each setting that this machine kind needs is explained where it is set
(``../shared/notes/real-node.md`` has how each was found).
"""

from __future__ import annotations

import json
from pathlib import Path

from monarch_operator.localcluster.node import network
from monarch_operator.localcluster.node.network import NodeAddresses

# Inside a node's own mount namespace these host paths are the node's folders (node.BINDS).
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
KUBELET_PORT = 10250
# Node heartbeats as the kwok nodes have them (cluster.NODE_LEASE_SECONDS): a node whose kubelet
# died is NotReady about 20 s later.
NODE_LEASE_SECONDS = 10


def containerd_config(root: Path, state: Path, cni_conf_dir: Path, pause_image: str) -> str:
    """containerd 2.x's ``config.toml`` (version 4) for one node.

    Args:
        root: persistent data (content store, snapshots, metadata): kept between runs so that
            imported images need not be imported again.
        state: runtime state (sockets of shims, pod network namespaces): removed by teardown.
        cni_conf_dir: where the node's CNI configuration list lives.
        pause_image: the pod sandbox image (imported, never pulled).
    """
    # Version 4 puts the servers' addresses under their plugins: a top-level [grpc] section is
    # silently ignored there, and containerd would serve on the host's default socket.
    return f"""version = 4
root = "{root}"
state = "{state}"
# Nothing of the host's containerd configuration applies here.
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = "{CONTAINERD_SOCKET}"
  [plugins.'io.containerd.server.v1.ttrpc']
    address = "{CONTAINERD_SOCKET}.ttrpc"
  [plugins.'io.containerd.server.v1.debug']
    address = ""
  [plugins.'io.containerd.server.v1.metrics']
    address = ""
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{pause_image}"

  [plugins.'io.containerd.cri.v1.runtime']
    # No CAP_SYS_RESOURCE in this sandbox: containers keep the OOM score they are given.
    restrict_oom_score_adj = true
    enable_selinux = false
    # Pod network namespaces under the node's state folder, not the host's /var/run/netns.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{CNI_BIN_DIR}"]
      conf_dir = "{cni_conf_dir}"
      max_conf_num = 1
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "/usr/sbin/runc"

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"""


def cni_config(node: NodeAddresses) -> dict[str, object]:
    """The node's CNI configuration list: a bridge (``cni0``) on the node's pod /24 with
    host-local addresses, routes to the pod, service and node ranges only (never a default
    route), hairpin on (a pod reaching itself through a Service), and portmap."""
    routes = [{"dst": str(net)} for net in (network.POD_RANGE, network.SERVICE_RANGE,
                                            network.NODE_RANGE)]
    return {
        "cniVersion": "1.0.0",
        "name": "monarch-localcluster",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local",
                      "ranges": [[{"subnet": str(node.pod_cidr),
                                   "gateway": str(node.pod_gateway)}]],
                      "routes": routes}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


# Feature gates set on the kubelets and the API server: ResourceHealthStatus shows device
# health in pod status (allocatedResourcesStatus); the API server drops the field without it.
FEATURE_GATES = {"ResourceHealthStatus": True}


def feature_gates_flag() -> str:
    """``--feature-gates=...`` for the API server: :data:`FEATURE_GATES`."""
    return "--feature-gates=" + ",".join(
        f"{gate}={'true' if on else 'false'}" for gate, on in sorted(FEATURE_GATES.items()))


def kubelet_config(node: NodeAddresses, pki: Path, cgroup_root: str) -> dict[str, object]:
    """The node's ``KubeletConfiguration`` (kubelet.config.k8s.io/v1beta1).

    Args:
        pki: holds ``ca.crt`` and the node's serving certificate ``<node>-serving.{crt,key}``.
        cgroup_root: the node's own cgroup (``/mlc-<node>``), made by :mod:`.node` in every
            cgroup v1 hierarchy.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine kind runs cgroup v1, which kubelets refuse by default since 1.35.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        # No CAP_SYS_RESOURCE here: a negative OOM score adjustment fails.
        "oomScoreAdj": 0,
        "failSwapOn": False,
        "protectKernelDefaults": False,
        # Pods resolve through the cluster's DNS only; nothing of the host's resolv.conf.
        "resolvConf": "",
        "clusterDNS": [str(network.DNS_SERVICE_IP)],
        "clusterDomain": network.CLUSTER_DOMAIN,
        "address": str(node.ip),
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki / f"{node.name}-serving.crt"),
        "tlsPrivateKeyFile": str(pki / f"{node.name}-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
        "nodeStatusUpdateFrequency": "4s",
        "serializeImagePulls": False,
        # Images are imported, not pulled: never collect them, and never evict for disk use
        # (the nodes share the machine's disk with everything else).
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
        # KEP-4680: the health of a pod's devices in its status (allocatedResourcesStatus);
        # beta and on by default in 1.36, named so that it stays on (docs/gpu-health.md).
        "featureGates": dict(FEATURE_GATES),
    }


def kube_proxy_config(node: NodeAddresses, kubeconfig: Path) -> dict[str, object]:
    """The node's ``KubeProxyConfiguration`` (iptables mode; its rules live in the node's
    network namespace only). Conntrack sysctls are left alone (they are host-wide here), and
    traffic to Services from outside the pod range (the host, a node) is masqueraded."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "bindAddress": str(node.ip),
        "clusterCIDR": str(network.POD_RANGE),
        "mode": "iptables",
        "oomScoreAdj": 0,
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": [f"{node.ip}/32"],
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
    }


def kube_router_args(node: NodeAddresses, kubeconfig: Path) -> list[str]:
    """kube-router's flags on a node: its NetworkPolicy firewall only (no routing, no service
    proxy, no CNI of its own: the nodes route, kube-proxy serves Services, the bridge plugin
    wires pods); health on the node's loopback, no metrics."""
    return [f"--kubeconfig={kubeconfig}", f"--hostname-override={node.name}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--run-loadbalancer=false", "--enable-cni=false", "--enable-ipv6=false",
            "--health-port=20244", "--metrics-port=0", "-v=1"]


def kubeconfig(server: str, ca: Path, cert: Path, key: Path) -> str:
    """A kubeconfig (JSON) for one client certificate against ``server``."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": server,
                                                   "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": {"client-certificate": str(cert),
                                            "client-key": str(key)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
    }, indent=2)
