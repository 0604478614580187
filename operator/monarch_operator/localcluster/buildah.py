"""buildah with the project's own image storage: commands, errors, progress of long builds.

Every call names the storage explicitly (``--root`` under ``~/.cache/monarch-operator/buildah``,
``--runroot`` under /run), so the machine's default /var/lib/containers is never touched. The
overlay driver works as root on ext4 and shares unchanged layers between images.
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STORAGE_DRIVER = "overlay"
# Where buildah keeps run-time state (locks, mount records): a tmpfs, so a reboot clears it.
RUNROOT_PARENT = Path("/run/monarch-operator-buildah")
# A build step quiet this long gets a "still running" progress line.
HEARTBEAT_S = 30.0
_STEP = re.compile(r"^STEP (\d+)/(\d+): (.*)$")


class Buildah:
    """One buildah storage: ``root`` holds its images and layers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runroot = RUNROOT_PARENT / hashlib.sha256(str(root).encode()).hexdigest()[:12]

    def command(self, *args: str) -> list[str]:
        """The full command line of ``buildah ARGS`` against this storage."""
        return ["buildah", "--root", str(self.root), "--runroot", str(self.runroot),
                "--storage-driver", STORAGE_DRIVER, *args]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``buildah ARGS`` and return its result.

        Raises:
            RuntimeError: it failed and ``check`` is set; the message has the command and the
                end of buildah's output.
        """
        command = self.command(*args)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(failure(command, result.returncode,
                                       result.stdout + result.stderr))
        return result

    def image_config(self, ref: str) -> dict[str, Any] | None:
        """The OCI config of image ``ref`` (``config``: User, Env, Labels...), None if absent."""
        result = self.run("inspect", "--type", "image", ref, check=False)
        if result.returncode != 0:
            return None
        config: dict[str, Any] = json.loads(result.stdout).get("OCIv1", {})
        return config

    def label(self, ref: str, key: str) -> str | None:
        """The value of label ``key`` on image ``ref``; None if the image or label is absent."""
        config = self.image_config(ref)
        labels = ((config or {}).get("config") or {}).get("Labels") or {}
        value = labels.get(key)
        return value if isinstance(value, str) else None

    def containers(self) -> list[str]:
        """Names of the working containers in this storage (a tidy storage has none)."""
        result = self.run("containers", "--noheading", "--format", "{{.ContainerName}}")
        return result.stdout.split()

    def stream(self, args: list[str], log_path: Path, what: str,
               progress: Callable[[str], None]) -> None:
        """Run ``buildah ARGS``, its output to ``log_path``; report each ``STEP n/m`` line, and
        a line every :data:`HEARTBEAT_S` seconds while a step runs quiet.

        Raises:
            RuntimeError: buildah failed; the message has the command and the end of the log.
        """
        command = self.command(*args)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        lines: queue.Queue[str | None] = queue.Queue()
        started = time.monotonic()
        with log_path.open("w", buffering=1) as log, subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
            log.write(" ".join(command) + "\n")
            reader = threading.Thread(target=_read_lines, args=(process, lines), daemon=True)
            reader.start()
            step, step_started, last_report = "starting", time.monotonic(), time.monotonic()
            while True:
                try:
                    line = lines.get(timeout=1.0)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                if line:
                    log.write(line)
                    match = _STEP.match(line.strip())
                    if match:
                        step, step_started = line.strip(), time.monotonic()
                        progress(f"{what}: {_shorten(step)}")
                        last_report = step_started
                now = time.monotonic()
                if now - last_report >= HEARTBEAT_S:
                    progress(f"{what}: still at {_shorten(step)} "
                             f"({now - step_started:.0f} s in this step, "
                             f"{now - started:.0f} s in all)")
                    last_report = now
            code = process.wait()
        if code != 0:
            raise RuntimeError(failure(command, code, log_path.read_text(), log_path))


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def _shorten(step: str, width: int = 110) -> str:
    return step if len(step) <= width else step[:width - 3] + "..."


def failure(command: list[str], code: int, output: str, log_path: Path | None = None) -> str:
    """An error message: the command, its exit status and the last 40 lines of its output."""
    tail = "\n".join(output.strip().splitlines()[-40:])
    where = f" (whole log: {log_path})" if log_path else ""
    return f"{' '.join(command)} failed (exit {code}){where}:\n{tail}"
