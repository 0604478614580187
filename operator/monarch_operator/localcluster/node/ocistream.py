"""A docker-archive handed to a node's containerd as an OCI image layout holding only the
layers the node has not unpacked yet.

``ctr images import`` of a docker-archive reads every layer of it into the content store and
digests it, even one whose snapshot the node has: it needs each layer's bytes to tell its media
type. Our images share their big layers (torch's is in the worker, examples and MPI images), and
a change to our code makes new archives of about 6 GB each whose new layers are a few MB: each
node then read, wrote and hashed some 12 GB for them (about 2 minutes of the end-to-end tests'
start and a third of a core, CI of 2026-12-07).

An OCI image layout names each layer in its manifest, with its digest and media type, so
containerd needs a layer's bytes only to unpack it, and its unpacker skips a layer whose
snapshot (named by the layer's chain ID) exists: the same end as before (``ctr``'s
``--discard-unpacked-layers`` drops the blobs after the unpack anyway), from a stream of the
image's config, its manifest and its new layers. The manifest uses Docker's media types, as
containerd's own docker-archive importer writes them, so the image is the one it was.

Formats: Docker's image archive (``manifest.json``, the config and the uncompressed layer tars,
``buildah push docker-archive:``), the OCI image layout
(https://github.com/opencontainers/image-spec/blob/main/image-layout.md), chain IDs
(https://github.com/opencontainers/image-spec/blob/main/config.md#layer-chainid).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import posixpath
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
# The annotation containerd names an imported image by (images.AnnotationImageName).
IMAGE_NAME_ANNOTATION = "io.containerd.image.name"
COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class Layer:
    """One layer of an archive: its member in the tar, its digest (``sha256:<hex>``, of the
    uncompressed tar: its diff ID too), its size in bytes and its chain ID."""

    member: str
    digest: str
    size: int
    chain_id: str


@dataclass(frozen=True)
class ArchiveImage:
    """The one image of a docker-archive: its reference (``RepoTags[0]``), its config's bytes
    and its layers, base first."""

    archive: Path
    ref: str
    config: bytes
    layers: tuple[Layer, ...]


def chain_ids(diff_ids: Iterable[str]) -> list[str]:
    """The chain ID of each layer from the layers' diff IDs, base first: the first is its diff
    ID, each next one ``sha256(<previous chain ID> + " " + <diff ID>)``."""
    found: list[str] = []
    for diff_id in diff_ids:
        found.append(diff_id if not found else "sha256:" + hashlib.sha256(
            f"{found[-1]} {diff_id}".encode()).hexdigest())
    return found


def read_archive(archive: Path) -> ArchiveImage:
    """Read a docker-archive's manifest and config (member headers only for the layers:
    milliseconds for a 6 GB archive).

    Raises:
        RuntimeError: not a docker-archive of one image with a tag, a layer it names is
            missing, or its config's diff IDs do not match its layers.
    """
    with tarfile.open(archive) as tar:
        members = {member.name: member for member in tar.getmembers()}

        def read(name: str) -> bytes:
            handle = tar.extractfile(members[name]) if name in members else None
            if handle is None:
                raise RuntimeError(f"{archive}: member {name} missing from the docker-archive")
            return handle.read()

        entries = json.loads(read("manifest.json"))
        if len(entries) != 1 or not entries[0].get("RepoTags"):
            raise RuntimeError(f"{archive}: a docker-archive of one tagged image expected, "
                               f"manifest.json has {len(entries)} images")
        entry = entries[0]
        config = read(entry["Config"])
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
        names = entry["Layers"]
        if len(diff_ids) != len(names):
            raise RuntimeError(f"{archive}: {len(names)} layers but {len(diff_ids)} diff IDs")
        layers = []
        for name, diff_id, chain_id in zip(names, diff_ids, chain_ids(diff_ids), strict=True):
            member = members.get(name)
            if member is not None and member.issym():  # "<id>/layer.tar -> ../<hex>.tar"
                member = members.get(posixpath.normpath(
                    posixpath.join(posixpath.dirname(name), member.linkname)))
            if member is None or not member.isfile():
                raise RuntimeError(f"{archive}: manifest.json names layer {name}, "
                                   f"which the archive lacks")
            layers.append(Layer(member.name, diff_id, member.size, chain_id))
    return ArchiveImage(archive, entry["RepoTags"][0], config, tuple(layers))


def _descriptor(media_type: str, body: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
            "size": len(body)}


def _add_bytes(out: tarfile.TarFile, name: str, body: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(body)
    info.mode = 0o444
    out.addfile(info, io.BytesIO(body))


def write_layout(image: ArchiveImage, present: set[str], stream: BinaryIO) -> list[Layer]:
    """Write ``image`` to ``stream`` as an OCI image layout tar that holds every layer whose
    chain ID is not in ``present`` (the node's committed snapshots), the config, the manifest
    and an index naming the image ``image.ref``.

    Returns:
        The layers written (those the node's containerd will unpack), base first.
    """
    config = image.config
    config_desc = _descriptor(CONFIG_TYPE, config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config_desc,
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer.digest, "size": layer.size}
                   for layer in image.layers]}).encode()
    settings = json.loads(config)
    manifest_desc = {**_descriptor(MANIFEST_TYPE, manifest),
                     "platform": {"architecture": settings.get("architecture", "amd64"),
                                  "os": settings.get("os", "linux")},
                     "annotations": {IMAGE_NAME_ANNOTATION: image.ref}}
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE,
                        "manifests": [manifest_desc]}).encode()
    sent = [layer for layer in image.layers if layer.chain_id not in present]
    with tarfile.open(fileobj=stream, mode="w|") as out, tarfile.open(image.archive) as source:
        out.copybufsize = COPY_CHUNK
        _add_bytes(out, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(out, "index.json", index)
        _add_bytes(out, f"blobs/sha256/{str(manifest_desc['digest'])[7:]}", manifest)
        _add_bytes(out, f"blobs/sha256/{str(config_desc['digest'])[7:]}", config)
        for layer in sent:
            handle = source.extractfile(layer.member)
            if handle is None:
                raise RuntimeError(f"{image.archive}: layer {layer.member} unreadable")
            info = tarfile.TarInfo(f"blobs/sha256/{layer.digest[7:]}")
            info.size, info.mode = layer.size, 0o444
            out.addfile(info, handle)
    return sent


def run_import(command: list[str], image: ArchiveImage, present: set[str],
               timeout: float = 600) -> tuple[int, str]:
    """Run ``command`` (``ctr images import ... -``) with :func:`write_layout`'s stream of
    ``image`` less the layers in ``present`` on its standard input.

    Returns:
        ``(exit status, its output)``; -9 when it ran past ``timeout`` seconds (then killed).
    """
    with tempfile.TemporaryFile() as output:
        ctr = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=output,
                               stderr=subprocess.STDOUT)
        assert ctr.stdin is not None
        try:
            write_layout(image, present, ctr.stdin)
        except BrokenPipeError:
            pass  # it ended early: its output says why
        finally:
            with contextlib.suppress(BrokenPipeError):
                ctr.stdin.close()
        try:
            code = ctr.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            ctr.kill()
            code = ctr.wait()
        output.seek(0)
        return code, output.read().decode(errors="replace")
