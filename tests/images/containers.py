"""Run a built image as a container with runc, as a node's runtime would start it.

The image's root file system is a buildah working container, mounted; runc runs the image's
entrypoint and command as the image's user, with the image's environment and working directory,
in fresh PID, mount, IPC and UTS namespaces but the host's network (tests reach its sshd or HTTP
server on a 127.x address). Everything is removed on exit: the runc container, the buildah
container and its mount, the bundle folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from monarch_operator.localcluster.buildah import Buildah

RUNC_ROOT = "/run/monarch-operator-test-runc"


def _passwd_entry(rootfs: Path, user: str) -> tuple[int, int] | None:
    passwd = rootfs / "etc" / "passwd"
    for line in passwd.read_text().splitlines() if passwd.exists() else []:
        fields = line.split(":")
        if len(fields) > 3 and user in (fields[0], fields[2]):
            return int(fields[2]), int(fields[3])
    return None


def resolve_user(rootfs: Path, user: str) -> tuple[int, int]:
    """The (uid, gid) an image's ``User`` means (``name``, ``uid`` or ``uid:gid``), as
    containerd resolves it: a uid without a passwd entry runs with gid 0."""
    name, _, group = (user or "0").partition(":")
    entry = _passwd_entry(rootfs, name)
    if entry is None and not name.isdigit():
        raise ValueError(f"user {name!r} is not in the image's /etc/passwd")
    uid, gid = entry if entry else (int(name), 0)
    return uid, int(group) if group else gid


class Container:
    """One image run by runc; use as a context manager. ``args`` replace the image's command
    (the entrypoint stays); ``env`` adds to the image's; ``binds`` maps host paths to container
    paths (read-only); ``user`` (uid, gid, additional gids) replaces the image's user, as a
    pod's ``runAsUser``, ``runAsGroup`` and ``fsGroup`` do."""

    def __init__(self, buildah: Buildah, ref: str, args: list[str] | None = None,
                 env: dict[str, str] | None = None, binds: dict[str, str] | None = None,
                 entrypoint: list[str] | None = None,
                 user: tuple[int, int, list[int]] | None = None) -> None:
        self.buildah, self.ref = buildah, ref
        self.args, self.env, self.binds = args, env or {}, binds or {}
        self.entrypoint, self.run_as = entrypoint, user
        self.id = f"monarch-images-test-{uuid.uuid4().hex[:8]}"
        self.bundle = Path(tempfile.mkdtemp(prefix="monarch-runc-"))
        self.log_path = self.bundle / "output.log"
        self.working: str | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Container:
        self.working = self.buildah.run("from", "--pull=never", self.ref).stdout.strip()
        rootfs = Path(self.buildah.run("mount", self.working).stdout.strip())
        self.image = (self.buildah.image_config(self.ref) or {}).get("config") or {}
        subprocess.run(["runc", "spec", "--bundle", str(self.bundle)], check=True)
        spec_path = self.bundle / "config.json"
        spec_path.write_text(json.dumps(self._spec(json.loads(spec_path.read_text()), rootfs)))
        return self

    def _spec(self, spec: dict[str, Any], rootfs: Path) -> dict[str, Any]:
        entrypoint = self.entrypoint if self.entrypoint is not None else (
            self.image.get("Entrypoint") or [])
        command = self.args if self.args is not None else (self.image.get("Cmd") or [])
        uid, gid = resolve_user(rootfs, self.image.get("User", ""))
        user: dict[str, Any] = {"uid": uid, "gid": gid}
        if self.run_as is not None:
            user = {"uid": self.run_as[0], "gid": self.run_as[1],
                    "additionalGids": list(self.run_as[2])}
        env = [*(self.image.get("Env") or []), *(f"{k}={v}" for k, v in self.env.items())]
        spec["process"].update(terminal=False, args=[*entrypoint, *command], env=env,
                               cwd=self.image.get("WorkingDir") or "/", user=user)
        spec["root"] = {"path": str(rootfs), "readonly": False}
        spec["hostname"] = self.id
        spec["linux"]["namespaces"] = [namespace for namespace in spec["linux"]["namespaces"]
                                       if namespace["type"] != "network"]
        spec["mounts"] += [{"destination": inside, "type": "bind", "source": outside,
                            "options": ["rbind", "ro"]} for outside, inside in self.binds.items()]
        return spec

    @property
    def user(self) -> str:
        """The image's configured user (``config.User``)."""
        return str(self.image.get("User", ""))

    def start(self) -> subprocess.Popen[bytes]:
        """Start the container; its output goes to :attr:`log_path`."""
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                ["runc", "--root", RUNC_ROOT, "run", "--bundle", str(self.bundle), self.id],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        return self.process

    def run(self, timeout: float = 120) -> tuple[int, str]:
        """Run the container to its end; return its exit status and output."""
        process = self.start()
        try:
            code = process.wait(timeout)
        finally:
            self.stop()
        return code, self.output()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, signal: str = "TERM", timeout: float = 15) -> int | None:
        """Send ``signal`` to the container's first process and wait for its end (then KILL);
        returns its exit status (None if it never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            subprocess.run(["runc", "--root", RUNC_ROOT, "kill", self.id, signal],
                           capture_output=True, check=False)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                subprocess.run(["runc", "--root", RUNC_ROOT, "kill", self.id, "KILL"],
                               capture_output=True, check=False)
                self.process.wait(timeout)
        return self.process.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()
        subprocess.run(["runc", "--root", RUNC_ROOT, "delete", "--force", self.id],
                       capture_output=True, check=False)
        if self.working:
            self.buildah.run("umount", self.working, check=False)
            self.buildah.run("rm", self.working, check=False)
        shutil.rmtree(self.bundle, ignore_errors=True)
