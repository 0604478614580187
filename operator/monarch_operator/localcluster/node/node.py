"""A real node: containerd, kubelet, kube-proxy and the fake GPU plugin in namespaces of its own.

Each node gets a network namespace (:mod:`.network`), a private mount namespace held by a
``sleep`` process (its *holder*) in which the node's folders are bound over the paths a kubelet
and containerd hard-code (``/var/lib/kubelet`` with its fixed ``device-plugins/``,
``/var/lib/cni``, ``/run/containerd``, ``/var/log/pods``, ``/var/log/containers``), and a cgroup
root ``/mlc-<node>`` in every cgroup v1 hierarchy. Components are started with ``nsenter``
into the holder's namespaces (never ``ip netns exec``: it mounts a fresh sysfs, and the
kubelet then finds no cgroups).

Stopping a node, or cleaning up after a run that was killed, ends every process in its
cgroups and namespaces, then removes the cgroups and the node's runtime folders: the host is
left as it was (:func:`leftovers` says what would remain).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from monarch_operator.localcluster import binaries
from monarch_operator.localcluster.node import configs, imports, network, ocistream
from monarch_operator.localcluster.node.network import NodeAddresses

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Host paths that each node sees as its own folder (created empty on the host when missing,
# and removed again by teardown when we created them).
BINDS = {"kubelet": "/var/lib/kubelet", "cni": "/var/lib/cni", "run": "/run/containerd",
         "pod-logs": "/var/log/pods", "container-logs": "/var/log/containers"}
# The file in a node's folder that lists its Unhealthy fake GPUs (RealNode.set_unhealthy_gpus).
GPU_HEALTH_FILE = "gpu-unhealthy"
COMPONENTS = ("containerd", "kubelet", "kube-proxy", "kube-router", "gpu-plugin")

Progress = Callable[[str], None]


def cgroup_hierarchies(unified: bool = False) -> list[Path]:
    """The mounted cgroup v1 hierarchies (``/sys/fs/cgroup/cpu``, ...), where a node's cgroup
    root is made; with ``unified``, also the cgroup v2 hierarchy of a hybrid host
    (``/sys/fs/cgroup/unified``), where runc makes cgroups too: teardown removes those."""
    found = []
    for entry in sorted(CGROUP_ROOT.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and (entry / "cgroup.procs").exists() \
                and (unified or entry.name != "unified"):
            found.append(entry)
    return found


class RealNode:
    """One node's folders, processes and cgroups.

    Args:
        addresses: the node's name and addresses.
        state_dir: the node's runtime folder (``<cluster state>/nodes/<name>``), removed on stop.
        images_root: containerd's persistent root (content and snapshots), kept between runs.
        logs: where each component's log goes (``<name>-<component>.log``).
        bin_dir: kubelet, kube-proxy, containerd, containerd-shim-runc-v2, ctr, fake-gpu-plugin.
        gpus: ``nvidia.com/gpu`` devices the fake plugin advertises.
    """

    def __init__(self, addresses: NodeAddresses, state_dir: Path, images_root: Path,
                 logs: Path, bin_dir: Path, gpus: int) -> None:
        self.addresses = addresses
        self.name = addresses.name
        self.state_dir = state_dir
        self.images_root = images_root
        self.logs = logs
        self.bin_dir = bin_dir
        self.gpus = gpus
        self.cgroup = f"/{network.PREFIX}{self.name}"
        self.pids: dict[str, int] = {}

    # -- folders and configuration ------------------------------------------------------------
    def write_files(self, pki: Path, server: str, pause_image: str) -> None:
        """Write the node's configuration files (the client certificates are already in
        ``pki``: ``<node>.{crt,key}``, ``<node>-serving.{crt,key}``, ``kube-proxy.{crt,key}``)."""
        for sub in (*BINDS, "containerd-state", "cni-conf"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        self.images_root.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "containerd.toml").write_text(configs.containerd_config(
            self.images_root, self.state_dir / "containerd-state", self.state_dir / "cni-conf",
            pause_image))
        (self.state_dir / "cni-conf" / "10-monarch.conflist").write_text(
            json.dumps(configs.cni_config(self.addresses), indent=2))
        (self.state_dir / "kubelet.yaml").write_text(json.dumps(
            configs.kubelet_config(self.addresses, pki, self.cgroup), indent=2))
        (self.state_dir / "kubelet.kubeconfig").write_text(configs.kubeconfig(
            server, pki / "ca.crt", pki / f"{self.name}.crt", pki / f"{self.name}.key"))
        (self.state_dir / "kube-proxy.kubeconfig").write_text(configs.kubeconfig(
            server, pki / "ca.crt", pki / "kube-proxy.crt", pki / "kube-proxy.key"))
        (self.state_dir / "kube-router.kubeconfig").write_text(configs.kubeconfig(
            server, pki / "ca.crt", pki / "kube-router.crt", pki / "kube-router.key"))
        self.set_unhealthy_gpus([])  # every device Healthy at start
        (self.state_dir / "kube-proxy.yaml").write_text(json.dumps(
            configs.kube_proxy_config(self.addresses, self.state_dir / "kube-proxy.kubeconfig"),
            indent=2))

    @property
    def gpu_health_file(self) -> Path:
        """The fake GPU plugin's test hook: the ids of the devices it reports Unhealthy."""
        return self.state_dir / GPU_HEALTH_FILE

    def set_unhealthy_gpus(self, ids: list[str]) -> None:
        """Have the node's fake GPU plugin report the devices ``ids`` (``"0"``, ``"1"`` ...)
        Unhealthy and every other one Healthy, within about a second (it reads the file every
        500 ms and sends the change on ListAndWatch; the kubelet drops them from allocatable
        and, with the ResourceHealthStatus gate, shows them in the pod status). ``[]``: all
        Healthy again."""
        scratch = self.gpu_health_file.with_suffix(".tmp")
        scratch.write_text("\n".join(ids) + ("\n" if ids else ""))
        scratch.replace(self.gpu_health_file)  # the plugin never reads half a list

    def make_cgroups(self) -> None:
        """Create ``/mlc-<node>`` in every hierarchy (cpuset: with its parent's CPUs and memory
        nodes, as v1 cpuset children start empty)."""
        for hierarchy in cgroup_hierarchies():
            path = hierarchy / self.cgroup.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((hierarchy / name).read_text())

    # -- processes ----------------------------------------------------------------------------
    def start_holder(self, start: Callable[[str, list[str]], int]) -> int:
        """Start the holder: a ``sleep`` in the node's network namespace and a private mount
        namespace in which the node's folders are bound over :data:`BINDS`. Returns its pid."""
        network.ensure_host_dirs(BINDS.values())
        binds = " && ".join(f"mount --bind {self.state_dir / sub} {target}"
                            for sub, target in BINDS.items())
        pid = start(f"{self.name}-holder", [
            "nsenter", f"--net=/run/netns/{self.addresses.netns}", "--",
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", f"{binds} && exec sleep infinity"])
        self.pids["holder"] = pid
        deadline = time.monotonic() + 10
        while not self._bound(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name}: its mount namespace was not ready in 10 s;"
                                   f" see {self.logs / (self.name + '-holder.log')}")
            time.sleep(0.05)
        return pid

    def _bound(self, pid: int) -> bool:
        try:
            mounts = Path(f"/proc/{pid}/mountinfo").read_text()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return False
        return comm == "sleep" and all(f" {target} " in mounts for target in BINDS.values())

    def enter(self, *command: str) -> list[str]:
        """``command`` run inside the node's namespaces (through its holder)."""
        return ["nsenter", "-t", str(self.pids["holder"]), "-m", "-n", "--", *command]

    def start_components(self, start: Callable[[str, list[str]], int]) -> None:
        """Start containerd, then the kubelet, kube-proxy and the fake GPU plugin."""
        bins = self.bin_dir
        self.pids["containerd"] = start(f"{self.name}-containerd", self.enter(
            str(bins / "containerd"), "--config", str(self.state_dir / "containerd.toml")))
        self.wait_containerd()

    def start_kubelet(self, start: Callable[[str, list[str]], int]) -> None:
        """Start the kubelet, kube-proxy and the fake GPU plugin (containerd runs); then
        :meth:`start_firewall` once the node has registered."""
        bins = self.bin_dir
        self.pids["kubelet"] = start(f"{self.name}-kubelet", self.enter(
            str(bins / "kubelet"), f"--config={self.state_dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.state_dir / 'kubelet.kubeconfig'}",
            f"--hostname-override={self.name}", f"--node-ip={self.addresses.ip}",
            "--v=1"))
        self.pids["kube-proxy"] = start(f"{self.name}-kube-proxy", self.enter(
            str(bins / "kube-proxy"), f"--config={self.state_dir / 'kube-proxy.yaml'}"))
        self.pids["gpu-plugin"] = start(f"{self.name}-gpu-plugin", self.enter(
            str(bins / binaries.gpu_plugin_name()), f"-count={self.gpus}",
            f"-dir={configs.DEVICE_PLUGIN_DIR}", f"-health-file={self.gpu_health_file}"))

    def start_firewall(self, start: Callable[[str, list[str]], int]) -> None:
        """Start kube-router's NetworkPolicy firewall. Only once the kubelet has registered
        the node's addresses: kube-router reads them from the Node object and exits without
        one (``IPv4 was enabled but no IPv4 address was found on node``)."""
        self.pids["kube-router"] = start(f"{self.name}-kube-router", self.enter(
            str(self.bin_dir / "kube-router"), *configs.kube_router_args(
                self.addresses, self.state_dir / "kube-router.kubeconfig")))

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd (namespace ``k8s.io``, the CRI's)."""
        return subprocess.run(self.enter(str(self.bin_dir / "ctr"), "--address",
                                         configs.CONTAINERD_SOCKET, "--namespace", "k8s.io",
                                         *args),
                              capture_output=True, text=True, check=False, timeout=timeout)

    def wait_containerd(self, timeout: float = 60) -> None:
        """Wait until containerd answers ``ctr version``.

        Raises:
            RuntimeError: it did not within ``timeout`` seconds (or it exited).
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.ctr("version", timeout=10).returncode == 0:
                return
            if time.monotonic() > deadline or not _alive(self.pids["containerd"]):
                log = self.logs / f"{self.name}-containerd.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"node {self.name}: containerd not answering after "
                                   f"{timeout:.0f}s; end of {log}:\n{tail}")
            time.sleep(0.2)

    def needs_import(self, archive: Path) -> bool:
        """Whether :meth:`import_image` would import ``archive`` (not imported before into the
        kept root)."""
        record = self.images_root / "monarch-imported.json"
        return archive.name not in (json.loads(record.read_text()) if record.exists() else [])

    def imports_to_come(self, archives: list[Path]) -> imports.NodeImports:
        """The archives among ``archives`` that :meth:`import_image` would import, with the
        layers this node holds already (for :func:`.imports.plan`)."""
        return imports.NodeImports(
            root=self.images_root, archives=tuple(a for a in archives if self.needs_import(a)),
            present=frozenset(imports.unpacked_layers(self.images_root)))

    def committed_snapshots(self) -> set[str]:
        """The keys of the committed overlayfs snapshots of the node's containerd: the chain
        IDs of the layers it has unpacked.

        Raises:
            RuntimeError: ``ctr snapshots ls`` failed; its output is in the message.
        """
        result = self.ctr("snapshots", "--snapshotter", "overlayfs", "ls", timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"node {self.name}: ctr snapshots ls failed: "
                               f"{(result.stderr or result.stdout).strip()[-2000:]}")
        return {fields[0] for line in result.stdout.splitlines()[1:]
                if len(fields := line.split()) >= 2 and fields[-1] == "Committed"}

    def import_image(self, archive: Path, progress: Progress) -> None:
        """Import a docker-archive into the node's containerd unless this very archive (its
        file name carries its content hash) was imported before into the kept root; only the
        layers the node has not unpacked go to containerd (:mod:`.ocistream`).

        Raises:
            RuntimeError: ``ctr images import`` failed; its output is in the message.
        """
        record = self.images_root / "monarch-imported.json"
        imported = json.loads(record.read_text()) if record.exists() else []
        if archive.name in imported:
            return
        started = time.monotonic()
        image = ocistream.read_archive(archive)
        present = self.committed_snapshots()
        new = [layer for layer in image.layers if layer.chain_id not in present]
        total, sending = (sum(layer.size for layer in layers) / 2**30
                          for layers in (image.layers, new))
        progress(f"{self.name}: importing {archive.name} ({total:.1f} GiB; "
                 f"{len(new)} of {len(image.layers)} layers new, {sending:.1f} GiB)")
        code, said = ocistream.run_import(self.enter(
            str(self.bin_dir / "ctr"), "--address", configs.CONTAINERD_SOCKET, "--namespace",
            "k8s.io", "images", "import", "--snapshotter", "overlayfs", "--local",
            "--discard-unpacked-layers", "-"), image, present)
        if code != 0:
            raise RuntimeError(f"node {self.name}: ctr images import of {archive} (as an OCI "
                               f"layout of its {len(new)} new layers) failed with exit code "
                               f"{code}: {said.strip()[-2000:]}")
        record.write_text(json.dumps(sorted({*imported, archive.name})))
        imports.record_layers(self.images_root, imports.archive_layers(archive))
        progress(f"{self.name}: imported {archive.name} in {time.monotonic() - started:.0f}s")

    def stop_kubelet(self) -> None:
        """Kill the kubelet alone (SIGKILL): the node stops heartbeating and its pods keep
        running unseen, as when a kubelet crashes."""
        pid = self.pids.pop("kubelet", None)
        if pid is not None:
            _kill(pid)

    def stop(self) -> None:
        """End every process of the node (containers, components, shims, holder), remove its
        cgroups and runtime folder. Idempotent."""
        stop_node(self.name, self.pids.values())
        self.pids.clear()
        shutil.rmtree(self.state_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except (ProcessLookupError, OSError):
        return False


def _pin(pid: int) -> int | None:
    """A pidfd of ``pid`` while it is alive (not a zombie), else None. Signals go through it:
    a recorded pid whose process ended may have been taken by another process since (on a
    loaded machine ``pid_max`` 32768 wraps in minutes), which a signal by pid would hit."""
    try:
        handle = os.pidfd_open(pid)
    except OSError:
        return None
    if not _alive(pid):  # checked after the pidfd pins it: the same process, or none
        os.close(handle)
        return None
    return handle


def _kill(pid: int) -> None:
    handle = _pin(pid)
    if handle is None:
        return
    try:
        signal.pidfd_send_signal(handle, signal.SIGKILL)
    except ProcessLookupError:
        return
    finally:
        os.close(handle)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def processes_of(name: str) -> set[int]:
    """Pids of every process of node ``name``: in its cgroups (containers) or in its network
    namespace (components, shims, the holder)."""
    pids: set[int] = set()
    cgroup = f"{network.PREFIX}{name}"
    for hierarchy in cgroup_hierarchies(unified=True):
        root = hierarchy / cgroup
        for folder in _cgroup_tree(root):
            try:
                pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
            except OSError:
                pass
    inode = network.netns_inode(f"{network.PREFIX}{name}")
    if inode is not None:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if (proc / "ns" / "net").stat().st_ino == inode:
                        pids.add(int(proc.name))
                except OSError:
                    pass
    pids.discard(os.getpid())
    return pids


def stop_node(name: str, known: object = (), keep: set[int] | None = None) -> None:
    """Kill every process of node ``name`` (``known`` pids too) but those in ``keep``,
    repeatedly until none is left (a shim may start a process while others die); then, when
    nothing is kept, remove its cgroups deepest first."""
    deadline = time.monotonic() + 20
    # The known pids are pinned once (pidfds): by the next round a process that ended may have
    # left its pid to an unrelated one. The node's own are found by membership each round.
    pinned = {int(p): h for p in known  # type: ignore[attr-defined]
              if int(p) not in (keep or set()) and (h := _pin(int(p))) is not None}
    try:
        while True:
            pids = processes_of(name) - (keep or set()) - set(pinned)
            for pid, handle in list(pinned.items()):
                try:
                    signal.pidfd_send_signal(handle, 0)  # raises once it was reaped
                    if not _alive(pid):  # not reaped: the pid is still its own; a zombie?
                        raise ProcessLookupError
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
                except ProcessLookupError:
                    os.close(pinned.pop(pid))
            if not pids and not pinned:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _reap_round(pids | set(pinned))
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {name}: processes {sorted(pids | set(pinned))} "
                                   "survive SIGKILL")
            time.sleep(0.1)
    finally:
        for handle in pinned.values():
            os.close(handle)
    if not keep:
        remove_cgroups(name)


def _reap_round(pids: set[int]) -> None:
    """Reap those of ``pids`` that are this process's ended children."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def remove_cgroups(name: str) -> None:
    """Remove ``/mlc-<name>`` and everything below it in every hierarchy (empty by now)."""
    for hierarchy in cgroup_hierarchies(unified=True):
        root = hierarchy / f"{network.PREFIX}{name}"
        if not root.is_dir():
            continue
        for path in sorted(_cgroup_tree(root), key=lambda p: len(p.parts), reverse=True):
            _rmdir(path)


def _cgroup_tree(root: Path) -> list[Path]:
    """``root`` and every cgroup below it; [] when it is gone. The kubelet and runc remove pod
    and container cgroups at any time: one that vanishes during the walk is left out (a
    ``Path.rglob`` raised FileNotFoundError then, seen under load in the real-node tests)."""
    return [Path(folder) for folder, _, _ in os.walk(root)]  # os.walk skips unreadable folders


def _rmdir(path: Path) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def leftover_node_names() -> list[str]:
    """Names of nodes whose cgroups or network namespace still exist (ours: :data:`PREFIX`)."""
    names = {ns[len(network.PREFIX):] for ns in network.leftover_namespaces()}
    for hierarchy in cgroup_hierarchies(unified=True):
        names.update(p.name[len(network.PREFIX):] for p in hierarchy.glob(f"{network.PREFIX}*"))
    return sorted(names)


def _iptables_rules(saved: str) -> list[str]:
    """``iptables-save`` output as comparable lines: each table's rules under its ``*table``
    line, sorted; comments, chain policy lines and tables without a rule are left out (a table
    the kernel loaded once and that holds no rule is the same as one never loaded: on a fresh
    machine the first cluster loads ``filter``, and ``down`` leaves it empty)."""
    tables: dict[str, list[str]] = {}
    current = ""
    for line in saved.splitlines():
        if line.startswith("*"):
            current = line
            tables.setdefault(current, [])
        elif line.strip() and not line.startswith(("#", ":", "COMMIT")):
            tables.setdefault(current, []).append(line)
    return sorted(line for table, lines in tables.items() if lines
                  for line in (table, *lines))


def host_state() -> dict[str, object]:
    """What a cluster with real nodes may change on this machine, as comparable data: the
    sysctls a kubelet or node changes, links, routes of every table, mount points, iptables
    rules, ipset names, cgroups, the bind folders, network namespaces. ``LocalCluster.up``
    saves it before it changes anything; a test compares it after ``down``."""
    def read(*command: str) -> str:
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout

    sysctls = {name: Path("/proc/sys", *name.split(".")).read_text().strip()
               for name in (*network.SAVED_SYSCTLS, "net.ipv4.ip_forward")}
    # Not the image builder's: buildah keeps its storage mounted between builds, and may build
    # while a cluster runs.
    mounts = sorted(point for point in (line.split()[4] for line in
                                        Path("/proc/self/mountinfo").read_text().splitlines())
                    if "buildah" not in point)
    rules = _iptables_rules(read("iptables-save"))
    cgroups = sorted(str(p) for h in cgroup_hierarchies(unified=True) for p in h.iterdir()
                     if p.is_dir())
    folders = {path: Path(path).exists()
               for path in (*BINDS.values(), "/run/netns", str(network.RUN_DIR))}
    return {"sysctls": sysctls, "links": read("ip", "-br", "link").split("\n"),
            "routes": read("ip", "route", "show", "table", "all").split("\n"),
            "mounts": mounts, "iptables": rules, "ipsets": read("ipset", "list", "-n").split(),
            "cgroups": cgroups, "folders": folders, "netns": read("ip", "netns", "list").split()}


def teardown_all(progress: Progress = print) -> list[str]:
    """Remove every node of ours on this machine, live or left by a killed run, and the host
    network (:func:`network.teardown`); then the host folders made for binds. Returns what
    was removed."""
    removed = []
    for name in leftover_node_names():
        stop_node(name)
        removed.append(f"node {name}")
    removed += network.teardown()
    removed += network.remove_created_dirs()
    if network.RUN_DIR.is_dir() and not any(network.RUN_DIR.iterdir()):
        network.RUN_DIR.rmdir()
    return removed
