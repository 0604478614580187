"""A name and a home for a uid the image's ``/etc/passwd`` does not know (field cases C36, C38).

OpenShift's ``restricted-v2`` (and any template with ``runAsUser: 1000680000``) starts the
container as a uid with no passwd entry and ``HOME=/``: ``ssh`` refuses to run ("No user
exists for uid"), ``getpass.getuser()`` and ``pwd.getpwuid(os.getuid())`` raise ``KeyError``,
and ``~`` is the unwritable ``/``. The launcher's console scripts therefore call
:func:`reexec_with_entry` first: for such a uid it writes a passwd file (the image's, with an
entry named ``monarch`` for this uid whose home is writable) and a group file into the pod's
runtime directory (``MONARCH_RUNTIME_DIR``, an emptyDir the operator mounts), and runs itself
again under nss_wrapper (``LD_PRELOAD``, ``NSS_WRAPPER_PASSWD``, ``NSS_WRAPPER_GROUP``), so that
this process, its ``ssh`` and everything it starts resolve the uid. The worker image's
entrypoint (images/worker/entrypoint.sh) does the same in shell for sshd and the ranks.

The entry is named ``monarch`` (``MONARCH_USER_NAME`` changes it) whatever the uid, so that a
launcher logging in as itself reaches a worker running as the image's ``monarch`` or as
another unknown uid: sshd not running as root logs in only its own user, by name.
A uid the image knows changes nothing here.
"""

from __future__ import annotations

import glob
import os
import pwd
import sys
import tempfile
from collections.abc import MutableMapping, Sequence
from pathlib import Path

from monarch_operator import constants

DEFAULT_USER_NAME = "monarch"
ENV_USER_NAME = "MONARCH_USER_NAME"
# Where a distribution's nss_wrapper package (Debian's libnss-wrapper) puts the library;
# NSS_WRAPPER_LIB names another.
ENV_LIBRARY = "NSS_WRAPPER_LIB"
LIBRARY_PATTERNS = ("/usr/lib/*/libnss_wrapper.so", "/usr/lib64/libnss_wrapper.so",
                    "/usr/lib/libnss_wrapper.so")
# nss_wrapper is active in a process only when both are set (nss_wrapper(1)).
ENV_PASSWD, ENV_GROUP = "NSS_WRAPPER_PASSWD", "NSS_WRAPPER_GROUP"
SHELLS = ("/bin/bash", "/bin/sh")
NOTE = "monarch-launch:"


class UserEntryError(RuntimeError):
    """The uid has no passwd entry and none can be given (no nss_wrapper, no writable dir)."""


def has_entry(uid: int) -> bool:
    """Whether the user database resolves ``uid``."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def find_library(environ: MutableMapping[str, str]) -> str | None:
    """The nss_wrapper library: ``NSS_WRAPPER_LIB`` if it names a file, else the first of
    :data:`LIBRARY_PATTERNS` that exists; ``None`` when there is none."""
    given = environ.get(ENV_LIBRARY)
    if given:
        return given if os.path.isfile(given) else None
    for pattern in LIBRARY_PATTERNS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def runtime_dir(environ: MutableMapping[str, str], uid: int) -> Path:
    """``MONARCH_RUNTIME_DIR`` (the operator's per-pod emptyDir), else a folder of this uid's
    own under the temporary directory."""
    given = environ.get(constants.ENV_RUNTIME_DIR)
    return Path(given) if given else Path(tempfile.gettempdir()) / f"monarch-{uid}"


def usable_home(path: str | None) -> bool:
    """Whether ``path`` can serve as a home: set, not ``/``, a writable directory."""
    return bool(path) and path != "/" and os.path.isdir(str(path)) \
        and os.access(str(path), os.W_OK | os.X_OK)


def passwd_text(image_passwd: str, name: str, uid: int, gid: int, home: str,
                shell: str) -> str:
    """The image's passwd without any entry named ``name``, then ``name`` for ``uid``."""
    kept = [line for line in image_passwd.splitlines() if line.split(":", 1)[0] != name]
    return "\n".join([*kept, f"{name}:x:{uid}:{gid}:{name}:{home}:{shell}"]) + "\n"


def group_text(image_group: str, name: str, gid: int) -> str:
    """The image's group file, plus a group ``name`` for ``gid`` when no group has that gid."""
    lines = image_group.splitlines()
    known = {fields[2] for fields in (line.split(":") for line in lines) if len(fields) > 2}
    if str(gid) not in known:
        taken = {line.split(":", 1)[0] for line in lines}
        lines.append(f"{name if name not in taken else f'{name}-{gid}'}:x:{gid}:")
    return "\n".join(lines) + "\n"


def _private_dir(path: Path, owned: bool) -> None:
    """Make ``path`` (mode 0700 when made here); refuse a symlink, one not writable, or, for a
    folder of our own choosing under a shared /tmp, one another uid made."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink() or not os.access(path, os.W_OK | os.X_OK) or (
            owned and path.stat().st_uid != os.getuid()):
        raise UserEntryError(f"{path} is not a writable directory of uid {os.getuid()}")


def _write(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(partial, path)


def prepare(environ: MutableMapping[str, str], uid: int, gid: int, library: str,
            etc: Path = Path("/etc")) -> dict[str, str]:
    """Write the passwd and group files for ``uid`` into the runtime directory; return the
    variables that make a new process use them (and ``HOME``, ``USER``, ``LOGNAME``)."""
    base = runtime_dir(environ, uid)
    _private_dir(base, owned=constants.ENV_RUNTIME_DIR not in environ)
    name = environ.get(ENV_USER_NAME) or DEFAULT_USER_NAME
    home = environ.get("HOME")
    if not usable_home(home):
        home = str(base / "home")
        _private_dir(Path(home), owned=True)
    shell = next((path for path in SHELLS if os.access(path, os.X_OK)), SHELLS[-1])
    passwd, group = base / "passwd", base / "group"
    _write(passwd, passwd_text((etc / "passwd").read_text(), name, uid, gid, str(home), shell))
    _write(group, group_text((etc / "group").read_text(), name, gid))
    preload = environ.get("LD_PRELOAD")
    return {"LD_PRELOAD": f"{library}:{preload}" if preload else library,
            ENV_PASSWD: str(passwd), ENV_GROUP: str(group), "HOME": str(home),
            "USER": environ.get("USER") or name, "LOGNAME": environ.get("LOGNAME") or name}


def entry_environment(environ: MutableMapping[str, str]) -> dict[str, str] | None:
    """The variables a new process needs to know this uid, or ``None`` when it needs none
    (the uid is known, or nss_wrapper is already active: a second pass never loops).

    Without nss_wrapper or a writable runtime directory it says why on stderr and returns
    ``None``: what needs no user name still works.
    """
    uid = os.getuid()
    if has_entry(uid) or environ.get(ENV_PASSWD):
        return None
    library = find_library(environ)
    try:
        if library is None:
            raise UserEntryError("no libnss_wrapper.so (install libnss-wrapper)")
        return prepare(environ, uid, os.getgid(), library)
    except (UserEntryError, OSError) as error:
        print(f"{NOTE} uid {uid} has no passwd entry, and none could be given: {error}; "
              "ssh and getpass.getuser() will fail", file=sys.stderr, flush=True)
        return None


def reexec_with_entry(argv: Sequence[str] | None = None,
                      environ: MutableMapping[str, str] | None = None) -> None:
    """Run this Python program (``argv``, default ``sys.orig_argv``) again under nss_wrapper
    when its uid has no passwd entry; return when there is nothing to do
    (:func:`entry_environment`)."""
    environ = os.environ if environ is None else environ
    updates = entry_environment(environ)
    if updates is None:
        return
    environ.update(updates)
    args = list(sys.orig_argv if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *args[1:]], dict(environ))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monarch_operator.launcher.userentry COMMAND [ARGS...]``: run COMMAND with a
    passwd entry for this uid (for a ``launcher.command`` of your own); 2 without COMMAND, 127
    when it cannot be run."""
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        print("usage: python -m monarch_operator.launcher.userentry COMMAND [ARGS...]",
              file=sys.stderr)
        return 2
    environ = dict(os.environ)
    environ.update(entry_environment(environ) or {})
    try:
        os.execvpe(command[0], command, environ)
    except OSError as error:
        print(f"{NOTE} cannot run {command[0]}: {error}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
