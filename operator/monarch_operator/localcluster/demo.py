"""The demo: the sample MonarchJob end to end on the local control plane.

Also the building blocks the cluster and end-to-end tests use: install the CRDs, run the
operator as a process, apply a manifest, wait for a job's phase with progress output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from monarch_operator import constants
from monarch_operator.localcluster.args import demo_parser
from monarch_operator.localcluster.cli import DEFAULT_STATE_DIR, pod_log_path
from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.kubeget import InProcessGet
from monarch_operator.localcluster.orphans import stop_with_parent

REPO_ROOT = Path(__file__).resolve().parents[3]
CRDS_DIR = REPO_ROOT / "crds"
SAMPLE = REPO_ROOT / "crds" / "samples" / "demo.yaml"
FINAL_PHASES = ("Succeeded", "Failed")
DEMO_GPUS_PER_NODE = 4
# The images the demo imports into its nodes; with --keep the examples image too.
DEMO_IMAGES = ("worker",)
KEPT_IMAGES = ("worker", "examples")


class Kubectl:
    """kubectl against one kubeconfig; every call raises with stderr on failure.

    A plain ``get ... -o json`` (what every wait polls) is answered in this process by the
    Python client instead of a kubectl run (:mod:`monarch_operator.localcluster.kubeget`),
    with the same output and exit status.
    """

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}
        kubeconfig = self.env.get("KUBECONFIG", "")
        self._get = InProcessGet(kubeconfig) if kubeconfig and os.pathsep not in kubeconfig \
            else None

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        answered = self._get.answer(args) if self._get is not None and stdin is None else None
        if answered is not None:
            returncode, stdout, stderr = answered
        else:
            result = subprocess.run(["kubectl", *args], input=stdin, capture_output=True,
                                    text=True, env=self.env, check=False)
            returncode, stdout, stderr = result.returncode, result.stdout, result.stderr
        if check and returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {stderr.strip()}")
        return stdout

    def json(self, *args: str) -> Any:
        return json.loads(self("get", *args, "-o", "json"))


def install_crds(kubectl: Kubectl) -> None:
    """Apply every CRD under ``crds/`` and wait until the MonarchJob CRD is Established."""
    for crd in sorted(CRDS_DIR.glob("*.yaml")):
        kubectl("apply", "--server-side", "-f", str(crd))
    wait_established(kubectl, "monarchjobs.monarch-operator.dev")


def wait_established(kubectl: Kubectl, crd: str, timeout: float = 60) -> None:
    """Wait until CustomResourceDefinition ``crd`` is Established (its API is served).

    ``kubectl wait --for=condition=Established`` fails at once, instead of waiting, while a
    just-created CRD has no conditions yet (`.status.conditions accessor error: <nil>`, seen
    on a loaded machine), so this polls every 0.5 s.

    Raises:
        RuntimeError: not Established within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        conditions = kubectl.json(f"crd/{crd}").get("status", {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"CRD {crd} not Established after {timeout:.0f}s")
        time.sleep(0.5)


# Where start_operator records the operator's pid (read by LocalCluster.down()).
OPERATOR_PID_FILE = "operator.pid"


def start_operator(state_dir: Path, env: dict[str, str], namespaces: tuple[str, ...] = (),
                   stop_with_owner: bool = False) -> subprocess.Popen[bytes]:
    """Run ``monarch-operator`` with output to ``<state_dir>/logs/operator.log``.

    ``namespaces`` become its ``--namespace`` flags (kopf patterns; none: every namespace).
    With ``stop_with_owner`` it gets SIGTERM when the calling process dies (tests; see
    :mod:`localcluster.orphans`).
    Its pid goes to ``<state_dir>/operator.pid`` so that ``monarch-localcluster down`` stops it
    too (``scripts/demo.sh --keep`` leaves it running with the cluster).
    """
    log_path = state_dir / "logs" / "operator.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "monarch_operator.controller",
             *(f"--namespace={namespace}" for namespace in namespaces)],
            env={**os.environ, **env},
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=stop_with_parent() if stop_with_owner else None)
    (state_dir / OPERATOR_PID_FILE).write_text(f"{process.pid}\n")
    return process


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_phase(kubectl: Kubectl, namespace: str, name: str, phases: tuple[str, ...],
                   timeout: float, progress: Any = print) -> dict[str, Any]:
    """Poll the MonarchJob until ``status.phase`` is one of ``phases``; print each change.

    Returns:
        The job object. Raises ``TimeoutError`` naming the last phase and ready count.
    """
    deadline = time.monotonic() + timeout
    last = None
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = kubectl.json("monarchjob", name, "-n", namespace)
        status = job.get("status") or {}
        summary = (status.get("phase"), status.get("readyWorkers"))
        if summary != last:
            progress(f"[demo] {namespace}/{name}: phase={summary[0] or '-'} "
                     f"ready={summary[1] or '-'}")
            last = summary
        if status.get("phase") in phases:
            return job
        time.sleep(1)
    raise TimeoutError(f"{namespace}/{name} still {last} after {timeout:.0f}s")


def launcher_log(kubectl: Kubectl, state_dir: Path, namespace: str, job_name: str) -> str:
    """Output of the job's launcher: as the node agent captured it (kwok nodes), else what
    ``kubectl logs`` gets from the kubelet (real nodes); "" when there is none."""
    pods = kubectl.json("pods", "-n", namespace, "-l", f"{constants.LABEL_JOB}={job_name},"
                        f"{constants.LABEL_ROLE}={constants.ROLE_LAUNCHER}")["items"]
    for pod in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"], reverse=True):
        path = pod_log_path(state_dir, namespace, pod["metadata"]["name"])
        if path is not None:
            return path.read_text(errors="replace")
        log = kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False)
        if log:
            return log
    return ""


# The line each Monarch process prints as it starts (the launcher and every worker's): said
# once, not once per process, interleaved with the output of the others.
_MONARCH_LOG_NOTE = re.compile(r"Monarch internal logs are being written to \S+")
# What is left of a line once that note is taken out of it: a rank prefix or nothing.
_PREFIX_ONLY = re.compile(r"\s*(?:\[[^\]]*\]\s*)*")


def tidy_output(text: str) -> str:
    """The launcher's output as the demo shows it: Monarch's "internal logs are being written
    to ..." note once (the first), wherever the processes' writes put the others, and every
    other line as it was."""
    lines, said = [], False
    for line in text.splitlines(keepends=True):
        found = _MONARCH_LOG_NOTE.search(line)
        if found is None:
            lines.append(line)
            continue
        if not said:
            lines.append(found.group(0) + "\n")
            said = True
        rest = _MONARCH_LOG_NOTE.sub("", line).rstrip()
        if not _PREFIX_ONLY.fullmatch(rest):
            lines.append(rest + "\n")
    return "".join(lines)


def jobs_table(kubectl: Kubectl, namespace: str) -> str:
    """``kubectl get monarchjobs`` as the demo shows it: the command, then the table with its
    column header (``--no-headers=false``: a kuberc default cannot drop it)."""
    table = kubectl("get", "monarchjobs", "-n", namespace, "--no-headers=false").rstrip()
    return f"\n$ kubectl get monarchjobs -n {namespace}\n{table}\n"


def timed_out(kubectl: Kubectl, state_dir: Path, namespace: str, timeout: float,
              error: TimeoutError) -> str:
    """What the demo says when the sample job has not finished within ``timeout`` seconds:
    the job's table, its conditions' last reasons, the end of the launcher's output so far and
    where to look next (no traceback: a slow machine is not a crash)."""
    lines = [f"[demo] the job did not finish within {timeout:.0f} s ({error}); "
             "--timeout SECONDS waits longer", jobs_table(kubectl, namespace)]
    job = kubectl.json("monarchjob", "demo", "-n", namespace)
    for condition in (job.get("status") or {}).get("conditions") or []:
        lines.append(f"  condition {condition.get('type')}={condition.get('status')} "
                     f"{condition.get('reason', '')}: {condition.get('message', '')}".rstrip(": "))
    output = launcher_log(kubectl, state_dir, namespace, "demo").strip().splitlines()
    if output:
        lines.append("--- the launcher's output so far (its last 20 lines) ---")
        lines.extend(output[-20:])
    lines.append(f"[demo] more: kubectl describe monarchjob demo -n {namespace}; "
                 f"the operator's log: {state_dir / 'logs' / 'operator.log'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns 0 when the sample job Succeeded."""
    args = demo_parser().parse_args(argv)
    started = time.monotonic()
    # A kept cluster is for trying the examples by hand: their image is built and imported too.
    cluster = LocalCluster(args.dir, real_nodes=0 if args.simulated else args.nodes,
                           gpus_per_node=DEMO_GPUS_PER_NODE if not args.simulated else 8,
                           images=KEPT_IMAGES if args.keep else DEMO_IMAGES)
    # A cluster (and operator) someone already runs here is used and left as it was found.
    was_running = cluster.is_running()
    cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
    env = cluster.env()
    kubectl = Kubectl(env)
    operator = None
    try:
        install_crds(kubectl)
        running = cluster.operator_pid()
        if running is not None:
            print(f"[demo] CRD installed; monarch-operator already runs (pid {running}, log: "
                  f"{cluster.state_dir / 'logs' / 'operator.log'})", flush=True)
        else:
            print("[demo] CRD installed; starting monarch-operator "
                  f"(log: {cluster.state_dir / 'logs' / 'operator.log'})", flush=True)
            operator = start_operator(cluster.state_dir, env)
        kubectl("create", "namespace", args.namespace, check=False)
        # As a security-minded cluster would: the API server refuses any pod of the namespace
        # that does not pass Pod Security "restricted" (the job's pods do).
        kubectl("label", "namespace", args.namespace, "--overwrite",
                *(f"pod-security.kubernetes.io/{mode}=restricted"
                  for mode in ("enforce", "warn", "audit")))
        print(f"[demo] namespace {args.namespace} enforces Pod Security \"restricted\"",
              flush=True)
        kubectl("delete", "monarchjob", "demo", "-n", args.namespace, "--ignore-not-found",
                "--wait=true")
        print(kubectl("apply", "-n", args.namespace, "-f", str(SAMPLE)).strip(), flush=True)
        try:
            job = wait_for_phase(kubectl, args.namespace, "demo", FINAL_PHASES, args.timeout,
                                 progress=lambda line: print(line, flush=True))
        except TimeoutError as error:
            print(timed_out(kubectl, cluster.state_dir, args.namespace, args.timeout, error),
                  flush=True)
            return 1
        # What a user sees from then on: the finished job's workers released (cleanupPolicy
        # DeleteWorkers), so READY, the workers Ready now, is 0/N.
        released_by = time.monotonic() + 60
        while (time.monotonic() < released_by and not str(
                (kubectl.json("monarchjob", "demo", "-n", args.namespace).get("status") or {})
                .get("readyWorkers", "")).startswith("0/")):
            time.sleep(1)
        print(jobs_table(kubectl, args.namespace), flush=True)
        print("--- launcher output (trainer / ref meshes) ---")
        print(tidy_output(launcher_log(kubectl, cluster.state_dir, args.namespace, "demo")),
              flush=True)
        phase = job["status"]["phase"]
        print(f"[demo] job {phase}, {time.monotonic() - started:.0f}s after the cluster's start-up "
              "began (set-up before it not counted)", flush=True)
        return 0 if phase == "Succeeded" else 1
    finally:
        where = "" if args.dir == DEFAULT_STATE_DIR else f" --dir {args.dir}"
        if was_running and not args.keep:
            if operator is not None:
                stop_process(operator)
            print(f"[demo] the cluster ran before the demo and is left running (stop it with "
                  f".venv/bin/monarch-localcluster{where} down)", flush=True)
        elif not args.keep:
            if operator is not None:
                stop_process(operator)
            cluster.down(quiet=True)
            print("[demo] cluster stopped (use --keep to leave it running)", flush=True)
        else:
            print(f"[demo] cluster and operator left running; use them with\n"
                  f'  eval "$(.venv/bin/monarch-localcluster{where} env)"\n'
                  f"and stop both with\n  .venv/bin/monarch-localcluster{where} down",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
