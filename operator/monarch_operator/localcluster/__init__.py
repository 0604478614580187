"""A real, local Kubernetes control plane on 127.0.0.1 for the demo and the tests.

Upstream etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake GPU nodes)
built from the Go module proxy (``build-binaries.sh``), plus a node agent that runs each pod's
container command as a real local process (sshd for workers, ``monarch-launch`` for the launcher).
Nothing listens or dials outside 127.0.0.0/8.
"""
