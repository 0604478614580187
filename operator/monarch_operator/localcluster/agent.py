"""Node agent of the local cluster: the kubelet of kwok's fake nodes, with real local processes.

It sees pods and nodes as a kubelet does, through a list and a watch (``listwatch.py``), and
syncs every half second and on each change. For each pod that kwok gave an IP on one of its
nodes, the agent:
- runs the pod's init containers in order, each to completion, then its containers, each as a
  local process in its own mount and UTS namespace (``sandbox.py``): the pod's hostname, a
  private ``/dev`` mirroring the machine's, its volumes at their mount paths (``volumes.py``:
  Secret, ConfigMap, downwardAPI and projected ones read-only, emptyDir; the same directories
  for every container of the pod), a cluster hosts file at ``/etc/hosts`` and a fresh empty
  file at ``terminationMessagePath`` for every instance;
- runs each process as its ``securityContext`` says (``identity.py``: ``runAsUser``,
  ``runAsGroup``, ``supplementalGroups``, ``fsGroup`` on the volumes' files, the
  ``runAsNonRoot`` refusal as ``CreateContainerConfigError``) with the kubelet's environment
  (``podfiles.py``: ``env``, ``envFrom``, ``fieldRef``, ``resourceFieldRef``);
- gives pods their service-account token and the API server's address (``serviceaccount.py``:
  the ``kube-api-access-*`` volume's token from the TokenRequest API, bound to the pod and
  renewed at 80% of its lifetime; ``KUBERNETES_SERVICE_HOST=127.0.0.1`` and the real port);
- restarts containers as ``restartPolicy`` asks, with the kubelet's crash-loop back-off
  (``podstatus.py``), and runs ``tcpSocket`` readiness probes against the pod IP;
- reports the pod's status as the kubelet computes it (phase, conditions, ``containerStatuses``
  and ``initContainerStatuses`` with exit codes, termination messages, restart counts) as one
  annotation, which a kwok Stage copies into the pod's status;
- when a container's main process ends, kills the rest of its processes (as the end of its PID
  namespace would) and lets go of its namespace;
- when the pod is deleted, terminates it as a kubelet does (``termination.py``), one step per
  pass so that no slow container holds up the other pods: the grace period from
  ``deletionGracePeriodSeconds`` (else ``terminationGracePeriodSeconds``, default 30 s), each
  container's ``preStop`` exec hook, SIGTERM to its main process, SIGKILL to all of its
  processes once the grace period is over (at least 2 s after SIGTERM); no container starts
  any more, and once all have ended it reports the final status and the annotation
  ``ANNOTATION_STOPPED``, on which kwok deletes the object (until then it is Terminating). A
  force-deleted pod's containers are stopped the same way, with a 1 s grace period;
- serves nothing for a node that is down (``nodestate.py``): for ``crash`` it kills the node's
  processes at once (each running container then counts as lost: 137,
  ``ContainerStatusUnknown``), for ``partition`` it leaves them running; either way it reports
  nothing and acts on no deletion for the node until it is up again;
- serves the kubelet API for ``kubectl logs`` and ``kubectl exec`` (``kubeletapi.py``), given
  ``--kubelet-port``.
Failures of the agent show on the pod: a sandbox that could not start a container ends that
container with reason ``StartError`` (exit code 128) and the sandbox's own words; an unexpected
error fails the pod with reason ``NodeAgentError``.

Without network namespaces all pods share the loopback interface, so the agent passes the pod
IP as ``SSH_LISTEN_ADDRESS`` for sshd to bind. A container without ``runAsUser`` runs as the
agent's user (root), as an image without ``USER`` would.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from monarch_operator.localcluster import (
    identity,
    kubeletapi,
    leasekeeper,
    listwatch,
    nodestate,
    podfiles,
    podstatus,
    sandbox,
    serviceaccount,
    termination,
    volumes,
)

# The pod status the agent computed, as JSON; the kwok Stage local-pod-status applies it.
ANNOTATION_STATUS = "localcluster.monarch-operator.dev/status"
# On a pod: simulated by kwok Stages (kwok-stages.yaml, for benchmarks); the agent leaves it alone.
LABEL_SIMULATE = "localcluster.monarch-operator.dev/simulate"
# Optional, on a pod: the crash-loop back-off's first delay in seconds (kubelet: 10; for tests).
ANNOTATION_BACKOFF = "localcluster.monarch-operator.dev/crash-loop-backoff-seconds"
# On a deleted pod: every container of it stopped on the node; the kwok Stage local-pod-delete
# then applies the final status and deletes the object (the kubelet's final delete).
ANNOTATION_STOPPED = "localcluster.monarch-operator.dev/containers-stopped"
REPO_ROOT = Path(__file__).resolve().parents[3]
# Image paths that live elsewhere on this machine: the worker image's entrypoint.
IMAGE_PATHS = {"/usr/local/bin/monarch-worker-entrypoint": REPO_ROOT / "images/worker/entrypoint.sh"}
# What "the image" is made of here, which a non-root container must be able to reach.
IMAGE_ROOTS = [Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix), REPO_ROOT]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AGENT_EXIT_GRACE_SECONDS = 3.0  # when the agent itself stops: SIGTERM -> SIGKILL
# Least time between two syncs, seconds: a burst of pod and node events (the agent's own status
# writes among them) wakes one sync, not one each.
SYNC_GAP_S = 0.1
# Reported for a container whose node went down under it (kubelet_pods.go: a container that
# was running and cannot be found any more).
LOST_CONTAINER = (137, "ContainerStatusUnknown",
                  "The container could not be located when the pod was terminated")

log = logging.getLogger("localcluster.agent")


@dataclass
class Running:
    """A container instance whose main process the agent still waits for."""

    record: podstatus.ContainerRecord
    process: sandbox.ContainerProcess
    spec: dict[str, Any]
    termination_path: Path  # the machine's side of the container's terminationMessagePath
    env: dict[str, str] = field(default_factory=dict)
    stop: termination.ContainerStop | None = None  # set once its pod terminates


@dataclass
class PodRun:
    """A pod this agent runs: the kubelet's record of it and its live container instances."""

    pod: dict[str, Any]
    record: podstatus.PodRecord
    workdir: Path
    containers: dict[str, Running] = field(default_factory=dict)
    volumes: dict[str, Path] | None = None
    tokens: serviceaccount.PodTokens | None = None
    reported: str = ""
    grace: float | None = None  # the termination's grace period, once the pod terminates

    @property
    def pod_ip(self) -> str:
        """The IP kwok gave the pod."""
        return str(self.pod["status"]["podIP"])

    @property
    def node(self) -> str:
        """The node the pod runs on."""
        return str(self.pod["spec"]["nodeName"])

    @property
    def name(self) -> str:
        """``namespace/name`` of the pod."""
        return f"{self.record.namespace}/{self.record.name}"

    def spec_of(self, record: podstatus.ContainerRecord) -> dict[str, Any]:
        """The pod spec's entry for ``record``'s container."""
        key = "initContainers" if record.init else "containers"
        return next(c for c in self.pod["spec"][key] if c["name"] == record.name)


class Agent:
    """Keeps local processes in line with the pods scheduled on the cluster's nodes.

    Args:
        backoff_base: the crash-loop back-off's first delay in seconds, unless a pod's
            ``ANNOTATION_BACKOFF`` says otherwise.
    """

    def __init__(self, state_dir: Path, core: kubernetes.client.CoreV1Api,
                 backoff_base: float = podstatus.DEFAULT_BACKOFF_SECONDS) -> None:
        self.state_dir = state_dir
        self.core = core
        self.backoff_base = backoff_base
        self.pods_dir = state_dir / "pods"
        self.hosts_path = state_dir / "hosts"
        self.hosts_path.write_text(podfiles.hosts_file([]))
        self.runs: dict[str, PodRun] = {}
        # Container instances with a process that survived SIGKILL so far (released later).
        self.lingering: list[sandbox.ContainerProcess] = []
        # Pods and nodes as a kubelet sees them: listed once, then watched (:mod:`.listwatch`).
        self.changed = threading.Event()
        self.pods = listwatch.ListWatch(core.list_pod_for_all_namespaces, self.changed, "pods")
        self.nodes = listwatch.ListWatch(core.list_node, self.changed, "nodes")
        # Node Leases kwok stopped renewing (:mod:`.leasekeeper`).
        self.lease_keeper = leasekeeper.LeaseKeeper(
            kubernetes.client.CoordinationV1Api(core.api_client))

    def run_forever(self, interval: float = 0.5) -> None:
        """Sync every ``interval`` seconds, and sooner (at most every ``SYNC_GAP_S``) when a
        pod or node changed, until SIGTERM; then stop every pod process."""
        stop = False

        def request_stop(*_: Any) -> None:
            nonlocal stop
            stop = True
            self.changed.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        while not stop:
            self.changed.clear()
            try:
                self.sync()
            except Exception:  # keep the node alive through API hiccups; log them
                log.exception("sync failed")
            time.sleep(SYNC_GAP_S)
            self.changed.wait(max(0.0, interval - SYNC_GAP_S))
        self.pods.stop()
        self.nodes.stop()
        self._stop_containers([r for run in self.runs.values() for r in run.containers.values()],
                              grace=AGENT_EXIT_GRACE_SECONDS)
        self.runs.clear()

    def sync(self) -> None:
        """One pass: begin or advance the termination of deleted pods, start new pods, step
        and report every pod; for a node that is down (``nodestate``), only what its mode
        leaves running."""
        # The first sync lists both (raising what a LIST raises; the next sync tries again).
        self.nodes.start()
        self.pods.start()
        down = {node["metadata"]["name"]: mode for node in self.nodes.objects()
                if (mode := (node["metadata"].get("labels") or {}).get(nodestate.LABEL_NODE_DOWN))}
        self.lease_keeper.keep(node["metadata"]["name"] for node in self.nodes.objects()
                               if node["metadata"]["name"] not in down)
        pods = [p for p in self.pods.objects() if p["spec"].get("nodeName")]
        self._write_hosts(pods)
        by_uid = {pod["metadata"]["uid"]: pod for pod in pods}
        for uid, run in list(self.runs.items()):
            pod = by_uid.get(uid)
            if down.get(run.node) == nodestate.CRASH:
                self._lose_containers(run, time.time())
            elif run.node not in down and (pod is None or pod["metadata"].get("deletionTimestamp")):
                self._terminate(run, pod, time.time())
        self.lingering = [process for process in self.lingering if not process.release()]
        # A terminating pod keeps its IP busy until its processes are gone (kwok may hand the
        # IP of a force-deleted pod to the next pod at once).
        busy_ips = {run.pod_ip for run in self.runs.values() if run.containers}
        for pod in pods:
            if pod["spec"]["nodeName"] in down:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self._confirm_unrun(pod)
            elif self._should_start(pod, busy_ips):
                run = self._new_run(pod)
                self.runs[run.record.uid] = run
                busy_ips.add(run.pod_ip)
        for uid, run in list(self.runs.items()):
            now, mode = time.time(), down.get(run.node)
            if mode == nodestate.CRASH:
                continue
            for running in run.containers.values():
                if running.stop is not None:
                    running.stop.advance(now)
                    self._log_stop(run, running)
            if run.containers or not run.record.finished:
                self._step_safely(run, now)
            if mode == nodestate.PARTITION:
                continue  # cut off from the API server: nothing is reported
            if run.record.terminating and not run.containers:
                self._confirm_stopped(run, by_uid.get(uid), now)
                del self.runs[uid]
            else:
                self._report(run, now)

    def _should_start(self, pod: dict[str, Any], busy_ips: set[str]) -> bool:
        meta, status = pod["metadata"], pod.get("status") or {}
        return (meta["uid"] not in self.runs
                and bool(status.get("podIP")) and status["podIP"] not in busy_ips
                and status.get("phase") not in ("Succeeded", "Failed")
                and LABEL_SIMULATE not in (meta.get("labels") or {})
                # run by an earlier agent process: its containers are gone with it
                and ANNOTATION_STATUS not in (meta.get("annotations") or {}))

    def _new_run(self, pod: dict[str, Any]) -> PodRun:
        meta = pod["metadata"]
        workdir = self.pods_dir / meta["namespace"] / meta["name"] / meta["uid"][:8]
        workdir.mkdir(parents=True, exist_ok=True)
        base = self.backoff_base
        try:
            base = float((meta.get("annotations") or {})[ANNOTATION_BACKOFF])
        except (KeyError, ValueError):
            pass
        return PodRun(pod=pod, record=podstatus.PodRecord.from_pod(pod, backoff_base=base),
                      workdir=workdir)

    def locate(self, namespace: str, pod: str, container: str) -> kubeletapi.ContainerView | None:
        """The kubelet API's view of a container of a pod this agent runs (from any thread)."""
        run = next((run for run in list(self.runs.values())
                    if run.record.namespace == namespace and run.record.name == pod), None)
        if run is None:
            return None
        running = run.containers.get(container)
        return kubeletapi.ContainerView(
            pod_uid=run.record.uid, log_path=run.workdir / f"{container}.log",
            previous_log_path=run.workdir / f"{container}.previous.log",
            pid=running.process.pid if running is not None else None,
            env=dict(running.env) if running is not None else None)

    # -- one pod -------------------------------------------------------------------------------
    def _step_safely(self, run: PodRun, now: float) -> None:
        try:
            self._step(run, now)
        except Exception as error:  # a bug of ours must show on the pod, not only in our log
            log.exception("%s/%s: node agent error", run.record.namespace, run.record.name)
            run.record.agent_error = f"local node agent: {type(error).__name__}: {error}"
            self._stop_containers(list(run.containers.values()), grace=0.0)
            run.containers.clear()

    def _step(self, run: PodRun, now: float) -> None:
        """Collect exits, probe readiness, start what is due (the next init container, or the
        containers, or restarts whose back-off is over)."""
        for name, running in list(run.containers.items()):
            code = running.process.poll()
            if code is not None:
                del run.containers[name]
                self._finish(run, running, code, now)
        for running in run.containers.values():
            if not running.record.init:
                running.record.ready = self._probe(run, running.spec)
        if run.tokens is not None:
            run.tokens.refresh(now)
        for record in run.record.due(now):
            self._start_container(run, record, now)

    def _finish(self, run: PodRun, running: Running, code: int, now: float) -> None:
        exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128+N
        process = running.process
        if process.exec_started():
            reason = "Completed" if exit_code == 0 else "Error"
            message = podfiles.termination_message(
                running.spec, exit_code,
                _read_end(running.termination_path, podfiles.MAX_TERMINATION_MESSAGE_BYTES),
                _read_end(process.log_path, podfiles.FALLBACK_LOG_BYTES))
        else:
            exit_code, reason = podstatus.START_ERROR_EXIT_CODE, "StartError"
            message = ("local node agent: the container's sandbox failed: "
                       f"{sandbox.tail_text(process.log_path)}")
        # The container's other processes end with it, as with the end of its PID namespace.
        self._stop_containers([running], grace=0.0)
        if running.stop is not None:
            running.stop.finish()
            self._log_stop(run, running)
        log.info("%s container %s exited with %d (%s)", run.name, running.record.name,
                 exit_code, reason)
        running.record.exited(exit_code, reason, message, now, run.record.restart_policy_now,
                              run.record.ref)

    def _start_container(self, run: PodRun, record: podstatus.ContainerRecord,
                         now: float) -> None:
        pod, spec, workdir = run.pod, run.spec_of(record), run.workdir
        try:
            identity.verify_run_as_non_root(pod, spec)
            if run.volumes is None:
                run.tokens = serviceaccount.PodTokens(self.core, pod)
                run.volumes = volumes.write_volumes(pod, workdir / "volumes", self._lookup,
                                                    run.tokens.write, self._allocatable(pod))
            env = self._env(pod, spec, workdir)
        except (ValueError, KeyError, ApiException) as error:
            why = (f"reading its Secret/ConfigMap: {error.status} {error.reason}"
                   if isinstance(error, ApiException) else str(error).strip("'\""))
            log.warning("%s/%s container %s: %s", run.record.namespace, run.record.name,
                        record.name, why)
            record.config_failed("CreateContainerConfigError", why, now)
            return
        command = [*(spec.get("command") or []), *(spec.get("args") or [])]
        if not command:
            self._start_failed(run, record, now, "cannot run an image's default entrypoint: "
                               "give the container a command")
            return
        command = [str(IMAGE_PATHS.get(command[0], command[0])),
                   *(podfiles.expand(arg, env) for arg in command[1:])]
        log_path, termination_path, mounts = self._instance_files(run, record, spec)
        user = identity.prepare_user(identity.identity(pod, spec), workdir, IMAGE_ROOTS)
        mounts += [sandbox.Mount(source, target, read_only)
                   for target, (source, read_only) in user.mounts.items()]
        if user.home:
            env["HOME"] = user.home
        try:
            process = sandbox.start(
                command, hostname=pod["spec"].get("hostname") or pod["metadata"]["name"],
                mounts=mounts, env=env, workdir=workdir, log_path=log_path, name=record.name,
                working_dir=spec.get("workingDir") or "", user=user.user, expose=user.expose,
                privileges=identity.privilege_options(spec))
        except sandbox.SandboxError as error:
            self._start_failed(run, record, now, f"the container's sandbox failed: {error}")
            return
        record.started(now)
        run.containers[record.name] = Running(record=record, process=process, spec=spec,
                                              termination_path=termination_path, env=env)
        log.info("%s/%s started %scontainer %s (pid %d): %s", run.record.namespace,
                 run.record.name, "init " if record.init else "", record.name, process.pid,
                 " ".join(command))

    def _instance_files(self, run: PodRun, record: podstatus.ContainerRecord,
                        spec: dict[str, Any]) -> tuple[Path, Path, list[sandbox.Mount]]:
        """Log file, termination-message file and mounts for a new instance of a container."""
        workdir, pod_volumes = run.workdir, run.volumes or {}
        log_path = workdir / f"{record.name}.log"
        if record.runs and log_path.exists():  # `kubectl logs --previous` keeps one instance
            log_path.replace(workdir / f"{record.name}.previous.log")
        # As the kubelet does: a fresh empty file per container instance, writable by any user.
        termination_path = workdir / f"{record.name}.termination-log"
        termination_path.write_bytes(b"")
        termination_path.chmod(0o666)
        # As a container runtime does: /etc/hostname holds the pod's hostname.
        hostname_path = workdir / "hostname"
        if not hostname_path.exists():
            hostname_path.write_text(f"{_hostname(run.pod)}\n")
        kinds = {volume["name"]: volume for volume in run.pod["spec"].get("volumes") or []}
        mounts = [sandbox.Mount(self.hosts_path, "/etc/hosts"),
                  sandbox.Mount(hostname_path, "/etc/hostname")]
        for mount in spec.get("volumeMounts") or []:
            read_only = bool(mount.get("readOnly")) or volumes.read_only_kind(kinds[mount["name"]])
            mounts.append(sandbox.Mount(pod_volumes[mount["name"]] / mount.get("subPath", ""),
                                        mount["mountPath"], read_only))
        # "The image" is this checkout and Python: bound back where a volume would hide it.
        mounts += [sandbox.Mount(root, str(root)) for root in sandbox.hidden_roots(
            (mount["mountPath"] for mount in spec.get("volumeMounts") or []), IMAGE_ROOTS)]
        mounts.append(sandbox.Mount(termination_path, podfiles.termination_message_path(spec)))
        return log_path, termination_path, mounts

    def _start_failed(self, run: PodRun, record: podstatus.ContainerRecord, now: float,
                      why: str) -> None:
        """The runtime could not start the container: it ends at once with StartError (128)
        and ``restartPolicy`` applies, as for a kubelet."""
        log.error("%s/%s container %s: %s", run.record.namespace, run.record.name,
                  record.name, why)
        record.started(now)
        record.exited(podstatus.START_ERROR_EXIT_CODE, "StartError", f"local node agent: {why}",
                      now, run.record.restart_policy, run.record.ref)

    def _env(self, pod: dict[str, Any], container: dict[str, Any], workdir: Path) -> dict[str, str]:
        home = workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": DEFAULT_PATH, "HOME": str(home),
               "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"],
               "LANG": "C.UTF-8",
               # No network namespace: sshd (and attach mode's Monarch worker loop,
               # launcher/attachworker.py) must bind the pod IP, not every loopback address.
               "SSH_LISTEN_ADDRESS": pod["status"]["podIP"],
               "MONARCH_WORKER_LISTEN_ADDRESS": pod["status"]["podIP"]}
        env.update(podfiles.container_env(
            pod, container, self._lookup,
            serviceaccount.api_server_env(self.core.api_client.configuration.host),
            self._allocatable(pod)))
        # "The image": this machine's Python environment with monarch-operator installed.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        return env

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, bytes]:
        try:
            if kind == "Secret":
                obj = self.core.read_namespaced_secret(name, namespace)
            else:
                obj = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as error:
            if error.status == 404:  # the kubelet's words, e.g. `secret "demo-ssh" not found`
                raise KeyError(f'{kind.lower()} "{name}" not found') from error
            raise
        return podfiles.decode_data(self.core.api_client.sanitize_for_serialization(obj))

    def _allocatable(self, pod: dict[str, Any]) -> dict[str, str]:
        """The pod's node's allocatable resources (limits a container leaves unset), read
        only for a pod that has a ``resourceFieldRef``."""
        if "resourceFieldRef" not in json.dumps(pod["spec"]):
            return {}
        node = self.core.read_node(pod["spec"]["nodeName"])
        return dict(node.status.allocatable or {})

    def _probe(self, run: PodRun, spec: dict[str, Any]) -> bool:
        port = _probe_port(spec)
        return port is None or _tcp_probe(run.pod_ip, port)

    # -- reporting -----------------------------------------------------------------------------
    def _report(self, run: PodRun, now: float) -> None:
        # A kubelet reports a container running once the runtime started its process (the OCI
        # runtime's start: the command exec'd); the sandbox sets up before that. Reported
        # sooner, a client acting on "running" (a deletion, an exec) meets a container whose
        # command has not run yet: its SIGTERM trap not set, its exit a StartError. The report
        # waits until every starting container's command runs (or its sandbox failed).
        if any(running.stop is None and running.record.running
               and not running.process.exec_started() for running in run.containers.values()):
            return
        document = json.dumps(run.record.api_status(now), sort_keys=True, separators=(",", ":"))
        if document != run.reported:
            annotate_pod(self.core, run.record.namespace, run.record.name, run.record.uid,
                         {ANNOTATION_STATUS: document})
            run.reported = document

    def _write_hosts(self, pods: list[dict[str, Any]]) -> None:
        content = podfiles.hosts_file(pods)
        if self.hosts_path.read_text() != content:
            # In place (same inode): pod namespaces bind-mounted this very file.
            with open(self.hosts_path, "r+") as hosts:
                hosts.truncate(0)
                hosts.write(content)

    # -- stopping ------------------------------------------------------------------------------
    def _terminate(self, run: PodRun, pod: dict[str, Any] | None, now: float) -> None:
        """Begin the pod's graceful termination (``termination.py``), or shorten it when a
        second deletion gave a shorter grace period. ``pod`` is ``None`` once the object is
        gone from the API (force deletion)."""
        grace = termination.grace_period(pod or run.pod, current=run.grace, vanished=pod is None)
        if run.grace is not None:
            if grace < run.grace:
                run.grace = grace
                for running in run.containers.values():
                    if running.stop is not None:
                        running.stop.shorten(grace)
            return
        run.grace = grace
        run.record.terminate()
        log.info("terminating %s (%s): grace period %gs", run.name,
                 "deleted" if pod else "gone from the API", grace)
        for running in run.containers.values():
            running.stop = termination.ContainerStop(running.record.name, running.process,
                                                     grace, now)
            hook = None if running.record.init else termination.prestop_command(running.spec)
            running.stop.begin(hook, running.env,
                               run.workdir / f"{running.record.name}.prestop.log")
            self._log_stop(run, running)

    def _confirm_stopped(self, run: PodRun, pod: dict[str, Any] | None, now: float) -> None:
        """Every container of the terminating pod ended: report its final status and let the
        pod object go (kwok Stage local-pod-delete), as a kubelet's final delete does."""
        if pod is not None:
            document = json.dumps(run.record.api_status(now), sort_keys=True,
                                  separators=(",", ":"))
            annotate_pod(self.core, run.record.namespace, run.record.name, run.record.uid,
                         {ANNOTATION_STATUS: document, ANNOTATION_STOPPED: "true"})
        log.info("%s: all containers stopped", run.name)

    def _confirm_unrun(self, pod: dict[str, Any]) -> None:
        """A deleted pod this agent runs nothing for (never started, or run by an earlier
        agent process): nothing to stop, the object may go."""
        meta = pod["metadata"]
        if LABEL_SIMULATE in (meta.get("labels") or {}):
            return  # kwok's own (Stage simulated-pod-delete)
        if meta["uid"] not in self.runs and ANNOTATION_STOPPED not in (meta.get("annotations")
                                                                      or {}):
            annotate_pod(self.core, meta["namespace"], meta["name"], meta["uid"],
                         {ANNOTATION_STOPPED: "true"})

    def _lose_containers(self, run: PodRun, now: float) -> None:
        """The pod's node crashed: every process of it dies at once (SIGKILL), and each
        container that was running counts as lost (``LOST_CONTAINER``)."""
        if not run.containers:
            return
        log.info("%s: node %s crashed, killing its containers", run.name, run.node)
        for running in run.containers.values():
            running.process.signal_all(signal.SIGKILL)
            if running.stop is not None:
                running.stop.finish()
            running.record.exited(*LOST_CONTAINER, now, run.record.restart_policy_now,
                                  run.record.ref)
        self.lingering += [running.process for running in run.containers.values()]
        run.containers.clear()

    def _log_stop(self, run: PodRun, running: Running) -> None:
        stop = running.stop
        while stop is not None and stop.events:
            log.info("%s container %s: %s", run.name, running.record.name, stop.events.pop(0))

    def _stop_containers(self, containers: list[Running], grace: float) -> None:
        """Stop these containers now (SIGTERM, SIGKILL after ``grace`` seconds), blocking."""
        processes = [running.process for running in containers]
        sandbox.stop_all(processes, grace=grace)
        self.lingering += [process for process in processes if not process.release()]


def annotate_pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str, uid: str,
                 annotations: dict[str, str]) -> bool:
    """Set ``annotations`` on the pod ``namespace/name`` only if it is still the pod ``uid``.

    A pod deleted and recreated under its name (a StatefulSet's worker) is another object: the
    patch carries ``metadata.uid``, which the API server may not change, so it fails with 409
    or 422 on the new pod instead of telling it that its containers stopped (a chaos soak saw
    a recreated worker kept in ContainerCreating by its predecessor's final status).

    Returns:
        True if the pod was patched; False if it is gone or is another pod by that name.

    Raises:
        ApiException: any other refusal.
    """
    try:
        core.patch_namespaced_pod(name, namespace,
                                  {"metadata": {"uid": uid, "annotations": annotations}})
    except ApiException as error:
        if error.status in (404, 409, 422):
            return False
        raise
    return True


def _hostname(pod: dict[str, Any]) -> str:
    """The pod's hostname: ``spec.hostname``, else its name."""
    return str(pod["spec"].get("hostname") or pod["metadata"]["name"])


def _probe_port(container: dict[str, Any]) -> int | None:
    probe = (container.get("readinessProbe") or {}).get("tcpSocket")
    if probe is None:
        return None
    port = probe["port"]
    if isinstance(port, str) and not port.isdigit():
        return next(int(p["containerPort"]) for p in container.get("ports") or []
                    if p.get("name") == port)
    return int(port)


def _read_end(path: Path, max_bytes: int) -> bytes:
    """The last ``max_bytes`` bytes of the file (empty when it cannot be read)."""
    try:
        with open(path, "rb") as file:
            file.seek(max(0, os.fstat(file.fileno()).st_size - max_bytes))
            return file.read(max_bytes)
    except OSError:
        return b""


def _tcp_probe(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> None:
    """``python -m monarch_operator.localcluster.agent --state-dir DIR --kubeconfig FILE``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--crash-loop-backoff-seconds", type=float,
                        default=podstatus.DEFAULT_BACKOFF_SECONDS,
                        help="first restart back-off (doubling up to 5 minutes; kubelet: 10)")
    parser.add_argument("--kubelet-port", type=int, default=0,
                        help="serve the kubelet API (logs, exec) on 127.0.0.1:PORT over TLS "
                             "with STATE_DIR/pki (0: not at all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kubernetes.config.load_kube_config(args.kubeconfig)
    agent = Agent(args.state_dir.resolve(), kubernetes.client.CoreV1Api(),
                  backoff_base=args.crash_loop_backoff_seconds)
    if args.kubelet_port:
        kubeletapi.serve_in_thread(agent, args.kubelet_port, agent.state_dir / "pki")
    agent.run_forever()


if __name__ == "__main__":
    main()
