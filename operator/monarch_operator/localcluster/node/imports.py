"""How much disk the nodes' image imports take, and whether they run side by side or in turn.

A node imports an archive as an OCI layout stream of the layers it lacks (:mod:`.ocistream`);
``ctr images import --discard-unpacked-layers`` writes those into the content store, unpacks
them, then drops the blobs. So while one archive imports a node holds its new layers twice (the
blobs and the unpacked layers); afterwards only the unpacked layers stay. Measured on this
machine (2026-12-05, with whole archives then): two nodes importing the 5.6 GiB worker archive
at once into empty roots took 23.3 GiB at the peak and kept 11.6.

Our images share most of their bytes (torch's layer is in each), so the estimate goes by layer:
an archive's layers are named by their digest in its ``manifest.json``, and each node records
the layers it has unpacked (``monarch-layers.json`` in its containerd root).
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Besides the layers, what an import may need on top (containerd's metadata, overlayfs' block
# rounding of many small files, a kubelet's logs) and what the machine should keep free, in GiB.
IMPORT_MARGIN_GIB = 2.0
LAYERS_RECORD = "monarch-layers.json"


def archive_layers(archive: Path) -> dict[str, int]:
    """The layers of a docker-archive (as ``buildah push docker-archive:`` writes it).

    Args:
        archive: the ``.tar`` file; only its member headers and ``manifest.json`` are read
            (milliseconds for a 6 GB archive).

    Returns:
        layer name (its digest file name in the archive) -> size in bytes, in the manifest's
        order (base first).

    Raises:
        RuntimeError: not a docker-archive (no ``manifest.json`` or a layer it names missing).
    """
    with tarfile.open(archive) as tar:
        sizes = {member.name: member.size for member in tar.getmembers()}
        manifest = tar.extractfile("manifest.json") if "manifest.json" in sizes else None
        if manifest is None:
            raise RuntimeError(f"{archive} is not a docker-archive: it has no manifest.json")
        entries = json.load(manifest)
    layers: dict[str, int] = {}
    for entry in entries:
        for name in entry.get("Layers", []):
            if name not in sizes:
                raise RuntimeError(f"{archive}: manifest.json names layer {name}, "
                                   f"which the archive lacks")
            layers[name] = sizes[name]
    return layers


def unpacked_layers(root: Path) -> set[str]:
    """The layer names a node's containerd root holds unpacked, from its record (empty for a
    new root or one from before the record existed: its imports are then counted whole)."""
    record = root / LAYERS_RECORD
    return set(json.loads(record.read_text())) if record.exists() else set()


def record_layers(root: Path, layers: Iterable[str]) -> None:
    """Add ``layers`` to the node's record once an import of them has succeeded."""
    record = root / LAYERS_RECORD
    record.write_text(json.dumps(sorted(unpacked_layers(root) | set(layers))))


@dataclass(frozen=True)
class NodeImports:
    """One node's imports to come.

    Attributes:
        root: the node's containerd root (where the layers land).
        archives: the archives it lacks, in the order it imports them.
        present: the layer names it holds unpacked already (:func:`unpacked_layers`).
    """

    root: Path
    archives: tuple[Path, ...]
    present: frozenset[str]

    def cost(self, layers: Callable[[Path], dict[str, int]] = archive_layers
             ) -> tuple[int, int]:
        """``(peak, kept)`` in bytes: the most this node's imports hold at once on its disk
        (everything kept so far, plus the new layers of the archive in flight twice: as blobs
        and unpacked), and what stays once they are done (the new layers)."""
        seen = set(self.present)
        kept = peak = 0
        for archive in self.archives:
            sizes = layers(archive)
            new = sum(size for name, size in sizes.items() if name not in seen)
            peak = max(peak, kept + 2 * new)
            kept += new
            seen.update(sizes)
        return peak, kept


def plan(nodes: list[NodeImports], usage: Callable[[Path], Any] = shutil.disk_usage,
         layers: Callable[[Path], dict[str, int]] = archive_layers) -> bool:
    """Whether the nodes may import side by side (True) or must take turns (False), before any
    import starts: a disk that fills up during ``ctr images import`` leaves half-imported layers
    behind and a traceback (stop 42's CI: a check that counted every archive whole refused 25 GiB
    on a disk with 20.6 free, where the imports needed about 12).

    Args:
        nodes: each node's imports to come; nodes without any are ignored.
        usage: ``shutil.disk_usage``'s kind (free bytes), for tests.
        layers: :func:`archive_layers`' kind, for tests.

    Returns:
        True when every disk holding node roots has room for all of its nodes' peaks at once
        and :data:`IMPORT_MARGIN_GIB`; False when it has room only for one node at a time (each
        earlier node's kept layers and the next one's peak).

    Raises:
        RuntimeError: not even one node at a time fits; the message gives the free space, the
            need, and what may be deleted.
    """
    by_disk: dict[int, tuple[Path, list[tuple[int, int]]]] = {}
    for node in nodes:
        if not node.archives:
            continue
        folder = node.root
        while not folder.exists():
            folder = folder.parent
        _, costs = by_disk.setdefault(folder.stat().st_dev, (folder, []))
        costs.append(node.cost(layers))
    together = True
    margin = IMPORT_MARGIN_GIB * 2**30
    for folder, costs in by_disk.values():
        free = usage(folder).free
        if free >= sum(peak for peak, _ in costs) + margin:
            continue
        together = False
        kept = 0
        in_turn = 0
        for peak, node_kept in costs:
            in_turn = max(in_turn, kept + peak)
            kept += node_kept
        if free < in_turn + margin:
            raise RuntimeError(
                f"only {free / 2**30:.1f} GiB free on the disk of {folder}, importing the images "
                f"into the real nodes needs about {(in_turn + margin) / 2**30:.0f} GiB even one "
                f"node at a time ({(sum(p for p, _ in costs) + margin) / 2**30:.0f} side by "
                f"side; docs/development.md#disk). To free more: `monarch-localcluster down`, "
                f"then delete older image archives in ~/.cache/monarch-operator/images, "
                f"~/.cache/go-build (Go's build cache), or the nodes' containerd roots under "
                f"~/.cache/monarch-operator/containerd (the nodes import the images again)")
    return together
