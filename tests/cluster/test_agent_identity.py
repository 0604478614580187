"""What a container sees on the local cluster, as from a kubelet: its user and groups
(securityContext), its volumes' owners and modes (fsGroup), env from Secrets, ConfigMaps and
resources, a projected service-account token with the API server's address, and the
runAsNonRoot refusal."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import yaml
from tests.cluster.helpers import get_json, wait_until

pytestmark = pytest.mark.cluster

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"


def apply(kubectl, namespace: str, *objects: dict) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(objects))


def pod(name: str, command: list[str], *, spec: dict | None = None, **container) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", **(spec or {}),
                     "containers": [{"name": "main", "image": IMAGE, "command": command,
                                     **container}]}}


def finished(kubectl, namespace: str, name: str, timeout: float = 90) -> dict:
    """The pod once it Succeeded or Failed; its main container's terminated state."""
    found = wait_until(lambda: (p := get_json(kubectl, "pod", name, "-n", namespace))
                       and p.get("status", {}).get("phase") in ("Succeeded", "Failed") and p,
                       timeout, f"pod {name} finished")
    (status,) = found["status"]["containerStatuses"]
    return status["state"]["terminated"]


def report(terminated: dict) -> dict[str, str]:
    """``KEY=VALUE`` lines the container wrote to its termination log."""
    lines = terminated["message"].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def api_server_port(local_cluster) -> str:
    record = json.loads((local_cluster.state_dir / "cluster.json").read_text())
    return str(record["ports"]["apiserver"])


# The variables the test looks at (all of `env` could pass the 4 KiB termination message).
ENV_SCRIPT = """
for name in PASSWORD MODE_COPY CFG_MODE CFG_LEVEL user password GREETING MEMORY_MIB \
            CPU_MILLIS CPU_LIMIT KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT \
            KUBERNETES_SERVICE_PORT_HTTPS; do
  echo "$name=$(printenv "$name")"
done > /dev/termination-log
echo "set=$(env | cut -d= -f1 | grep -E '^(MAYBE|MODE|LEVEL)$|_SERVICE_|_PORT' | sort | xargs)" \
  >> /dev/termination-log
"""


def test_env_from_secret_configmap_resources_and_the_api_server(kubectl, namespace,
                                                               local_cluster):
    """valueFrom (secretKeyRef, configMapKeyRef, resourceFieldRef with divisors, a limit the
    container leaves to the node's allocatable) and envFrom (prefix, optional); the API server
    at its real loopback address and no other service variables."""
    apply(kubectl, namespace,
          {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
           "stringData": {"user": "alice", "password": "s3cret"}},
          {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
           "data": {"MODE": "fast", "LEVEL": "3"}},
          pod("env", ["sh", "-c", ENV_SCRIPT], env=[
              {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                  "key": "password"}}},
              {"name": "MODE_COPY", "valueFrom": {"configMapKeyRef": {"name": "settings",
                                                                      "key": "MODE"}}},
              {"name": "GREETING", "value": "hi $(user) at $(CFG_LEVEL)"},
              {"name": "MEMORY_MIB", "valueFrom": {"resourceFieldRef": {
                  "resource": "limits.memory", "divisor": "1Mi"}}},
              {"name": "CPU_MILLIS", "valueFrom": {"resourceFieldRef": {
                  "resource": "requests.cpu", "divisor": "1m"}}},
              {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {
                  "containerName": "main", "resource": "limits.cpu"}}},
              {"name": "MAYBE", "valueFrom": {"secretKeyRef": {
                  "name": "absent", "key": "x", "optional": True}}},
          ], envFrom=[
              {"configMapRef": {"name": "settings"}, "prefix": "CFG_"},
              {"secretRef": {"name": "creds"}},
              {"configMapRef": {"name": "absent", "optional": True}},
          ], resources={"requests": {"cpu": "250m", "memory": "256Mi"},
                        "limits": {"memory": "256Mi"}}))
    terminated = finished(kubectl, namespace, "env")
    assert terminated["exitCode"] == 0, terminated
    env = report(terminated)
    assert env["PASSWORD"] == "s3cret" and env["MODE_COPY"] == "fast"
    assert env["CFG_MODE"] == "fast" and env["CFG_LEVEL"] == "3"
    assert env["user"] == "alice" and env["password"] == "s3cret"
    assert env["GREETING"] == "hi alice at 3"
    assert env["MEMORY_MIB"] == "256" and env["CPU_MILLIS"] == "250"
    assert env["CPU_LIMIT"] == "64"  # no limit: the node's allocatable (kwok nodes: 64 CPUs)
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    port = api_server_port(local_cluster)
    assert env["KUBERNETES_SERVICE_PORT"] == env["KUBERNETES_SERVICE_PORT_HTTPS"] == port
    # No MAYBE (optional, missing), no unprefixed ConfigMap keys, no other service variables.
    assert env["set"].split() == ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
                                  "KUBERNETES_SERVICE_PORT_HTTPS"]


def test_missing_env_source_waits_with_create_container_config_error(kubectl, namespace):
    apply(kubectl, namespace, pod("noconf", ["true"], envFrom=[
        {"configMapRef": {"name": "nowhere"}}]))

    def waiting():
        found = get_json(kubectl, "pod", "noconf", "-n", namespace) or {}
        for status in (found.get("status") or {}).get("containerStatuses") or []:
            state = (status.get("state") or {}).get("waiting") or {}
            if state.get("reason") == "CreateContainerConfigError":
                return state
        return None

    state = wait_until(waiting, 60, "CreateContainerConfigError")
    assert state["message"] == 'configmap "nowhere" not found'


SECURE_SCRIPT = """
set -e
{
  echo "uid=$(id -u)"; echo "gid=$(id -g)"; echo "groups=$(id -G)"
  echo "id=$(id)"
  for f in /etc/monarch/test-creds/user /etc/monarch/test-creds/key; do
    echo "$(basename $f)=$(stat -c '%u %g %a' "$(readlink -f $f)")"
  done
  echo "creds_dir=$(stat -c '%g %a' /etc/monarch/test-creds)"
  echo "token=$(stat -c '%u %g %a' "$(readlink -f /var/run/secrets/kubernetes.io/serviceaccount/token)")"
  echo "scratch=$(stat -c '%g %a' /etc/monarch/test-scratch)"
  echo made > /etc/monarch/test-scratch/file; echo "scratch_file=$(stat -c '%u %g' /etc/monarch/test-scratch/file)"
  touch "$HOME/.written"; echo "home=$HOME $(stat -c '%u' "$HOME")"
  if touch /etc/monarch/test-creds/new 2>/dev/null; then echo "creds_writable=yes"; else echo "creds_writable=no"; fi
  echo "pty_group=$(python3 -c 'import os; print(os.stat(os.ttyname(os.openpty()[1])).st_gid)')"
  echo "tty_group=$(getent group tty | cut -d: -f3)"
} > /dev/termination-log
"""


def test_run_as_user_group_and_fs_group(kubectl, namespace):
    """runAsUser 1000, runAsGroup 3000, fsGroup 2000, supplementalGroups: the process's ids;
    Secret files with group 2000 and the kubelet's modes (defaultMode 0644, items[].mode 0400
    -> 0440), a read-only Secret volume, the token 0640 owned by the pod's user, a writable
    emptyDir with the fsGroup inherited (setgid), a home and termination log it can write, and
    ptys in the tty group."""
    apply(kubectl, namespace,
          {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
           "stringData": {"user": "alice", "key": "private"}},
          pod("secure", ["sh", "-c", SECURE_SCRIPT],
              spec={"securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000,
                                        "supplementalGroups": [4000]},
                    "volumes": [{"name": "creds", "secret": {"secretName": "creds", "items": [
                        {"key": "user", "path": "user"},
                        {"key": "key", "path": "key", "mode": 0o400}]}},
                        {"name": "scratch", "emptyDir": {}}]},
              volumeMounts=[{"name": "creds", "mountPath": "/etc/monarch/test-creds"},
                            {"name": "scratch", "mountPath": "/etc/monarch/test-scratch"}]))
    terminated = finished(kubectl, namespace, "secure")
    assert terminated["exitCode"] == 0, terminated
    seen = report(terminated)
    assert (seen["uid"], seen["gid"]) == ("1000", "3000"), seen
    assert seen["groups"].split() == ["3000", "2000", "4000"], seen
    assert seen["user"] == "0 2000 644" and seen["key"] == "0 2000 440", seen
    assert seen["creds_dir"].split()[0] == "2000"
    assert seen["token"] == "1000 2000 640", seen
    assert seen["scratch"] == "2000 2777" and seen["scratch_file"] == "1000 2000", seen
    assert seen["home"].split()[1] == "1000"
    assert seen["creds_writable"] == "no"
    # a pty of its own devpts, in the tty group (what a non-root sshd needs for `ssh -tt`)
    assert seen["pty_group"] == seen["tty_group"] != "", seen


IN_CLUSTER_SCRIPT = """
import base64, json, os
from kubernetes import client, config

config.load_incluster_config()
api = client.CoreV1Api()
account = "/var/run/secrets/kubernetes.io/serviceaccount"
namespace = open(f"{account}/namespace").read()
names = [p.metadata.name for p in api.list_namespaced_pod(namespace).items]
try:
    api.list_namespaced_secret(namespace)
    secrets = "allowed"
except client.ApiException as error:
    secrets = str(error.status)
claims = json.loads(base64.urlsafe_b64decode(
    open(f"{account}/token").read().split(".")[1] + "=="))
with open("/dev/termination-log", "w") as out:
    out.write(f"uid={os.getuid()}\\nnamespace={namespace}\\npods={','.join(sorted(names))}\\n"
              f"secrets={secrets}\\nbound={claims['kubernetes.io']['pod']['name']}\\n"
              f"account={claims['sub']}\\n")
"""


def test_service_account_token_lets_a_pod_use_load_incluster_config(kubectl, namespace,
                                                                    local_cluster):
    """A ServiceAccount allowed to list pods (Role + RoleBinding): a non-root pod (uid 65532,
    unknown to the machine, as in the operator's chart) lists pods through
    kubernetes.config.load_incluster_config() and gets 403 for secrets; its token is bound
    to the pod. A pod with automountServiceAccountToken: false gets no token."""
    apply(kubectl, namespace,
          {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "lister"}},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": "pod-lister"},
           "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": "pod-lister"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                       "name": "pod-lister"},
           "subjects": [{"kind": "ServiceAccount", "name": "lister"}]})
    apply(kubectl, namespace,
          pod("incluster", [sys.executable, "-c", textwrap.dedent(IN_CLUSTER_SCRIPT)],
              spec={"serviceAccountName": "lister",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532}}),
          pod("notoken", ["sh", "-c", "test ! -e /var/run/secrets/kubernetes.io/serviceaccount/"
                                      "token && echo none > /dev/termination-log"],
              spec={"automountServiceAccountToken": False}))
    terminated = finished(kubectl, namespace, "incluster")
    assert terminated["exitCode"] == 0, terminated
    seen = report(terminated)
    assert seen["uid"] == "65532" and seen["namespace"] == namespace
    assert "incluster" in seen["pods"].split(","), seen
    assert seen["secrets"] == "403"
    assert seen["bound"] == "incluster"
    assert seen["account"] == f"system:serviceaccount:{namespace}:lister"
    assert finished(kubectl, namespace, "notoken")["message"] == "none\n"
    # ca.crt is KCM's kube-root-ca.crt: the CA that signed the API server's serving certificate
    root_ca = get_json(kubectl, "configmap", "kube-root-ca.crt", "-n", namespace)
    assert root_ca["data"]["ca.crt"] == (local_cluster.state_dir / "pki" / "ca.crt").read_text()


def test_run_as_non_root_refuses_root_with_the_kubelets_reason(kubectl, namespace):
    """runAsNonRoot with no runAsUser (this "image" runs as root) or with runAsUser 0: the
    container waits with CreateContainerConfigError and the kubelet's message; it never runs."""
    apply(kubectl, namespace,
          pod("nouser", ["sh", "-c", "echo RAN"],
              spec={"securityContext": {"runAsNonRoot": True}}),
          pod("rootuser", ["sh", "-c", "echo RAN"],
              spec={"securityContext": {"runAsNonRoot": True}},
              securityContext={"runAsUser": 0}))

    def waiting(name):
        found = get_json(kubectl, "pod", name, "-n", namespace) or {}
        for status in (found.get("status") or {}).get("containerStatuses") or []:
            state = (status.get("state") or {}).get("waiting") or {}
            if state.get("reason") == "CreateContainerConfigError":
                return found, state
        return None

    found, state = wait_until(lambda: waiting("nouser"), 60, "nouser refused")
    uid = found["metadata"]["uid"]
    assert state["message"] == ("container has runAsNonRoot and image will run as root "
                                f'(pod: "nouser_{namespace}({uid})", container: main)')
    found, state = wait_until(lambda: waiting("rootuser"), 60, "rootuser refused")
    uid = found["metadata"]["uid"]
    assert state["message"] == ("container's runAsUser breaks non-root policy "
                                f'(pod: "rootuser_{namespace}({uid})", container: main)')
    header, row = kubectl("get", "pods", "-n", namespace, "nouser").strip().splitlines()
    assert dict(zip(header.split(), row.split(), strict=False))["STATUS"] == \
        "CreateContainerConfigError"
    assert found["status"]["phase"] == "Pending"


PRIVILEGES_SCRIPT = """
grep -E '^(Uid|NoNewPrivs|Cap[A-Za-z]+):' /proc/self/status > /scratch/main-status
exec sleep 300
"""
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def status_fields(text: str) -> dict[str, str]:
    return {key: value.strip() for key, _, value in
            (line.partition(":") for line in text.splitlines()) if value}


def test_restricted_security_context_holds_in_the_container_and_in_exec(kubectl, namespace):
    """In a namespace enforcing Pod Security "restricted", a pod that passes it runs with what
    it asked for: uid 1000, NoNewPrivs 1 (allowPrivilegeEscalation: false) and no capabilities
    (drop ALL), in its main process and in a `kubectl exec` command alike."""
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    apply(kubectl, namespace, pod(
        "restricted", ["sh", "-c", PRIVILEGES_SCRIPT],
        spec={"securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                  "seccompProfile": {"type": "RuntimeDefault"}},
              "volumes": [{"name": "scratch", "emptyDir": {}}]},
        securityContext=RESTRICTED, volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}]))

    def main_status():
        out = kubectl("exec", "-n", namespace, "restricted", "--", "cat", "/scratch/main-status",
                      check=False)
        return status_fields(out) if "NoNewPrivs" in out else None

    main = wait_until(main_status, 60, "the restricted pod's main process status")
    in_exec = status_fields(kubectl("exec", "-n", namespace, "restricted", "--",
                                    "cat", "/proc/self/status"))
    for seen in (main, in_exec):
        assert seen["Uid"].split()[:2] == ["1000", "1000"], seen
        assert seen["NoNewPrivs"] == "1", seen
        assert {seen[key] for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {
            "0000000000000000"}, seen
