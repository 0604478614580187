"""A local stand-in for ``python:3.11.14-slim-bookworm``, made from Debian's own packages.

No container registry is reachable from the machines this project is developed and tested on,
but Debian's package mirror is. So the images' base is made here: ``debootstrap --variant=minbase
bookworm`` with Python 3.11 and pip, turned into an image by ``buildah from scratch`` + ``buildah
add``. It is what the Dockerfiles rely on: ``python``, ``python3`` and ``pip`` on PATH, ``pip
install`` as root system-wide with console scripts in /usr/local/bin, Python 3.11, ``useradd``,
and apt reading the same Debian suites as the official image (bookworm, bookworm-updates,
bookworm-security; main), from the mirror this machine's apt uses.

Residual differences from the official image (none matters to our Dockerfiles):
- Python is Debian's 3.11.2 (with Debian's security backports) in /usr/bin, not 3.11.14 built
  from source in /usr/local/bin; root's ``pip install`` lands in
  /usr/local/lib/python3.11/dist-packages (official: .../site-packages), scripts in /usr/local/bin
  in both.
- pip is Debian's 23.0.1 (official: 24.x), with Debian's setuptools and wheel beside it.
- Debian's EXTERNALLY-MANAGED marker is removed (the official image has none), so ``pip
  install`` as root works as there.
- No PYTHON_VERSION, PYTHON_SHA256 or GPG_KEY environment variables.
- An empty /etc/pip.conf: the mount point of the pip config of the builds
  (:mod:`.wheelhouse`); buildah 1.28 leaves a mount point it had to create in the image (an
  empty file, mode 0755), so it is made here once, harmless, rather than in every image.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

SUITE = "bookworm"
# minbase is Debian's "required" packages plus apt (passwd brings useradd); python-is-python3
# gives /usr/bin/python, python3-pip /usr/bin/pip.
PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
# Bump when the recipe below changes in a way the hashed inputs do not show.
RECIPE_VERSION = "2"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SOURCES_DIRS = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def _deb822_entries(text: str) -> list[dict[str, str]]:
    entries = []
    for paragraph in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line.strip().startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields:
            entries.append(fields)
    return entries


def _one_line_entries(text: str) -> list[dict[str, str]]:
    entries = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words[:1] != ["deb"]:
            continue
        words = [w for w in words[1:] if not w.startswith("[")]  # drop [arch=... signed-by=...]
        if len(words) >= 3:
            entries.append({"types": "deb", "uris": words[0], "suites": words[1],
                            "components": " ".join(words[2:])})
    return entries


def host_debian_sources(suite: str = SUITE,
                        places: tuple[Path, ...] = SOURCES_DIRS) -> list[tuple[str, str]]:
    """This machine's apt sources for ``suite`` and its -updates/-security suites.

    Reads ``/etc/apt/sources.list`` and ``/etc/apt/sources.list.d/*.list`` / ``*.sources``
    (deb822), keeping ``deb`` entries with the ``main`` component. Returns ``(uri, suite)`` pairs
    in the order found, the plain ``suite`` first.

    Raises:
        RuntimeError: no entry for ``suite`` itself (then there is no mirror to bootstrap from).
    """
    files: list[Path] = []
    for place in places:
        if place.is_dir():
            files += sorted(p for p in place.iterdir() if p.suffix in (".list", ".sources"))
        elif place.is_file():
            files.append(place)
    pairs: list[tuple[str, str]] = []
    for path in files:
        text = path.read_text()
        entries = _deb822_entries(text) if path.suffix == ".sources" else _one_line_entries(text)
        for entry in entries:
            if ("deb" not in entry.get("types", "").split() or entry.get("enabled") == "no"
                    or "main" not in entry.get("components", "").split()):
                continue
            for uri in entry.get("uris", "").split():
                for name in entry.get("suites", "").split():
                    if name in (suite, f"{suite}-updates", f"{suite}-security"):
                        pairs.append((uri.rstrip("/"), name))
    pairs = list(dict.fromkeys(pairs))
    if not any(name == suite for _, name in pairs):
        raise RuntimeError(f"no apt source for Debian {suite} (main) in "
                           f"{', '.join(str(p) for p in places)}: cannot bootstrap a base image")
    return sorted(pairs, key=lambda pair: pair[1] != suite)


def sources_file(pairs: list[tuple[str, str]]) -> str:
    """The base image's ``/etc/apt/sources.list.d/debian.sources`` (deb822) for ``pairs``."""
    by_uri: dict[str, list[str]] = {}
    for uri, name in pairs:
        by_uri.setdefault(uri, []).append(name)
    return "\n".join(f"Types: deb\nURIs: {uri}\nSuites: {' '.join(names)}\nComponents: main\n"
                     f"Signed-By: {KEYRING}\n" for uri, names in by_uri.items())


def base_tag(pairs: list[tuple[str, str]]) -> str:
    """The base image's tag: the suite, Python and a hash of the recipe and the apt sources."""
    recipe = "\n".join([RECIPE_VERSION, SUITE, *PACKAGES, sources_file(pairs)])
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    return f"localhost/monarch-base:{SUITE}-python3.11-{digest}"


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    return [point for point in points if point == prefix or point.startswith(prefix + "/")]


def _remove_tree(path: Path) -> None:
    """Delete a bootstrap folder, refusing while anything is mounted under it (debootstrap
    mounts /proc and /sys there while it runs): rm -rf through such a mount would reach the
    host's files."""
    if not path.exists():
        return
    mounts = _mounts_under(path)
    if mounts:
        raise RuntimeError(f"refusing to delete {path}: still mounted there: {mounts}")
    shutil.rmtree(path)


def bootstrap_rootfs(work: Path, pairs: list[tuple[str, str]],
                     progress: Callable[[str], None]) -> Path:
    """Run debootstrap into ``work/rootfs`` and write ``work/rootfs.tar`` from it.

    The tree is trimmed as a container image's: apt lists, downloaded .debs, the host's
    resolv.conf and hostname and /dev's nodes removed (the runtime provides them); apt's sources
    are those of :func:`sources_file`; Debian's EXTERNALLY-MANAGED marker is removed.
    Returns the tar's path; deletes the tree.

    Raises:
        RuntimeError: debootstrap failed (its command and the end of its log in the message).
    """
    rootfs = work / "rootfs"
    _remove_tree(rootfs)
    work.mkdir(parents=True, exist_ok=True)
    mirror = pairs[0][0]
    command = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
               SUITE, str(rootfs), mirror]
    progress(f"base: {' '.join(command)} (about 1-3 min)")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        log = rootfs / "debootstrap" / "debootstrap.log"
        tail = (log.read_text()[-2000:] if log.exists() else "") + result.stderr[-2000:]
        raise RuntimeError(f"debootstrap failed (exit {result.returncode}): "
                           f"{' '.join(command)}\n{tail.strip()}")
    if _mounts_under(rootfs):
        raise RuntimeError(f"debootstrap left mounts under {rootfs}: {_mounts_under(rootfs)}")
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(sources_file(pairs))
    for marker in (rootfs / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/archives/*.deb", "var/cache/apt/*.bin",
                    "dev/*", "var/log/*.log", "var/log/apt/*"):
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for name in ("etc/resolv.conf", "etc/hostname"):
        (rootfs / name).unlink(missing_ok=True)
    (rootfs / "etc/resolv.conf").touch()
    (rootfs / "etc/pip.conf").touch(mode=0o644)
    tar_path = work / "rootfs.tar"
    command = ["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", str(rootfs),
               "-cf", str(tar_path), "."]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {result.returncode}): "
                           f"{result.stderr.strip()[-2000:]}")
    _remove_tree(rootfs)
    return tar_path
