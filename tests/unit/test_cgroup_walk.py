"""Walking a node's cgroups while the kubelet and runc remove some of them (localcluster.node):
a folder that vanishes is left out, never an error (a Path.rglob raised FileNotFoundError under
load in the real-node tests)."""

import os
from pathlib import Path

from monarch_operator.localcluster.node import node


def test_the_walk_lists_every_folder_and_nothing_for_a_gone_root(tmp_path: Path) -> None:
    root = tmp_path / "mlc-n1"
    (root / "kubepods" / "pod1" / "c1").mkdir(parents=True)
    (root / "kubepods" / "pod2").mkdir(parents=True)
    (root / "cgroup.procs").write_text("1\n")
    found = {path.relative_to(tmp_path).as_posix() for path in node._cgroup_tree(root)}
    assert found == {"mlc-n1", "mlc-n1/kubepods", "mlc-n1/kubepods/pod1",
                     "mlc-n1/kubepods/pod1/c1", "mlc-n1/kubepods/pod2"}
    assert node._cgroup_tree(tmp_path / "gone") == []


class _Listing:
    """What os.scandir returns: an iterator that is its own context manager."""

    def __init__(self, entries: list) -> None:
        self.entries = iter(entries)

    def __enter__(self) -> "_Listing":
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def __iter__(self) -> "_Listing":
        return self

    def __next__(self):
        return next(self.entries)


def test_a_folder_removed_during_the_walk_is_left_out(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "mlc-n1"
    (root / "pod1" / "c1").mkdir(parents=True)
    (root / "pod2" / "c2").mkdir(parents=True)
    real_scandir = os.scandir

    def racing_scandir(path):  # the first listing done, pod1 goes as the kubelet removes it
        entries = real_scandir(path)
        if Path(path) == root:
            listed = list(entries)
            for folder in (root / "pod1" / "c1", root / "pod1"):
                folder.rmdir()
            return _Listing(listed)
        return entries

    monkeypatch.setattr(os, "scandir", racing_scandir)
    found = {path.relative_to(root).as_posix() for path in node._cgroup_tree(root)}
    assert found == {".", "pod2", "pod2/c2"}
