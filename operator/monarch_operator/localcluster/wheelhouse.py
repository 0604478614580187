"""The machine's wheelhouse: every wheel the images install, downloaded once per machine.

torch and its CUDA wheels are about 3 GB. They are fetched once into
``~/.cache/monarch-operator/wheels/`` (or under ``$MONARCH_OPERATOR_CACHE``), and every later
install reads them from there: the image builds (the folder mounted at ``/mnt`` with a pip
config that says ``no-index``, see :func:`pip_config`) and, through ``scripts/setup.sh``, each
clone's ``.venv``. pip's own HTTP cache cannot be relied on for this: a mirror may answer with
headers that forbid caching, and then nothing is kept.

Stdlib only: ``scripts/setup.sh`` runs it (``python -m monarch_operator.localcluster.wheelhouse``
with ``PYTHONPATH=operator``) before the project is installed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
# The interpreter of every image: Python 3.11 on Debian 12 (glibc 2.36), this machine's CPU.
PYTHON_VERSION = "3.11"
GLIBC_MINOR = 36
# In-image paths of the wheelhouse and of the pip config that points there (buildah --volume).
# Both exist in the base images (Debian's empty /mnt; imagebase ships an empty /etc/pip.conf):
# buildah 1.28 would leave a mount point it had to create in the image.
MOUNT_POINT = "/mnt"
PIP_CONF_MOUNT = "/etc/pip.conf"


def cache_root() -> Path:
    """``$MONARCH_OPERATOR_CACHE``, else ``~/.cache/monarch-operator`` (as build-binaries.sh)."""
    return Path(os.environ.get("MONARCH_OPERATOR_CACHE")
                or Path.home() / ".cache" / "monarch-operator")


def wheels_dir() -> Path:
    """The wheelhouse folder (it may not exist yet)."""
    return cache_root() / "wheels"


def requirements(repo_root: Path = REPO_ROOT) -> list[str]:
    """The pinned requirements every image installs, read from the pyproject files.

    The project's dependencies and its ``operator`` and ``launcher`` extras, plus what pip needs
    to build the project and the examples from source (their ``build-system.requires``), sorted,
    without duplicates. torch's own dependencies (the CUDA wheels) come along with it.
    """
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())
    examples = tomllib.loads((repo_root / "examples" / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    wanted = [*project["project"]["dependencies"], *extras["operator"], *extras["launcher"],
              *project["build-system"]["requires"], *examples["build-system"]["requires"]]
    return sorted(set(wanted), key=str.lower)


def platform_tags() -> list[str]:
    """The wheel platform tags the images' glibc runs, newest first: pip does not expand a given
    ``--platform manylinux_2_36_x86_64`` to the older manylinux versions it implies."""
    machine = platform.machine()
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR, 16, -1)]
    return [*tags, *(f"{legacy}_{machine}" for legacy in ("manylinux2014", "manylinux2010",
                                                          "manylinux1"))]


def _stamp_name(reqs: list[str]) -> str:
    digest = hashlib.sha256("\n".join([PYTHON_VERSION, *platform_tags(), *reqs]).encode()
                            ).hexdigest()
    return f".complete-{digest[:16]}"


def ensure_wheelhouse(progress: Callable[[str], None] = print,
                      repo_root: Path = REPO_ROOT) -> Path:
    """Return the wheelhouse folder, downloading what :func:`requirements` needs if missing.

    The first call downloads every wheel (torch and the CUDA wheels: about 3 GB, a few minutes);
    later calls with the same requirements return at once (a stamp file records a complete
    download). Wheels already in the folder are not downloaded again. Only wheels are taken
    (``--only-binary=:all:``) for CPython 3.11 on glibc 2.36, whatever Python runs this.
    ``requirements.txt`` in the folder lists what was asked for.

    Raises:
        RuntimeError: pip failed; the message has the command and the end of pip's output.
    """
    folder = wheels_dir()
    reqs = requirements(repo_root)
    stamp = folder / _stamp_name(reqs)
    if stamp.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "requirements.txt").write_text("\n".join(reqs) + "\n")
    progress(f"wheelhouse: downloading {len(reqs)} pinned requirements and their dependencies "
             f"into {folder} (first time: torch + CUDA wheels, about 3 GB)")
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
               "--progress-bar", "off", "--dest", str(folder), "--find-links", str(folder),
               "--only-binary=:all:", "--python-version", PYTHON_VERSION,
               "--implementation", "cp", "--abi", f"cp{PYTHON_VERSION.replace('.', '')}",
               "--abi", "abi3", "--abi", "none",
               *(arg for tag in platform_tags() for arg in ("--platform", tag)), *reqs]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip()[-3000:]
        raise RuntimeError(f"filling the wheelhouse failed (exit {result.returncode}): "
                           f"{' '.join(command)}\n{tail}")
    for old in folder.glob(".complete-*"):
        old.unlink()
    stamp.touch()
    wheels = list(folder.glob("*.whl"))
    size_gb = sum(path.stat().st_size for path in wheels) / 1e9
    progress(f"wheelhouse: {len(wheels)} wheels, {size_gb:.1f} GB in {folder}")
    return folder


def pip_config() -> str:
    """The pip config mounted at ``/etc/pip.conf`` during a build: the wheelhouse only.

    ``no-index`` makes a wheel missing from the wheelhouse an error, never a silent download.
    """
    return (f"[global]\nno-index = true\nfind-links = {MOUNT_POINT}\n"
            "disable-pip-version-check = true\n")


def main() -> None:
    """Fill the wheelhouse and print its folder (what ``scripts/setup.sh`` calls)."""
    print(ensure_wheelhouse(progress=lambda line: print(line, file=sys.stderr, flush=True)))


if __name__ == "__main__":
    main()
