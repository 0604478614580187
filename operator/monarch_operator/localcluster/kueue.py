"""Kueue on the local control plane: its manager as a host process, its CRDs and webhooks.

Kueue (kubernetes-sigs/kueue, :data:`KUEUE_VERSION`, built by ``build-binaries.sh kueue`` from the
Go module proxy) normally runs as a pod behind a Service; here nothing routes to a Service, so:

- its webhooks (and the CRDs' conversion webhooks) are registered by URL,
  ``https://127.0.0.1:<port><path>``, with a serving certificate for 127.0.0.1 signed by the
  cluster's CA (:mod:`.certs`), and ``internalCertManagement`` off;
- with its own certificates, Kueue v0.19 reads the metrics server's pair from the fixed path
  ``/etc/kueue/metrics/certs`` (``cmd/kueue/main.go``); the process runs in a private mount
  namespace whose ``/etc`` is an overlay that adds that folder, so nothing is written to the
  machine's ``/etc``;
- its configuration registers MonarchJob as an external framework
  (``integrations.externalFrameworks``), so that Kueue's webhooks leave the children of a job
  alone (``IsOwnerManagedByKueueForObject``) and never queue them on their own;
- leader election is off, and so is the visibility API server (it would need an APIService).

``KueueProcess.up()`` installs and starts it and returns once its webhooks answer; ``down()``
removes the webhook configurations first (their ``failurePolicy: Fail`` would refuse every pod
without Kueue), then stops the process.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from monarch_operator import constants
from monarch_operator.localcluster import certs
from monarch_operator.localcluster.binaries import BUILD_SCRIPT
from monarch_operator.localcluster.orphans import stop_with_parent
from monarch_operator.localcluster.ports import free_port

KUEUE_VERSION = "v0.19.2"
NAMESPACE = "kueue-system"
# Our names for the two webhook configurations (Kueue's manifests say
# mutating-/validating-webhook-configuration, prefixed by its installers).
MUTATING_WEBHOOKS = "monarch-localcluster-kueue-mutating"
VALIDATING_WEBHOOKS = "monarch-localcluster-kueue-validating"
# The integrations C23 runs with, besides MonarchJob: Kueue's pod, StatefulSet, Job and
# Deployment integrations (their webhooks are the ones that could split a MonarchJob).
FRAMEWORKS = ("batch/job", "pod", "statefulset", "deployment")
# MonarchJob as Kueue names an external framework: Kind.version.group.
MONARCHJOB_FRAMEWORK = f"{constants.KIND}.{constants.VERSION}.{constants.GROUP}"
# API groups whose webhooks we register: Kueue's own and those of FRAMEWORKS.
_WEBHOOK_GROUPS = {"kueue.x-k8s.io", "", "apps", "batch"}
# Namespaces Kueue's own install keeps its pod-facing webhooks out of.
_NAMESPACE_SELECTOR = {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                             "operator": "NotIn",
                                             "values": ["kube-system", NAMESPACE]}]}
# CRDs served at two versions with a conversion webhook (config/components/crd/patches).
_CONVERTED_CRDS = ("workloads", "localqueues", "clusterqueues", "cohorts", "multikueueclusters")
# Where KueueProcess records the process's pid in the cluster's state dir, so that another
# process (``monarch-localcluster down``, ``multikueue up`` run again) finds it.
PID_FILE = "kueue.pid"


def running_pid(state_dir: Path) -> int | None:
    """The pid of the Kueue a :class:`KueueProcess` started for the cluster in ``state_dir``
    (``<state_dir>/kueue.pid``) while that process still runs that Kueue; else None (pids are
    reused: its command line must still name this cluster's ``kueue/config.yaml``)."""
    config = f"--config={Path(state_dir).resolve() / 'kueue' / 'config.yaml'}".encode()
    try:
        pid = int((Path(state_dir) / PID_FILE).read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return pid if config in cmdline.read().split(bytes(1)) else None
    except (OSError, ValueError):
        return None


def ensure_kueue() -> Path:
    """Return the folder with ``kueue``, ``crds/*.yaml`` and ``webhooks.yaml`` of
    :data:`KUEUE_VERSION`, building them the first time (``build-binaries.sh kueue``:
    ``~/.cache/monarch-operator/bin/kueue-<version>/``, 5-15 minutes on 2 cores).

    Raises:
        RuntimeError: the build failed (the Go output precedes it) or left a file missing.
    """
    result = subprocess.run(["bash", str(BUILD_SCRIPT), "kueue"], stdout=subprocess.PIPE,
                            stderr=None, text=True, check=False,
                            env={**os.environ, "KUEUE_VERSION": KUEUE_VERSION})
    if result.returncode != 0:
        raise RuntimeError(f"building kueue {KUEUE_VERSION} failed (exit {result.returncode}); "
                           f"see the Go output above. Script: {BUILD_SCRIPT} kueue")
    folder = Path(result.stdout.strip().splitlines()[-1])
    for needed in ("kueue", "webhooks.yaml", "crds/kueue.x-k8s.io_workloads.yaml"):
        if not (folder / needed).exists():
            raise RuntimeError(f"build finished but {folder / needed} is missing")
    return folder


def configuration(webhook_port: int, health_port: int, cert_dir: Path,
                  pods_ready_timeout_seconds: int | None = None,
                  multikueue: dict[str, Any] | None = None) -> dict[str, Any]:
    """Kueue's ``Configuration`` (``config.kueue.x-k8s.io/v1beta2``) for a host process.

    Args:
        pods_ready_timeout_seconds: ``waitForPodsReady.timeout`` (Kueue's default: 30 min); an
            admitted workload whose ``PodsReady`` is not True by then is evicted.
        multikueue: the ``multiKueue`` section of a MultiKueue manager
            (:func:`.multikueue.manager_section`); None: none.
    """
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": list(FRAMEWORKS),
                         "externalFrameworks": [MONARCHJOB_FRAMEWORK]},
    }
    if multikueue is not None:
        config["multiKueue"] = multikueue
    if pods_ready_timeout_seconds is not None:
        config["waitForPodsReady"] = {"timeout": f"{pods_ready_timeout_seconds}s",
                                      "blockAdmission": False}
    return config


def url_webhooks(manifests: list[dict[str, Any]], base_url: str,
                 ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations with every ``service`` reference turned into
    ``url: <base_url><path>`` and ``ca_bundle`` (base64 PEM), keeping only the webhooks of
    :data:`_WEBHOOK_GROUPS`, renamed to :data:`MUTATING_WEBHOOKS` / :data:`VALIDATING_WEBHOOKS`;
    pod-facing ones skip kube-system and kueue-system, as Kueue's own install does."""
    out = []
    for manifest in manifests:
        kind = manifest["kind"]
        hooks = []
        for hook in manifest.get("webhooks") or []:
            groups = {group for rule in hook.get("rules") or [] for group in rule["apiGroups"]}
            if not groups <= _WEBHOOK_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook = {**hook, "clientConfig": {"url": base_url + path, "caBundle": ca_bundle}}
            if "kueue.x-k8s.io" not in groups:
                hook["namespaceSelector"] = _NAMESPACE_SELECTOR
            hooks.append(hook)
        name = MUTATING_WEBHOOKS if kind == "MutatingWebhookConfiguration" else VALIDATING_WEBHOOKS
        out.append({"apiVersion": manifest["apiVersion"], "kind": kind,
                    "metadata": {"name": name}, "webhooks": hooks})
    return out


def with_url_conversion(crd: dict[str, Any], base_url: str, ca_bundle: str) -> dict[str, Any]:
    """The CRD with a ``/convert`` webhook at ``base_url`` when Kueue converts its versions."""
    if crd["spec"]["names"]["plural"] not in _CONVERTED_CRDS:
        return crd
    crd = dict(crd)
    crd["spec"] = {**crd["spec"], "conversion": {"strategy": "Webhook", "webhook": {
        "clientConfig": {"url": f"{base_url}/convert", "caBundle": ca_bundle},
        "conversionReviewVersions": ["v1"]}}}
    return crd


class KueueProcess:
    """Kueue's manager running against a local cluster (``LocalCluster``'s state dir and
    kubeconfig).

    Args:
        state_dir: the cluster's state folder: its ``pki/`` signs Kueue's serving certificate;
            Kueue's files go to ``kueue/``, its log to ``logs/kueue.log``.
        kubeconfig: an admin kubeconfig of the cluster.
        kubectl: a callable running kubectl against it (``demo.Kubectl``).
        pods_ready_timeout_seconds: see :func:`configuration`.
        stop_with_owner: SIGKILL when the calling process dies (tests).
        multikueue: see :func:`configuration` (a MultiKueue manager).
        feature_gates: Kueue feature gates set on its command line (name -> on).
    """

    def __init__(self, state_dir: Path, kubeconfig: Path, kubectl: Any,
                 pods_ready_timeout_seconds: int | None = None,
                 stop_with_owner: bool = False, multikueue: dict[str, Any] | None = None,
                 feature_gates: dict[str, bool] | None = None) -> None:
        self.multikueue = multikueue
        self.feature_gates = {"VisibilityOnDemand": False, **(feature_gates or {})}
        self.state_dir = Path(state_dir).resolve()
        self.kubeconfig = Path(kubeconfig)
        self.kubectl = kubectl
        self.pods_ready_timeout_seconds = pods_ready_timeout_seconds
        self.stop_with_owner = stop_with_owner
        self.folder = self.state_dir / "kueue"
        self.log_path = self.state_dir / "logs" / "kueue.log"
        self.process: subprocess.Popen[bytes] | None = None

    def up(self, timeout: float = 120) -> None:
        """Build if needed, install the CRDs, start the manager, register its webhooks.

        Raises:
            RuntimeError: the build failed, the process exited, or it was not ready within
                ``timeout`` seconds (the end of its log is in the message).
        """
        from monarch_operator.localcluster.demo import wait_established

        built = ensure_kueue()
        pki = self.state_dir / "pki"
        cert_dir = self.folder / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        certs.write_client_cert(pki, "kueue-webhook", server_names=("127.0.0.1", "localhost"))
        for suffix in ("crt", "key"):
            (cert_dir / f"tls.{suffix}").write_bytes((pki / f"kueue-webhook.{suffix}").read_bytes())
        webhook_port, health_port = free_port(), free_port()
        base_url = f"https://127.0.0.1:{webhook_port}"
        ca_bundle = _b64((pki / "ca.crt").read_bytes())
        crds = [with_url_conversion(yaml.safe_load(path.read_text()), base_url, ca_bundle)
                for path in sorted((built / "crds").glob("*.yaml"))]
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                     stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
        for crd in crds:
            wait_established(self.kubectl, crd["metadata"]["name"])
        self.kubectl("create", "namespace", NAMESPACE, check=False)
        config_path = self.folder / "config.yaml"
        config_path.write_text(yaml.safe_dump(configuration(
            webhook_port, health_port, cert_dir, self.pods_ready_timeout_seconds,
            self.multikueue)))
        self.process = self._start(built / "kueue", config_path, cert_dir)
        (self.state_dir / PID_FILE).write_text(f"{self.process.pid}\n")
        self._wait_ready(f"http://127.0.0.1:{health_port}/readyz", timeout)
        manifests = list(yaml.safe_load_all((built / "webhooks.yaml").read_text()))
        hooks = url_webhooks([m for m in manifests if m], base_url, ca_bundle)
        self.kubectl("apply", "-f", "-",
                     stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks}))

    def down(self) -> None:
        """Remove the webhook configurations, then stop the process (SIGTERM, then SIGKILL).
        The CRDs and Kueue's objects stay."""
        self.kubectl("delete", "mutatingwebhookconfiguration", MUTATING_WEBHOOKS,
                     "--ignore-not-found", check=False)
        self.kubectl("delete", "validatingwebhookconfiguration", VALIDATING_WEBHOOKS,
                     "--ignore-not-found", check=False)
        if self.process is None:
            return
        (self.state_dir / PID_FILE).unlink(missing_ok=True)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.process = None

    def _start(self, binary: Path, config_path: Path,
               cert_dir: Path) -> subprocess.Popen[bytes]:
        """The manager in a private mount namespace whose /etc has ``kueue/metrics/certs``."""
        upper, work = self.folder / "etc-upper", self.folder / "etc-work"
        metrics_certs = upper / "kueue" / "metrics" / "certs"
        metrics_certs.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (metrics_certs / name).write_bytes((cert_dir / name).read_bytes())
        script = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} "
                  f'/etc && exec "$0" "$@"')
        # Root: a mount namespace of its own; otherwise a user namespace mapping us to root.
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.insert(1, "--map-root-user")
        args = [*unshare, "sh", "-c", script, str(binary), f"--config={config_path}",
                "--feature-gates=" + ",".join(f"{gate}={str(on).lower()}" for gate, on
                                             in sorted(self.feature_gates.items())),
                "--zap-log-level=2"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {key: value for key, value in os.environ.items()
               if key.lower() not in ("http_proxy", "https_proxy")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                    preexec_fn=stop_with_parent(signal.SIGKILL)
                                    if self.stop_with_owner else None)

    def _wait_ready(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"kueue exited with {self.process.returncode}; end of "
                                   f"{self.log_path}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=3) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"kueue not ready at {url} after {timeout:.0f}s; end of "
                                   f"{self.log_path}:\n{self._log_tail()}")
            time.sleep(0.5)

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
