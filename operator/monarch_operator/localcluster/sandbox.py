"""One container as a local process in its own mount and UTS namespace, and how it is stopped.

``start()`` runs ``unshare --mount --uts`` with a small POSIX shell script (``SANDBOX_SCRIPT``)
that gives the process its hostname, a private ``/dev`` mirroring the machine's, the pod's
volumes and files bind-mounted at their container paths, then execs the command. The machine's
``/etc/hosts`` and ``/dev`` are never edited.

The shell script names no file descriptor numbers (``dash`` reads only single-digit ones in
redirections, and the agent's descriptors go well past 9): the agent's "go" arrives on the
script's standard input, which is then replaced by ``/dev/null`` before the exec.

A ``ContainerProcess`` holds one descriptor, on its mount namespace, only while a process of it
can be alive: the open namespace keeps its inode number from being reused by another
container's namespace while the agent may still signal "every process of this namespace".
``release()`` closes it once the namespace is empty.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# Runs inside the new namespaces. Arguments: marker file (relative to the working directory),
# an empty directory for the machine's /dev meanwhile, hostname, working directory ("" = stay),
# the user to run as ("UID:GID:G1,G2", "" = stay root), setpriv's privilege options separated
# by spaces ("--nnp --bounding-set=-all ...", "" = none), then SOURCE=TARGET mounts (prefix
# "ro:" for a read-only one) and "expose:DIR=CHILD/CHILD" entries, "--", the command.
# The mounts need root, so the command gets its user and privileges only at the exec
# (setpriv, util-linux).
# The script's own variables start with "__sb_": a variable that came in the environment is
# exported, so assigning to a name the pod's env also sets would change what the command gets. Its standard input carries the agent's "go": the
# agent says go once it holds the namespace, so that a command that exits at once cannot take
# its namespace with it before the agent tracks it.
# The private /dev is a tmpfs mirroring the machine's /dev (devices and symlinks copied,
# directories such as pts and shm and anything else bind-mounted), so that mount points such as
# /dev/termination-log are created there and never in the machine's /dev.
# The marker file says "the sandbox is ready and the command exists": without it, an exit is the
# sandbox's failure (reported as StartError), not the command's.
SANDBOX_SCRIPT = r"""
set -e
private_dev() {
  __sb_real="$1"
  mount --rbind /dev "$__sb_real"
  mount -t tmpfs -o mode=755,nosuid tmpfs /dev
  set --
  for __sb_entry in "$__sb_real"/* "$__sb_real"/.[!.]*; do
    [ -e "$__sb_entry" ] || [ -L "$__sb_entry" ] || continue
    __sb_name="${__sb_entry##*/}"
    if [ -L "$__sb_entry" ] || [ -c "$__sb_entry" ] || [ -b "$__sb_entry" ]; then set -- "$@" "$__sb_entry"
    elif [ -d "$__sb_entry" ]; then mkdir "/dev/$__sb_name"; mount --rbind "$__sb_entry" "/dev/$__sb_name"
    else : > "/dev/$__sb_name"; mount --bind "$__sb_entry" "/dev/$__sb_name"; fi
  done
  # One cp for the ~100 device nodes (fast); binding each one is the fallback without mknod.
  if [ $# -gt 0 ] && ! cp -a "$@" /dev/ 2>/dev/null; then
    for __sb_entry; do
      __sb_name="${__sb_entry##*/}"
      if [ -L "$__sb_entry" ]; then [ -L "/dev/$__sb_name" ] || ln -s "$(readlink "$__sb_entry")" "/dev/$__sb_name"
      else [ -e "/dev/$__sb_name" ] || : > "/dev/$__sb_name"; mount --bind "$__sb_entry" "/dev/$__sb_name"; fi
    done
  fi
  umount -R "$__sb_real" 2>/dev/null || umount -l "$__sb_real"
  # Terminals of its own, as a container runtime gives: a new devpts instance whose ptys
  # belong to the tty group (a non-root sshd cannot chown a pty to it otherwise).
  __sb_tty_gid="$(getent group tty | cut -d: -f3)"
  if mount -t devpts -o "newinstance,ptmxmode=0666,mode=0620,gid=${__sb_tty_gid:-5}" \
       devpts /dev/pts 2>/dev/null; then
    rm -f /dev/ptmx; ln -s pts/ptmx /dev/ptmx
  fi
}
# Makes the listed children of a directory the user cannot enter reachable, hiding the rest of
# it: a tmpfs over the directory, each child bind-mounted back from a saved view of it (in the
# private /dev: the machine path of the marker may lie under a container mount such as /tmp).
expose() {
  __sb_dir="$1"; __sb_children="$2"; __sb_saved="$3"
  mkdir -p "$__sb_saved"
  mount --rbind "$__sb_dir" "$__sb_saved"
  mount -t tmpfs -o mode=755 tmpfs "$__sb_dir"
  __sb_old_ifs="$IFS"; IFS=/
  for __sb_child in $__sb_children; do
    mkdir -p "$__sb_dir/$__sb_child"
    mount --rbind "$__sb_saved/$__sb_child" "$__sb_dir/$__sb_child"
  done
  IFS="$__sb_old_ifs"
  umount -R "$__sb_saved" 2>/dev/null || umount -l "$__sb_saved"
  rmdir "$__sb_saved"
}
__sb_marker="$1"; shift
private_dev "$1"; shift
hostname "$1"; shift
__sb_workdir="$1"; shift
__sb_user="$1"; shift
__sb_privileges="$1"; shift
# Every source is first bound into a staging directory in the private /dev, before any mount
# at a container path: a mount over a source's parent (an emptyDir at /tmp over the agent's
# state directory) would otherwise hide the sources of the mounts after it.
__sb_stage=/dev/.sandbox-sources
mkdir "$__sb_stage"
__sb_n=0
for __sb_arg; do
  case "$__sb_arg" in
    --) break ;;
    expose:*) continue ;;
    ro:*) __sb_entry="${__sb_arg#ro:}" ;;
    *) __sb_entry="$__sb_arg" ;;
  esac
  __sb_n=$((__sb_n + 1)); __sb_src="${__sb_entry%%=*}"
  if [ -d "$__sb_src" ]; then mkdir "$__sb_stage/$__sb_n"; else : > "$__sb_stage/$__sb_n"; fi
  mount --bind "$__sb_src" "$__sb_stage/$__sb_n"
done
__sb_n=0
while [ "$1" != "--" ]; do
  case "$1" in
    expose:*) __sb_entry="${1#expose:}"; shift
      expose "${__sb_entry%%=*}" "${__sb_entry#*=}" /dev/.sandbox-expose; continue ;;
    ro:*) __sb_read_only=1; __sb_entry="${1#ro:}" ;;
    *) __sb_read_only=""; __sb_entry="$1" ;;
  esac
  shift
  __sb_n=$((__sb_n + 1)); __sb_src="$__sb_stage/$__sb_n"; __sb_dst="${__sb_entry#*=}"
  if [ -d "$__sb_src" ]; then mkdir -p "$__sb_dst"
  elif [ ! -e "$__sb_dst" ]; then mkdir -p "${__sb_dst%/*}"; : > "$__sb_dst"; fi
  mount --bind "$__sb_src" "$__sb_dst"
  if [ -n "$__sb_read_only" ]; then mount -o remount,bind,ro "$__sb_dst"; fi
done
# The staged binds go; the container's own mounts are separate copies and stay.
for __sb_staged in "$__sb_stage"/*; do
  [ -e "$__sb_staged" ] || continue
  umount "$__sb_staged"
  if [ -d "$__sb_staged" ]; then rmdir "$__sb_staged"; else rm -f "$__sb_staged"; fi
done
rmdir "$__sb_stage"
shift
read -r _
exec < /dev/null
case "$1" in
  */*) [ -f "$1" ] && [ -x "$1" ] ;;
  *) command -v "$1" > /dev/null ;;
esac || { echo "exec: \"$1\": executable file not found in \$PATH" >&2; exit 127; }
if [ -n "$__sb_workdir" ]; then mkdir -p "$__sb_workdir"; fi
if [ -n "$__sb_user$__sb_privileges" ]; then
  command -v setpriv > /dev/null || { echo "setpriv (util-linux) is needed to run as $__sb_user $__sb_privileges" >&2; exit 127; }
fi
: > "$__sb_marker"
if [ -n "$__sb_workdir" ]; then cd "$__sb_workdir"; fi
if [ -z "$__sb_user$__sb_privileges" ]; then exec "$@"; fi
# The privilege options are single words without glob characters: split them on spaces.
if [ -z "$__sb_user" ]; then exec setpriv $__sb_privileges -- "$@"; fi
__sb_uid="${__sb_user%%:*}"; __sb_rest="${__sb_user#*:}"; __sb_gid="${__sb_rest%%:*}"; __sb_groups="${__sb_rest#*:}"
if [ -n "$__sb_groups" ]; then
  exec setpriv $__sb_privileges --reuid="$__sb_uid" --regid="$__sb_gid" --groups="$__sb_groups" -- "$@"
fi
exec setpriv $__sb_privileges --reuid="$__sb_uid" --regid="$__sb_gid" --clear-groups -- "$@"
"""

NAMESPACE_TIMEOUT_SECONDS = 5.0
# The script's $0: while a container's main process has it as its fourth word, the sandbox is
# still making the container's mounts (``start`` returns before that, once it holds the
# namespace).
SCRIPT_NAME = "pod-sandbox"


class SandboxError(RuntimeError):
    """The container's sandbox could not be set up (the message says why)."""


@dataclass
class ContainerProcess:
    """A started container: its main process and the mount namespace holding all of its
    processes (children, daemons) until it is empty."""

    process: subprocess.Popen[bytes]
    mount_ns: str
    marker: Path
    log_path: Path
    _ns_fd: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        """The main process id."""
        return self.process.pid

    def poll(self) -> int | None:
        """The main process's return code once it ended (reaped), else ``None``."""
        return self.process.poll()

    def exec_started(self) -> bool:
        """Whether the sandbox got as far as exec'ing the command (its marker file exists)."""
        return self.marker.exists()

    def pids(self) -> list[int]:
        """Every live process of the container's mount namespace (empty once released)."""
        if self._ns_fd is None:
            return []
        return pids_in_mount_ns(self.mount_ns)

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to every process of the container."""
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def release(self) -> bool:
        """Close the namespace descriptor if no process is left; returns whether it is closed."""
        self.process.poll()
        if self._ns_fd is None:
            return True
        if pids_in_mount_ns(self.mount_ns):
            return False
        os.close(self._ns_fd)
        self._ns_fd = None
        return True


@dataclass(frozen=True)
class Mount:
    """A bind mount of ``source`` (on the machine) at ``target`` (in the container)."""

    source: Path
    target: str
    read_only: bool = False

    def argument(self) -> str:
        """The sandbox script's argument for this mount."""
        return f"{'ro:' if self.read_only else ''}{self.source}={self.target}"


def hidden_roots(targets: Iterable[str], roots: Iterable[Path]) -> list[Path]:
    """The ``roots`` that a mount at one of ``targets`` (container paths) would hide: each
    root at or under a target, less those inside another root returned, in ``roots``' order.

    On the local cluster "the image" is this machine's checkout and Python (the agent's
    ``IMAGE_ROOTS``); a real image's files never sit under a volume's mount point, but a
    checkout under /tmp does under an emptyDir at /tmp (the chart's operator pod has one). The
    agent binds these roots back at their own paths after the volumes."""
    mount_points = [Path(target) for target in targets]
    hidden = [root for root in roots
              if any(root.is_relative_to(point) for point in mount_points)]
    return [root for root in dict.fromkeys(hidden)
            if not any(root != other and root.is_relative_to(other) for other in hidden)]


def start(command: list[str], *, hostname: str, mounts: Iterable[Mount | tuple[Path, str]],
          env: dict[str, str], workdir: Path, log_path: Path, name: str,
          working_dir: str = "", user: tuple[int, int, Iterable[int]] | None = None,
          expose: dict[str, list[str]] | None = None,
          privileges: Iterable[str] = ()) -> ContainerProcess:
    """Start ``command`` in a new mount and UTS namespace; returns once the agent tracks it.

    Args:
        hostname: the pod's hostname, set in the new UTS namespace.
        mounts: bind mounts (or (machine path, container path) pairs), made in order; every
            source is bound into a staging directory first, so that a mount over a source's
            parent (e.g. an emptyDir at /tmp) does not hide it.
        workdir: the pod's directory on the machine (the process starts there).
        log_path: the container's stdout and stderr go to the end of this file.
        name: the container's name (names the marker file and the /dev placeholder).
        working_dir: the container's ``workingDir`` ("" = stay in ``workdir``).
        user: (uid, gid, supplementary gids) the command runs as, after the mounts;
            ``None``: the agent's own user (root).
        expose: directory -> children (single path components) to make reachable inside a
            directory the user could not enter (e.g. ``{"/root": [".pyenv"]}``), hiding the
            rest of it; done after the mounts.
        privileges: setpriv options applied at the exec, after the mounts (e.g. ``--nnp``,
            ``--bounding-set=-all``; ``identity.privilege_options()``); single words without
            spaces or glob characters.

    Raises:
        SandboxError: the namespace did not come up; the message carries the sandbox's output.
    """
    marker = workdir / f".{name}.exec"
    marker.unlink(missing_ok=True)
    real_dev = workdir / f".{name}.machine-dev"  # stays an empty directory outside the pod
    real_dev.mkdir(exist_ok=True)
    mount_args = [(mount if isinstance(mount, Mount) else Mount(*mount)).argument()
                  for mount in mounts]
    mount_args += [f"expose:{directory}={'/'.join(children)}"
                   for directory, children in (expose or {}).items()]
    user_arg = "" if user is None else f"{user[0]}:{user[1]}:{','.join(map(str, user[2]))}"
    privilege_arg = " ".join(privileges)
    if any(char in privilege_arg for char in "*?[\t\n"):
        raise SandboxError(f"privilege options must be plain words: {privilege_arg!r}")
    go_read, go_write = os.pipe()
    try:
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                 "sh", "-c", SANDBOX_SCRIPT, SCRIPT_NAME, marker.name, str(real_dev),
                 hostname, working_dir, user_arg, privilege_arg, *mount_args, "--", *command],
                env=env, cwd=workdir, stdin=go_read, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True)
    finally:
        os.close(go_read)
    try:
        mount_ns = _wait_new_mount_ns(process)
        ns_fd = os.open(f"/proc/{process.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except (SandboxError, OSError) as error:
        os.close(go_write)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise SandboxError(f"{error}; sandbox output: {tail_text(log_path)}") from error
    try:
        os.write(go_write, b"go\n")
    except OSError:
        pass  # the sandbox already failed; its exit without the marker says so
    finally:
        os.close(go_write)
    return ContainerProcess(process=process, mount_ns=mount_ns, marker=marker,
                            log_path=log_path, _ns_fd=ns_fd)


def stop_all(containers: list[ContainerProcess], grace: float = 3.0,
             kill_wait: float = 2.0) -> None:
    """SIGTERM every process of ``containers`` at once, SIGKILL what is left after ``grace``
    seconds, then release each namespace that emptied (all of them, unless a process hangs)."""
    tracked = [c for c in containers if c._ns_fd is not None]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        live = processes_by_mount_ns({c.mount_ns for c in tracked})
        if not live:
            break
        for pids in live.values():
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and live:
            for container in tracked:
                container.process.poll()
            time.sleep(0.05)
            live = processes_by_mount_ns(set(live))
    for container in containers:
        container.release()


def tail_text(path: Path, max_bytes: int = 1024) -> str:
    """The file's last ``max_bytes`` bytes as one line of text ("" if unreadable)."""
    try:
        with open(path, "rb") as file:
            file.seek(max(0, os.fstat(file.fileno()).st_size - max_bytes))
            data = file.read(max_bytes)
    except OSError:
        return ""
    return " ".join(data.decode("utf-8", "replace").split())


def _mount_ns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def command_started(pid: int) -> bool:
    """Whether process ``pid``, a container's main process as :func:`start` returned it, runs
    the container's command: the sandbox made its mounts and exec'd it, as a runtime's exec
    would find it. False while the process is still ``unshare``, the sandbox script or
    ``setpriv`` (its user not taken yet), and once it is gone. An exec that joined it earlier
    saw the mounts half made: ``kubectl cp`` into a volume wrote under it, and the file was
    hidden by the volume mounted over it (a clean-clone CI run, 2026-12-06,
    tests/cluster/test_kubectl_logs_exec.py)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    program = os.path.basename(argv[0])
    return program not in (b"unshare", b"setpriv") and argv[3:4] != [SCRIPT_NAME.encode()]


def _wait_new_mount_ns(process: subprocess.Popen[bytes]) -> str:
    """The mount namespace of ``process`` once ``unshare`` has moved it out of ours."""
    own = _mount_ns("self")
    deadline = time.monotonic() + NAMESPACE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        ns = _mount_ns(process.pid)
        if ns and ns != own:
            return ns
        if process.poll() is not None:
            raise SandboxError(f"sandbox exited with {process.returncode} before entering its "
                               "mount namespace")
        time.sleep(0.005)
    raise SandboxError(f"pid {process.pid} did not enter a new mount namespace in "
                       f"{NAMESPACE_TIMEOUT_SECONDS:.0f}s")


def pids_in_mount_ns(mount_ns: str) -> list[int]:
    """Live processes (zombies excluded) whose mount namespace is ``mount_ns``."""
    return processes_by_mount_ns({mount_ns}).get(mount_ns, [])


def processes_by_mount_ns(namespaces: set[str]) -> dict[str, list[int]]:
    """Live processes of each of ``namespaces`` that has any, in one pass over ``/proc``."""
    own = os.getpid()
    found: dict[str, list[int]] = {}
    if not namespaces:
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != own:
            ns = _mount_ns(entry)
            if ns in namespaces:
                found.setdefault(ns, []).append(int(entry))
    return found
