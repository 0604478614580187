"""Node agent of the local cluster: runs each scheduled pod's container as a real local process.

It stands in for the kubelet and container runtime of kwok's fake nodes:
- a pod that kwok marked Running with an IP gets its first container's command started inside
  a private mount and UTS namespace (``unshare``): its own hostname, its own ``/dev`` (a tmpfs
  mirroring the machine's devices), its Secret/ConfigMap volumes bind-mounted at their mount
  paths, a cluster hosts file at ``/etc/hosts`` and a fresh empty file at its
  ``terminationMessagePath`` (the machine's ``/etc/hosts`` and ``/dev`` are never edited);
- the container's ``tcpSocket`` readiness probe is run against the pod IP, and the result goes
  back as an annotation that a kwok Stage turns into the Ready condition;
- when the process ends, its exit code and termination message (``terminationMessagePolicy``
  ``File`` or ``FallbackToLogsOnError``, as the kubelet reads them) go back as annotations
  (kwok Stage -> phase and ``state.terminated``); when the pod is deleted, every process of its
  mount namespace is killed.
Without network namespaces all pods share the loopback interface, so the agent passes the pod
IP as ``SSH_LISTEN_ADDRESS`` for sshd to bind. Containers run as the agent's user.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from monarch_operator.localcluster import podfiles

ANNOTATION_READY = "localcluster.monarch-operator.dev/ready"
ANNOTATION_EXIT_CODE = "localcluster.monarch-operator.dev/exit-code"
ANNOTATION_TERMINATION_MESSAGE = "localcluster.monarch-operator.dev/termination-message"
REPO_ROOT = Path(__file__).resolve().parents[3]
# Image paths that live elsewhere on this machine: the worker image's entrypoint.
IMAGE_PATHS = {"/usr/local/bin/monarch-worker-entrypoint": REPO_ROOT / "images/worker/entrypoint.sh"}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs inside the new namespaces: set the hostname, give the pod its own /dev, bind-mount
# volumes and files, exec the command. It waits on the fd in $1 until the agent holds the
# namespace (a command that exits at once must not take its namespace with it before the agent
# can track it).
# The private /dev is a tmpfs mirroring the machine's /dev (devices and symlinks copied,
# directories such as pts and shm and anything else bind-mounted), so that mount points such as
# /dev/termination-log are created there and never in the machine's /dev. $2 is an empty
# directory that holds the machine's /dev meanwhile; it is unmounted again before the command.
SANDBOX_SCRIPT = r"""
set -e
private_dev() {
  real="$1"
  mount --rbind /dev "$real"
  mount -t tmpfs -o mode=755,nosuid tmpfs /dev
  set --
  for entry in "$real"/* "$real"/.[!.]*; do
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    name="${entry##*/}"
    if [ -L "$entry" ] || [ -c "$entry" ] || [ -b "$entry" ]; then set -- "$@" "$entry"
    elif [ -d "$entry" ]; then mkdir "/dev/$name"; mount --rbind "$entry" "/dev/$name"
    else : > "/dev/$name"; mount --bind "$entry" "/dev/$name"; fi
  done
  # One cp for the ~100 device nodes (fast); binding each one is the fallback without mknod.
  if [ $# -gt 0 ] && ! cp -a "$@" /dev/ 2>/dev/null; then
    for entry; do
      name="${entry##*/}"
      if [ -L "$entry" ]; then [ -L "/dev/$name" ] || ln -s "$(readlink "$entry")" "/dev/$name"
      else [ -e "/dev/$name" ] || : > "/dev/$name"; mount --bind "$entry" "/dev/$name"; fi
    done
  fi
  umount -R "$real" 2>/dev/null || umount -l "$real"
}
go_fd="$1"; shift
private_dev "$1"; shift
hostname "$1"; shift
while [ "$1" != "--" ]; do
  src="${1%%=*}"; dst="${1#*=}"; shift
  if [ -d "$src" ]; then mkdir -p "$dst"
  elif [ ! -e "$dst" ]; then mkdir -p "${dst%/*}"; : > "$dst"; fi
  mount --bind "$src" "$dst"
done
shift
eval "read -r _ <&$go_fd; exec $go_fd<&-"
exec "$@"
"""

log = logging.getLogger("localcluster.agent")


@dataclass
class PodProcess:
    """A pod's running container process and what was last reported about it."""

    namespace: str
    name: str
    process: subprocess.Popen[bytes]
    mount_ns: str
    # Open fd on the namespace: keeps it alive so its inode number cannot be reused by a new
    # pod's namespace while we may still kill "every process in mount_ns".
    mount_ns_fd: int
    probe_port: int | None
    pod_ip: str
    container: dict[str, Any]
    log_path: Path
    termination_path: Path  # the machine's side of the container's terminationMessagePath
    reported_ready: str | None = None
    exit_reported: bool = False
    annotations: dict[str, str] = field(default_factory=dict)


class Agent:
    """Keeps local processes in line with the pods scheduled on the cluster's nodes."""

    def __init__(self, state_dir: Path, core: kubernetes.client.CoreV1Api) -> None:
        self.state_dir = state_dir
        self.core = core
        self.pods_dir = state_dir / "pods"
        self.hosts_path = state_dir / "hosts"
        self.hosts_path.write_text(podfiles.hosts_file([]))
        self.running: dict[str, PodProcess] = {}
        self.failed_uids: set[str] = set()

    def run_forever(self, interval: float = 0.5) -> None:
        """Poll pods every ``interval`` seconds until SIGTERM, then stop every pod process."""
        stop = False

        def request_stop(*_: Any) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        while not stop:
            try:
                self.sync()
            except Exception:  # keep the node alive through API hiccups; log them
                log.exception("sync failed")
            time.sleep(interval)
        for uid in list(self.running):
            self._stop(uid)

    def sync(self) -> None:
        """One pass: start new pods, stop deleted ones, report exits and readiness."""
        pods = [self.core.api_client.sanitize_for_serialization(p)
                for p in self.core.list_pod_for_all_namespaces().items]
        pods = [p for p in pods if p["spec"].get("nodeName")]
        self._write_hosts(pods)
        live = {pod["metadata"]["uid"] for pod in pods
                if not pod["metadata"].get("deletionTimestamp")}
        # Stop departed pods first: kwok hands a freed pod IP to the next pod at once, and a
        # new sshd must not find the old one (with another job's key) still on that address.
        for uid in [uid for uid in self.running if uid not in live]:
            self._stop(uid)
        busy_ips = {pod_process.pod_ip for pod_process in self.running.values()}
        for pod in pods:
            uid = pod["metadata"]["uid"]
            status = pod.get("status") or {}
            annotations = pod["metadata"].get("annotations") or {}
            if (uid in live and uid not in self.running and uid not in self.failed_uids
                    and status.get("phase") == "Running" and status.get("podIP")
                    and status["podIP"] not in busy_ips
                    and ANNOTATION_EXIT_CODE not in annotations):
                self._start(pod)
        for pod_process in list(self.running.values()):
            self._report(pod_process)

    # -- starting ----------------------------------------------------------------------------
    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        workdir = self.pods_dir / meta["namespace"] / meta["name"] / uid[:8]
        container = spec["containers"][0]
        try:
            command = [*(container.get("command") or []), *(container.get("args") or [])]
            if not command:
                raise ValueError("container has no command; the agent cannot run image defaults")
            volumes = podfiles.write_volumes(pod, workdir / "volumes", self._lookup)
            env = self._env(pod, container, workdir)
            command = [str(IMAGE_PATHS.get(command[0], command[0])),
                       *(podfiles.expand(arg, env) for arg in command[1:])]
        except (ValueError, KeyError, ApiException) as error:
            log.error("cannot start %s/%s: %s", meta["namespace"], meta["name"], error)
            self.failed_uids.add(uid)
            self._annotate(meta["namespace"], meta["name"], {
                ANNOTATION_EXIT_CODE: "128", ANNOTATION_TERMINATION_MESSAGE: str(error)})
            return
        mounts = [f"{self.hosts_path}=/etc/hosts"]
        for mount in container.get("volumeMounts") or []:
            source = volumes[mount["name"]] / mount.get("subPath", "")
            mounts.append(f"{source}={mount['mountPath']}")
        # As the kubelet does: a fresh empty file per container, writable by any user.
        termination_path = workdir / f"{container['name']}.termination-log"
        termination_path.write_bytes(b"")
        termination_path.chmod(0o666)
        mounts.append(f"{termination_path}={podfiles.termination_message_path(container)}")
        real_dev = workdir / "machine-dev"  # stays an empty directory outside the pod
        real_dev.mkdir(exist_ok=True)
        hostname = spec.get("hostname") or meta["name"]
        log_path = workdir / f"{container['name']}.log"
        go_read, go_write = os.pipe()
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                 "sh", "-c", SANDBOX_SCRIPT, "pod-sandbox", str(go_read), str(real_dev),
                 hostname, *mounts, "--", *command],
                env=env, cwd=workdir, stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(go_read,))
        os.close(go_read)
        try:
            mount_ns = _wait_new_mount_ns(process.pid)
            mount_ns_fd = os.open(f"/proc/{process.pid}/ns/mnt", os.O_RDONLY)
        except (RuntimeError, OSError) as error:
            os.close(go_write)
            code = process.wait(timeout=10)
            log.error("%s/%s sandbox failed (exit %s): %s; see %s", meta["namespace"],
                      meta["name"], code, error, log_path)
            self.failed_uids.add(uid)
            self._annotate(meta["namespace"], meta["name"], {
                ANNOTATION_EXIT_CODE: "128", ANNOTATION_TERMINATION_MESSAGE: str(error)})
            return
        os.write(go_write, b"go\n")
        os.close(go_write)
        self.running[uid] = PodProcess(
            namespace=meta["namespace"], name=meta["name"], process=process,
            mount_ns=mount_ns, mount_ns_fd=mount_ns_fd, probe_port=_probe_port(container),
            pod_ip=pod["status"]["podIP"], container=container, log_path=log_path,
            termination_path=termination_path)
        log.info("started %s/%s (pid %d): %s", meta["namespace"], meta["name"], process.pid,
                 " ".join(command))

    def _env(self, pod: dict[str, Any], container: dict[str, Any], workdir: Path) -> dict[str, str]:
        home = workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": DEFAULT_PATH, "HOME": str(home),
               "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"],
               "LANG": "C.UTF-8",
               # No network namespace: sshd must bind the pod IP, not every loopback address.
               "SSH_LISTEN_ADDRESS": pod["status"]["podIP"]}
        env.update(podfiles.container_env(pod, container, self._lookup))
        # "The image": this machine's Python environment with monarch-operator installed.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        return env

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, bytes]:
        if kind == "Secret":
            obj = self.core.read_namespaced_secret(name, namespace)
        else:
            obj = self.core.read_namespaced_config_map(name, namespace)
        return podfiles.decode_data(self.core.api_client.sanitize_for_serialization(obj))

    # -- reporting ---------------------------------------------------------------------------
    def _report(self, pod_process: PodProcess) -> None:
        code = pod_process.process.poll()
        if code is not None:
            if not pod_process.exit_reported:
                exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128+N
                log.info("%s/%s exited with %d", pod_process.namespace, pod_process.name, exit_code)
                # One patch: the exit Stage must see the message together with the exit code.
                annotations = {ANNOTATION_EXIT_CODE: str(exit_code)}
                message = podfiles.termination_message(
                    pod_process.container, exit_code,
                    _read_end(pod_process.termination_path, podfiles.MAX_TERMINATION_MESSAGE_BYTES),
                    _read_end(pod_process.log_path, podfiles.FALLBACK_LOG_BYTES))
                if message:
                    annotations[ANNOTATION_TERMINATION_MESSAGE] = message
                self._annotate(pod_process.namespace, pod_process.name, annotations)
                pod_process.exit_reported = True
            return
        ready = "true" if pod_process.probe_port is None else _tcp_probe(
            pod_process.pod_ip, pod_process.probe_port)
        if ready != pod_process.reported_ready:
            self._annotate(pod_process.namespace, pod_process.name, {ANNOTATION_READY: ready})
            pod_process.reported_ready = ready

    def _annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        try:
            self.core.patch_namespaced_pod(name, namespace,
                                           {"metadata": {"annotations": annotations}})
        except ApiException as error:
            if error.status != 404:
                raise

    def _write_hosts(self, pods: list[dict[str, Any]]) -> None:
        content = podfiles.hosts_file(pods)
        if self.hosts_path.read_text() != content:
            # In place (same inode): pod namespaces bind-mounted this very file.
            with open(self.hosts_path, "r+") as hosts:
                hosts.truncate(0)
                hosts.write(content)

    # -- stopping ----------------------------------------------------------------------------
    def _stop(self, uid: str) -> None:
        pod_process = self.running.pop(uid)
        log.info("stopping %s/%s", pod_process.namespace, pod_process.name)
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
            pids = _pids_in_mount_ns(pod_process.mount_ns)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _pids_in_mount_ns(pod_process.mount_ns):
                pod_process.process.poll()
                time.sleep(0.05)
        pod_process.process.poll()
        os.close(pod_process.mount_ns_fd)


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


def _tcp_probe(ip: str, port: int) -> str:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return "true"
    except OSError:
        return "false"


def _mount_ns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _wait_new_mount_ns(pid: int, timeout: float = 5.0) -> str:
    """The mount namespace of ``pid`` once ``unshare`` has moved it out of ours."""
    own = _mount_ns("self")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ns = _mount_ns(pid)
        if ns and ns != own:
            return ns
        time.sleep(0.01)
    raise RuntimeError(f"pid {pid} did not enter a new mount namespace")


def _pids_in_mount_ns(mount_ns: str) -> list[int]:
    own = os.getpid()
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and int(entry) != own and _mount_ns(entry) == mount_ns]


def main(argv: list[str] | None = None) -> None:
    """``python -m monarch_operator.localcluster.agent --state-dir DIR --kubeconfig FILE``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kubernetes.config.load_kube_config(args.kubeconfig)
    Agent(args.state_dir.resolve(), kubernetes.client.CoreV1Api()).run_forever()


if __name__ == "__main__":
    main()
