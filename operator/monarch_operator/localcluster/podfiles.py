"""What the kubelet would prepare for a container: env values, volume files, the hosts file,
and what it reads back when the container ends: the termination message.

Pure functions over pod dicts plus a ``lookup`` callback for Secrets and ConfigMaps, so they
are tested without a cluster.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# lookup(kind, namespace, name) -> the object's data as {key: bytes}
Lookup = Callable[[str, str, str], dict[str, bytes]]

# The kubelet's defaults and limits for termination messages (pkg/kubelet/container/runtime.go:
# MaxContainerTerminationMessageLength, ...LogLines, ...LogLength).
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
MAX_TERMINATION_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined variables are replaced, ``$$`` becomes ``$``,
    undefined references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR_REF.sub(replace, value)


def field_value(pod: dict[str, Any], field_path: str) -> str:
    """Value of a downward-API ``fieldRef`` such as ``status.podIP`` or ``metadata.labels['a']``.

    Raises:
        ValueError: a field path this agent does not know.
    """
    label = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if label:
        return str((pod["metadata"].get(label.group(1)) or {}).get(label.group(2), ""))
    simple = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": (pod.get("status") or {}).get("podIP", ""),
        "status.hostIP": (pod.get("status") or {}).get("hostIP", ""),
    }
    if field_path not in simple:
        raise ValueError(f"fieldRef {field_path!r} is not supported by the local agent")
    return str(simple[field_path])


def container_env(pod: dict[str, Any], container: dict[str, Any], lookup: Lookup) -> dict[str, str]:
    """The container's ``env`` resolved in order (``value``, ``fieldRef``, secret/configMap keys)."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
            ref = source.get("secretKeyRef") or source["configMapKeyRef"]
            env[name] = _key(lookup(kind, namespace, ref["name"]), ref["key"], kind,
                             f"{namespace}/{ref['name']}").decode()
    return env


def _key(data: dict[str, bytes], key: str, kind: str, where: str) -> bytes:
    if key not in data:  # the kubelet's words
        raise KeyError(f"couldn't find key {key} in {kind} {where}")
    return data[key]


def write_volumes(pod: dict[str, Any], root: Path, lookup: Lookup) -> dict[str, Path]:
    """Materialise the pod's secret, configMap and emptyDir volumes under ``root``.

    Returns:
        Volume name -> directory holding its files (mode from ``defaultMode``/``mode``).

    Raises:
        KeyError: a referenced Secret/ConfigMap key is missing (the kubelet fails the same way).
    """
    namespace = pod["metadata"]["namespace"]
    directories: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        directory = root / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        directories[volume["name"]] = directory
        source = volume.get("secret") or volume.get("configMap")
        if source is None:
            continue  # emptyDir and others: an empty directory
        kind = "Secret" if "secret" in volume else "ConfigMap"
        name = source.get("secretName") or source.get("name")
        data = lookup(kind, namespace, name)
        items = source.get("items") or [{"key": key, "path": key} for key in data]
        for item in items:
            path = directory / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_key(data, item["key"], kind, f"{namespace}/{name}"))
            path.chmod(item.get("mode", source.get("defaultMode", 0o644)))
    return directories


def decode_data(obj: dict[str, Any]) -> dict[str, bytes]:
    """``data`` of a Secret (base64) or ConfigMap (text, plus ``binaryData``) as bytes."""
    if obj.get("kind") == "Secret" or obj.get("type"):
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def hosts_file(pods: list[dict[str, Any]], cluster_domain: str = "cluster.local") -> str:
    """An ``/etc/hosts`` for pod processes: what cluster DNS would answer for pods.

    A pod with ``hostname`` and ``subdomain`` (StatefulSet pods behind a headless Service) gets
    ``<ip> <hostname>.<subdomain>.<ns>.svc.<domain> <hostname>``; others ``<ip> <pod name>``.
    Deleting pods are left out, so their names stop resolving.
    """
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or pod["metadata"].get("deletionTimestamp"):
            continue
        spec, namespace = pod["spec"], pod["metadata"]["namespace"]
        hostname = spec.get("hostname") or pod["metadata"]["name"]
        names = [hostname]
        if spec.get("subdomain"):
            names.insert(0, f"{hostname}.{spec['subdomain']}.{namespace}.svc.{cluster_domain}")
        lines.append(f"{ip}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"


def termination_message_path(container: dict[str, Any]) -> str:
    """Where the container writes its termination message (``terminationMessagePath``)."""
    return str(container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH)


def log_tail(log: bytes, max_lines: int = FALLBACK_LOG_LINES,
             max_bytes: int = FALLBACK_LOG_BYTES) -> bytes:
    """The last ``max_lines`` lines of ``log``, then at most its last ``max_bytes`` bytes.

    What the kubelet reports for ``FallbackToLogsOnError`` (tail 80 lines into a 2 KiB ring
    buffer). Passing only the log's last ``max_bytes`` bytes gives the same answer.
    """
    pieces = log.split(b"\n")
    keep = max_lines + 1 if log.endswith(b"\n") else max_lines  # a final newline ends a line
    return b"\n".join(pieces[-keep:])[-max_bytes:]


def termination_message(container: dict[str, Any], exit_code: int, message_file: bytes,
                        log_end: bytes) -> str:
    """``state.terminated.message`` as the kubelet builds it for a container that exited.

    Args:
        container: the pod spec's container (``terminationMessagePolicy``).
        exit_code: how the container ended.
        message_file: the termination message file's last 4096 bytes (what the kubelet reads).
        log_end: the end of the container's log (at least its last 2048 bytes), used with
            ``FallbackToLogsOnError`` when the file is empty and the container failed.
    """
    message = message_file[-MAX_TERMINATION_MESSAGE_BYTES:]
    fallback = container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    if not message and fallback and exit_code != 0:
        message = log_tail(log_end)
    return message.decode("utf-8", "replace")
