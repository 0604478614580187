"""The job's key Secret: client key pair, pinned host key, known_hosts; what each pod mounts."""

import base64
import re

from cryptography.hazmat.primitives import serialization

from monarch_operator import constants, names
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.sshkeys import generate_job_keys
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec

SETTINGS = Settings()


def make_job(name="demo", namespace="team-a"):
    return JobSpec.from_body({
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 3, "gpusPerWorker": 1},
                 "meshes": {"trainer": {"hosts": 2}, "ref": {"hosts": 1}}},
    })


def secret_data(job, settings=SETTINGS):
    keys = generate_job_keys(job.namespace, job.name)
    secret = build_ssh_secret(job, settings, keys)
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def public_bytes(key):
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def openssh_match(pattern, name):
    """OpenSSH's known_hosts pattern rule (match_pattern): '*' any run, '?' one character."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, name) is not None


def test_known_hosts_pins_the_workers_host_key_for_every_worker_name():
    job = make_job()
    data = secret_data(job)
    host_key = serialization.load_ssh_private_key(data[constants.SSH_HOST_KEY], password=None)
    (line,) = data[constants.SSH_KNOWN_HOSTS].decode().splitlines()
    pattern, key_type, key_b64, *comment = line.split()
    assert pattern == "[*.demo-worker.team-a.svc.cluster.local]:2222"
    assert f"{key_type} {key_b64}".encode() == public_bytes(host_key.public_key())
    assert " ".join(comment) == "monarch-job team-a/demo host key"
    assert data[constants.SSH_HOST_PUBLIC_KEY].split()[:2] == [key_type.encode(), key_b64.encode()]
    # ssh looks each hostfile name up as [name]:2222; one pattern covers every ordinal.
    for ordinal in (0, 2, 17):
        fqdn = names.worker_fqdn("demo", "team-a", ordinal, SETTINGS.cluster_domain)
        assert openssh_match(pattern, f"[{fqdn}]:{constants.SSH_PORT}"), fqdn


def test_known_hosts_covers_no_other_job_namespace_or_port():
    (line,) = secret_data(make_job()).get(constants.SSH_KNOWN_HOSTS).decode().splitlines()
    pattern = line.split()[0]
    for other in [
        "[demo-worker-0.demo2-worker.team-a.svc.cluster.local]:2222",  # job demo2
        "[demo-worker-0.demo-worker.team-b.svc.cluster.local]:2222",  # another namespace
        "[demo-worker-0.demo-worker.team-a.svc.cluster.local]:22",  # another port
        "demo-worker-0.demo-worker.team-a.svc.cluster.local",  # port 22 form
    ]:
        assert not openssh_match(pattern, other), other


def test_the_cluster_domain_setting_is_used():
    data = secret_data(make_job(), Settings(cluster_domain="corp.example"))
    pattern = b"[*.demo-worker.team-a.svc.corp.example]:2222 "
    assert data[constants.SSH_KNOWN_HOSTS].startswith(pattern)


def test_client_and_host_keys_differ_and_each_pair_matches():
    data = secret_data(make_job())
    client = serialization.load_ssh_private_key(data[constants.SSH_PRIVATE_KEY], password=None)
    host = serialization.load_ssh_private_key(data[constants.SSH_HOST_KEY], password=None)
    assert public_bytes(client.public_key()) != public_bytes(host.public_key())
    assert data[constants.SSH_AUTHORIZED_KEYS] == data[constants.SSH_PUBLIC_KEY]
    assert data[constants.SSH_PUBLIC_KEY].startswith(public_bytes(client.public_key()) + b" ")
    assert data[constants.SSH_HOST_PUBLIC_KEY].startswith(public_bytes(host.public_key()) + b" ")


def test_each_job_gets_its_own_keys():
    first, second = secret_data(make_job()), secret_data(make_job())
    assert first[constants.SSH_HOST_KEY] != second[constants.SSH_HOST_KEY]
    assert first[constants.SSH_PRIVATE_KEY] != second[constants.SSH_PRIVATE_KEY]


def mounted_items(pod_spec):
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "ssh"]
    assert volume["secret"]["secretName"] == "demo-ssh"
    return {item["key"] for item in volume["secret"]["items"]}


def test_workers_mount_the_host_key_but_never_the_client_private_key():
    pod = build_worker_statefulset(make_job(), SETTINGS)["spec"]["template"]["spec"]
    assert mounted_items(pod) == {constants.SSH_AUTHORIZED_KEYS, constants.SSH_HOST_KEY}
    (container,) = pod["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["SSH_HOST_KEY"] == "/etc/monarch/ssh/ssh_host_ed25519_key"
    assert env["SSH_AUTHORIZED_KEYS"] == "/etc/monarch/ssh/authorized_keys"


def test_the_launcher_mounts_the_client_key_and_known_hosts_but_never_the_host_key():
    pod = build_launcher_pod(make_job(), SETTINGS)["spec"]
    assert mounted_items(pod) == {constants.SSH_PRIVATE_KEY, constants.SSH_KNOWN_HOSTS}
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env[constants.ENV_KNOWN_HOSTS] == "/etc/monarch/ssh/known_hosts"
