"""What each image weighs, layer by layer, and what a change to our code makes a node pull.

Reads the docker-archives the local cluster built (``~/.cache/monarch-operator/images``, one
per image, newest of each name): per layer its size, the Dockerfile step that made it, and the
other images that carry the same layer (a node that has one of them pulls that layer once).
Below each image: the bytes of the layers from the first step that copies a source tree of
ours (``COPY dir:``: the operator's code, the examples) onwards, which is what a change to that code rebuilds and what each
node pulls again; everything above it (the base, apt, torch) stays cached.

Run: ``.venv/bin/python bench/image_layers.py [--images worker examples]`` after any command
that built the images (``scripts/demo.sh``, the tests' real nodes). Issue 36 item 5.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from monarch_operator.localcluster.images import images_dir
from monarch_operator.localcluster.node.imports import archive_layers

MIB = 2**20
OURS = "COPY dir:"  # a step copying a source tree of ours (operator/, examples/)


def newest_archives(names: list[str] | None) -> dict[str, Path]:
    """The newest archive per image name in the image cache (``<name>-<hash>.tar``).

    Returns:
        image name -> archive, sorted by name; only ``names`` when given.

    Raises:
        SystemExit: the cache has none of the images asked for (nothing built yet).
    """
    found: dict[str, Path] = {}
    for path in sorted(images_dir().glob("*-*.tar"), key=lambda p: p.stat().st_mtime):
        name = path.name.rsplit("-", 1)[0]
        if names is None or name in names:
            found[name] = path
    if not found:
        raise SystemExit(f"no image archives in {images_dir()}: build the images first "
                         "(scripts/demo.sh, or monarch-localcluster up --real-nodes 2)")
    return dict(sorted(found.items()))


def steps(archive: Path) -> list[str]:
    """The Dockerfile step (``created_by``) of each layer of ``archive``, base first, from the
    image config's history (steps with ``empty_layer`` make no layer)."""
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    made = [entry.get("created_by", "") for entry in config.get("history", [])
            if not entry.get("empty_layer")]
    return [" ".join(step.replace("/bin/sh -c ", "").replace("#(nop) ", "").split())
            for step in made]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", nargs="*", help="image names (default: every one built)")
    args = parser.parse_args(argv)
    archives = newest_archives(args.images)
    layers = {name: archive_layers(path) for name, path in archives.items()}
    for name, path in archives.items():
        made = steps(path)
        sizes = layers[name]
        print(f"\n{name} ({path.name}): {sum(sizes.values()) / MIB:,.0f} MiB in {len(sizes)} "
              f"layers")
        print(f"  {'MiB':>8}  {'shared with':<24} step")
        changed_from = None
        for index, (layer, size) in enumerate(sizes.items()):
            step = made[index] if index < len(made) else "?"
            shared = ",".join(other for other in layers if other != name and layer in layers[other])
            if changed_from is None and step.startswith(OURS):
                changed_from = index
            print(f"  {size / MIB:8,.1f}  {shared or '-':<24} {step[:90]}")
        if changed_from is not None:
            again = sum(list(sizes.values())[changed_from:])
            print(f"  a change to our code rebuilds and re-pulls {again / MIB:,.1f} MiB "
                  f"(layers {changed_from + 1}-{len(sizes)}); the rest stays cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
