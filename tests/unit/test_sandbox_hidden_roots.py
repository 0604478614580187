"""A volume mounted over the directory that holds the local cluster's "image" (this checkout,
its venv, Python) must not hide it: the chart's operator pod mounts an emptyDir at /tmp, and a
checkout under /tmp then lost its venv in the pod ("monarch-operator": executable file not
found), found by a newcomer's run of the chart test from a clone in /tmp."""

from __future__ import annotations

from pathlib import Path

from monarch_operator.localcluster import agent, sandbox

ROOTS = [Path("/root/.pyenv/versions/3.11.7/bin/python3.11"), Path("/tmp/clone/.venv"),
         Path("/root/.pyenv/versions/3.11.7"), Path("/tmp/clone")]


def test_an_emptydir_at_tmp_hides_a_checkout_under_tmp_and_it_is_bound_back_whole():
    assert sandbox.hidden_roots(["/tmp", "/var/run/monarch"], ROOTS) == [Path("/tmp/clone")]


def test_a_mount_at_the_root_itself_or_above_it_hides_it_one_elsewhere_does_not():
    assert sandbox.hidden_roots(["/tmp/clone/.venv"], ROOTS) == [Path("/tmp/clone/.venv")]
    assert sandbox.hidden_roots(["/root"], ROOTS) == [Path("/root/.pyenv/versions/3.11.7")]
    assert sandbox.hidden_roots(["/tmp/clonex", "/tm", "/etc/monarch"], ROOTS) == []
    assert sandbox.hidden_roots([], ROOTS) == []


def test_the_agents_mounts_bind_the_hidden_image_back_after_the_volumes(tmp_path):
    """Over the agent's own roots: a volume at the parent of the checkout is followed by a
    bind of the checkout at its own path (before the termination message's file)."""
    parent = str(agent.REPO_ROOT.parent)
    hidden = sandbox.hidden_roots([parent], agent.IMAGE_ROOTS)
    assert agent.REPO_ROOT in hidden
    assert all(not root.is_relative_to(agent.REPO_ROOT) or root == agent.REPO_ROOT
               for root in hidden)
