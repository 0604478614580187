"""The images' Dockerfiles: hadolint clean, base images pinned (a base named by a build argument:
its default), a non-root user at the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.chart import ROOT
from tests.scan.tools import run, scanner

DOCKERFILES = sorted([*ROOT.glob("images/*/Dockerfile"), ROOT / "examples" / "Dockerfile"])
# An exact image reference: by digest, or a tag that names a full version (3.11.14-slim-bookworm,
# 0.1.0), never a moving one (3.11-slim, latest).
PINNED = re.compile(r"^\S+(@sha256:[0-9a-f]{64}|:v?\d+\.\d+\.\d+[-\w.]*)$")


def _instructions(dockerfile: Path, keyword: str) -> list[str]:
    return [line.split(None, 1)[1].strip() for line in dockerfile.read_text().splitlines()
            if line.split(None, 1)[:1] == [keyword]]


def test_every_dockerfile_is_found():
    assert [p.relative_to(ROOT).as_posix() for p in DOCKERFILES] == [
        "examples/Dockerfile", "images/coredns/Dockerfile", "images/mpi-peer/Dockerfile",
        "images/operator/Dockerfile",
        "images/pause/Dockerfile", "images/worker/Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_nothing(dockerfile):
    result = run(scanner("hadolint"), "--no-color", str(dockerfile.relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_what_it_should(tmp_path):
    """The same invocation fails on an unpinned base image and an unpinned apt package."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y curl\n")
    result = run(scanner("hadolint"), "--no-color", str(bad))
    assert result.returncode != 0
    assert "DL3006" in result.stdout and "DL3008" in result.stdout, result.stdout


def _resolve(base: str, defaults: dict[str, str]) -> str:
    """``base`` with ``${NAME}`` / ``$NAME`` replaced by the ARG defaults before FROM."""
    return re.sub(r"\$\{?(\w+)\}?", lambda match: defaults.get(match.group(1), match.group(0)),
                  base)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(dockerfile):
    """Every FROM is an exact reference (by default, when a build argument names it), or
    ``scratch`` (no base at all)."""
    defaults = dict(arg.split("=", 1) for arg in _instructions(dockerfile, "ARG") if "=" in arg)
    bases = [_resolve(spec.split()[-1] if " AS " not in spec.upper() else spec.split()[-3],
                      defaults) for spec in _instructions(dockerfile, "FROM")]
    assert bases and all(base == "scratch" or PINNED.match(base) for base in bases), bases


def test_an_unpinned_default_is_caught():
    defaults = {"BASE_IMAGE": "python:3.11-slim"}
    assert not PINNED.match(_resolve("${BASE_IMAGE}", defaults))
    assert PINNED.match(_resolve("$BASE_IMAGE", {"BASE_IMAGE": "python:3.11.14-slim-bookworm"}))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_the_image_runs_as_a_non_root_uid(dockerfile):
    """The last USER is a number other than 0: Kubernetes' runAsNonRoot can verify only a
    numeric user, and a name could map to root."""
    users = _instructions(dockerfile, "USER")
    assert users, f"{dockerfile} sets no USER (the image would run as root)"
    assert users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) != 0, users[-1]
