"""What the kubelet would prepare for a container: env values, the hosts file, and what it
reads back when the container ends: the termination message (volume files: ``volumes.py``).

Pure functions over pod dicts plus a ``lookup`` callback for Secrets and ConfigMaps, so they
are tested without a cluster.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable
from typing import Any

from kubernetes.utils.quantity import parse_quantity

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

    ``metadata.labels`` and ``metadata.annotations`` as a whole (downwardAPI volumes only) are
    ``key="value"`` lines, sorted by key, as the kubelet writes them.

    Raises:
        ValueError: a field path this agent does not know.
    """
    label = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if label:
        return str((pod["metadata"].get(label.group(1)) or {}).get(label.group(2), ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = pod["metadata"].get(field_path.split(".")[1]) or {}
        return "\n".join(f"{key}={json.dumps(str(values[key]), ensure_ascii=False)}"
                         for key in sorted(values))
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


def resource_value(pod: dict[str, Any], container: dict[str, Any], selector: dict[str, Any],
                   allocatable: dict[str, str] | None = None) -> str:
    """Value of a downward-API ``resourceFieldRef`` (``limits.cpu``, ``requests.memory``, ...).

    As the kubelet resolves it (pkg/api/v1/resource/helpers.go ``ExtractContainerResourceValue``):
    the container named by ``containerName`` (default ``container``); a limit the container does
    not set is the node's allocatable (kubelet ``defaultPodLimitsForDownwardAPI``); the value is
    divided by ``divisor`` (default 1) and rounded up: CPU in millicores, memory and
    ephemeral-storage in bytes.

    Raises:
        ValueError: an unknown container or resource.
    """
    name = selector.get("containerName") or container["name"]
    target = next((c for key in ("containers", "initContainers")
                   for c in pod["spec"].get(key) or [] if c["name"] == name), None)
    if target is None:
        raise ValueError(f"resourceFieldRef: container {name!r} not found in the pod")
    kind, _, resource = str(selector["resource"]).partition(".")
    if kind not in ("limits", "requests") or resource not in ("cpu", "memory",
                                                               "ephemeral-storage"):
        raise ValueError(f"unsupported container resource : {selector['resource']}")
    resources = (target.get("resources") or {}).get(kind) or {}
    quantity = resources.get(resource)
    if quantity is None and kind == "limits":
        quantity = (allocatable or {}).get(resource)
    amount = parse_quantity(quantity if quantity is not None else 0)
    divisor = parse_quantity(selector.get("divisor") or "1")
    if divisor == 0:
        divisor = parse_quantity("1")
    if resource == "cpu":  # Quantity.MilliValue() rounds up
        return str(math.ceil(math.ceil(amount * 1000) / math.ceil(divisor * 1000)))
    return str(math.ceil(math.ceil(amount) / math.ceil(divisor)))


def container_env(pod: dict[str, Any], container: dict[str, Any], lookup: Lookup,
                  service_env: dict[str, str] | None = None,
                  allocatable: dict[str, str] | None = None) -> dict[str, str]:
    """The container's environment as the kubelet makes it (``makeEnvironmentVariables``).

    ``service_env`` first (the API server's ``KUBERNETES_SERVICE_*``), then ``envFrom`` in
    order (every key of the ConfigMap or Secret, after ``prefix``), then ``env`` in order
    (``value`` with ``$(VAR)`` expansion over what came before, ``fieldRef``,
    ``resourceFieldRef``, ``secretKeyRef``/``configMapKeyRef``); later names win. A source or
    key marked ``optional`` that does not exist is skipped.

    Raises:
        KeyError: a Secret, ConfigMap or key that is not optional is missing (the kubelet's
            words: ``configmap "x" not found``, ``couldn't find key k in Secret ns/x``).
        ValueError: an unsupported ``fieldRef`` or ``resourceFieldRef``.
    """
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = dict(service_env or {})
    for source in container.get("envFrom") or []:
        kind = "Secret" if "secretRef" in source else "ConfigMap"
        ref = source.get("secretRef") or source.get("configMapRef") or {}
        data = _lookup_optional(lookup, kind, namespace, ref)
        for key, value in (data or {}).items():
            env[f"{source.get('prefix') or ''}{key}"] = value.decode()
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or not item.get("valueFrom"):
            env[name] = expand(str(item.get("value") or ""), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_value(pod, container, source["resourceFieldRef"], allocatable)
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
            ref = source.get("secretKeyRef") or source["configMapKeyRef"]
            data = _lookup_optional(lookup, kind, namespace, ref)
            if data is None or (ref.get("optional") and ref["key"] not in data):
                continue
            env[name] = _key(data, ref["key"], kind, f"{namespace}/{ref['name']}").decode()
    return env


def _lookup_optional(lookup: Lookup, kind: str, namespace: str,
                     ref: dict[str, Any]) -> dict[str, bytes] | None:
    """The object's data, or ``None`` when it is missing and ``ref`` says ``optional``."""
    try:
        return lookup(kind, namespace, ref["name"])
    except KeyError:
        if ref.get("optional"):
            return None
        raise


def _key(data: dict[str, bytes], key: str, kind: str, where: str) -> bytes:
    if key not in data:  # the kubelet's words
        raise KeyError(f"couldn't find key {key} in {kind} {where}")
    return data[key]


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
