"""Field case C33 (issue 34 item 4): `helm upgrade` of the operator leaves jobs alone, in every
phase.

The chart runs as its own two pods (leader election) on the node agent, watching this module's
``chart-*`` namespace. One install and one upgrade serve the module (:func:`upgraded`): job
``demo`` runs (its program reports steps until the test lets it end), ``gated`` waits for a
worker that is not Ready, ``restarting`` waits for a replaced worker before its attempt 2,
``paused`` is suspended, and ``queued`` waits in Kueue for the quota ``demo`` holds. Then the
release is upgraded to a newer chart: another appVersion (the operator image tag), default
worker labels and env (``workerDefaults``) that the old one did not have, and a CRD with one
more optional, defaulted spec field, applied first as docs/install.md says; job ``during`` is
created while the upgrade rolls, ``late`` after it. Each test then checks one phase: no pod
deleted or restarted, no StatefulSet changed, no attempt, restart or failure added, runPolicy
as it was; the job ends as it would have. A job whose StatefulSet is made after the upgrade
gets the new defaults (docs/install.md, "Upgrades and running jobs").

The last test upgrades from a lone replica (leader election off): the chart refuses while that
replica runs and names the commands that stop it (docs/ha.md).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.chart import (
    CHART,
    CHART_NAMESPACE_PREFIX,
    NEW_FIELD,
    NEW_VERSION,
    ROOT,
    helm,
    helm_binary,
    newer_chart,
)
from tests.cluster import upgradejobs as uj
from tests.cluster.helpers import (
    apply_manifest,
    get_json,
    job_manifest,
    running_attempt,
    wait_phase,
    wait_until,
)
from tests.cluster.test_kueue import KUEUE, cluster_queue, kueue_objects

pytestmark = pytest.mark.cluster

RELEASE = "mo"
FULLNAME = f"{RELEASE}-monarch-operator"
CRD_FILE = ROOT / "crds" / "monarchjobs.monarch-operator.dev.yaml"
# The jobs that exist across the upgrade, and what each must keep.
KEPT = ("demo", "gated", "restarting", "paused")


@dataclass
class Upgrade:
    """What the module's install and upgrade left for the tests."""

    namespace: str
    flags: Path
    before: dict[str, dict[str, Any]]
    after: dict[str, dict[str, Any]]
    old_pods: set[str]
    new_pods: set[str]
    workload_uid: str
    demo_template: tuple[dict, dict]
    demo_step: int
    timings: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def module_namespace(kubectl) -> Iterator[str]:
    name = f"{CHART_NAMESPACE_PREFIX}{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl("delete", "monarchjobs", "--all", "-n", name, "--wait=false", check=False)
        kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def module_helm_env(local_cluster, tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("helm")
    env = dict(local_cluster.env())
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(home / kind.lower())
    return env


@pytest.fixture(scope="module")
def flags() -> Iterator[Path]:
    """A directory for the files that let the jobs go on: the job's pods run as uid 1000, and
    pytest's own directories are the test user's alone (0700)."""
    path = Path(tempfile.mkdtemp(prefix="c33-flags-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def newer(tmp_path_factory) -> Path:
    return newer_chart(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="module", autouse=True)
def restore_crd(kubectl) -> Iterator[None]:
    """Put the repository's CRD back (without the upgrade's field) after the module."""
    try:
        yield
    finally:
        kubectl("replace", "-f", str(CRD_FILE))


@pytest.fixture(scope="module")
def module_queue(kueue, kubectl, module_namespace) -> Iterator[None]:
    """A ClusterQueue of 4 GPUs for this namespace only and LocalQueue ``user-queue``.

    The chart in namespaced mode grants no cluster-scoped read, and the operator reads the
    admitted job's ResourceFlavor (cluster-scoped) to put its node labels on the pods: here a
    ClusterRole that may get ResourceFlavors and WorkloadPriorityClasses is bound to the
    release's ServiceAccount, as a cluster admin would have to today (docs/kueue.md)."""
    namespace = module_namespace
    flavor, cq = f"flavor-{namespace}", f"cq-{namespace}"
    kueue_objects(kubectl, {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                            "metadata": {"name": flavor}},
                  cluster_queue(cq, flavor, namespace, gpus=4),
                  {"apiVersion": KUEUE, "kind": "LocalQueue",
                   "metadata": {"name": "user-queue", "namespace": namespace},
                   "spec": {"clusterQueue": cq}})
    reader = f"{namespace}-kueue-reader"
    kubectl("create", "clusterrole", reader, "--verb=get",
            "--resource=resourceflavors.kueue.x-k8s.io,workloadpriorityclasses.kueue.x-k8s.io")
    kubectl("create", "clusterrolebinding", reader, f"--clusterrole={reader}",
            f"--serviceaccount={namespace}:{FULLNAME}")
    try:
        yield
    finally:
        kubectl("delete", "clusterrolebinding,clusterrole", reader, check=False)
        kubectl("delete", "monarchjobs", "--all", "-n", namespace, "--wait=true",
                "--timeout=60s", check=False)
        kubectl("delete", "localqueues", "--all", "-n", namespace, check=False)
        kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
        kubectl("delete", "resourceflavor", flavor, "--wait=false", check=False)


@pytest.fixture(scope="module")
def upgraded(kubectl, module_helm_env, module_namespace, module_queue, flags, newer,
             local_cluster) -> Iterator[Upgrade]:
    """The chart installed, a job in each phase, the upgrade done (see the module's words)."""
    started = time.monotonic()
    namespace = module_namespace
    scope = ("--set", f"watchNamespaces={{{namespace}}}")
    helm("install", RELEASE, str(CHART), "-n", namespace, *scope, "--wait", "--timeout=120s",
         env=module_helm_env)
    try:
        old_pods = {pod["metadata"]["name"] for pod in uj.operator_pods(kubectl, namespace,
                                                                        RELEASE)}
        assert len(old_pods) == 2, old_pods
        wait_until(lambda: uj.leader(kubectl, namespace, FULLNAME) in old_pods, 60,
                   "an operator pod holds the Lease")
        result = _install_jobs_and_upgrade(kubectl, module_helm_env, namespace, scope, flags,
                                           newer, old_pods)
        result.timings["module set-up"] = time.monotonic() - started
        print(f"C33 timings: {result.timings}")
        yield result
    except Exception:
        print(uj.report(kubectl, local_cluster, namespace, RELEASE))
        raise
    finally:
        helm("uninstall", RELEASE, "-n", namespace, "--wait", env=module_helm_env, check=False)


def _install_jobs_and_upgrade(kubectl, helm_env, namespace: str, scope: tuple[str, ...],
                              flags: Path, chart: Path, old_pods: set[str]) -> Upgrade:
    apply_manifest(kubectl, namespace, uj.queued(
        "demo", progress={"reportIntervalSeconds": 1},
        launcher={"command": ["python3", "-c", uj.reporting_program(flags / "demo-done")]}))
    apply_manifest(kubectl, namespace, job_manifest(
        "gated", runPolicy={"backoffLimit": 2},
        workers={"replicas": 2, "gpusPerWorker": 1,
                 "template": uj.gated_worker_template(flags / "gated-gate")},
        launcher={"command": ["true"]}))
    apply_manifest(kubectl, namespace, uj.queued("queued",
                                                 launcher=uj.waits_for(flags / "queued-done")))
    uj.start_restarting(kubectl, namespace, "restarting", flags)
    uj.start_suspended(kubectl, namespace, "paused", flags)
    wait_until(lambda: uj.step(kubectl, namespace, "demo") >= 2, 120, "demo reporting steps")
    wait_phase(kubectl, namespace, "queued", "Queued", timeout=60)
    wait_until(lambda: len([pod for pod in uj.job_pods(kubectl, namespace, "gated")
                            if pod["status"].get("phase") == "Running"]) == 2, 60,
               "gated's workers running, not Ready")
    before = {job: uj.snapshot(kubectl, namespace, job) for job in KEPT}
    assert [before[job]["phase"] for job in KEPT] == [
        "Running", "Starting", "Restarting", "Suspended"], before
    workload_uid = get_json(kubectl, "workloads", "-n", namespace, "-l",
                            "monarch-operator.dev/job=queued")["items"][0]["metadata"]["uid"]
    demo_template = uj.worker_template(kubectl, namespace, "demo")

    # The upgrade as docs/install.md says: the new chart's CRD first, then the release (its
    # own values, the new chart's defaults: no --reuse-values). Job `during` is created once
    # the first pod of the new image exists, while the old leader may still act.
    kubectl("apply", "-f", "-", stdin=helm("show", "crds", str(chart), env=helm_env).stdout)
    upgrade_started = time.monotonic()
    rollout = subprocess.Popen(
        [str(helm_binary()), "upgrade", RELEASE, str(chart), "-n", namespace, *scope, "--wait",
         "--timeout=180s"], env={**os.environ, **helm_env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: any(pod["spec"]["containers"][0]["image"].endswith(f":{NEW_VERSION}")
                               for pod in uj.operator_pods(kubectl, namespace, RELEASE)), 120,
                   "a pod of the new operator image")
        apply_manifest(kubectl, namespace, job_manifest(
            "during", launcher=uj.waits_for(flags / "during-done")))
        out, _ = rollout.communicate(timeout=240)
    finally:
        if rollout.poll() is None:
            rollout.kill()
    assert rollout.returncode == 0, out
    new_pods = wait_until(lambda: (pods := uj.operator_pods(kubectl, namespace, RELEASE))
                          and len(pods) == 2 and all(
                              pod["spec"]["containers"][0]["image"].endswith(f":{NEW_VERSION}")
                              for pod in pods) and {pod["metadata"]["name"] for pod in pods},
                          120, "two operator pods of the new image")
    wait_until(lambda: uj.leader(kubectl, namespace, FULLNAME) in new_pods, 60,
               "a new operator pod holds the Lease")
    handed_over = time.monotonic() - upgrade_started
    demo_step = uj.step(kubectl, namespace, "demo")
    apply_manifest(kubectl, namespace, job_manifest(
        "late", launcher=uj.waits_for(flags / "late-done")))
    wait_phase(kubectl, namespace, "late", "Running", timeout=90)  # the new leader acts
    after = {job: uj.snapshot(kubectl, namespace, job) for job in KEPT}
    return Upgrade(namespace, flags, before, after, old_pods, new_pods, workload_uid,
                   demo_template, demo_step, {"upgrade and hand-over": handed_over})


def test_the_new_operator_leads_from_new_pods(upgraded):
    assert not upgraded.new_pods & upgraded.old_pods


@pytest.mark.parametrize("job", KEPT)
def test_no_pod_attempt_budget_or_run_policy_of_a_job_changes(upgraded, job):
    assert upgraded.after[job] == upgraded.before[job]


def test_the_running_job_goes_on_with_its_pods_and_template(kubectl, upgraded):
    namespace = upgraded.namespace
    wait_until(lambda: uj.step(kubectl, namespace, "demo") > upgraded.demo_step + 2, 60,
               "demo's steps advancing after the upgrade")
    assert uj.worker_template(kubectl, namespace, "demo") == upgraded.demo_template
    (upgraded.flags / "demo-done").touch()
    uj.ended_once(kubectl, namespace, "demo")
    assert uj.step(kubectl, namespace, "demo") > upgraded.demo_step


def test_the_gated_job_starts_once_its_workers_are_ready(kubectl, upgraded):
    (upgraded.flags / "gated-gate").touch()
    uj.ended_once(kubectl, upgraded.namespace, "gated")


def test_the_restarting_job_runs_its_attempt_2_on_the_same_workers(kubectl, upgraded):
    namespace, flags = upgraded.namespace, upgraded.flags
    (flags / "restarting-gate").touch()
    running_attempt(kubectl, namespace, "restarting", 2)
    workers = {name: uid for name, (uid, _, _) in
               uj.snapshot(kubectl, namespace, "restarting")["pods"].items()
               if "-worker-" in name}
    assert workers == {name: uid for name, (uid, _, _) in
                       upgraded.before["restarting"]["pods"].items()}
    (flags / "restarting-done").touch()
    uj.ended_once(kubectl, namespace, "restarting", attempt=2, restarts=1,
                  failures={"infrastructure": 1})


def test_the_suspended_job_resumes_with_the_new_defaults(kubectl, upgraded):
    """Its StatefulSet went with the suspension: the one made at the resume is the new
    operator's. A resume is no restart (attempt 2 began at the suspension)."""
    namespace = upgraded.namespace
    uj.set_suspend(kubectl, namespace, "paused", False)
    running_attempt(kubectl, namespace, "paused", 2)
    uj.assert_new_defaults(kubectl, namespace, "paused")
    (upgraded.flags / "paused-done").touch()
    status = wait_phase(kubectl, namespace, "paused", "Succeeded", timeout=120)
    assert (status["attempt"], status.get("restartCount", 0), status.get("failureCounts")
            ) == (2, 0, upgraded.before["paused"]["failureCounts"] or None), status
    assert [record.get("class") for record in status["attempts"]] == ["Suspended", "Succeeded"]


def test_the_queued_job_keeps_its_workload_and_starts_with_the_new_defaults(kubectl, upgraded):
    namespace = upgraded.namespace
    assert get_json(kubectl, "workloads", "-n", namespace, "-l",
                    "monarch-operator.dev/job=queued")["items"][0]["metadata"]["uid"] \
        == upgraded.workload_uid
    (upgraded.flags / "demo-done").touch()  # demo holds the quota until it ends
    wait_phase(kubectl, namespace, "queued", "Running", timeout=120)
    uj.assert_new_defaults(kubectl, namespace, "queued")
    (upgraded.flags / "queued-done").touch()
    uj.ended_once(kubectl, namespace, "queued")


def test_jobs_created_during_and_after_the_upgrade_are_picked_up(kubectl, upgraded):
    namespace = upgraded.namespace
    uj.assert_new_defaults(kubectl, namespace, "late")
    for job in ("during", "late"):
        (upgraded.flags / f"{job}-done").touch()
        uj.ended_once(kubectl, namespace, job)


def test_the_stored_jobs_read_through_the_new_schema(kubectl, upgraded):
    """The new field defaulted when read; the spec itself never written."""
    demo = get_json(kubectl, "monarchjob", "demo", "-n", upgraded.namespace)
    assert demo["spec"][NEW_FIELD[0]] == NEW_FIELD[1]
    assert demo["metadata"]["generation"] == 1


# -- an upgrade from a lone replica ---------------------------------------------------------


def test_an_upgrade_from_a_lone_replica_waits_until_it_is_stopped(
        kubectl, helm_env, chart_namespace, flags, newer, local_cluster):
    """Installed with leader election off (one replica, acting alone, no Lease), upgraded to
    the newer chart's defaults (two replicas under leader election): the rolling update would
    start a leader beside the lone replica, two operators acting at once. The chart refuses,
    naming the commands; once they ran, the same upgrade goes through and the job running
    across it keeps its pods and its one attempt."""
    namespace, release = chart_namespace, "lone"
    scope = ("--set", f"watchNamespaces={{{namespace}}}")
    helm("install", release, str(CHART), "-n", namespace, *scope, "--set", "replicas=1",
         "--set", "leaderElection.enabled=false", "--wait", "--timeout=120s", env=helm_env)
    try:
        apply_manifest(kubectl, namespace, job_manifest(
            "solo", launcher=uj.waits_for(flags / "solo-done")))
        running_attempt(kubectl, namespace, "solo", 1)
        before = uj.snapshot(kubectl, namespace, "solo")
        [lone] = uj.operator_pods(kubectl, namespace, release)

        refused = helm("upgrade", release, str(newer), "-n", namespace, *scope, "--wait",
                       "--timeout=120s", env=helm_env, check=False)
        assert refused.returncode != 0
        fullname = f"{release}-monarch-operator"
        commands = [line.strip() for line in refused.stderr.splitlines()
                    if line.strip().startswith("kubectl ")]
        assert commands == [
            f"kubectl scale deployment/{fullname} -n {namespace} --replicas=0",
            f"kubectl wait --for=delete pod -n {namespace} -l app.kubernetes.io/name="
            f"monarch-operator,app.kubernetes.io/instance={release} --timeout=120s"], refused
        assert f"pod {lone['metadata']['name']} runs the operator alone" in refused.stderr
        assert [pod["metadata"]["uid"] for pod in uj.operator_pods(
            kubectl, namespace, release)] == [lone["metadata"]["uid"]], "nothing rolled"
        assert get_json(kubectl, "lease", fullname, "-n", namespace) is None

        for command in commands:  # as the message says, word for word
            kubectl(*shlex.split(command)[1:])
        helm("upgrade", release, str(newer), "-n", namespace, *scope, "--wait",
             "--timeout=180s", env=helm_env)
        new_pods = {pod["metadata"]["name"] for pod in uj.operator_pods(kubectl, namespace,
                                                                        release)}
        assert len(new_pods) == 2 and lone["metadata"]["name"] not in new_pods
        wait_until(lambda: uj.leader(kubectl, namespace, fullname) in new_pods, 60,
                   "a new operator pod holds the Lease")
        assert uj.snapshot(kubectl, namespace, "solo") == before
        (flags / "solo-done").touch()
        uj.ended_once(kubectl, namespace, "solo")
    except Exception:
        print(uj.report(kubectl, local_cluster, namespace, release))
        raise
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", env=helm_env, check=False)
