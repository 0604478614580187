"""The images built here (monarch_operator.localcluster.images), run as containers by runc:
the docker-archives carry the references the cluster uses; the worker runs as uid 1000 and its
entrypoint's sshd accepts the job's key; Monarch, torch and the operator import in the worker
and the examples image (and the example programs there); the operator image serves /healthz
against the local control plane; the worker run as a uid it does not know (1000680000) names
it and serves ssh; pause reaps orphans and exits 0 on SIGTERM/SIGINT; CoreDNS
answers as non-root. A second ensure is only a hash check.

Needs root, buildah, runc, debootstrap and gcc (scripts/setup.sh installs them): without them
the tests fail when ``CI`` is set and skip otherwise. The first run builds every image (about
15-25 minutes cold, mostly the torch layer and its archives); later runs reuse the archives.
Starts sshd on 127.0.0.251 and CoreDNS on 127.0.0.252.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator import constants, names
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.sshkeys import generate_job_keys
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.localcluster import images
from monarch_operator.localcluster.demo import install_crds
from monarch_operator.testing.loopback_sshd import free_port
from tests.images.containers import RUNC_ROOT, Container

pytestmark = [pytest.mark.images, pytest.mark.timeout(2700)]  # a cold build: 15-25 min

SSH_ADDRESS = "127.0.0.251"
DNS_ADDRESS = "127.0.0.252"
EXPECTED_USERS = {"worker": "1000", "operator": "65532", "examples": "1000", "mpi-peer": "1000",
                  "pause": "65535:65535", "coredns": "65532:65532"}
IMPORTS = "import monarch, torch, monarch_operator; print('imported', torch.__version__)"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def built_images() -> Iterator[dict[str, Path]]:
    """Every image's docker-archive, built once per session when missing or changed."""
    if os.geteuid() != 0:
        _unavailable("building and running images needs root (buildah storage, runc)")
    missing = [tool for tool in ("buildah", "runc", "debootstrap", "gcc") if not shutil.which(tool)]
    if missing:
        _unavailable(f"needs {missing}: apt-get install buildah runc debootstrap gcc libc6-dev "
                     "(scripts/setup.sh)")
    buildah = images.storage()
    before = set(buildah.containers()) if buildah.root.exists() else set()
    archives = images.ensure_images(progress=lambda line: print(f"[images] {line}", flush=True))
    yield archives
    assert set(buildah.containers()) - before == set(), "a test left a buildah container"


def _archive_manifest(archive: Path) -> tuple[list[str], dict]:
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert len(manifest) == 1
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    return manifest[0]["RepoTags"], config


def test_archives_carry_the_refs_the_cluster_uses(built_images):
    assert sorted(built_images) == sorted(images.IMAGES)
    for name, archive in built_images.items():
        tags, config = _archive_manifest(archive)
        assert tags == [images.IMAGES[name].ref], name
        assert config["config"]["User"] == EXPECTED_USERS[name], name
        assert config["config"]["Labels"][images.HASH_LABEL] in archive.name, name
    _, worker = _archive_manifest(built_images["worker"])
    assert worker["config"]["Entrypoint"] == ["/usr/local/bin/monarch-worker-entrypoint"]


def test_a_second_ensure_is_only_a_hash_check(built_images):
    lines: list[str] = []
    started = time.monotonic()
    again = images.ensure_images(progress=lines.append)
    elapsed = time.monotonic() - started
    assert again == built_images
    assert not [line for line in lines if "building" in line or "writing" in line], lines
    waited = any(line.startswith("waiting for another image build") for line in lines)
    assert waited or elapsed < 30, f"a warm ensure took {elapsed:.1f} s"


def _secret_files(job_name: str) -> dict[str, bytes]:
    job = JobSpec.from_body({
        "metadata": {"name": job_name, "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                 "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}},
    })
    secret = build_ssh_secret(job, Settings(), generate_job_keys(job.namespace, job.name))
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A folder any uid can traverse (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="monarch-images-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _wait_port(address: str, port: int, container: Container, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert container.process and container.process.poll() is None, container.output()
        try:
            socket.create_connection((address, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"nothing listens on {address}:{port} after {timeout} s:\n{container.output()}")


def test_worker_sshd_runs_as_uid_1000_and_accepts_the_jobs_key(built_images, world_dir):
    files = _secret_files("demo")
    secret_dir = world_dir / "ssh"
    secret_dir.mkdir()
    for key in (constants.SSH_AUTHORIZED_KEYS, constants.SSH_HOST_KEY):
        # As a kubelet mounts a Secret under fsGroup 1000: root-owned, group-readable.
        (secret_dir / key).write_bytes(files[key])
        os.chown(secret_dir / key, 0, 1000)
        (secret_dir / key).chmod(0o440)
    client_key = world_dir / "id_ed25519"
    client_key.write_bytes(files[constants.SSH_PRIVATE_KEY])
    client_key.chmod(0o600)
    known_hosts = world_dir / "known_hosts"
    known_hosts.write_bytes(files[constants.SSH_KNOWN_HOSTS])
    port = free_port((SSH_ADDRESS,))
    env = {"SSH_PORT": str(port), "SSH_LISTEN_ADDRESS": SSH_ADDRESS,
           "SSH_HOST_KEY": f"{constants.SSH_DIR}/{constants.SSH_HOST_KEY}"}
    ref = images.IMAGES["worker"].ref
    with Container(images.storage(), ref, env=env,
                   binds={str(secret_dir): constants.SSH_DIR}) as container:
        container.start()
        _wait_port(SSH_ADDRESS, port, container)
        alias = f"[{names.worker_fqdn('demo', 'team-a', 0, Settings().cluster_domain)}]:2222"
        result = subprocess.run(
            ["ssh", "-p", str(port), "-i", str(client_key), "-l", "monarch",
             "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
             "-o", f"HostKeyAlias={alias}", "-o", "CheckHostIP=no", "-o", "ConnectTimeout=10",
             SSH_ADDRESS, f'id -u; python -c "{IMPORTS}"'],
            capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr + container.output()
        assert result.stdout.split()[:2] == ["1000", "imported"], result.stdout
        container.stop()
        assert "Accepted publickey for monarch" in container.output(), container.output()


WHO_AM_I = ("import getpass, os, pwd; home = os.path.expanduser('~'); "
            "open(os.path.join(home, 'probe'), 'w').write('ok'); "
            "print(getpass.getuser(), pwd.getpwuid(os.getuid()).pw_name, home, os.getuid())")


def test_worker_image_run_as_a_uid_it_does_not_know_serves_ssh(built_images, world_dir):
    """Field cases C36, C38: the image as OpenShift's restricted-v2 runs it, uid 1000680000
    (no passwd entry in the image; runc gives it HOME=/), gid 0, fsGroup 1000680000; no
    MONARCH_RUNTIME_DIR (the image run by hand: the entrypoint's own folder under /tmp). The
    entrypoint names the uid through the image's nss_wrapper; sshd logs the job's key in; the
    session's Python gets a name and a writable home; nothing is written under "/"."""
    uid = 1000680000
    files = _secret_files("demo")
    secret_dir = world_dir / "ssh"
    secret_dir.mkdir()
    for key in (constants.SSH_AUTHORIZED_KEYS, constants.SSH_HOST_KEY):
        (secret_dir / key).write_bytes(files[key])
        os.chown(secret_dir / key, 0, uid)  # a kubelet's Secret under fsGroup 1000680000
        (secret_dir / key).chmod(0o440)
    client_key = world_dir / "id_ed25519"
    client_key.write_bytes(files[constants.SSH_PRIVATE_KEY])
    client_key.chmod(0o600)
    known_hosts = world_dir / "known_hosts"
    known_hosts.write_bytes(files[constants.SSH_KNOWN_HOSTS])
    port = free_port((SSH_ADDRESS,))
    env = {"SSH_PORT": str(port), "SSH_LISTEN_ADDRESS": SSH_ADDRESS,
           "SSH_HOST_KEY": f"{constants.SSH_DIR}/{constants.SSH_HOST_KEY}"}
    with Container(images.storage(), images.IMAGES["worker"].ref, env=env,
                   binds={str(secret_dir): constants.SSH_DIR},
                   user=(uid, 0, [uid])) as container:
        container.start()
        _wait_port(SSH_ADDRESS, port, container)
        alias = f"[{names.worker_fqdn('demo', 'team-a', 0, Settings().cluster_domain)}]:2222"
        result = subprocess.run(
            ["ssh", "-p", str(port), "-i", str(client_key), "-l", "monarch",
             "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
             "-o", f"HostKeyAlias={alias}", "-o", "CheckHostIP=no", "-o", "ConnectTimeout=10",
             SSH_ADDRESS, f'python -c "{WHO_AM_I}"; ls -a / | grep -c "^.sshd$" || true'],
            capture_output=True, text=True, timeout=120, check=False)
        home = f"/tmp/monarch-{uid}/home"
        assert result.returncode == 0, result.stderr + container.output()
        assert result.stdout.split() == ["monarch", "monarch", home, str(uid), "0"], (
            result.stdout + result.stderr + container.output())
        container.stop()
        output = container.output()
    assert f"uid {uid} has no passwd entry: named monarch, home {home}" in output, output
    assert "Accepted publickey for monarch" in output, output


@pytest.mark.parametrize("name", ["worker", "examples"])
def test_monarch_torch_and_the_operator_import(built_images, name):
    code = IMPORTS + ("; import rl_kl, torchrun_demo; print('examples', rl_kl.__name__)"
                      if name == "examples" else "")
    with Container(images.storage(), images.IMAGES[name].ref, entrypoint=["python", "-c"],
                   args=[code + "; import os; print('uid', os.getuid())"]) as container:
        status, output = container.run(timeout=180)
    assert status == 0, output
    assert "imported 2.13.0" in output and "uid 1000" in output, output
    assert name != "examples" or "examples rl_kl" in output, output


def test_operator_image_serves_healthz(built_images, local_cluster, kubectl, world_dir):
    install_crds(kubectl)
    kube = world_dir / "kube"
    kube.mkdir()
    (kube / "config").write_text(kubectl("config", "view", "--raw", "--flatten", "--minify"))
    (kube / "config").chmod(0o644)
    port = free_port(("127.0.0.1",))
    url = f"http://127.0.0.1:{port}/healthz"
    args = ["--namespace", "images-test-nothing-here", "--liveness", url]
    with Container(images.storage(), images.IMAGES["operator"].ref, args=args,
                   env={"KUBECONFIG": "/kube/config"}, binds={str(kube): "/kube"}) as container:
        container.start()
        deadline = time.monotonic() + 60
        while True:
            assert container.process and container.process.poll() is None, container.output()
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, container.output()
                time.sleep(0.5)
        assert container.stop() == 0, container.output()


ORPHANS_C = r"""
#include <unistd.h>
int main(void) {  /* three children outlive this process: the container's init inherits them */
  for (int i = 0; i < 3; i++) if (fork() == 0) { usleep(1000000); return 0; }
  return 0;
}
"""


def _children(pid: int) -> dict[int, str]:
    """{pid: state} of the processes whose parent is ``pid``."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = fields[0]
    return found


@pytest.mark.parametrize("signal", ["TERM", "INT"])
def test_pause_reaps_orphans_and_exits_0(built_images, world_dir, signal):
    subprocess.run(["gcc", "-static", "-o", str(world_dir / "orphans"), "-x", "c", "-"],
                   input=ORPHANS_C, text=True, check=True)
    with Container(images.storage(), images.IMAGES["pause"].ref,
                   binds={str(world_dir): "/test"}) as container:
        container.start()
        deadline = time.monotonic() + 10
        while True:
            state = subprocess.run(["runc", "--root", RUNC_ROOT, "state", container.id],
                                   capture_output=True, text=True, check=False)
            if state.returncode == 0 and json.loads(state.stdout)["status"] == "running":
                break
            assert time.monotonic() < deadline, state.stderr + container.output()
            time.sleep(0.05)
        pause_pid = json.loads(state.stdout)["pid"]
        subprocess.run(["runc", "--root", RUNC_ROOT, "exec", "--detach", "--user", "65535:65535",
                        container.id, "/test/orphans"], check=True, timeout=10)
        deadline = time.monotonic() + 5
        while [state for state in _children(pause_pid).values() if state != "Z"] != ["S"] * 3:
            # The three sleepers are reparented to pause, the container's init.
            assert time.monotonic() < deadline, _children(pause_pid)
            time.sleep(0.02)
        time.sleep(2.0)  # they have ended: pause must have reaped them
        assert _children(pause_pid) == {}, "pause left zombies: " + repr(_children(pause_pid))
        assert container.stop(signal) == 0, container.output()


def _dns_query(address: str, port: int, name: str) -> bytes:
    query_id = 0x4D4F
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + (
        b"\0" + struct.pack(">HH", 1, 1))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(5)
        udp.sendto(struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question,
                   (address, port))
        answer = udp.recv(512)
    assert struct.unpack(">H", answer[:2])[0] == query_id and answer[2] & 0x80, answer
    return answer


def test_coredns_answers_as_non_root(built_images, world_dir):
    with Container(images.storage(), images.IMAGES["coredns"].ref, args=["-version"]) as c:
        status, output = c.run(timeout=30)
    assert status == 0 and f"CoreDNS-{images.COREDNS_VERSION.lstrip('v')}" in output, output
    port = free_port((DNS_ADDRESS,))
    (world_dir / "Corefile").write_text(f".:{port} {{\n  bind {DNS_ADDRESS}\n  whoami\n}}\n")
    (world_dir / "Corefile").chmod(0o644)
    with Container(images.storage(), images.IMAGES["coredns"].ref,
                   args=["-conf", "/etc/coredns/Corefile"],
                   binds={str(world_dir): "/etc/coredns"}) as container:
        container.start()
        deadline = time.monotonic() + 20
        while True:
            assert container.process and container.process.poll() is None, container.output()
            try:
                answer = _dns_query(DNS_ADDRESS, port, "whoami.example")
                break
            except OSError:
                assert time.monotonic() < deadline, container.output()
                time.sleep(0.2)
        assert answer[3] & 0x0F == 0, answer  # rcode NOERROR
