"""The pod's volumes as the kubelet sets them up, written under the pod's directory.

Secret, ConfigMap, downwardAPI and projected volumes (the kubelet's read-only "API data"
volumes), emptyDir, and an empty directory for every other kind. Files get the kubelet's modes
(``defaultMode`` 0644 unless set, ``items[].mode``) and, under ``fsGroup``, its group
(``identity.set_volume_ownership``). Projected ``serviceAccountToken`` sources are written by a
``TokenWriter`` (``serviceaccount.py``), which also refreshes them.

Follows pkg/volume/{secret,configmap,downwardapi,projected,emptydir}. Not emulated: the
kubelet's ``..data`` symlink swap (files are replaced one by one), updates of Secret and
ConfigMap files after the pod started, clusterTrustBundle and podCertificate sources.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from monarch_operator.localcluster import identity, podfiles

DEFAULT_MODE = 0o644  # SecretVolumeSourceDefaultMode, ConfigMap..., DownwardAPI..., Projected...
EMPTY_DIR_MODE = 0o777  # emptyDir: anyone in the pod may write (pkg/volume/emptydir)
# Volume kinds the kubelet always mounts read-only (ReadOnlyAPIDataVolumes).
API_DATA_KINDS = ("secret", "configMap", "downwardAPI", "projected")

# token_writer(serviceAccountToken source, file, mode, owner uid or None): requests the token
# and writes it (serviceaccount.PodTokens.write).
TokenWriter = Callable[[dict[str, Any], Path, int, "int | None"], None]


def volume_kind(volume: dict[str, Any]) -> str:
    """The volume's source kind (``secret``, ``emptyDir``, ``projected``, ...)."""
    return next((key for key in volume if key != "name"), "emptyDir")


def read_only_kind(volume: dict[str, Any]) -> bool:
    """Whether the kubelet mounts this volume read-only whatever ``readOnly`` says."""
    return volume_kind(volume) in API_DATA_KINDS


def write_volumes(pod: dict[str, Any], root: Path, lookup: podfiles.Lookup,
                  token_writer: TokenWriter | None = None,
                  allocatable: dict[str, str] | None = None) -> dict[str, Path]:
    """Materialise the pod's volumes under ``root``.

    Args:
        lookup: reads a Secret's or ConfigMap's data (raises ``KeyError`` when it is missing).
        token_writer: writes projected ``serviceAccountToken`` files; ``None``: such a source
            is an error.
        allocatable: the node's allocatable resources (limits a container does not set, for
            ``resourceFieldRef`` items).

    Returns:
        Volume name -> directory holding its files.

    Raises:
        KeyError: a Secret, ConfigMap or key that is not optional is missing (the kubelet fails
            the same way and retries).
        ValueError: an unsupported source or field.
    """
    group = identity.fs_group(pod)
    directories: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        directory = root / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        directories[volume["name"]] = directory
        kind = volume_kind(volume)
        source = volume.get(kind) or {}
        if kind == "emptyDir":
            directory.chmod(EMPTY_DIR_MODE)
        default_mode = int(source.get("defaultMode", DEFAULT_MODE))
        if kind in ("secret", "configMap"):
            name = source.get("secretName") or source.get("name")
            _write_key_files(directory, _object_files(pod, kind, {**source, "name": name},
                                                      default_mode, lookup))
        elif kind == "downwardAPI":
            _write_key_files(directory, _downward_files(pod, source, default_mode, allocatable))
        elif kind == "projected":
            _write_projected(pod, directory, source, default_mode, lookup, token_writer,
                             allocatable)
        identity.set_volume_ownership(directory, group, read_only=kind in API_DATA_KINDS)
    return directories


def _object_files(pod: dict[str, Any], kind: str, source: dict[str, Any], default_mode: int,
                  lookup: podfiles.Lookup) -> dict[str, tuple[bytes, int]]:
    """Relative path -> (content, mode) of a Secret or ConfigMap source (``MakePayload``)."""
    namespace, name = pod["metadata"]["namespace"], source["name"]
    kind_name = "Secret" if kind == "secret" else "ConfigMap"
    try:
        data = lookup(kind_name, namespace, name)
    except KeyError:
        if source.get("optional"):
            return {}
        raise
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    files: dict[str, tuple[bytes, int]] = {}
    for item in items:
        if item["key"] not in data and source.get("optional"):
            continue
        if item["key"] not in data:  # the kubelet's words
            raise KeyError(f"configmap references non-existent config key: {item['key']}"
                           if kind == "configMap" else
                           f"references non-existent secret key: {item['key']}")
        files[item["path"]] = (data[item["key"]], int(item.get("mode", default_mode)))
    return files


def _downward_files(pod: dict[str, Any], source: dict[str, Any], default_mode: int,
                    allocatable: dict[str, str] | None) -> dict[str, tuple[bytes, int]]:
    """Relative path -> (content, mode) of a downwardAPI source (``CollectData``)."""
    files: dict[str, tuple[bytes, int]] = {}
    for item in source.get("items") or []:
        if "fieldRef" in item:
            value = podfiles.field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            selector = item["resourceFieldRef"]
            if not selector.get("containerName"):
                raise ValueError(f"downwardAPI item {item['path']}: resourceFieldRef needs "
                                 "containerName in a volume")
            value = podfiles.resource_value(pod, {"name": selector["containerName"]},
                                            selector, allocatable)
        files[item["path"]] = (value.encode(), int(item.get("mode", default_mode)))
    return files


def _write_projected(pod: dict[str, Any], directory: Path, source: dict[str, Any],
                     default_mode: int, lookup: podfiles.Lookup,
                     token_writer: TokenWriter | None,
                     allocatable: dict[str, str] | None) -> None:
    """A projected volume's sources, in order, into one directory (pkg/volume/projected)."""
    owner = identity.fs_user(pod)
    for projection in source.get("sources") or []:
        if "secret" in projection or "configMap" in projection:
            kind = "secret" if "secret" in projection else "configMap"
            _write_key_files(directory, _object_files(pod, kind, projection[kind],
                                                      default_mode, lookup))
        elif "downwardAPI" in projection:
            _write_key_files(directory, _downward_files(pod, projection["downwardAPI"],
                                                        default_mode, allocatable))
        elif "serviceAccountToken" in projection:
            if token_writer is None:
                raise ValueError("serviceAccountToken projection without a token writer")
            token = projection["serviceAccountToken"]
            # Under fsUser or fsGroup the token is 0600 (0640 after the fsGroup pass), owned
            # by the pod's user: projected.go collectData.
            mode = 0o600 if owner is not None or identity.fs_group(pod) is not None \
                else default_mode
            path = directory / token["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            token_writer(token, path, mode, owner)
        else:
            kinds = ", ".join(sorted(projection))
            raise ValueError(f"projected volume source {kinds} is not supported by the local "
                             "agent")


def _write_key_files(directory: Path, files: dict[str, tuple[bytes, int]]) -> None:
    for relative, (content, mode) in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
