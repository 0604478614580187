"""Cluster add-ons the real nodes need: CoreDNS as a pod behind the ``kube-dns`` Service, the
API server's right to use the kubelets' API (logs, exec), as kubeadm grants it, and what
kube-router's NetworkPolicy firewall may read.

CoreDNS answers for the cluster domain from the API server (Services, StatefulSet pod names)
with its usual 30 s cache, and has no ``forward`` plugin: a name outside the cluster gets
SERVFAIL, never a query to a resolver outside this machine.
"""

from __future__ import annotations

from monarch_operator.localcluster.node import network

NAMESPACE = "kube-system"
NAME = "coredns"

COREFILE = f""".:53 {{
    errors
    health :8080
    ready :8181
    kubernetes {network.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loop
    loadbalance
}}
"""


def kubelet_api_access(user: str) -> dict[str, object]:
    """Binds the API server's kubelet client (certificate CN ``user``) to
    ``system:kubelet-api-admin``: kubelets authorize it by webhook for ``kubectl logs`` and
    ``exec`` (kubeadm's ``kube-apiserver-kubelet-client`` binding)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "monarch-localcluster:kubelet-api-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": user}]}


KUBE_ROUTER_USER = "monarch-localcluster:kube-router"


def kube_router_access() -> list[dict[str, object]]:
    """What kube-router's NetworkPolicy firewall reads (user :data:`KUBE_ROUTER_USER`, its
    client certificate's CN): pods, namespaces, nodes, services, endpoints and policies."""
    name = "monarch-localcluster:kube-router"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name},
         "rules": [{"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes",
                                                     "endpoints"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": KUBE_ROUTER_USER}]},
    ]


def coredns_manifests(image: str, replicas: int = 2) -> list[dict[str, object]]:
    """The objects of cluster DNS: ServiceAccount, ClusterRole and binding (read Services,
    EndpointSlices, Pods, Namespaces), the Corefile ConfigMap, a Deployment of ``replicas``
    pods of ``image`` (never pulled), at most one per node (as kubeadm spreads its two, so that
    losing a node never loses cluster DNS; each replica has its own cache), and the
    ``kube-dns`` Service at :data:`network.DNS_SERVICE_IP`."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": NAME, "namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods",
                                                     "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", **meta}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {**meta, "labels": labels},
         "spec": {
             "replicas": replicas,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels},
                 "spec": {
                     "serviceAccountName": NAME,
                     "priorityClassName": "system-cluster-critical",
                     # Its own resolv.conf would be the node's (empty here), not itself.
                     "dnsPolicy": "Default",
                     "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                     "affinity": {"podAntiAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": [{
                             "labelSelector": {"matchLabels": labels},
                             "topologyKey": "kubernetes.io/hostname"}]}},
                     "containers": [{
                         "name": "coredns", "image": image, "imagePullPolicy": "Never",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                   {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"}],
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                            "periodSeconds": 1},
                         "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                         "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                       "limits": {"memory": "128Mi"}},
                         "securityContext": {
                             "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                             "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
         "spec": {"selector": labels, "clusterIP": str(network.DNS_SERVICE_IP),
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP",
                             "targetPort": 53}]}},
    ]
