"""The image pipeline without building: the references the cluster looks for, what each
Dockerfile's content hash covers (COPY sources less .dockerignore), the Debian mirror read from
apt's sources, and the wheelhouse's requirements (monarch_operator.localcluster.images)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from monarch_operator.localcluster import imagebase, images, wheelhouse
from monarch_operator.localcluster.buildcontext import (
    context_files,
    copied_sources,
    ignore_patterns,
    is_ignored,
)
from tests.chart import CHART, ROOT


def test_refs_are_those_the_chart_samples_and_examples_use():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert images.IMAGES["operator"].ref == (
        f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}")
    for sample in (ROOT / "crds" / "samples").glob("*.yaml"):
        assert yaml.safe_load(sample.read_text())["spec"]["image"] == (
            images.IMAGES["worker"].ref), sample
    manifests = sorted((ROOT / "examples").glob("*/monarchjob*.yaml"))
    assert manifests
    for manifest in manifests:
        assert yaml.safe_load(manifest.read_text())["spec"]["image"] == (
            images.IMAGES["examples"].ref), manifest


def test_coredns_tag_is_the_version_build_binaries_builds():
    script = (ROOT / "operator/monarch_operator/localcluster/build-binaries.sh").read_text()
    version = re.search(r'COREDNS_VERSION="\$\{COREDNS_VERSION:-(v[\d.]+)\}"', script)
    assert version and images.IMAGES["coredns"].ref.endswith(f":{version.group(1)}")


def test_each_base_argument_defaults_to_the_base_the_spec_names():
    """The build argument images.py sets is the one the Dockerfile declares before FROM, and
    the examples' default is the worker's reference."""
    for spec in images.IMAGES.values():
        text = (ROOT / spec.dockerfile).read_text()
        if spec.base_arg is None:
            assert re.search(r"^FROM scratch$", text, re.M), spec.name
            continue
        assert re.search(rf"^ARG {spec.base_arg}=\S+\nFROM \$\{{{spec.base_arg}\}}$", text,
                         re.M), spec.name
    examples = (ROOT / "examples" / "Dockerfile").read_text()
    assert f"ARG WORKER_IMAGE={images.IMAGES['worker'].ref}\n" in examples


def test_copied_sources_follow_the_dockerfiles():
    assert copied_sources((ROOT / "images/worker/Dockerfile").read_text()) == [
        "pyproject.toml", "operator", "images/worker/entrypoint.sh"]
    # An edit of the README rebuilds no image (a 6 GB worker archive and both nodes' imports).
    for dockerfile in ("images/worker/Dockerfile", "images/operator/Dockerfile"):
        assert "README.md" not in copied_sources((ROOT / dockerfile).read_text()), dockerfile
    assert copied_sources((ROOT / "examples/Dockerfile").read_text()) == ["."]
    assert copied_sources("COPY --from=build /a /b\nCOPY --chown=1:1 x \\\n  y /z\n") == ["x", "y"]
    with pytest.raises(ValueError, match="unsupported"):
        copied_sources('COPY ["a", "/b"]\n')


@pytest.mark.parametrize(("path", "ignored"), [
    (".venv/bin/python", True),
    ("operator/monarch_operator/__pycache__/x.cpython-311.pyc", True),
    ("__pycache__/x.pyc", True),
    ("operator/monarch_operator.egg-info/PKG-INFO", True),
    (".localcluster/state.json", True),
    ("build/lib/x.py", True),
    ("operator/build/x.py", False),  # "build" is anchored at the context root, as in Docker
    ("operator/monarch_operator/images.py", False),
    ("pyproject.toml", False),
])
def test_repository_dockerignore(path, ignored):
    assert is_ignored(path, ignore_patterns(ROOT)) is ignored


def test_negation_and_single_star_as_in_docker(tmp_path):
    (tmp_path / ".dockerignore").write_text("# comment\n*.log\n!keep.log\ndocs/*/draft\n")
    patterns = ignore_patterns(tmp_path)
    assert is_ignored("a.log", patterns) and not is_ignored("keep.log", patterns)
    assert not is_ignored("sub/a.log", patterns)  # one star stays in one folder
    assert is_ignored("docs/x/draft/page.md", patterns)


def _context(tmp_path: Path) -> Path:
    context = tmp_path / "context"
    (context / "pkg" / "__pycache__").mkdir(parents=True)
    (context / "pkg" / "a.py").write_text("a = 1\n")
    (context / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (context / "tests").mkdir()
    (context / "tests" / "t.py").write_text("")
    (context / ".dockerignore").write_text("**/__pycache__\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY pkg /pkg\n")
    return context


def test_context_files_are_the_copied_ones_less_the_ignored(tmp_path):
    context = _context(tmp_path)
    files = context_files(context, ["pkg"])
    assert [path.relative_to(context).as_posix() for path in files] == ["pkg/a.py"]
    with pytest.raises(FileNotFoundError, match="missing"):
        context_files(context, ["missing"])


def test_content_hash_changes_with_what_the_image_gets_and_nothing_else(tmp_path):
    context = _context(tmp_path)
    spec = images.ImageSpec("t", "localhost/t:1", str(context / "Dockerfile"), str(context))

    def current(base: str = "scratch", args: dict[str, str] | None = None) -> str:
        return images.content_hash(spec, context, base, args or {})

    first = current()
    (context / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\1")
    (context / "tests" / "t.py").write_text("changed")
    assert current() == first
    (context / "pkg" / "a.py").chmod(0o755)
    assert current() != first
    (context / "pkg" / "a.py").chmod(0o644)
    assert current() == first
    (context / "pkg" / "a.py").write_text("a = 2\n")
    changed = current()
    assert changed != first
    assert current(base="other-base") != changed
    assert current(args={"X": "1"}) != changed


DEB822 = """\
Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://mirror.example/debian-security/
Suites: bookworm-security
Components: main
"""


def test_mirror_is_read_from_apt_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    (tmp_path / "sources.list.d" / "other.list").write_text(
        "deb [signed-by=/k.gpg] https://vendor.example/apt stable main\n")
    (tmp_path / "sources.list").write_text("# nothing\n")
    pairs = imagebase.host_debian_sources(
        places=(tmp_path / "sources.list", tmp_path / "sources.list.d"))
    assert pairs == [("http://mirror.example/debian", "bookworm"),
                     ("http://mirror.example/debian", "bookworm-updates"),
                     ("http://mirror.example/debian-security", "bookworm-security")]
    text = imagebase.sources_file(pairs)
    assert "URIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n" in text
    assert "vendor.example" not in text and "src.example" not in text


def test_one_line_sources_and_no_mirror(tmp_path):
    listing = tmp_path / "sources.list"
    listing.write_text("deb http://m.example/debian bookworm main\n")
    assert imagebase.host_debian_sources(places=(listing,)) == [
        ("http://m.example/debian", "bookworm")]
    listing.write_text("deb http://m.example/debian bookworm-updates main\n")
    with pytest.raises(RuntimeError, match="no apt source for Debian bookworm"):
        imagebase.host_debian_sources(places=(listing,))


def test_wheelhouse_takes_the_pinned_requirements_of_the_images():
    reqs = wheelhouse.requirements()
    assert "torch==2.13.0" in reqs and "torchmonarch==0.7.0" in reqs
    assert "kopf==1.45.2" in reqs and any(r.startswith("setuptools") for r in reqs)
    assert not [r for r in reqs if r.startswith("monarch-operator")]
    assert "no-index = true" in wheelhouse.pip_config()
    assert f"find-links = {wheelhouse.MOUNT_POINT}" in wheelhouse.pip_config()


def test_cache_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MONARCH_OPERATOR_CACHE", str(tmp_path))
    assert images.images_dir() == tmp_path / "images"
    assert images.storage().root == tmp_path / "buildah"
    assert wheelhouse.wheels_dir() == tmp_path / "wheels"


class _Usage:
    def __init__(self, free_gib: float) -> None:
        self.free = int(free_gib * 2**30)


def test_a_build_is_refused_when_the_disk_cannot_take_it(tmp_path):
    images.check_free_space(tmp_path, 20, usage=lambda _: _Usage(20.5))
    with pytest.raises(RuntimeError) as refused:
        images.check_free_space(tmp_path / "images", 20, usage=lambda _: _Usage(3.25))
    message = str(refused.value)
    # How much there is, how much it needs, and where space can be freed.
    assert "only 3.2 GiB free" in message and "about 20 GiB" in message
    assert str(tmp_path / "containerd") in message and "docs/development.md#disk" in message


def test_stale_and_half_written_archives_are_dropped_and_the_current_one_kept(
        monkeypatch, tmp_path):
    monkeypatch.setenv("MONARCH_OPERATOR_CACHE", str(tmp_path))
    folder = images.images_dir()
    folder.mkdir()
    names = ["worker-aaaa.tar", "worker-bbbb.tar", "worker-cccc.tar.partial",
             "worker-bbbb.tar.partial", "examples-aaaa.tar", "worker-aaaa.log"]
    for name in names:
        (folder / name).write_text("x")
    dropped = images._drop_stale("worker", folder / "worker-bbbb.tar")
    assert sorted(path.name for path in dropped) == [
        "worker-aaaa.tar", "worker-bbbb.tar.partial", "worker-cccc.tar.partial"]
    assert sorted(path.name for path in folder.iterdir()) == [
        "examples-aaaa.tar", "worker-aaaa.log", "worker-bbbb.tar"]


def test_the_archive_a_build_replaces_counts_as_free_space(tmp_path):
    # Stop 39's CI: 8.8 GiB free and a 6 GB worker archive about to be replaced was refused.
    old = tmp_path / "worker-aaaa.tar"
    with old.open("wb") as handle:
        handle.truncate(2 * 2**30)  # sparse: the size counts, not the blocks
    images.check_free_space(tmp_path, 10, usage=lambda _: _Usage(8.8), replaced=[old])
    with pytest.raises(RuntimeError) as refused:
        images.check_free_space(tmp_path, 11, usage=lambda _: _Usage(8.8), replaced=[old])
    assert "only 8.8 GiB free" in str(refused.value)
    assert "and 2.0 GiB in archives it replaces" in str(refused.value)
    with pytest.raises(RuntimeError):
        images.check_free_space(tmp_path, 10, usage=lambda _: _Usage(8.8),
                                replaced=[tmp_path / "gone.tar"])


def test_base_command_bootstraps_the_base_under_the_build_lock(monkeypatch, tmp_path, capsys):
    # scripts/setup.sh runs `images base` beside the wheelhouse's download and the image builds
    # after it: the base must come from the same locked path a build takes, and a failure must
    # be an exit status with the reason, not a traceback.
    monkeypatch.setenv("MONARCH_OPERATOR_CACHE", str(tmp_path))
    seen = []

    def fake_base(buildah, progress):
        lock = images.images_dir() / ".lock"
        seen.append((buildah.root, lock.exists()))
        return "localhost/monarch-base:test"

    monkeypatch.setattr(images, "ensure_base", fake_base)
    assert images.main(["base"]) == 0
    assert capsys.readouterr().out.strip() == "localhost/monarch-base:test"
    assert seen == [(tmp_path / "buildah", True)]

    def failing_base(buildah, progress):
        raise RuntimeError("debootstrap failed (exit 1)")

    monkeypatch.setattr(images, "ensure_base", failing_base)
    assert images.main(["base"]) == 1
    assert "debootstrap failed" in capsys.readouterr().err
