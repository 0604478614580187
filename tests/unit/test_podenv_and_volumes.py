"""The node agent's env (envFrom, resourceFieldRef, optional sources) and volumes
(projected, downwardAPI, optional sources, emptyDir, fsGroup), as a kubelet makes them."""

from __future__ import annotations

import os
import stat

import pytest

from monarch_operator.localcluster import podfiles, volumes

DATA = {("ConfigMap", "settings"): {"MODE": b"fast", "LEVEL": b"3"},
        ("Secret", "creds"): {"user": b"alice", "password": b"s3cret"},
        ("ConfigMap", "kube-root-ca.crt"): {"ca.crt": b"-----BEGIN CERTIFICATE-----\n"}}


def lookup(kind, namespace, name):
    assert namespace == "team-a"
    if (kind, name) not in DATA:
        raise KeyError(f'{kind.lower()} "{name}" not found')
    return DATA[(kind, name)]


def pod(container=None, **spec):
    main = {"name": "main", "resources": {"requests": {"cpu": "250m", "memory": "100Mi"},
                                          "limits": {"memory": "1Gi"}}, **(container or {})}
    return {"metadata": {"name": "p", "namespace": "team-a", "uid": "u-1",
                         "labels": {"app": "x", "tier": "b"}},
            "spec": {"containers": [main], "nodeName": "n0", **spec},
            "status": {"podIP": "127.100.0.5"}}


ALLOCATABLE = {"cpu": "64", "memory": "512Gi"}


@pytest.mark.parametrize(("resource", "divisor", "expected"), [
    ("requests.cpu", None, "1"),        # 250m rounded up to whole CPUs
    ("requests.cpu", "1m", "250"),
    ("limits.cpu", None, "64"),         # unset limit: the node's allocatable
    ("limits.memory", None, str(2**30)),
    ("limits.memory", "1Mi", "1024"),
    ("requests.memory", "1Gi", "1"),     # 100Mi rounded up
    ("requests.ephemeral-storage", None, "0"),
])
def test_resource_field_ref(resource, divisor, expected):
    selector = {"resource": resource, **({"divisor": divisor} if divisor else {})}
    the_pod = pod()
    assert podfiles.resource_value(the_pod, the_pod["spec"]["containers"][0], selector,
                                   ALLOCATABLE) == expected


def test_unknown_resource_is_an_error():
    the_pod = pod()
    with pytest.raises(ValueError, match="unsupported container resource"):
        podfiles.resource_value(the_pod, the_pod["spec"]["containers"][0],
                                {"resource": "limits.nvidia.com/gpu"})


def test_env_from_then_env_with_prefix_optional_and_service_variables():
    container = {"envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"},
                             {"secretRef": {"name": "creds"}},
                             {"configMapRef": {"name": "absent", "optional": True}}],
                 "env": [{"name": "user", "value": "bob"},  # env wins over envFrom
                         {"name": "URL", "value": "https://$(KUBERNETES_SERVICE_HOST):$(CFG_MODE)"},
                         {"name": "GONE", "valueFrom": {"configMapKeyRef": {
                             "name": "settings", "key": "nope", "optional": True}}},
                         {"name": "CPU", "valueFrom": {"resourceFieldRef": {
                             "resource": "requests.cpu", "divisor": "1m"}}}]}
    the_pod = pod(container)
    env = podfiles.container_env(the_pod, the_pod["spec"]["containers"][0], lookup,
                                 {"KUBERNETES_SERVICE_HOST": "127.0.0.1"}, ALLOCATABLE)
    assert env == {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "CFG_MODE": "fast", "CFG_LEVEL": "3",
                   "user": "bob", "password": "s3cret", "URL": "https://127.0.0.1:fast",
                   "CPU": "250"}


def test_env_from_a_missing_source_is_an_error_unless_optional():
    the_pod = pod({"envFrom": [{"secretRef": {"name": "absent"}}]})
    with pytest.raises(KeyError, match='secret "absent" not found'):
        podfiles.container_env(the_pod, the_pod["spec"]["containers"][0], lookup)


def kube_api_access(default_mode=0o644):
    """The volume ServiceAccount admission adds to every pod."""
    return {"name": "kube-api-access-abcde", "projected": {"defaultMode": default_mode, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                              "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}


class Tokens:
    def __init__(self):
        self.written = []

    def __call__(self, source, path, mode, owner):
        self.written.append((source["path"], mode, owner))
        path.write_bytes(b"jwt")
        path.chmod(mode)


def test_projected_service_account_volume(tmp_path):
    tokens = Tokens()
    dirs = volumes.write_volumes(pod(volumes=[kube_api_access()]), tmp_path, lookup, tokens)
    directory = dirs["kube-api-access-abcde"]
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "namespace", "token"]
    assert (directory / "namespace").read_text() == "team-a"
    assert (directory / "ca.crt").read_bytes().startswith(b"-----BEGIN CERTIFICATE")
    assert tokens.written == [("token", 0o644, None)]  # no fsUser or fsGroup: defaultMode
    assert stat.S_IMODE((directory / "ca.crt").stat().st_mode) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_projected_token_under_fs_group_is_0640_for_the_pods_user(tmp_path):
    tokens = Tokens()
    the_pod = pod(volumes=[kube_api_access()],
                  securityContext={"runAsUser": 1000, "fsGroup": 2000})
    dirs = volumes.write_volumes(the_pod, tmp_path, lookup, tokens)
    assert tokens.written == [("token", 0o600, 1000)]
    token = dirs["kube-api-access-abcde"] / "token"
    assert (stat.S_IMODE(token.stat().st_mode), token.stat().st_gid) == (0o640, 2000)


def test_downward_api_volume_labels_and_resources(tmp_path):
    volume = {"name": "info", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "mem", "resourceFieldRef": {"containerName": "main",
                                             "resource": "limits.memory", "divisor": "1Mi"},
         "mode": 0o600}]}}
    dirs = volumes.write_volumes(pod(volumes=[volume]), tmp_path, lookup, None, ALLOCATABLE)
    assert (dirs["info"] / "labels").read_text() == 'app="x"\ntier="b"'
    assert (dirs["info"] / "mem").read_text() == "1024"
    assert stat.S_IMODE((dirs["info"] / "mem").stat().st_mode) == 0o600


def test_optional_secret_volume_may_be_missing_but_a_required_key_may_not(tmp_path):
    optional = {"name": "maybe", "secret": {"secretName": "absent", "optional": True}}
    dirs = volumes.write_volumes(pod(volumes=[optional]), tmp_path, lookup)
    assert list(dirs["maybe"].iterdir()) == []
    missing_key = {"name": "c", "configMap": {"name": "settings",
                                              "items": [{"key": "nope", "path": "x"}]}}
    with pytest.raises(KeyError, match="non-existent config key: nope"):
        volumes.write_volumes(pod(volumes=[missing_key]), tmp_path, lookup)


def test_empty_dir_is_writable_by_any_user_of_the_pod(tmp_path):
    dirs = volumes.write_volumes(pod(volumes=[{"name": "scratch", "emptyDir": {}}]), tmp_path,
                                 lookup)
    assert stat.S_IMODE(dirs["scratch"].stat().st_mode) == 0o777
    assert volumes.read_only_kind({"name": "s", "secret": {}})
    assert not volumes.read_only_kind({"name": "scratch", "emptyDir": {}})


def test_labels_file_quotes_values_like_the_kubelet():
    the_pod = pod()
    the_pod["metadata"]["annotations"] = {"note": 'say "hi"'}
    assert podfiles.field_value(the_pod, "metadata.annotations") == 'note="say \\"hi\\""'
