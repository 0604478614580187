"""launcher/userentry.py: the passwd and group files written for a uid the image does not know,
the environment that makes a new process use them, and when the launcher runs itself again
(field cases C36, C38). No other uid is needed: the user database is faked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from monarch_operator import constants
from monarch_operator.launcher import userentry

IMAGE_PASSWD = ("root:x:0:0:root:/root:/bin/bash\n"
                "monarch:x:1000:1000::/home/monarch:/bin/bash\n")
IMAGE_GROUP = "root:x:0:\nmonarch:x:1000:\n"


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "passwd").write_text(IMAGE_PASSWD)
    (folder / "group").write_text(IMAGE_GROUP)
    return folder


def test_passwd_gives_the_name_to_the_uid_and_drops_the_images_user_of_that_name():
    text = userentry.passwd_text(IMAGE_PASSWD, "monarch", 1000680000, 0, "/run/monarch/home",
                                 "/bin/bash")
    assert text.splitlines() == ["root:x:0:0:root:/root:/bin/bash",
                                 "monarch:x:1000680000:0:monarch:/run/monarch/home:/bin/bash"]


@pytest.mark.parametrize(("gid", "added"), [
    (0, None),                                # root's group exists
    (1000, None),                             # the image's monarch group
    (1000680000, "monarch-1000680000:x:1000680000:"),  # "monarch" is taken by gid 1000
])
def test_group_is_added_only_for_a_gid_without_one(gid, added):
    lines = userentry.group_text(IMAGE_GROUP, "monarch", gid).splitlines()
    assert lines[:2] == IMAGE_GROUP.splitlines()
    assert lines[2:] == ([added] if added else [])
    assert userentry.group_text("root:x:0:\n", "monarch", 7).splitlines()[-1] == "monarch:x:7:"


def test_find_library_takes_nss_wrapper_lib_only_when_it_names_a_file(tmp_path):
    library = tmp_path / "libnss_wrapper.so"
    library.write_bytes(b"")
    assert userentry.find_library({"NSS_WRAPPER_LIB": str(library)}) == str(library)
    assert userentry.find_library({"NSS_WRAPPER_LIB": str(tmp_path / "none.so")}) is None


@pytest.mark.parametrize(("home", "usable"), [
    (None, False), ("", False), ("/", False), ("missing", False), ("dir", True)])
def test_usable_home(tmp_path, home, usable):
    (tmp_path / "dir").mkdir()
    path = home if home in (None, "", "/") else str(tmp_path / home)
    assert userentry.usable_home(path) is usable


def test_runtime_dir_is_the_pods_emptydir_else_a_folder_of_the_uid_under_tmp(tmp_path):
    assert userentry.runtime_dir({constants.ENV_RUNTIME_DIR: "/run/monarch"}, 5) == Path(
        "/run/monarch")
    assert userentry.runtime_dir({}, 5).name == "monarch-5"


def test_prepare_writes_private_files_and_a_home_in_the_runtime_dir(tmp_path, etc):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o777)
    environ = {constants.ENV_RUNTIME_DIR: str(runtime), "HOME": "/", "LD_PRELOAD": "libjemalloc.so"}
    updates = userentry.prepare(environ, 1000680000, 0, "/lib/libnss_wrapper.so", etc=etc)
    home = runtime / "home"
    assert updates == {
        "LD_PRELOAD": "/lib/libnss_wrapper.so:libjemalloc.so",
        "NSS_WRAPPER_PASSWD": str(runtime / "passwd"), "NSS_WRAPPER_GROUP": str(runtime / "group"),
        "HOME": str(home), "USER": "monarch", "LOGNAME": "monarch"}
    assert (runtime / "passwd").read_text().splitlines()[-1].startswith(
        f"monarch:x:1000680000:0:monarch:{home}:")
    assert (runtime / "group").read_text() == IMAGE_GROUP
    for path in (runtime / "passwd", runtime / "group"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert home.is_dir() and stat.S_IMODE(home.stat().st_mode) == 0o700
    assert not list(runtime.glob("*.partial"))


def test_prepare_keeps_a_usable_home_and_a_given_name(tmp_path, etc):
    runtime, home = tmp_path / "runtime", tmp_path / "workspace"
    home.mkdir()
    environ = {constants.ENV_RUNTIME_DIR: str(runtime), "HOME": str(home),
               userentry.ENV_USER_NAME: "trainer"}
    updates = userentry.prepare(environ, 4242, 4242, "/lib/libnss_wrapper.so", etc=etc)
    assert (updates["HOME"], updates["USER"], updates["LD_PRELOAD"]) == (
        str(home), "trainer", "/lib/libnss_wrapper.so")
    entry, _, shell = (runtime / "passwd").read_text().splitlines()[-1].rpartition(":")
    assert entry == f"trainer:x:4242:4242:trainer:{home}" and shell in userentry.SHELLS
    assert "trainer:x:4242:" in (runtime / "group").read_text()
    assert not (runtime / "home").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another uid")
def test_a_default_folder_another_uid_made_first_is_refused(tmp_path, etc, monkeypatch):
    monkeypatch.setattr(userentry.tempfile, "gettempdir", lambda: str(tmp_path))
    planted = tmp_path / f"monarch-{os.getuid()}"
    planted.mkdir(mode=0o777)
    os.chown(planted, 12345, 12345)
    with pytest.raises(userentry.UserEntryError, match="not a writable directory of uid"):
        userentry.prepare({"HOME": "/"}, os.getuid(), 0, "/lib/libnss_wrapper.so", etc=etc)


class Exec(Exception):
    """os.execve was called (with these arguments)."""


@pytest.fixture
def unknown(monkeypatch, tmp_path, etc):
    """This process's uid without a passwd entry, nss_wrapper at a fake path, os.execve
    recorded instead of run."""
    library = tmp_path / "libnss_wrapper.so"
    library.write_bytes(b"")
    monkeypatch.setattr(userentry, "has_entry", lambda uid: False)
    monkeypatch.setattr(userentry, "prepare",
                        lambda environ, uid, gid, lib: {"LD_PRELOAD": lib, "HOME": "/h",
                                                        "NSS_WRAPPER_PASSWD": "/p"})

    def execve(path, args, env):
        raise Exec(path, args, env)

    monkeypatch.setattr(userentry.os, "execve", execve)
    return {"NSS_WRAPPER_LIB": str(library), "HOME": "/"}


def test_an_unknown_uid_runs_the_program_again_under_nss_wrapper(unknown):
    with pytest.raises(Exec) as called:
        userentry.reexec_with_entry(["python3", "-u", "-m", "monarch_operator.launcher", "x"],
                                    unknown)
    path, args, env = called.value.args
    assert args[1:] == ["-u", "-m", "monarch_operator.launcher", "x"]
    assert path == args[0]
    assert env["LD_PRELOAD"] == unknown["NSS_WRAPPER_LIB"] and env["HOME"] == "/h"


def test_nothing_is_done_for_a_known_uid_or_a_second_time(unknown, monkeypatch):
    userentry.reexec_with_entry(["python3"], {**unknown, "NSS_WRAPPER_PASSWD": "/p"})
    monkeypatch.setattr(userentry, "has_entry", lambda uid: True)
    environ = dict(unknown)
    userentry.reexec_with_entry(["python3"], environ)
    assert environ == unknown


def test_without_nss_wrapper_it_says_why_and_goes_on(unknown, capsys):
    environ = {**unknown, "NSS_WRAPPER_LIB": "/nonexistent.so"}
    userentry.reexec_with_entry(["python3"], environ)
    err = capsys.readouterr().err
    assert "has no passwd entry, and none could be given: no libnss_wrapper.so" in err
    assert "ssh and getpass.getuser() will fail" in err


def test_the_module_runs_a_command_with_the_entry(unknown, monkeypatch):
    calls = []
    monkeypatch.setattr(userentry.os, "execvpe",
                        lambda file, args, env: calls.append((file, args, env)))
    monkeypatch.setattr(userentry.os, "environ", dict(unknown))
    assert userentry.main(["python", "my_launcher.py", "--x"]) == 127  # the fake exec returned
    ((file, args, env),) = calls
    assert (file, args) == ("python", ["python", "my_launcher.py", "--x"])
    assert env["HOME"] == "/h" and env["NSS_WRAPPER_PASSWD"] == "/p"


def test_the_module_without_a_command_is_a_usage_error(capsys):
    assert userentry.main([]) == 2
    assert "usage: python -m monarch_operator.launcher.userentry COMMAND" in capsys.readouterr().err
