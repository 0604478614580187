"""``kubectl exec`` on the local nodes: a command in a running container, its streams over the
WebSocket channel protocol.

The command joins the container as a runtime's exec would: ``nsenter`` enters the mount and UTS
namespaces of the container's main process (the command sees the pod's ``/etc/hosts``, volumes,
private ``/dev`` and hostname) and takes its working directory; ``setpriv`` takes that process's
user, group and supplementary groups, its ``no_new_privs`` flag and its capability bounding set
(a runtime's exec runs with the container's process spec); the environment is the one the
agent started the container with (the container's env). Being in the
container's mount namespace, the command ends with the container (the agent stops every process
of that namespace). With a terminal, the pty comes from the container's own devpts
(``/dev/pts`` inside it), as a runtime's exec console does, so the command's ``tty`` names it.

The channel protocol (``k8s.io/apimachinery/pkg/util/remotecommand``, subprotocols
``v5.channel.k8s.io`` and ``v4.channel.k8s.io``): every binary message starts with its channel,
0 stdin, 1 stdout, 2 stderr, 3 the final status (a ``metav1.Status``: ``Success``, or
``Failure`` with reason ``NonZeroExitCode`` and the exit code as the cause ``ExitCode``, which
kubectl exits with), 4 terminal size (``{"Width": w, "Height": h}``); v5 adds 255, "the peer
closed channel N", which is how the end of kubectl's stdin arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import struct
import termios
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from monarch_operator.localcluster import sandbox

# How long an exec waits for a container whose sandbox is still making its mounts, and how
# often it looks, seconds.
COMMAND_START_SECONDS, COMMAND_START_POLL_SECONDS = 10.0, 0.02
V5_PROTOCOL = "v5.channel.k8s.io"
V4_PROTOCOL = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
READ_CHUNK_BYTES = 32 * 1024
# After the command exits, how long its output may still drain (a daemon it left behind may
# hold the pipes open).
DRAIN_SECONDS = 2.0


@dataclass(frozen=True)
class Identity:
    """Who a container's main process is: user, group, supplementary groups, environment, and
    its privileges: ``no_new_privs`` and the capability bounding set (a bit mask, ``None``: the
    same as the agent's own, left alone)."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    env: dict[str, str]
    no_new_privs: bool = False
    bounding_set: int | None = None

    @classmethod
    def of(cls, pid: int) -> Identity:
        """Read ``/proc/<pid>/status`` (effective ids) and ``/proc/<pid>/environ``.

        Raises:
            OSError: the process is gone.
        """
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        pairs = [entry.split(b"=", 1) for entry in environ.split(b"\0") if b"=" in entry]
        bounding_set = int(fields["CapBnd"], 16)
        return cls(uid=int(fields["Uid"].split()[1]), gid=int(fields["Gid"].split()[1]),
                   groups=tuple(int(group) for group in fields.get("Groups", "").split()),
                   env={key.decode(errors="replace"): value.decode(errors="replace")
                        for key, value in pairs},
                   no_new_privs=fields.get("NoNewPrivs", "0").strip() == "1",
                   bounding_set=None if bounding_set == _own_bounding_set() else bounding_set)


def _own_bounding_set() -> int:
    """The agent's own capability bounding set (``CapBnd`` of ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split(":", 1)[1], 16)
    raise OSError("no CapBnd in /proc/self/status")


def privilege_options(identity: Identity) -> list[str]:
    """setpriv options that give a command the container's ``no_new_privs`` and bounding set
    (capabilities by number, ``cap_N``, as setpriv accepts them)."""
    options = ["--nnp"] if identity.no_new_privs else []
    if identity.bounding_set is not None:
        kept = [f"+cap_{bit}" for bit in range(identity.bounding_set.bit_length())
                if identity.bounding_set >> bit & 1]
        options += [f"--bounding-set={','.join(['-all', *kept])}", "--inh-caps=-all",
                    "--ambient-caps=-all"]
    return options


def exec_argv(pid: int, identity: Identity, command: list[str], tty: bool) -> list[str]:
    """The command line that runs ``command`` inside the container whose main process is
    ``pid``, as ``identity`` (with ``tty``: in a new session whose controlling terminal is the
    command's standard input)."""
    groups = (f"--groups={','.join(str(group) for group in identity.groups)}" if identity.groups
              else "--clear-groups")
    argv = [_tool("nsenter"), f"--target={pid}", "--mount", "--uts", "--wd", "--",
            _tool("setpriv"), *privilege_options(identity), f"--reuid={identity.uid}",
            f"--regid={identity.gid}", groups, "--", *command]
    return [_tool("setsid"), "--ctty", "--wait", *argv] if tty else argv


# Linux ioctls on a pty master: unlock its follower; open the follower (no path lookup).
TIOCSPTLCK, TIOCGPTPEER = 0x40045431, 0x5441


def container_pty(pid: int, owner: int | None = None) -> tuple[int, int]:
    """A new pty (master, follower) of the devpts that the container of main process ``pid``
    sees at ``/dev/pts`` (the sandbox mounts one per container); the agent's own pty when the
    container has none. The follower belongs to ``owner`` (a uid) when given, as a login's
    terminal does."""
    try:
        terminal = os.open(f"/proc/{pid}/root/dev/pts/ptmx",
                           os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return os.openpty()
    try:
        fcntl.ioctl(terminal, TIOCSPTLCK, struct.pack("i", 0))
        follower = int(fcntl.ioctl(terminal, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:
        os.close(terminal)
        return os.openpty()
    if owner is not None:
        os.fchown(follower, owner, -1)
    return terminal, follower


def exit_status(exit_code: int) -> dict[str, Any]:
    """The status message of channel 3 for ``exit_code`` (as the kubelet's streaming server)."""
    if exit_code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit status {exit_code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]}}


def _tool(name: str) -> str:
    # Absolute, so that the container's PATH does not decide which nsenter runs.
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin") or name


def _requested(request: web.Request, name: str) -> bool:
    return request.query.get(name, "") in ("1", "true")


async def wait_for_command(pid: int, timeout: float = COMMAND_START_SECONDS) -> bool:
    """Wait until the container of main process ``pid`` runs its command (its sandbox's
    mounts made, its user taken: :func:`.sandbox.command_started`), polling every
    :data:`COMMAND_START_POLL_SECONDS`, at most ``timeout`` seconds. The agent reports a
    container Running as soon as it holds its namespace, a little before. Returns whether it
    did; an exec goes ahead either way (a command that is itself ``setpriv`` never looks
    started)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not sandbox.command_started(pid):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(COMMAND_START_POLL_SECONDS)
    return True


async def serve(request: web.Request, pid: int,
                env: dict[str, str] | None = None) -> web.StreamResponse:
    """Run the request's ``command`` in the container of main process ``pid`` over a WebSocket,
    with ``env`` (the container's environment as the agent started it; ``None``: the main
    process's ``/proc/<pid>/environ``, which a process may have rewritten: sshd's process
    title overwrites it).

    Raises:
        web.HTTPBadRequest: no command, or not a WebSocket request (SPDY is not served).
        web.HTTPNotFound: the container's process is gone.
    """
    command = request.query.getall("command", [])
    if not command:
        raise web.HTTPBadRequest(text="command: at least one word is required")
    ws = web.WebSocketResponse(protocols=(V5_PROTOCOL, V4_PROTOCOL), max_msg_size=0)
    if not ws.can_prepare(request).ok:
        raise web.HTTPBadRequest(text="exec: the local node agent serves WebSocket "
                                      f"({V5_PROTOCOL}, {V4_PROTOCOL}) only, not SPDY")
    await wait_for_command(pid)
    try:
        identity = Identity.of(pid)
    except (OSError, KeyError, ValueError):
        raise web.HTTPNotFound(text="the container is not running") from None
    await ws.prepare(request)
    session = _Session(ws, pid=pid, uid=identity.uid, stdin=_requested(request, "input"),
                       stdout=_requested(request, "output"),
                       stderr=_requested(request, "error"), tty=_requested(request, "tty"))
    await session.run(exec_argv(pid, identity, command, session.tty),
                      identity.env if env is None else env)
    return ws


class _Session:
    """One exec: the process, its pipes (or terminal) and the WebSocket they are copied to."""

    def __init__(self, ws: web.WebSocketResponse, *, pid: int, uid: int, stdin: bool,
                 stdout: bool, stderr: bool, tty: bool) -> None:
        self.ws, self.stdin, self.stdout, self.stderr, self.tty = ws, stdin, stdout, stderr, tty
        self.pid, self.uid = pid, uid  # the container's main process and the command's user
        self.send_lock = asyncio.Lock()
        self.terminal: int | None = None  # the pty's master side, with tty
        self.process: asyncio.subprocess.Process | None = None

    async def run(self, argv: list[str], env: dict[str, str]) -> None:
        """Start the process, copy streams both ways, send the exit status, close."""
        if self.tty:
            self.terminal, follower = container_pty(self.pid, self.uid)
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *argv, stdin=follower, stdout=follower, stderr=follower, env=env,
                    start_new_session=True)
            finally:
                os.close(follower)
            outputs = [self._copy_terminal()]
        else:
            self.process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if self.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                start_new_session=True)
            assert self.process.stdout is not None and self.process.stderr is not None
            outputs = [self._copy(self.process.stdout, STDOUT, self.stdout),
                       self._copy(self.process.stderr, STDERR, self.stderr)]
        receiver = asyncio.create_task(self._receive())
        copies = asyncio.gather(*outputs)
        try:
            code = await self.process.wait()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(copies), DRAIN_SECONDS)
            exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128+N
            await self._send(STATUS, json.dumps(exit_status(exit_code)).encode())
        finally:
            copies.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await copies
            await self.ws.close()
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiver
            if self.terminal is not None:
                os.close(self.terminal)

    async def _send(self, channel: int, data: bytes) -> None:
        async with self.send_lock:
            with contextlib.suppress(ConnectionError, RuntimeError):  # the client left
                await self.ws.send_bytes(bytes([channel]) + data)

    async def _copy(self, stream: asyncio.StreamReader, channel: int, wanted: bool) -> None:
        while chunk := await stream.read(READ_CHUNK_BYTES):
            if wanted:
                await self._send(channel, chunk)

    async def _copy_terminal(self) -> None:
        assert self.terminal is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                chunk = await loop.run_in_executor(None, os.read, self.terminal, READ_CHUNK_BYTES)
            except OSError:  # EIO: every process of the terminal closed it
                return
            if not chunk:
                return
            await self._send(STDOUT, chunk)

    async def _receive(self) -> None:
        """Stdin, its end and terminal sizes from the client; its leaving ends stdin too."""
        try:
            async for message in self.ws:
                if message.type != WSMsgType.BINARY or not message.data:
                    continue
                channel, data = message.data[0], message.data[1:]
                if channel == STDIN:
                    await self._write_stdin(data)
                elif channel == CLOSE and data[:1] == bytes([STDIN]):
                    self._close_stdin()
                elif channel == RESIZE and self.terminal is not None:
                    self._resize(data)
        finally:
            self._close_stdin()

    async def _write_stdin(self, data: bytes) -> None:
        if not self.stdin:
            return
        if self.terminal is not None:
            os.write(self.terminal, data)
            return
        assert self.process is not None
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            with contextlib.suppress(ConnectionError):
                self.process.stdin.write(data)
                await self.process.stdin.drain()

    def _close_stdin(self) -> None:
        if self.terminal is not None:
            if self.stdin:
                with contextlib.suppress(OSError):
                    os.write(self.terminal, b"\x04")  # end of input for a terminal
            return
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()

    def _resize(self, data: bytes) -> None:
        assert self.terminal is not None
        try:
            size = json.loads(data)
            fcntl.ioctl(self.terminal, termios.TIOCSWINSZ,
                        struct.pack("HHHH", int(size["Height"]), int(size["Width"]), 0, 0))
        except (ValueError, KeyError, TypeError, OSError):
            pass  # a malformed size changes nothing
