"""The kubelet's securityContext rules in the node agent: the container's uid, gid and groups,
the runAsNonRoot refusal, fsGroup on volume files, and what a non-root container is given."""

from __future__ import annotations

import os
import stat

import pytest

from monarch_operator.localcluster import identity

USERS = {0: ("root", 0, "/root"), 1000: ("monarch", 1000, "/home/monarch")}


def users(uid):
    return USERS.get(uid)


def groups_of(name):
    return {"monarch": [1000, 27]}.get(name, [])


def pod(pod_context=None, container_context=None, init_context=None):
    spec = {"containers": [{"name": "main", "securityContext": container_context or {}}]}
    if pod_context is not None:
        spec["securityContext"] = pod_context
    if init_context is not None:
        spec["initContainers"] = [{"name": "prep", "securityContext": init_context}]
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": spec}


def ident(pod_dict):
    return identity.identity(pod_dict, pod_dict["spec"]["containers"][0], users, groups_of)


@pytest.mark.parametrize(("pod_context", "container_context", "expected"), [
    # nothing set: the "image" user, root
    (None, None, (0, 0, ())),
    # the Kubernetes docs' example: groups are the gid, then fsGroup, then supplementalGroups
    ({"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000]},
     None, (1000, 3000, (1000, 27, 2000, 4000))),
    # the container overrides the pod's user and group
    ({"runAsUser": 1000, "runAsGroup": 3000}, {"runAsUser": 1234, "runAsGroup": 5000},
     (1234, 5000, ())),
    # no runAsGroup: the passwd gid of a known uid, 0 for an unknown one (as containerd)
    ({"runAsUser": 1000}, None, (1000, 1000, (27,))),
    ({"runAsUser": 4242}, None, (4242, 0, ())),
    # a group alone keeps uid 0
    ({"runAsGroup": 7}, None, (0, 7, ())),
])
def test_identity_from_the_effective_security_context(pod_context, container_context, expected):
    result = ident(pod(pod_context, container_context))
    assert (result.uid, result.gid, result.groups) == expected


def test_run_as_non_root_without_a_user_is_refused_with_the_kubelets_words():
    refused = pod({"runAsNonRoot": True})
    with pytest.raises(ValueError) as error:
        identity.verify_run_as_non_root(refused, refused["spec"]["containers"][0])
    assert str(error.value) == ('container has runAsNonRoot and image will run as root '
                                '(pod: "p_ns(u-1)", container: main)')


def test_run_as_non_root_with_uid_zero_is_refused():
    refused = pod({"runAsNonRoot": True, "runAsUser": 1000}, {"runAsUser": 0})
    with pytest.raises(ValueError, match="^container's runAsUser breaks non-root policy"):
        identity.verify_run_as_non_root(refused, refused["spec"]["containers"][0])


@pytest.mark.parametrize(("pod_context", "container_context"), [
    ({"runAsNonRoot": True, "runAsUser": 1000}, None),
    ({"runAsUser": 0}, None),  # runAsNonRoot not set: root is fine
    ({"runAsNonRoot": True}, {"runAsUser": 5}),
    ({"runAsNonRoot": True}, {"runAsNonRoot": False}),  # the container allows root
])
def test_allowed_users(pod_context, container_context):
    allowed = pod(pod_context, container_context)
    identity.verify_run_as_non_root(allowed, allowed["spec"]["containers"][0])


def test_fs_user_only_when_every_container_shares_the_uid():
    assert identity.fs_user(pod({"runAsUser": 1000})) == 1000
    assert identity.fs_user(pod({"runAsUser": 1000}, init_context={"runAsUser": 1000})) == 1000
    assert identity.fs_user(pod({"runAsUser": 1000}, init_context={"runAsUser": 7})) is None
    assert identity.fs_user(pod()) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another group needs root")
def test_fs_group_ownership_and_modes(tmp_path):
    volume = tmp_path / "v"
    (volume / "sub").mkdir(parents=True)
    (volume / "key").write_bytes(b"k")
    (volume / "key").chmod(0o400)
    (volume / "sub" / "conf").write_bytes(b"c")
    (volume / "sub" / "conf").chmod(0o644)
    (volume / "link").symlink_to("key")
    identity.set_volume_ownership(volume, 2000, read_only=True)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (volume / "key", volume / "sub",
                                                              volume / "sub" / "conf")}
    assert mode == {"key": 0o440, "sub": 0o2755, "conf": 0o644}
    assert {p.stat().st_gid for p in volume.rglob("*")} == {2000}
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)
    identity.set_volume_ownership(scratch, 2000, read_only=False)
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o2777


def test_no_fs_group_changes_nothing(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "f").chmod(0o400)
    identity.set_volume_ownership(tmp_path, None, read_only=True)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o400


def test_closed_directories_on_the_way_to_the_image(tmp_path):
    closed = tmp_path / "closed"
    (closed / "python" / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    someone = identity.Identity(uid=4242, gid=4242, groups=(), user=None)
    found = identity.closed_directories(someone, [closed / "python" / "bin"])
    # (pytest's own temporary directories above tmp_path may be closed too)
    assert {d: c for d, c in found.items() if d.startswith(str(closed))} == {
        str(closed): ["python"]}
    owner = identity.Identity(uid=os.geteuid(), gid=0, groups=(), user=None)
    assert str(closed) not in identity.closed_directories(owner, [closed / "python" / "bin"])


def test_root_needs_no_setup(tmp_path):
    setup = identity.prepare_user(identity.Identity(0, 0, (), ("root", 0, "/root")), tmp_path,
                                  [tmp_path])
    assert setup.user is None and not setup.mounts and setup.home is None


def test_unknown_uid_gets_no_passwd_entry_and_home_slash_as_runc_gives_it(tmp_path):
    """Field case C38: the simulated node no longer papers over a uid the image does not know
    (it once mounted an /etc/passwd with an entry and a home for it): as with runc, no name
    and HOME=/, so what breaks on a real node breaks here too."""
    setup = identity.prepare_user(identity.Identity(1000680000, 0, (1000680000,), None),
                                  tmp_path, [])
    assert setup.user == (1000680000, 0, (1000680000,))
    assert setup.home == "/"
    assert setup.mounts == {}
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_known_uid_gets_its_own_home_for_the_pod_at_its_passwd_home(tmp_path):
    setup = identity.prepare_user(identity.Identity(4242, 7, (2000,), ("u", 7, "/home/u")),
                                  tmp_path, [])
    assert setup.user == (4242, 7, (2000,))
    assert setup.home == "/home/u"
    home_dir, read_only = setup.mounts["/home/u"]
    assert not read_only and home_dir.stat().st_uid == 4242
    assert "/etc/passwd" not in setup.mounts


RESTRICTED_CAPS = ["--inh-caps=-all", "--ambient-caps=-all"]


@pytest.mark.parametrize(("context", "expected"), [
    # nothing asked: the agent's own privileges, no setpriv options
    ({}, []),
    ({"allowPrivilegeEscalation": True, "capabilities": {}}, []),
    # Pod Security "restricted": no_new_privs, an empty bounding set
    ({"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
     ["--nnp", "--bounding-set=-all", *RESTRICTED_CAPS]),
    # the one capability "restricted" lets a pod add back, either spelling
    ({"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CAP_CHOWN"]}},
     ["--bounding-set=-all,+net_bind_service,+chown", *RESTRICTED_CAPS]),
    # single drops leave the bounding set one by one; an added capability cannot go beyond it
    ({"capabilities": {"drop": ["NET_RAW", "CAP_SYS_ADMIN"], "add": ["SYS_TIME"]}},
     ["--bounding-set=-net_raw,-sys_admin", *RESTRICTED_CAPS]),
    # dropping and adding ALL keeps everything
    ({"capabilities": {"drop": ["ALL"], "add": ["ALL"]}}, []),
])
def test_privilege_options_for_no_new_privs_and_capabilities(context, expected):
    assert identity.privilege_options({"name": "main", "securityContext": context}) == expected


def test_privilege_options_are_container_level_only():
    # allowPrivilegeEscalation and capabilities do not exist in the pod's securityContext.
    assert identity.privilege_options({"name": "main"}) == []
