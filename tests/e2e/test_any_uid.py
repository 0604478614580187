"""Field cases C36 and C38 on the real nodes: every pod of a job runs as uid 1000680000 with
``runAsGroup: 0`` and ``fsGroup: 1000680000``, as OpenShift's restricted-v2 assigns them, a uid
the worker image's ``/etc/passwd`` does not know (runc gives it ``HOME=/``). The sample job
(trainer and ref meshes over ssh) Succeeds, and so does a torchrun-style job whose ranks ask
who they are: ``getpass.getuser()``, ``pwd.getpwuid(os.getuid())`` and a file written under
``os.path.expanduser('~')``. Both run at once: 3 + 1 workers of 2 GPUs each fill the two
nodes' 4 + 4 whatever the scheduler's placement.

Before this worked, admission took such a job, the workers crash-looped on
``mkdir: cannot create directory '//.sshd'`` and the job failed only at its 300 s startup
deadline. The simulated nodes now give such a uid no passwd entry either
(localcluster/identity.py), but only real nodes run the image's own passwd and runc.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from monarch_operator import constants
from monarch_operator.localcluster.demo import SAMPLE, launcher_log, wait_for_phase

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

ARBITRARY_UID = 1000680000
SECURITY = {"runAsUser": ARBITRARY_UID, "runAsGroup": 0, "fsGroup": ARBITRARY_UID}
WORKER_IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
# Each rank of the torchrun-style job: who am I, where is home, can I write there.
WHOAMI = """\
import getpass, json, os, pwd
home = os.path.expanduser("~")
path = os.path.join(home, "rank-%s" % os.environ["RANK"])
with open(path, "w") as out:
    out.write("ok")
print("whoami " + json.dumps({"rank": int(os.environ["RANK"]), "getuser": getpass.getuser(),
                              "pwd": pwd.getpwuid(os.getuid()).pw_name, "uid": os.getuid(),
                              "home": home, "wrote": os.path.isfile(path)}), flush=True)
"""
WHOAMI_LINE = re.compile(r"whoami (\{.*\})")


def as_arbitrary_uid(body: dict) -> dict:
    template = {"spec": {"securityContext": dict(SECURITY)}}
    body["spec"]["workers"]["template"] = json.loads(json.dumps(template))
    body["spec"].setdefault("launcher", {})["template"] = json.loads(json.dumps(template))
    body["spec"]["cleanupPolicy"] = "KeepAll"  # the workers stay, for the look inside below
    return body


def whoami_job() -> dict:
    """1 worker, 2 ranks, running WHOAMI (a ConfigMap mounted in the worker template)."""
    body = as_arbitrary_uid({
        "apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
        "metadata": {"name": "whoami"},
        "spec": {"image": WORKER_IMAGE, "workers": {"replicas": 1, "gpusPerWorker": 2},
                 "spmd": {"script": "/etc/whoami/whoami.py", "nprocPerNode": 2},
                 "startupTimeoutSeconds": 300}})
    body["spec"]["workers"]["template"]["spec"].update(
        containers=[{"name": "worker",
                     "volumeMounts": [{"name": "whoami", "mountPath": "/etc/whoami"}]}],
        volumes=[{"name": "whoami", "configMap": {"name": "whoami"}}])
    return body


def test_jobs_succeed_as_a_uid_the_image_does_not_know(kubectl, namespace, local_cluster):
    kubectl("create", "configmap", "whoami", "-n", namespace, f"--from-literal=whoami.py={WHOAMI}")
    sample = as_arbitrary_uid(yaml.safe_load(SAMPLE.read_text()))
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(sample))
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(whoami_job()))

    for name in ("demo", "whoami"):
        job = wait_for_phase(kubectl, namespace, name, ("Succeeded", "Failed"), timeout=420)
        log = launcher_log(kubectl, local_cluster.state_dir, namespace, name)
        assert job["status"]["phase"] == "Succeeded", f"{name}: {job['status']}\n{log[-4000:]}"
        assert job["status"]["launcher"]["exitCode"] == 0
    assert "monarch-launch: succeeded" in launcher_log(
        kubectl, local_cluster.state_dir, namespace, "demo")

    # C36: each rank has a name and a writable home (the runtime emptyDir's "home").
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "whoami")
    seen = sorted((json.loads(match) for match in WHOAMI_LINE.findall(log)),
                  key=lambda rank: rank["rank"])
    assert [rank["rank"] for rank in seen] == [0, 1], log[-4000:]
    for rank in seen:
        assert rank == {"rank": rank["rank"], "getuser": "monarch", "pwd": "monarch",
                        "uid": ARBITRARY_UID, "home": f"{constants.RUNTIME_DIR}/home",
                        "wrote": True}, rank

    # The pods really ran as that uid, which the image does not know (kubectl exec gets no
    # nss_wrapper): sshd, the main process, is that uid's, and nothing was written under "/".
    for pod in ("demo-worker-0", "whoami-worker-0"):
        inside = kubectl(
            "exec", "-n", namespace, pod, "-c", "worker", "--", "sh", "-c",
            'entry=$(getent passwd "$(id -u)" || echo none); '
            'echo "uid=$(id -u) gid=$(id -g) entry=$entry"; '
            f'grep ^Uid: "/proc/$(cat {constants.SSHD_STATE_DIR}/sshd.pid)/status"; '
            'ls -a / | grep -c "^.sshd$" || true')
        lines = inside.splitlines()
        assert lines[0] == f"uid={ARBITRARY_UID} gid=0 entry=none", inside
        assert lines[1].split()[1:3] == [str(ARBITRARY_UID)] * 2, inside
        assert lines[2] == "0", inside
    launcher = kubectl.json("pods", "-n", namespace, "-l",
                            f"{constants.LABEL_JOB}=demo,"
                            f"{constants.LABEL_ROLE}={constants.ROLE_LAUNCHER}")["items"][0]
    assert launcher["spec"]["securityContext"]["runAsUser"] == ARBITRARY_UID
