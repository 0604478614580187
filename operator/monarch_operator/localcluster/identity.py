"""Who a container runs as, and what its volumes' files look like: the kubelet's
``securityContext`` rules for the node agent.

Pure functions over pod dicts (plus the machine's user database, which plays the image's
``/etc/passwd`` and ``/etc/group``), so the rules are tested without a cluster:

- ``identity()``: the process's uid, primary gid and supplementary groups, from the effective
  security context (container fields override the pod's; ``fsGroup`` and
  ``supplementalGroups`` are pod-level), as the kubelet hands them to the runtime and the
  runtime resolves them against the image (kubelet
  ``pkg/kubelet/kuberuntime/security_context.go``; containerd/runc user resolution);
- ``verify_run_as_non_root()``: the kubelet's ``runAsNonRoot`` refusal
  (``pkg/kubelet/kuberuntime/security_context_others.go`` ``verifyRunAsNonRoot``), reported
  as ``CreateContainerConfigError``;
- ``set_volume_ownership()``: ``fsGroup`` on a volume's files (``pkg/volume/volume_linux.go``
  ``changeFilePermission``: group ``fsGroup``, mode OR 0440 for read-only API-data volumes or
  0660 for writable ones, directories also setgid and 0110);
- ``privilege_options()``: ``allowPrivilegeEscalation: false`` (the runtime's
  ``noNewPrivileges``) and ``capabilities`` (the bounding set) as ``setpriv`` options. The
  seccomp profile is not applied: the node agent has no seccomp filter of its own.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT_UID = 0
# Modes the kubelet ORs into files under fsGroup (pkg/volume/volume_linux.go).
RW_MASK, RO_MASK, EXEC_MASK = 0o660, 0o440, 0o110

# users(uid) -> (name, primary gid, home) or None; groups_of(name) -> gids listing the user.
Users = Callable[[int], "tuple[str, int, str] | None"]
GroupsOf = Callable[[str], "list[int]"]


def machine_user(uid: int) -> tuple[str, int, str] | None:
    """The machine's passwd entry for ``uid`` as (name, gid, home), or ``None``."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    return entry.pw_name, entry.pw_gid, entry.pw_dir


def machine_groups_of(name: str) -> list[int]:
    """Gids of the machine's groups that list ``name`` as a member (``/etc/group``)."""
    return sorted(group.gr_gid for group in grp.getgrall() if name in group.gr_mem)


@dataclass(frozen=True)
class Identity:
    """The credentials a container's process runs with.

    ``user`` is the passwd entry (name, gid, home) the uid has on the machine, or ``None``;
    ``groups`` are the supplementary groups in the order ``id -G`` lists them after the gid.
    """

    uid: int
    gid: int
    groups: tuple[int, ...]
    user: tuple[str, int, str] | None

    @property
    def root(self) -> bool:
        """Whether the process runs as uid 0 (then the agent changes nothing about it)."""
        return self.uid == ROOT_UID


def effective_security_context(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The pod's ``securityContext`` with the container's fields laid over it
    (``securitycontext.DetermineEffectiveSecurityContext``): ``runAsUser``, ``runAsGroup``,
    ``runAsNonRoot`` per container; ``fsGroup``, ``supplementalGroups`` from the pod."""
    pod_context = pod["spec"].get("securityContext") or {}
    effective = {key: pod_context[key] for key in ("runAsUser", "runAsGroup", "runAsNonRoot",
                                                   "fsGroup", "supplementalGroups")
                 if pod_context.get(key) is not None}
    for key, value in (container.get("securityContext") or {}).items():
        if key in ("runAsUser", "runAsGroup", "runAsNonRoot") and value is not None:
            effective[key] = value
    return effective


def identity(pod: dict[str, Any], container: dict[str, Any], users: Users = machine_user,
             groups_of: GroupsOf = machine_groups_of) -> Identity:
    """The uid, gid and supplementary groups ``container`` runs with.

    The image's user is the machine's root (uid 0) unless ``runAsUser`` says otherwise. The
    primary gid is ``runAsGroup``, else the uid's passwd gid, else 0 (what containerd does for
    a uid the image does not know). Supplementary groups, as ``id -G`` shows them after the
    gid: the groups that list the user in ``/etc/group``, then ``fsGroup``, then
    ``supplementalGroups`` (kubelet order), each once.
    """
    context = effective_security_context(pod, container)
    uid = int(context.get("runAsUser", ROOT_UID))
    user = users(uid)
    gid = int(context["runAsGroup"]) if "runAsGroup" in context else (user[1] if user else 0)
    groups: list[int] = []
    candidates = [*(groups_of(user[0]) if user else []), *(
        [context["fsGroup"]] if "fsGroup" in context else []),
        *(context.get("supplementalGroups") or [])]
    for group in candidates:
        if int(group) != gid and int(group) not in groups:
            groups.append(int(group))
    return Identity(uid=uid, gid=gid, groups=tuple(groups), user=user)


def verify_run_as_non_root(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Refuse a container that must not run as root but would (kubelet ``verifyRunAsNonRoot``).

    Without ``runAsUser`` the image's user decides, and this "image" (the machine) runs as
    root, as an image without ``USER`` does.

    Raises:
        ValueError: the kubelet's message, e.g. ``container's runAsUser breaks non-root policy
            (pod: "name_namespace(uid)", container: main)``.
    """
    context = effective_security_context(pod, container)
    if not context.get("runAsNonRoot"):
        return
    meta = pod["metadata"]
    where = (f'(pod: "{meta["name"]}_{meta["namespace"]}({meta.get("uid", "")})", '
             f'container: {container["name"]})')
    if "runAsUser" in context:
        if int(context["runAsUser"]) == ROOT_UID:
            raise ValueError(f"container's runAsUser breaks non-root policy {where}")
        return
    raise ValueError(f"container has runAsNonRoot and image will run as root {where}")


def fs_user(pod: dict[str, Any]) -> int | None:
    """The uid that owns projected service-account token files: the ``runAsUser`` every
    container and init container of the pod shares, if they all share one (kubelet
    ``FsUserFrom``), else ``None``."""
    uids = {effective_security_context(pod, container).get("runAsUser")
            for key in ("initContainers", "containers")
            for container in pod["spec"].get(key) or []}
    if len(uids) != 1:
        return None
    (uid,) = uids
    return None if uid is None else int(uid)


def fs_group(pod: dict[str, Any]) -> int | None:
    """The pod's ``securityContext.fsGroup``, or ``None``."""
    value = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    return None if value is None else int(value)


def set_volume_ownership(directory: Path, group: int | None, read_only: bool) -> None:
    """Give every file and directory under ``directory`` (itself included) the ``fsGroup``
    ``group`` and the kubelet's group permissions; nothing when ``group`` is ``None``.

    Files get mode | 0440 (read-only API-data volumes: Secret, ConfigMap, downwardAPI,
    projected) or mode | 0660 (emptyDir); directories also the setgid bit and 0110, so that
    files made later inherit the group. Symbolic links are left alone.
    """
    if group is None:
        return
    mask = RO_MASK if read_only else RW_MASK
    paths = [directory, *directory.rglob("*")]
    for path in paths:
        if path.is_symlink():
            continue
        os.chown(path, -1, group)
        mode = path.stat().st_mode & 0o7777
        path.chmod(mode | mask | (0o2000 | EXEC_MASK if path.is_dir() else 0))


def privilege_options(container: dict[str, Any]) -> list[str]:
    """``setpriv`` options for the container's ``allowPrivilegeEscalation`` and
    ``capabilities`` (both container-level only in the Kubernetes API).

    ``allowPrivilegeEscalation: false`` gives ``--nnp``: the process and its children run with
    ``no_new_privs``, so setuid binaries and file capabilities grant nothing (the kubelet sets
    the OCI ``noNewPrivileges`` only when the field is false, ``kuberuntime``
    ``security_context.go``). ``capabilities.drop`` shrinks the bounding set: with ``ALL``
    only ``add``'s capabilities stay in it, otherwise the dropped ones leave it; the
    inheritable and ambient sets are cleared with it (a runtime gives neither). Names are
    Kubernetes' (``NET_BIND_SERVICE`` or ``CAP_NET_BIND_SERVICE``). ``add`` cannot give more
    than the agent has, and with no ``drop`` the agent's own bounding set stays (a runtime
    would start from its default set of 14 capabilities).

    Returns:
        options such as ``["--nnp", "--bounding-set=-all,+net_bind_service", "--inh-caps=-all",
        "--ambient-caps=-all"]``; empty when neither field asks for anything.
    """
    context = container.get("securityContext") or {}
    options = ["--nnp"] if context.get("allowPrivilegeEscalation") is False else []
    capabilities = context.get("capabilities") or {}
    dropped = [_capability(name) for name in capabilities.get("drop") or []]
    added = [_capability(name) for name in capabilities.get("add") or []]
    if "all" in dropped and "all" not in added:
        bounding = ["-all", *(f"+{name}" for name in added)]
    else:
        bounding = [f"-{name}" for name in dropped if name != "all"]
    if bounding:
        options += [f"--bounding-set={','.join(bounding)}", "--inh-caps=-all",
                    "--ambient-caps=-all"]
    return options


def _capability(name: str) -> str:
    """A Kubernetes capability name as setpriv spells it: ``CAP_SYS_ADMIN`` -> ``sys_admin``."""
    lowered = str(name).lower()
    return lowered.removeprefix("cap_")


# HOME of a uid without a passwd entry: what runc sets when the image has none (libcontainer
# falls back to "/"), so that such a container fails here as on a real node unless it gives
# itself a name and a home (field case C38, images/worker/entrypoint.sh).
UNKNOWN_UID_HOME = "/"


@dataclass(frozen=True)
class UserSetup:
    """What the agent gives a non-root container so that the machine works as its image would:
    ``user`` for the sandbox, extra read-only or writable ``mounts`` (container path ->
    (machine path, read-only)), directories to ``expose`` and the ``home`` it runs with."""

    user: tuple[int, int, tuple[int, ...]] | None
    mounts: dict[str, tuple[Path, bool]]
    expose: dict[str, list[str]]
    home: str | None


def prepare_user(ident: Identity, pod_dir: Path, image_paths: list[Path]) -> UserSetup:
    """Make the machine usable as ``ident`` inside the container's mount namespace.

    For a process that is not the agent's own root: a home directory of its own for the pod
    (``pod_dir/home-<uid>``, owned by it) mounted at the user's passwd home; and
    ``image_paths`` (the Python environment and this repository: "the image") made reachable
    through directories the user could not enter, such as a ``/root`` of mode 0700, without
    showing the rest of them. A uid the machine does not know gets no passwd entry and
    ``HOME=/``, as runc gives a uid the image does not know (OpenShift's arbitrary uids): ssh,
    sshd and ``getpass.getuser()`` fail for it here as on a real node, unless the container
    gives itself an entry (the worker entrypoint and the launcher do, with nss_wrapper).
    """
    if ident.uid == ROOT_UID and ident.gid == 0 and not ident.groups:
        return UserSetup(user=None, mounts={}, expose={}, home=None)
    user = (ident.uid, ident.gid, ident.groups)
    if ident.uid == ROOT_UID:
        return UserSetup(user=user, mounts={}, expose={}, home=None)
    expose = closed_directories(ident, image_paths)
    if ident.user is None or ident.user[2] in ("", "/"):
        return UserSetup(user=user, mounts={}, expose=expose, home=UNKNOWN_UID_HOME)
    home = ident.user[2]
    home_dir = pod_dir / f"home-{ident.uid}"
    home_dir.mkdir(exist_ok=True)
    os.chown(home_dir, ident.uid, ident.gid)
    home_dir.chmod(0o755)
    return UserSetup(user=user, mounts={home: (home_dir, False)}, expose=expose, home=home)


def closed_directories(ident: Identity, paths: list[Path]) -> dict[str, list[str]]:
    """Directory -> children on the way to ``paths`` that ``ident`` cannot enter (no search
    permission for it), e.g. ``{"/root": [".pyenv"]}`` for a Python under a 0700 ``/root``."""
    closed: dict[str, list[str]] = {}
    for path in paths:
        parts = Path(os.path.abspath(path)).parts
        for depth in range(1, len(parts) - 1):
            directory = Path(*parts[:depth + 1])
            try:
                info = directory.stat()
            except OSError:
                break
            if info.st_uid == ident.uid:
                allowed = info.st_mode & 0o100
            elif info.st_gid in (ident.gid, *ident.groups):
                allowed = info.st_mode & 0o010
            else:
                allowed = info.st_mode & 0o001
            if not allowed:
                children = closed.setdefault(str(directory), [])
                if parts[depth + 1] not in children:
                    children.append(parts[depth + 1])
    return closed
