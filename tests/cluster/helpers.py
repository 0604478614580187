"""Helpers shared by the cluster tests: waiting for a condition, reading an object, a sample
MonarchJob and its status, watching its worker pods, reading pods through the typed client."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
import yaml

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               interval: float = 0.5, explain: Callable[[], str] | None = None) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy.

    Returns:
        That value.

    Raises:
        AssertionError: ``timeout`` seconds passed first; the message names ``what`` and ends
            with what ``explain()`` returns then (the state that was waited on).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    message = f"timed out after {timeout}s waiting for {what}"
    if explain is not None:
        try:
            message += "\n" + explain()
        except Exception as error:  # the explanation must never hide the timeout
            message += f"\n(no explanation: {error!r})"
    raise AssertionError(message)


def get_json(kubectl: Callable[..., str], *args: str) -> Any:
    """``kubectl get ARGS -o json`` as a dict, or None when the object does not exist."""
    out = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out) if out else None


IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
LABEL_JOB = "monarch-operator.dev/job"


def job_manifest(name: str, **spec: Any) -> str:
    """A MonarchJob of 2 one-GPU workers (trainer 1 host, ref 1 host) as YAML; ``spec`` keys
    are set over those defaults."""
    body = {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": name},
            "spec": {"image": IMAGE, "workers": {"replicas": 2, "gpusPerWorker": 1},
                     "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}, **spec}}
    return yaml.safe_dump(body)


def apply_manifest(kubectl: Callable[..., str], namespace: str, manifest: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)


def job_status(kubectl: Callable[..., str], namespace: str, name: str) -> dict[str, Any]:
    """The MonarchJob's status ({} while it has none or the job is gone)."""
    return (get_json(kubectl, "monarchjob", name, "-n", namespace) or {}).get("status") or {}


def wait_phase(kubectl: Callable[..., str], namespace: str, name: str, phase: str,
               timeout: float = 120) -> dict[str, Any]:
    """Wait until the job's ``status.phase`` is ``phase``; returns its status."""
    return wait_until(lambda: (status := job_status(kubectl, namespace, name))
                      .get("phase") == phase and status, timeout, f"{name} {phase}",
                      explain=lambda: job_snapshot(kubectl, namespace, name))


def job_snapshot(kubectl: Callable[..., str], namespace: str, name: str) -> str:
    """What a timed-out wait on job ``name`` shows: its status (phase, attempt, conditions,
    message), each of its pods (phase, node, readiness, each container's state) and the
    namespace's last 15 Events, as text."""
    status = job_status(kubectl, namespace, name)
    lines = [f"job {namespace}/{name}: phase {status.get('phase')}, attempt "
             f"{status.get('attempt')}, message {status.get('message')!r}"]
    lines += [f"  condition {c.get('type')}={c.get('status')} ({c.get('reason')}): "
              f"{c.get('message', '')}" for c in status.get("conditions") or []]
    for pod in job_pods(kubectl, namespace, name):
        pod_status = pod.get("status") or {}
        states = ", ".join(f"{c['name']} {next(iter(c.get('state') or {'?': 0}))}"
                           f" (restarts {c.get('restartCount', 0)})"
                           for c in pod_status.get("containerStatuses") or [])
        lines.append(f"  pod {pod['metadata']['name']}: {pod_status.get('phase')} on "
                     f"{pod['spec'].get('nodeName')}, Ready {pod_condition(pod)}; {states}")
    events = (get_json(kubectl, "events", "-n", namespace) or {}).get("items") or []
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    lines += [f"  event {e.get('lastTimestamp') or e.get('eventTime')} "
              f"{e['involvedObject'].get('name')} {e.get('reason')}: {e.get('message', '')}"
              for e in events[-15:]]
    return "\n".join(lines)


def condition(status: dict[str, Any], condition_type: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == condition_type)


def job_pods(kubectl: Callable[..., str], namespace: str, name: str) -> list[dict[str, Any]]:
    """Every pod of the job (workers and launchers)."""
    return list(get_json(kubectl, "pods", "-n", namespace, "-l", f"{LABEL_JOB}={name}")["items"])


def running_attempt(kubectl: Callable[..., str], namespace: str, name: str,
                    attempt: int) -> dict[str, Any]:
    """Wait until ``attempt``'s launcher pod runs; returns the job's status."""
    def running() -> dict[str, Any] | None:
        status = job_status(kubectl, namespace, name)
        if status.get("phase") != "Running" or status.get("attempt") != attempt:
            return None
        pods = get_json(kubectl, "pods", "-n", namespace, "-l",
                        f"{LABEL_JOB}={name},monarch-operator.dev/attempt={attempt}")
        phases = [pod["status"].get("phase") for pod in pods["items"]]
        return status if "Running" in phases else None
    return wait_until(running, 120, f"{name} attempt {attempt} running",
                      explain=lambda: job_snapshot(kubectl, namespace, name))


class PodWatch:
    """Every worker pod uid the API server announces while the watch runs (kubectl --watch),
    and the nodes they were bound to.

    ``with PodWatch(kubectl, namespace, job) as watch: ...``, then ``watch.pods_seen()``.
    """

    def __init__(self, kubectl: Any, namespace: str, job: str) -> None:
        self.uids: dict[str, set[str]] = {}
        self.nodes: dict[str, set[str]] = {}
        self.bound: dict[str, set[str]] = {}  # the uids seen bound to a node, per pod name
        self._process = subprocess.Popen(
            ["kubectl", "get", "pods", "-n", namespace, "--watch", "--output-watch-events",
             "-l", f"{LABEL_JOB}={job},monarch-operator.dev/role=worker", "-o", "json"],
            stdout=subprocess.PIPE, text=True, env=kubectl.env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> PodWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self._process.stdout is not None
        for line in self._process.stdout:
            buffer += line
            try:
                event, _ = decoder.raw_decode(buffer.strip())
            except ValueError:
                continue
            buffer = ""
            metadata = event["object"]["metadata"]
            self.uids.setdefault(metadata["name"], set()).add(metadata["uid"])
            node = (event["object"].get("spec") or {}).get("nodeName")
            if node:
                self.nodes.setdefault(metadata["name"], set()).add(node)
                self.bound.setdefault(metadata["name"], set()).add(metadata["uid"])

    def stop(self) -> dict[str, set[str]]:
        """End the watch; returns the uids seen per worker pod name."""
        if self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._reader.join(timeout=10)
        assert self._process.stdout is not None
        self._process.stdout.close()
        return self.uids

    def pods_seen(self) -> dict[str, int]:
        """How many distinct pods (uids) each worker name had: 1 means never recreated."""
        return {name: len(uids) for name, uids in sorted(self.uids.items())}

    def pods_bound(self) -> dict[str, int]:
        """How many distinct pods (uids) of each worker name were bound to a node: the pods
        that could run. A pod object the StatefulSet created and that was gone before the
        scheduler could bind it is not counted (real nodes, CI 2026-12-07: after a force
        deletion, one lived 25 ms, its binding answered 404)."""
        return {name: len(uids) for name, uids in sorted(self.bound.items())}


def read_pod(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as a dict through a ``kubernetes.client.CoreV1Api``, None when it is gone."""
    try:
        pod: dict[str, Any] = core.api_client.sanitize_for_serialization(
            core.read_namespaced_pod(name, namespace))
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return pod


def pod_condition(pod: dict[str, Any] | None, kind: str = "Ready") -> str:
    """The status ("True", "False", "Unknown") of the pod's condition ``kind``, "" if none."""
    return next((c["status"] for c in ((pod or {}).get("status") or {}).get("conditions") or []
                 if c["type"] == kind), "")


def start_pod(core: Any, namespace: str, name: str, script: str, ready: bool = False,
              **spec: Any) -> dict[str, Any]:
    """Create a pod with one container ``main`` running ``sh -c script`` (``restartPolicy:
    Never``; ``spec`` keys, and ``container={...}`` for the container, set over that) and wait
    until its container runs, or with ``ready`` until the pod is Ready; returns the pod."""
    container = {"name": "main", "image": IMAGE, "command": ["sh", "-c", script],
                 **spec.pop("container", {})}
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec}})

    def started() -> dict[str, Any] | None:
        pod = read_pod(core, namespace, name)
        if ready:
            return pod if pod_condition(pod) == "True" else None
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        return pod if "running" in (statuses[0].get("state") or {}) else None

    return wait_until(started, 60, f"pod {name} {'Ready' if ready else 'running'}")


# A launcher program (checkpoint before a stop, issue 21 item 4): opts in, resumes from
# MONARCH_CHECKPOINT when there is one (then ends at once), else "trains" until asked to stop,
# saves its state and names it.
CHECKPOINTING_PROGRAM = textwrap.dedent("""
    import sys, time
    from monarch_operator.job import checkpoint_saved, on_stop, resume_checkpoint, stop_requested
    on_stop()
    print("ready for a stop", flush=True)  # before this line a SIGTERM stops it at once
    if resume_checkpoint():
        print("resumed from", resume_checkpoint(), flush=True)
        sys.exit(0)
    step = 0
    while not stop_requested():
        time.sleep(0.1)
        step += 1
    time.sleep(2)  # saving takes a while: the workers must still be there
    checkpoint_saved(f"/ckpt/ckpt-demo/step-{step}")
    print("saved", flush=True)
""")


def wait_ready_for_a_stop(kubectl: Callable[..., str], namespace: str, pod: str,
                          timeout: float = 60) -> None:
    """Wait until :data:`CHECKPOINTING_PROGRAM` in ``pod`` has opted in (``on_stop()``): a
    pod is Running while its Python still imports, and a SIGTERM then stops it at once,
    with no checkpoint (the cause of this test's failures under load, 2026-12-04)."""
    wait_until(lambda: "ready for a stop" in kubectl("logs", pod, "-n", namespace,
                                                      check=False),
               timeout, f"{pod} ready for a stop")


def table_row(table: str) -> dict[str, str]:
    """The first row of a ``kubectl get`` table by column name (cut at the header's column
    starts, so that an empty cell stays empty)."""
    header, row = table.splitlines()[:2]
    columns = list(re.finditer(r"\S+", header))
    ends = [column.start() for column in columns[1:]] + [None]
    return {column.group(): row[column.start():end].strip()
            for column, end in zip(columns, ends, strict=True)}
