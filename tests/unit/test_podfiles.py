"""What the local node agent prepares for a container (env, volumes, hosts file)."""

import base64

import pytest

from monarch_operator.localcluster import podfiles, volumes

POD = {
    "metadata": {"name": "demo-worker-0", "namespace": "team-a", "uid": "u1"},
    "spec": {"hostname": "demo-worker-0", "subdomain": "demo-worker", "nodeName": "n0",
             "volumes": [{"name": "ssh", "secret": {"secretName": "demo-ssh", "defaultMode": 0o400,
                                                    "items": [{"key": "k", "path": "authorized_keys"}]}},
                         {"name": "scratch", "emptyDir": {}}]},
    "status": {"podIP": "127.100.0.5"},
}


def lookup(kind, namespace, name):
    assert (kind, namespace, name) == ("Secret", "team-a", "demo-ssh")
    return {"k": b"ssh-ed25519 AAAA\n"}


def test_expand_follows_kubernetes_rules():
    env = {"POD_IP": "127.100.0.5"}
    assert podfiles.expand("tcp://$(POD_IP):0", env) == "tcp://127.100.0.5:0"
    assert podfiles.expand("$(MISSING)/$$(POD_IP)", env) == "$(MISSING)/$(POD_IP)"


def test_container_env_resolves_field_refs_in_order():
    container = {"env": [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "ADDR", "value": "tcp://$(POD_IP):0"},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "demo-ssh", "key": "k"}}},
    ]}
    env = podfiles.container_env(POD, container, lookup)
    assert env == {"POD_IP": "127.100.0.5", "ADDR": "tcp://127.100.0.5:0",
                   "KEY": "ssh-ed25519 AAAA\n"}


def test_unknown_field_ref_is_an_error():
    with pytest.raises(ValueError, match="not supported"):
        podfiles.field_value(POD, "status.nominatedNodeName")


def test_volumes_written_with_items_and_mode(tmp_path):
    dirs = volumes.write_volumes(POD, tmp_path, lookup)
    key = dirs["ssh"] / "authorized_keys"
    assert key.read_bytes() == b"ssh-ed25519 AAAA\n"
    assert key.stat().st_mode & 0o777 == 0o400
    assert dirs["scratch"].is_dir()


def test_hosts_file_resolves_statefulset_fqdns_and_skips_deleting_pods():
    deleting = {"metadata": {"name": "old", "namespace": "team-a", "deletionTimestamp": "x"},
                "spec": {}, "status": {"podIP": "127.100.0.9"}}
    text = podfiles.hosts_file([POD, deleting])
    assert "127.100.0.5\tdemo-worker-0.demo-worker.team-a.svc.cluster.local demo-worker-0" in text
    assert "127.100.0.9" not in text


def test_secret_data_is_base64_decoded():
    secret = {"kind": "Secret", "data": {"a": base64.b64encode(b"xyz").decode()}}
    assert podfiles.decode_data(secret) == {"a": b"xyz"}
    assert podfiles.decode_data({"kind": "ConfigMap", "data": {"h": "x\n"}}) == {"h": b"x\n"}


@pytest.mark.parametrize(
    ("container", "exit_code", "message_file", "log_end", "expected"),
    [
        ({}, 3, b"boom happened", b"out\n", "boom happened"),
        ({}, 0, b"done: 3 steps", b"", "done: 3 steps"),  # File: reported on success too
        ({}, 1, b"", b"Traceback\nValueError: boom\n", ""),  # File: never the log
        ({"terminationMessagePolicy": "FallbackToLogsOnError"}, 1, b"",
         b"Traceback\nValueError: boom\n", "Traceback\nValueError: boom\n"),
        ({"terminationMessagePolicy": "FallbackToLogsOnError"}, 0, b"", b"all good\n", ""),
        ({"terminationMessagePolicy": "FallbackToLogsOnError"}, 1, b"written", b"log\n",
         "written"),
        ({}, 1, b"x" * 5000 + b"end", b"", ("x" * 5000 + "end")[-4096:]),  # the file's end
        ({}, 1, b"bad \xff byte", b"", "bad \ufffd byte"),
    ],
    ids=["file", "file-success", "file-no-fallback", "fallback", "fallback-success",
         "fallback-file-wins", "file-4096", "not-utf8"],
)
def test_termination_message_follows_the_kubelet(container, exit_code, message_file, log_end,
                                                  expected):
    assert podfiles.termination_message(container, exit_code, message_file, log_end) == expected


def test_log_tail_keeps_80_lines_then_2048_bytes():
    lines = b"".join(b"line %d\n" % i for i in range(100))
    assert podfiles.log_tail(lines) == b"".join(b"line %d\n" % i for i in range(20, 100))
    assert podfiles.log_tail(b"a\nb\nc", max_lines=2) == b"b\nc"  # unterminated last line
    long_lines = b"".join(b"%04d" % i + b"." * 95 + b"\n" for i in range(50))  # 100 B each
    tail = podfiles.log_tail(long_lines)
    assert len(tail) == 2048 and tail == long_lines[-2048:]
    # The agent passes only the log's end: same answer as the whole log.
    assert podfiles.log_tail(long_lines[-2048:]) == tail
    assert podfiles.log_tail(lines[-2048:]) == podfiles.log_tail(lines)


def test_termination_message_path_defaults_like_kubernetes():
    assert podfiles.termination_message_path({}) == "/dev/termination-log"
    assert podfiles.termination_message_path({"terminationMessagePath": "/tmp/t"}) == "/tmp/t"
