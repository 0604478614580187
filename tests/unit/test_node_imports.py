"""The disk the real nodes' image imports need (``localcluster/node/imports.py``): by layer,
with the blobs ``ctr images import`` holds while it unpacks, side by side or in turn."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from monarch_operator.localcluster.node import imports

GIB = 2**30
TORCH, BASE, OURS, EXAMPLES, OPERATOR = "torch.tar", "base.tar", "ours.tar", "ex.tar", "op.tar"
SIZES = {TORCH: 5.2 * GIB, BASE: 0.3 * GIB, OURS: 0.1 * GIB, EXAMPLES: 0.05 * GIB,
         OPERATOR: 0.35 * GIB}
# The archives of this machine's images (2026-12-05), by the layers they share.
LAYERS = {"worker.tar": [BASE, TORCH, OURS], "examples.tar": [BASE, TORCH, OURS, EXAMPLES],
          "operator.tar": [BASE, OPERATOR]}


class _Usage:
    def __init__(self, free_gib: float):
        self.free = int(free_gib * GIB)


def _layers(archive: Path) -> dict[str, int]:
    return {name: int(SIZES[name]) for name in LAYERS[archive.name]}


def _node(tmp_path: Path, index: int, archives: list[str], present: set[str] = frozenset()):
    root = tmp_path / "containerd" / f"node-{index}"
    return imports.NodeImports(root=root, archives=tuple(tmp_path / a for a in archives),
                               present=frozenset(present))


def test_a_node_holds_the_new_layers_in_flight_twice_at_the_peak(tmp_path):
    peak, kept = _node(tmp_path, 0, ["worker.tar", "examples.tar"]).cost(_layers)
    worker = sum(SIZES[name] for name in LAYERS["worker.tar"])
    assert kept == pytest.approx(worker + SIZES[EXAMPLES], abs=4)
    # The worker's blobs and its unpacked layers (11.2 GiB, measured 11.65 per node); then the
    # examples image streams only its one new layer (ocistream.py), on top of what the worker
    # left: less than the worker's peak.
    assert peak == pytest.approx(2 * worker, abs=4)


def test_an_empty_disk_pair_imports_side_by_side_when_both_peaks_fit(tmp_path):
    cold = [_node(tmp_path, i, ["worker.tar"]) for i in (0, 1)]
    both = 4 * 5.6 + imports.IMPORT_MARGIN_GIB
    assert imports.plan(cold, usage=lambda _: _Usage(both + 0.1), layers=_layers) is True


def test_nodes_take_turns_when_only_one_peak_fits(tmp_path):
    """Cold roots, 20.6 GiB free (stop 42's CI): side by side needs 24.4, in turn 18.8 (the
    first node's kept 5.6 and the second's peak 11.2)."""
    cold = [_node(tmp_path, i, ["worker.tar"]) for i in (0, 1)]
    assert imports.plan(cold, usage=lambda _: _Usage(20.6), layers=_layers) is False


def test_refused_before_any_import_when_not_even_one_node_at_a_time_fits(tmp_path):
    cold = [_node(tmp_path, i, ["worker.tar"]) for i in (0, 1)]
    with pytest.raises(RuntimeError) as refused:
        imports.plan(cold, usage=lambda _: _Usage(15.0), layers=_layers)
    message = str(refused.value)
    assert "only 15.0 GiB free" in message
    assert "about 19 GiB even one node at a time (24 side by side" in message
    assert "monarch-localcluster down" in message


def test_an_image_sharing_the_nodes_layers_needs_its_blobs_only(tmp_path):
    """Stop 42's CI: the worker imported, the examples and operator images to come, 20.6 GiB
    free. Counting each archive whole asked for 25 GiB and refused; by layer each node needs
    the examples archive's blobs for a moment and the operator's new layers (~12 GiB both)."""
    present = set(LAYERS["worker.tar"])
    warm = [_node(tmp_path, i, ["examples.tar", "operator.tar"], present) for i in (0, 1)]
    peak, kept = warm[0].cost(_layers)
    assert kept == pytest.approx(SIZES[EXAMPLES] + SIZES[OPERATOR], abs=4)
    assert peak < 6 * GIB
    assert imports.plan(warm, usage=lambda _: _Usage(20.6), layers=_layers) is True


def test_nodes_with_nothing_to_import_need_nothing(tmp_path):
    done = [_node(tmp_path, i, []) for i in (0, 1)]
    assert imports.plan(done, usage=lambda _: _Usage(0.0), layers=_layers) is True


def _docker_archive(path: Path, layers: dict[str, bytes], manifest: list | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        entries = manifest if manifest is not None else [{"Layers": list(layers)}]
        for name, data in {"manifest.json": json.dumps(entries).encode(), **layers}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_layers_are_read_from_the_archives_manifest(tmp_path):
    archive = _docker_archive(tmp_path / "a.tar", {"aaa.tar": b"x" * 700, "bbb.tar": b"y" * 5})
    assert imports.archive_layers(archive) == {"aaa.tar": 700, "bbb.tar": 5}
    broken = _docker_archive(tmp_path / "b.tar", {"aaa.tar": b"x"},
                             manifest=[{"Layers": ["aaa.tar", "gone.tar"]}])
    with pytest.raises(RuntimeError, match="names layer gone.tar, which the archive lacks"):
        imports.archive_layers(broken)
    plain = tmp_path / "c.tar"
    with tarfile.open(plain, "w"):
        pass
    with pytest.raises(RuntimeError, match="is not a docker-archive"):
        imports.archive_layers(plain)


def test_a_nodes_record_of_unpacked_layers_grows_with_each_import(tmp_path):
    root = tmp_path / "node-0"
    root.mkdir()
    assert imports.unpacked_layers(root) == set()
    imports.record_layers(root, ["aaa.tar"])
    imports.record_layers(root, ["bbb.tar", "aaa.tar"])
    assert imports.unpacked_layers(root) == {"aaa.tar", "bbb.tar"}
