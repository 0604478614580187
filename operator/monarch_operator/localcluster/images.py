"""The container images of the local cluster's real node, built here without a daemon.

Each image of :data:`IMAGES` is built with buildah from its Dockerfile in this repository and
written as a docker-archive tar that containerd imports (``ctr -n k8s.io images import F.tar``),
tagged with the reference the chart, the samples and the examples use, so that a kubelet finds
it with ``imagePullPolicy: IfNotPresent``. Archives live in ``~/.cache/monarch-operator/images/``
(or under ``$MONARCH_OPERATOR_CACHE``), named by a hash of everything that goes into the image:
its Dockerfile, the files its COPY lines take from the context (less the context's
.dockerignore), its build arguments and its base image's own hash. An unchanged image costs one
hash check; a change in ``operator/`` rebuilds only the layers from that COPY on (``--layers``).

The worker and operator images are built on a local Debian base (:mod:`.imagebase`) because no
registry is reachable; their pip installs read only the machine's wheelhouse (:mod:`.wheelhouse`),
so torch is never downloaded again. The Dockerfiles stay plain: with docker and a registry they
build as before, with no arguments.

    python -m monarch_operator.localcluster.images build [NAME...]   # prints each archive path
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monarch_operator import __version__
from monarch_operator.localcluster import imagebase, wheelhouse
from monarch_operator.localcluster.buildah import Buildah
from monarch_operator.localcluster.buildcontext import context_files, copied_sources, file_digest

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_BINARIES = Path(__file__).with_name("build-binaries.sh")
# build-binaries.sh's COREDNS_VERSION (tests/unit keeps the two equal).
COREDNS_VERSION = "v1.15.0"
PAUSE_VERSION = "1.0"
# Bump when the way images are built changes in a way the hashed inputs do not show.
RECIPE_VERSION = "1"
# The label each built image carries: its content hash (tells a stale tag from a current one).
HASH_LABEL = "dev.monarch-operator.content-hash"
# IMAGES[...].base naming the local Debian base rather than another image of IMAGES.
DEBIAN_BASE = "debian-base"
# Free space (GiB) a build needs at least: the worker's archive (~6 GB) and its new layers,
# and room for the real nodes to import it.
MIN_FREE_GIB = 10.0


@dataclass(frozen=True)
class ImageSpec:
    """How one image is built.

    ``context``: a repository folder; None when ``stage`` fills a fresh one (for binaries made
    elsewhere). ``base``: :data:`DEBIAN_BASE`, another image's name, or None (``FROM scratch``);
    ``base_arg`` is the build argument that names it. ``wheels``: pip reads the wheelhouse.
    """

    name: str
    ref: str
    dockerfile: str
    context: str | None
    base: str | None = None
    base_arg: str | None = None
    wheels: bool = False
    stage: Callable[[Path], None] | None = field(default=None, compare=False)


def _stage_pause(folder: Path) -> None:
    source = REPO_ROOT / "images" / "pause" / "pause.c"
    command = ["gcc", "-static", "-Os", "-s", "-Wall", "-Werror", "-o", str(folder / "pause"),
               str(source)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {result.returncode}): "
                           f"{result.stderr.strip()} (apt-get install gcc libc6-dev)")


def _stage_coredns(folder: Path) -> None:
    result = subprocess.run(["bash", str(BUILD_BINARIES), "node"], stdout=subprocess.PIPE,
                            stderr=None, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"bash {BUILD_BINARIES} node failed (exit {result.returncode}); "
                           "see the Go output above")
    binary = Path(result.stdout.strip().splitlines()[-1]) / "coredns"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"bash {BUILD_BINARIES} node finished but {binary} is missing")
    shutil.copy2(binary, folder / "coredns")


IMAGES: dict[str, ImageSpec] = {spec.name: spec for spec in (
    ImageSpec("worker", f"ghcr.io/monarch-operator/worker:{__version__}",
              "images/worker/Dockerfile", ".", DEBIAN_BASE, "BASE_IMAGE", wheels=True),
    ImageSpec("operator", f"ghcr.io/monarch-operator/operator:{__version__}",
              "images/operator/Dockerfile", ".", DEBIAN_BASE, "BASE_IMAGE", wheels=True),
    ImageSpec("examples", f"ghcr.io/monarch-operator/examples:{__version__}",
              "examples/Dockerfile", "examples", "worker", "WORKER_IMAGE", wheels=True),
    # The MPI Operator's job in bench/apply_to_first_step.py: the examples plus Open MPI.
    ImageSpec("mpi-peer", f"localhost/monarch-bench-mpi:{__version__}",
              "images/mpi-peer/Dockerfile", "images/mpi-peer", "examples", "EXAMPLES_IMAGE"),
    ImageSpec("pause", f"localhost/monarch-pause:{PAUSE_VERSION}", "images/pause/Dockerfile",
              None, stage=_stage_pause),
    ImageSpec("coredns", f"localhost/monarch-coredns:{COREDNS_VERSION}",
              "images/coredns/Dockerfile", None, stage=_stage_coredns),
)}


def images_dir() -> Path:
    """Where the docker-archive files live: ``<cache>/images``."""
    return wheelhouse.cache_root() / "images"


def storage() -> Buildah:
    """The project's buildah storage: ``<cache>/buildah``."""
    return Buildah(wheelhouse.cache_root() / "buildah")


# --- What goes into an image -----------------------------------------------------------------

def content_hash(spec: ImageSpec, context: Path, base_identity: str,
                 build_args: dict[str, str]) -> str:
    """The hash that names ``spec``'s archive: recipe, ref, Dockerfile, build arguments, the
    base's identity and every file the Dockerfile copies from ``context`` (path, mode, bytes)."""
    dockerfile = (REPO_ROOT / spec.dockerfile).read_bytes()
    digest = hashlib.sha256()
    for part in (RECIPE_VERSION, spec.ref, base_identity, *sorted(build_args.items())):
        digest.update(repr(part).encode() + b"\0")
    digest.update(dockerfile + b"\0")
    for path in context_files(context, copied_sources(dockerfile.decode())):
        mode = path.lstat().st_mode & 0o7777
        digest.update(f"{path.relative_to(context).as_posix()}\0{mode:o}\0"
                      f"{file_digest(path)}\0".encode())
    return digest.hexdigest()[:16]


# --- Building --------------------------------------------------------------------------------

@contextmanager
def _lock(progress: Callable[[str], None]) -> Iterator[None]:
    """One image build at a time on this machine (tests and a node may ask together)."""
    images_dir().mkdir(parents=True, exist_ok=True)
    with (images_dir() / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another image build to finish ({images_dir() / '.lock'})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _archive(name: str, content: str) -> Path:
    return images_dir() / f"{name}-{content}.tar"


def check_free_space(folder: Path, need_gib: float = MIN_FREE_GIB,
                     usage: Callable[[Path], Any] = shutil.disk_usage,
                     replaced: list[Path] | None = None, needed_for: str = "a build") -> None:
    """Refuse to start a build (or what ``needed_for`` names) that the disk holding ``folder``
    cannot take.

    Args:
        folder: where the build writes (the image cache); ``usage(folder).free`` is in bytes.
        need_gib: the free space a build needs, in GiB (:data:`MIN_FREE_GIB`).
        replaced: the image's older archives, which the build deletes before it writes the new
            one (:func:`_export`): their bytes count as free. A changed worker image on a disk
            with 9 GiB free and its 6 GB archive to replace is a build that fits (stop 39's CI
            refused it).
        needed_for: what needs the space, for the message.

    Raises:
        RuntimeError: less than ``need_gib`` free, counting ``replaced``; the message says how
            much there is and what may be deleted.
    """
    free_gib = usage(folder).free / 2**30
    reclaimable = sum(path.stat().st_size for path in replaced or [] if path.exists()) / 2**30
    if free_gib + reclaimable < need_gib:
        also = f" (and {reclaimable:.1f} GiB in archives it replaces)" if reclaimable else ""
        raise RuntimeError(disk_advice(folder, f"only {free_gib:.1f} GiB free on the disk of "
                                               f"{folder}{also}, {needed_for} needs about "
                                               f"{need_gib:.0f}"))


def disk_advice(folder: Path, what: str) -> str:
    """``what`` (a sentence about the full disk) followed by what may be deleted to go on."""
    cache = folder.parent
    return (f"{what} GiB (buildah's layers, the image archive, each real node's import; "
            f"docs/development.md#disk). Each build replaces its image's older archive in "
            f"{folder}; to free more: `monarch-localcluster down`, then delete "
            f"{cache / 'containerd'} (the nodes import the images again, ~2 min) or "
            f"~/.cache/go-build (Go's build cache).")


def _stale(name: str, keep: Path) -> list[Path]:
    """Image ``name``'s archives other than ``keep``, half-written ones (a failed export's
    ``.tar.partial``) included."""
    return [path for path in images_dir().glob(f"{name}-*.tar*")
            if path != keep and path.name.endswith((".tar", ".tar.partial"))]


def _drop_stale(name: str, keep: Path) -> list[Path]:
    """Delete :func:`_stale` archives of image ``name``; returns what was deleted."""
    stale = _stale(name, keep)
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def ensure_base(buildah: Buildah, progress: Callable[[str], None]) -> str:
    """Return the local Debian base's reference, bootstrapping it into ``buildah`` if missing
    (about 2 minutes). Raises RuntimeError when debootstrap or buildah fails."""
    pairs = imagebase.host_debian_sources()
    ref = imagebase.base_tag(pairs)
    if buildah.image_config(ref) is not None:
        return ref
    started = time.monotonic()
    tar = imagebase.bootstrap_rootfs(buildah.root.parent / "base-build", pairs, progress)
    container = buildah.run("from", "--pull=never", "scratch").stdout.strip()
    try:
        progress(f"base: importing {tar.stat().st_size / 1e6:.0f} MB root file system")
        buildah.run("add", container, str(tar), "/")
        buildah.run("config", "--env", "LANG=C.UTF-8",
                    "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--cmd", "python3", "--label", f"{HASH_LABEL}={ref.rsplit('-', 1)[-1]}",
                    container)
        buildah.run("commit", "--quiet", container, ref)
    finally:
        buildah.run("rm", container, check=False)
        tar.unlink(missing_ok=True)
    progress(f"base: {ref} in {time.monotonic() - started:.0f} s")
    return ref


@dataclass
class _Plan:
    spec: ImageSpec
    context: Path
    build_args: dict[str, str]
    content: str
    built: bool = False


def _plan(name: str, staging: Path, memo: dict[str, _Plan]) -> _Plan:
    """What building ``name`` takes and its content hash (its bases' hashes first)."""
    if name in memo:
        return memo[name]
    spec = IMAGES[name]
    if spec.context is None:
        context = staging / name
        context.mkdir(parents=True)
        assert spec.stage is not None
        spec.stage(context)
    else:
        context = REPO_ROOT / spec.context
    build_args: dict[str, str] = {}
    base_identity = "scratch"
    if spec.base == DEBIAN_BASE:
        base_identity = imagebase.base_tag(imagebase.host_debian_sources())
    elif spec.base is not None:
        base_identity = _plan(spec.base, staging, memo).content
    if spec.base is not None and spec.base_arg:
        build_args[spec.base_arg] = (base_identity if spec.base == DEBIAN_BASE
                                     else IMAGES[spec.base].ref)
    memo[name] = _Plan(spec, context, build_args, content_hash(spec, context, base_identity,
                                                               build_args))
    return memo[name]


def _build(plan: _Plan, buildah: Buildah, progress: Callable[[str], None]) -> None:
    spec = plan.spec
    args = ["build", "--isolation", "chroot", "--pull=never", "--layers", "--force-rm",
            "--label", f"{HASH_LABEL}={plan.content}", "-f", str(REPO_ROOT / spec.dockerfile),
            "-t", spec.ref]
    for key, value in plan.build_args.items():
        args += ["--build-arg", f"{key}={value}"]
    if spec.wheels:
        wheels = wheelhouse.ensure_wheelhouse(progress)
        pip_conf = wheels.parent / "images" / "pip.conf"
        pip_conf.write_text(wheelhouse.pip_config())
        args += ["--volume", f"{wheels}:{wheelhouse.MOUNT_POINT}:ro",
                 "--volume", f"{pip_conf}:{wheelhouse.PIP_CONF_MOUNT}:ro"]
    buildah.stream([*args, str(plan.context)], images_dir() / "logs" / f"{spec.name}.log",
                   spec.name, progress)


def _export(plan: _Plan, buildah: Buildah, progress: Callable[[str], None]) -> Path:
    """Write the docker-archive (atomically) and delete this image's older archives."""
    target = _archive(plan.spec.name, plan.content)
    partial = target.with_name(target.name + ".partial")
    _drop_stale(plan.spec.name, target)  # before writing: the old archive's space is needed
    progress(f"{plan.spec.name}: writing {target.name}")
    buildah.run("push", "--quiet", plan.spec.ref, f"docker-archive:{partial}:{plan.spec.ref}")
    partial.replace(target)
    return target


def _prune(buildah: Buildah) -> None:
    """Drop what no current image needs: older local bases, then untagged images that no tagged
    one builds on (earlier builds' layers; the current layer caches stay)."""
    current = imagebase.base_tag(imagebase.host_debian_sources())
    listed = buildah.run("images", "--noheading", "--format", "{{.Name}}:{{.Tag}}").stdout
    for ref in listed.split():
        if ref.startswith(current.split(":")[0] + ":") and ref != current:
            buildah.run("rmi", ref, check=False)
    buildah.run("rmi", "--prune", check=False)


def _ensure(name: str, plans: dict[str, _Plan], buildah: Buildah, need_local: bool,
            progress: Callable[[str], None]) -> Path:
    plan = plans[name]
    archive = _archive(name, plan.content)
    local = buildah.label(plan.spec.ref, HASH_LABEL) == plan.content
    if archive.exists() and (local or not need_local):
        return archive
    if not local:
        check_free_space(images_dir(), replaced=_stale(name, archive))
        started = time.monotonic()
        if plan.spec.base == DEBIAN_BASE:
            ensure_base(buildah, progress)
        elif plan.spec.base is not None:
            _ensure(plan.spec.base, plans, buildah, True, progress)
        progress(f"{name}: building {plan.spec.ref} ({plan.content})")
        _build(plan, buildah, progress)
        plan.built = True
        progress(f"{name}: built in {time.monotonic() - started:.0f} s")
    return archive if archive.exists() else _export(plan, buildah, progress)


def ensure_images(names: list[str] | None = None,
                  progress: Callable[[str], None] = print) -> dict[str, Path]:
    """Return ``{name: docker-archive path}`` for ``names`` (default: all of :data:`IMAGES`),
    building what is missing or changed (bases first).

    Warm (nothing changed): a hash check of each image's inputs, about a second. Cold: the
    Debian base (~2 min), the wheelhouse (one download per machine) and each build; the worker
    takes several minutes (torch). Progress lines go to ``progress``.

    Raises:
        KeyError: an unknown name.
        RuntimeError: a build step failed; the message has the command and buildah's output tail.
    """
    wanted = list(names or IMAGES)
    unknown = [name for name in wanted if name not in IMAGES]
    if unknown:
        raise KeyError(f"unknown images {unknown}; known: {sorted(IMAGES)}")
    buildah = storage()
    with _lock(progress), tempfile.TemporaryDirectory(prefix="monarch-images-") as staging:
        plans: dict[str, _Plan] = {}
        for name in wanted:
            _plan(name, Path(staging), plans)
        before = set(buildah.containers())
        try:
            archives = {name: _ensure(name, plans, buildah, False, progress) for name in wanted}
        except RuntimeError as error:
            if "no space left on device" not in str(error).lower():
                raise
            raise RuntimeError(disk_advice(images_dir(), "the disk filled up during the build "
                                           f"({str(error).strip()[-300:]}); it needs about "
                                           f"{MIN_FREE_GIB:.0f}")) from error
        finally:
            for leftover in set(buildah.containers()) - before:
                buildah.run("rm", leftover, check=False)
        if any(plan.built for plan in plans.values()):
            _prune(buildah)
    return archives


def ensure_image(name: str, progress: Callable[[str], None] = print) -> Path:
    """Return the docker-archive path of image ``name`` (a key of :data:`IMAGES`), building it
    if missing or changed. Raises as :func:`ensure_images`."""
    return ensure_images([name], progress)[name]


def ensure_base_image(progress: Callable[[str], None] = print) -> str:
    """Return the local Debian base's reference, bootstrapping it if missing (as the first
    image build would), under the one-build-at-a-time lock; ``scripts/setup.sh`` runs it
    beside the wheelhouse's download. Raises RuntimeError as :func:`ensure_base`."""
    with _lock(progress):
        return ensure_base(storage(), progress)


def main(argv: list[str] | None = None) -> int:
    """``python -m monarch_operator.localcluster.images build [NAME...]`` (prints each archive
    path), ``base`` (bootstraps the Debian base, prints its reference) or ``refs`` (prints each
    name and image reference)."""
    parser = argparse.ArgumentParser(prog="python -m monarch_operator.localcluster.images",
                                     description="Build the local cluster's images (buildah).")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build if needed; print each docker-archive path")
    build.add_argument("names", nargs="*", metavar="NAME",
                       help=f"default: all ({', '.join(IMAGES)})")
    commands.add_parser("base", help="bootstrap the Debian base if missing; print its ref")
    commands.add_parser("refs", help="print each image's name and reference")
    args = parser.parse_args(argv)
    if args.command == "refs":
        for spec in IMAGES.values():
            print(f"{spec.name}\t{spec.ref}")
        return 0

    def progress(line: str) -> None:
        print(f"[images] {line}", file=sys.stderr, flush=True)
    try:
        if args.command == "base":
            print(ensure_base_image(progress))
            return 0
        archives = ensure_images(args.names or None, progress)
    except (KeyError, RuntimeError, FileNotFoundError) as error:
        print(f"[images] {error}", file=sys.stderr)
        return 1
    for path in archives.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
