"""What a Dockerfile takes from its build context: its COPY/ADD sources less .dockerignore.

Read the way Docker and buildah read them, so that a content hash over these files changes
exactly when the image's copied files do.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path


def copied_sources(dockerfile_text: str) -> list[str]:
    """The context paths (or globs) of the Dockerfile's COPY and ADD lines, in order.

    Raises:
        ValueError: a form this reader does not follow (JSON arrays, ADD of a URL).
    """
    sources: list[str] = []
    for line in re.sub(r"\\\n", " ", dockerfile_text).splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(word.startswith("--from") for word in words):
            continue  # from another stage or image, not from the context
        args = [word for word in words[1:] if not word.startswith("--")]
        if not args or args[0].startswith("[") or any("://" in arg for arg in args):
            raise ValueError(f"unsupported {words[0]} form: {line.strip()}")
        sources += args[:-1]
    return sources


def ignore_patterns(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """The context's ``.dockerignore`` as ``(negated, regex)`` pairs, in file order."""
    path = context / ".dockerignore"
    patterns = []
    for raw in (path.read_text().splitlines() if path.exists() else []):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line.lstrip("!").strip().strip("/")
        regex = "".join(".*" if part == "**" else "[^/]*" if part == "*" else "[^/]"
                        if part == "?" else re.escape(part)
                        for part in re.split(r"(\*\*|\*|\?)", glob))
        regex = regex.replace(".*/", "(.*/)?")  # "**/x" also matches a top-level x
        patterns.append((negated, re.compile(regex + "$")))
    return patterns


def is_ignored(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether ``relative`` (a posix path in the context) is left out: the last pattern that
    matches it or one of its parent folders decides, as in Docker."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    ignored = False
    for negated, pattern in patterns:
        if any(pattern.match(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def context_files(context: Path, sources: list[str]) -> list[Path]:
    """The files under ``context`` that ``sources`` (COPY sources, globs allowed) take, less the
    ignored ones, sorted.

    Raises:
        FileNotFoundError: a source matches nothing (the build would fail too).
    """
    patterns = ignore_patterns(context)
    found: set[Path] = set()
    for source in sources:
        matches = sorted(context.glob(source.lstrip("/"))) if source.strip("./") else [context]
        if not matches:
            raise FileNotFoundError(f"COPY source {source!r} matches nothing in {context}")
        for match in matches:
            walk = [match] if not match.is_dir() else [
                Path(top) / name for top, dirs, names in os.walk(match) for name in [*dirs, *names]
                if not (Path(top) / name).is_dir() or (Path(top) / name).is_symlink()]
            found.update(path for path in walk
                         if not is_ignored(path.relative_to(context).as_posix(), patterns))
    return sorted(found)


def file_digest(path: Path) -> str:
    """A file's sha256 (hex), or ``link:<target>`` for a symbolic link."""
    if path.is_symlink():
        return "link:" + os.readlink(path)
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
