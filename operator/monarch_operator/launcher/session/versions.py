"""The version fingerprint and the skew guard of the pre-flight (field case C27; monarch #873).

Monarch pickles actor classes and messages between the launcher (the client) and every worker:
a host whose torchmonarch, torch or monarch-operator release, or Python minor version, differs
from the launcher's fails late and obscurely (an attach timeout, an unpickling error, a hang).
Mixed versions are easy to get: a launcher image apart from the worker image, a node image
roll-out, hosts with different environments. So the pre-flight's remote check reports each
host's :data:`COMPONENTS` (:data:`REMOTE_FINGERPRINT` runs there, as :func:`fingerprint` runs
here), and a host that differs is refused with ``VersionSkew`` before any worker starts, naming
each component and both versions.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib import metadata

VERSION_SKEW = "VersionSkew"
# Distributions whose release must match the launcher's, and the Python minor version.
COMPONENTS = ("torchmonarch", "torch", "monarch-operator")
PYTHON = "python"
NOT_INSTALLED = "not installed"

# The same, as Python source for the remote check (a function ``fingerprint()``).
REMOTE_FINGERPRINT = f"""
def fingerprint():
    import sys
    from importlib import metadata
    found = {{"{PYTHON}": "%d.%d" % sys.version_info[:2]}}
    for name in {COMPONENTS!r}:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "{NOT_INSTALLED}"
    return found
"""


def fingerprint() -> dict[str, str]:
    """``{component: version}`` of this Python: each of :data:`COMPONENTS` (``not installed``
    when absent) and ``python`` as ``major.minor``."""
    found = {PYTHON: "%d.%d" % sys.version_info[:2]}
    for name in COMPONENTS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = NOT_INSTALLED
    return found


def skew(launcher: Mapping[str, str], host: Mapping[str, str]) -> list[str]:
    """What differs between the launcher's fingerprint and a host's, one phrase per component
    in :data:`COMPONENTS` order then Python (``torchmonarch 0.6.0 on the host, 0.7.0 on the
    launcher``); ``[]`` when they match. A component the host did not report (an older remote
    check), or that either side does not have, is not compared: whether the host can import
    what the job needs is the pre-flight's ``ImportFailed`` check."""
    differences = []
    for name in (*COMPONENTS, PYTHON):
        if NOT_INSTALLED in (host.get(name, NOT_INSTALLED), launcher.get(name, NOT_INSTALLED)):
            continue
        if host[name] != launcher[name]:
            differences.append(f"{name} {host[name]} on the host, {launcher[name]} on the "
                               "launcher")
    return differences


def describe_skew(differences: list[str]) -> str:
    """The ``VersionSkew`` detail: the differences, and what to do."""
    return ("; ".join(differences) + ": Monarch needs the same releases on the launcher and "
            "every host (use one image for spec.image and spec.launcher.image, or the same "
            "environment on every machine)")
