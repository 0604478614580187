"""Field case C18 on the real local control plane: the operator talks to the API server through
a TCP proxy that a test disturbs for 20 s (every connection reset; forwarding stopped on open
connections, which stay open; the API server paused with SIGSTOP). Afterwards a new job and a
lost worker are both handled within 60 s, and the log names the streams re-established. A
proxy that never forwards again turns ``/healthz`` unhealthy.

The pause stops the nodes' heartbeats too: this cluster's node controller (20 s grace, shortened
for tests) may mark a node NotReady on resuming, until its next Lease renewal. The operator
must not take that blip for a node loss (attempts.NODE_LOSS_CONFIRM_SECONDS): once, under load,
it ended demo's attempt as LauncherLost instead.

The shared test operator is stopped meanwhile: this one runs with the proxy's kubeconfig and a
liveness endpoint, and the shared one is started again after the test (tests/conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from monarch_operator.localcluster.demo import stop_process
from monarch_operator.localcluster.ports import free_port
from tests.cluster.helpers import (
    apply_manifest,
    job_manifest,
    job_status,
    running_attempt,
    wait_until,
)
from tests.cluster.tcpproxy import TcpProxy
from tests.conftest import OPERATOR_NAMESPACES, operator_env

pytestmark = pytest.mark.cluster

DISTURBANCE_SECONDS = 20


@dataclass
class ProxiedOperator:
    proxy: TcpProxy
    log_path: Path
    health_url: str
    process: subprocess.Popen[bytes]

    last_answer: str = ""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as reply:
                self.last_answer = f"{reply.status} {reply.read(4000).decode(errors='replace')}"
                return bool(reply.status == 200)
        except urllib.error.HTTPError as error:
            self.last_answer = f"HTTP {error.code}"
            error.close()
            return False
        except (urllib.error.URLError, OSError) as error:
            self.last_answer = repr(error)
            return False

    def stream_lines(self) -> str:
        """The operator log's lines about watch streams and index readiness (diagnostics)."""
        return "\n".join(line for line in self.log().splitlines()
                         if "watch stream" in line or "index readiness" in line)[-4000:]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")




@pytest.fixture
def proxied_operator(local_cluster, operator_process, namespace,
                     tmp_path) -> Iterator[ProxiedOperator]:
    """The operator under test, reaching the API server only through a :class:`TcpProxy`."""
    config = yaml.safe_load(local_cluster.kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    port = int(server.rsplit(":", 1)[1])
    operator_process.stop()  # one operator at a time; the `operator` fixture restarts it
    with TcpProxy(port) as proxy:
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        kubeconfig = tmp_path / "kubeconfig-proxy"
        kubeconfig.write_text(yaml.safe_dump(config))
        health_url = f"http://127.0.0.1:{free_port()}/healthz"
        log_path = tmp_path / "operator.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "monarch_operator.controller", f"--liveness={health_url}",
                 *(f"--namespace={pattern}" for pattern in OPERATOR_NAMESPACES)],
                env={**os.environ, **local_cluster.env(), **operator_env(local_cluster),
                     "KUBECONFIG": str(kubeconfig)},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        handle = ProxiedOperator(proxy, log_path, health_url, process)
        try:
            wait_until(handle.healthy, 60, "the proxied operator's /healthz")
            yield handle
        finally:
            stop_process(process)


def disturb(how: str, proxy: TcpProxy, local_cluster) -> None:
    """Disturb the operator's connections for DISTURBANCE_SECONDS, one way."""
    end = time.monotonic() + DISTURBANCE_SECONDS
    if how == "reset":
        while time.monotonic() < end:
            proxy.reset_all()
            time.sleep(0.5)
    elif how == "stall":
        proxy.stall()
        time.sleep(DISTURBANCE_SECONDS)
        proxy.forward()
    else:
        pid = local_cluster.pid("kube-apiserver")
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(DISTURBANCE_SECONDS)
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["reset", "stall", "pause"])
def test_c18_the_operator_hears_again_after_its_connections_are_disturbed(
        kubectl, namespace, local_cluster, proxied_operator, how):
    apply_manifest(kubectl, namespace, job_manifest(
        "demo", launcher={"command": ["sh", "-c", "sleep 600"]}))
    running_attempt(kubectl, namespace, "demo", 1)

    disturb(how, proxied_operator.proxy, local_cluster)
    again = time.monotonic()
    apply_manifest(kubectl, namespace, job_manifest(
        "probe", workers={"replicas": 1, "gpusPerWorker": 2},
        meshes={"trainer": {"hosts": 1}, "ref": {"hosts": 1}, "colocate": True},
        launcher={"command": ["sh", "-c", "exit 0"]}))
    kubectl("delete", "pod", "demo-worker-0", "-n", namespace, "--wait=false")

    def lost_worker_recorded() -> bool:
        records = job_status(kubectl, namespace, "demo").get("attempts") or []
        return any(record.get("class") == "Infrastructure"
                   and "demo-worker-0" in (record.get("lostWorkers") or []) for record in records)

    try:
        wait_until(lost_worker_recorded, 60, f"demo's lost worker recorded after '{how}'")
        lost_after = time.monotonic() - again
        wait_until(lambda: job_status(kubectl, namespace, "probe").get("phase") == "Succeeded",
                   max(1.0, 60 - (time.monotonic() - again)), f"probe Succeeded after '{how}'")
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log, last lines:\n"
                             + "\n".join(proxied_operator.log().splitlines()[-60:])) from None
    probe_after = time.monotonic() - again
    print(f"C18 {how}: lost worker recorded {lost_after:.1f}s, probe Succeeded "
          f"{probe_after:.1f}s after the API server was reachable again")
    wait_until(proxied_operator.healthy, 60, "/healthz healthy again")
    log = proxied_operator.log()
    if how != "pause":  # paused, the API server answers late but every connection survives
        assert "re-established" in log and "watch stream pods" in log, log[-3000:]


def test_c18_healthz_turns_unhealthy_while_no_stream_can_be_re_established(
        kubectl, namespace, proxied_operator):
    """Forwarding never comes back: /healthz fails before any stream has been without a
    working one for 2 minutes (kopf caches probe results for 10 s)."""
    # Its streams started (the probe lists each): an operator that never started one is not
    # what this test disturbs (under load, once in 10 runs, the stall came before any).
    wait_until(lambda: proxied_operator.healthy()
               and '"watch_streams": {}' not in proxied_operator.last_answer, 60,
               "/healthz healthy with its watch streams started")
    frozen = proxied_operator.proxy.stall()
    stalled = time.monotonic()
    try:
        wait_until(lambda: not proxied_operator.healthy(), 120, "/healthz unhealthy",
                   interval=1)
    except AssertionError as error:
        raise AssertionError(
            f"{error}; {frozen} connections frozen, {proxied_operator.proxy.accepted} accepted;"
            f" last /healthz answer: {proxied_operator.last_answer}\n"
            f"{proxied_operator.stream_lines()}") from None
    print(f"C18 /healthz unhealthy {time.monotonic() - stalled:.1f}s after the proxy stopped "
          "forwarding")
    # kopf's own API scan (its resource observer, every minute) may time out first and end
    # the operator: the kubelet's liveness probe fails as well (connection refused) and it
    # restarts the operator just the same. Then the exit is an error and kopf names it.
    exited = proxied_operator.process.poll()
    if exited is None and not proxied_operator.last_answer.startswith("HTTP"):
        exited = proxied_operator.process.wait(timeout=30)  # its listener is closing
    if exited is not None:
        assert exited != 0, "the operator exited 0 while it could not reach the API server"
        assert "Resource observer has failed" in proxied_operator.log(), \
            proxied_operator.log()[-3000:]
        return
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(proxied_operator.health_url, timeout=5)
    failed.value.close()
    assert failed.value.code == 500
    assert "watch streams not working" in proxied_operator.log()
