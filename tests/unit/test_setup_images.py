"""scripts/setup.sh builds every image of the local cluster (localcluster/images.py): those
that need only the wheelhouse while Go still builds the node, the CoreDNS image (which copies the
node's CoreDNS) after it. A new image missing from both lists would not be built by the
set-up; one that needs the node binaries must be in the second."""

from __future__ import annotations

import re
from pathlib import Path

from monarch_operator.localcluster import images

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"


def listed(name: str) -> list[str]:
    found = re.search(rf"^{name}=\(([^)]*)\)", SETUP.read_text(), re.MULTILINE)
    assert found, f"{name}=(...) not in {SETUP}"
    return found.group(1).split()


def test_the_set_up_builds_each_image_once():
    wheel, node = listed("wheel_images"), listed("node_images")
    assert sorted(wheel + node) == sorted(images.IMAGES)


def test_images_staged_from_the_node_binaries_wait_for_the_node():
    node = set(listed("node_images"))
    for name, spec in images.IMAGES.items():
        needs_node = spec.stage is not None and "BUILD_BINARIES" in \
            spec.stage.__code__.co_names
        assert needs_node == (name in node), name
