"""The documentation: the site under docs/ builds with MkDocs with every warning an error (broken
links and anchors included, mkdocs.yml's ``validation``), and README.md stays the short entry:
at most 250 lines, every relative link and anchor in it resolving, its first MonarchJob the one
docs/index.md shows and a spec the CRD and the operator accept.

mkdocs and mkdocs-material are pinned in pyproject.toml's ``docs`` extra (part of ``dev``). The
build reads nothing from the network: mkdocs.yml turns off Material's web fonts and uses no
plugin that downloads.
"""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from monarch_operator.controller.spec.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
CRD = ROOT / "crds" / "monarchjobs.monarch-operator.dev.yaml"
README_MAX_LINES = 250


def mkdocs_build(site_dir: Path, config: Path = CONFIG) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site_dir``; mkdocs' output in the result."""
    probe = subprocess.run([sys.executable, "-m", "mkdocs", "--version"], capture_output=True,
                           text=True, check=False)
    assert probe.returncode == 0, (
        "mkdocs is not installed: pip install -e '.[dev]' (the docs extra pins it)\n"
        + probe.stderr)
    # NO_MKDOCS_2_WARNING: Material's banner about its end of life, printed on every build.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site_dir = tmp_path_factory.mktemp("docs") / "site"
    done = mkdocs_build(site_dir)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, f"mkdocs build warned:\n{output}"
    return site_dir


def test_site_builds_with_warnings_as_errors(site: Path) -> None:
    pages = sorted(p.relative_to(DOCS).with_suffix("") for p in DOCS.glob("*.md"))
    for page in pages:
        built = site / "index.html" if page.name == "index" else site / page / "index.html"
        assert built.exists(), f"docs/{page}.md was not built"
    # No web fonts (a build or a reader offline): Material's default would load Google Fonts.
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()


def test_every_page_is_in_the_nav() -> None:
    # mkdocs' own tags (!ENV, !relative) would need its loader; mkdocs.yml uses none.
    config = yaml.safe_load(CONFIG.read_text())

    def files(nav: Any) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [f for item in nav for f in files(item)]
        if isinstance(nav, dict):
            return [f for value in nav.values() for f in files(value)]
        return []

    listed = files(config["nav"])
    assert sorted(listed) == sorted(p.name for p in DOCS.glob("*.md"))
    assert config["strict"] is True
    assert set(config["validation"].values()) == {"warn"}
    assert config["theme"]["font"] is False


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    """The control: the same configuration over a copy of docs/ with one link to an anchor that
    does not exist must fail, naming it (so the test above would catch a moved section)."""
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    index = docs / "index.md"
    index.write_text(index.read_text() + "\nSee [nothing](monarchjob.md#no-such-section).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(CONFIG.read_text().replace("docs_dir: docs\n", f"docs_dir: {docs}\n"))
    done = mkdocs_build(tmp_path / "site", config)
    assert done.returncode != 0
    assert "no-such-section" in done.stdout + done.stderr


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into docs/")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading of README.md."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def built_ids(site: Path, page: Path) -> set[str]:
    """The element ids of a docs page as the site built it (its headings' anchors)."""
    name = page.relative_to(DOCS).with_suffix("")
    built = site / "index.html" if str(name) == "index" else site / name / "index.html"
    parser = _Ids()
    parser.feed(built.read_text())
    return parser.ids


def test_readme_links_resolve(site: Path) -> None:
    text = README.read_text()
    own = {github_slug(line.lstrip("#")) for line in prose(text).splitlines()
           if line.startswith("#")}
    links = LINK.findall(prose(text))
    assert links, "README.md has no links: where do readers go next?"
    broken = []
    for target in links:
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in own:
                broken.append(f"{target}: no such heading in README.md")
            continue
        file = (ROOT / path).resolve()
        if not file.exists():
            broken.append(f"{target}: {path} does not exist")
        elif anchor and file.parent == DOCS and file.suffix == ".md":
            if anchor not in built_ids(site, file):
                broken.append(f"{target}: no anchor #{anchor} in {path}")
        elif anchor:
            broken.append(f"{target}: anchors are checked only into docs/ pages")
    assert not broken, "README.md's links:\n" + "\n".join(broken)


def first_job() -> str:
    """The YAML block of README.md's "A first MonarchJob"."""
    section = README.read_text().split("## A first MonarchJob\n", 1)[1]
    return re.search(r"^```yaml\n(.*?)^```", section, flags=re.S | re.M).group(1)


def unknown_fields(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    """Fields of ``value`` the CRD's structural schema would prune or refuse, with wrong types."""
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
    if kind in types and not isinstance(value, types[kind]):
        return [f"{where}: not {kind}"]
    problems = [f"{where}.{key}: required" for key in schema.get("required", [])
                if isinstance(value, dict) and key not in value]
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                problems.append(f"{where}.{key}: not in the CRD")
            else:
                problems += unknown_fields(item, schema["properties"][key], f"{where}.{key}")
    return problems


def test_readme_first_job_is_a_valid_spec_and_the_getting_started_one() -> None:
    block = first_job()
    assert block in (DOCS / "index.md").read_text(), (
        "README.md's first MonarchJob differs from docs/index.md's: keep them the same")
    body = yaml.safe_load(block)
    crd = yaml.safe_load(CRD.read_text())
    version = crd["spec"]["versions"][0]
    assert body["apiVersion"] == f"{crd['spec']['group']}/{version['name']}"
    assert body["kind"] == crd["spec"]["names"]["kind"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert unknown_fields(body["spec"], schema, "spec") == []
    job = JobSpec.from_body({**body, "metadata": {**body["metadata"], "namespace": "team-a"}})
    assert job.trainer_hosts + job.ref_hosts <= job.replicas
    # The image the demo's nodes have (imported, never pulled): the sample job's.
    demo = yaml.safe_load((ROOT / "crds" / "samples" / "demo.yaml").read_text())
    assert body["spec"]["image"] == demo["spec"]["image"]
