"""The operator process under leader election (controller/leader/run.py, fence.py,
standby.py, the ``--leader-elect`` flags): kopf starts only after winning, a loss stops it and
ends the process, SIGTERM releases the Lease after kopf stopped, the fence refuses writes, the
standby answers ``/healthz`` (issue 34 items 1-4). Real threads and short timings; a fake
Lease API."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import kubernetes
import pytest
from prometheus_client import REGISTRY

from monarch_operator.controller import __main__ as entry
from monarch_operator.controller.leader import fence, run, settings
from monarch_operator.controller.leader.settings import ElectionSettings
from monarch_operator.localcluster.ports import free_port
from tests.leaderfakes import FakeLeaseApi, FakeServer, RealClock

# Short timings: the same ratios as the defaults 15/10/2 s.
LD, RD, RP = 1.5, 1.0, 0.2


def election(identity: str = "me") -> ElectionSettings:
    return ElectionSettings(namespace="monarch-system", identity=identity, lease_duration=LD,
                            renew_deadline=RD, retry_period=RP)


@pytest.fixture
def server():
    yield FakeServer(RealClock())
    fence.uninstall()


def leader_gauge() -> float | None:
    return REGISTRY.get_sample_value("monarch_operator_leader")


def test_a_loss_stops_kopf_before_the_deadline_and_ends_the_process(server):
    exits: list[int] = []
    seen: dict[str, float] = {}

    def kopf(stop_flag: threading.Event) -> None:
        assert fence_allows_writes()
        seen["leader"] = leader_gauge()
        time.sleep(3 * RP)  # a few renewals
        server.down = True  # a partition: the Lease cannot be renewed any more
        seen["partitioned"] = time.monotonic()
        assert stop_flag.wait(LD + 1), "kopf was not asked to stop"
        seen["stopped"] = time.monotonic()
        seen["writable"] = fence_allows_writes()

    status = run.run_elected(election(), kopf, api=FakeLeaseApi(server),
                             exit_process=exits.append)
    assert status == run.EXIT_LOST
    assert seen["leader"] == 1 and leader_gauge() == 0
    # Asked to stop within the renew deadline of the partition (the last renewal came before).
    assert seen["stopped"] - seen["partitioned"] <= RD + 0.1
    assert not seen["writable"]
    assert len([holder for _, _, holder in server.writes if holder == "me"]) >= 3
    assert all(time_ <= seen["stopped"] for time_, _, _ in server.writes)


def fence_allows_writes() -> bool:
    """Whether the installed fence lets a write through (it would reach the network)."""
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(
        kubernetes.client.Configuration(host="http://127.0.0.1:9")))
    try:
        api.create_namespaced_config_map("ns", {"metadata": {"name": "x"}},
                                         _request_timeout=0.2)
    except fence.FencedError:
        return False
    except Exception:  # noqa: BLE001 (let through: refused by the closed port)
        return True
    return True


def test_sigterm_stops_kopf_first_then_releases(server):
    order: list[str] = []

    def kopf(stop_flag: threading.Event) -> None:
        order.append("kopf started")
        time.sleep(3 * RP)
        order.append("kopf stopped")  # as kopf returns after SIGTERM

    original = FakeLeaseApi.replace

    def replace(self, previous, holder, *args, **kwargs):
        if holder is None:
            order.append("released")
        return original(self, previous, holder, *args, **kwargs)

    api = FakeLeaseApi(server)
    api.replace = replace.__get__(api)
    before = signal.getsignal(signal.SIGTERM)
    assert run.run_elected(election(), kopf, api=api, exit_process=pytest.fail) == 0
    assert signal.getsignal(signal.SIGTERM) is before
    assert order == ["kopf started", "kopf stopped", "released"]
    assert server.record.holder is None and server.record.duration == 1
    assert leader_gauge() == 0


def test_a_standby_answers_healthz_and_stops_on_sigterm_without_starting_kopf(server):
    server._write("other", 3600, 0, None)  # held by a live leader for the whole test
    url = f"http://127.0.0.1:{free_port()}/healthz"
    answers: list[tuple[int, dict]] = []

    def probe_then_terminate() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not answers:
            try:
                with urllib.request.urlopen(url, timeout=1) as reply:
                    answers.append((reply.status, json.loads(reply.read())))
            except OSError:
                time.sleep(0.05)
        time.sleep(2 * RP)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=probe_then_terminate, daemon=True).start()
    before = signal.getsignal(signal.SIGTERM)
    status = run.run_elected(election(), lambda flag: pytest.fail("kopf started"),
                             liveness=url, api=FakeLeaseApi(server))
    assert status == 0
    assert answers and answers[0][0] == 200
    assert answers[0][1]["leader"] is False and answers[0][1]["identity"] == "me"
    assert signal.getsignal(signal.SIGTERM) is before  # kopf installs its own next
    with pytest.raises(OSError):  # the address is free for kopf's endpoint
        urllib.request.urlopen(url, timeout=1)
    assert server.record.holder == "other"


def test_the_fence_refuses_writes_of_both_clients_and_lets_reads_through(server):
    allowed = [True]
    fence.install(lambda: allowed[0])
    assert fence_allows_writes()
    allowed[0] = False
    assert not fence_allows_writes()
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(
        kubernetes.client.Configuration(host="http://127.0.0.1:9")))
    with pytest.raises(Exception) as error:  # a read goes to the network
        api.read_namespaced_config_map("x", "ns", _request_timeout=0.2)
    assert not isinstance(error.value, fence.FencedError)

    import asyncio

    from kopf._cogs.clients import api as kopf_api

    with pytest.raises(fence.FencedError):
        asyncio.run(kopf_api.patch("/api/v1/namespaces/ns/pods/x", payload={},
                                   settings=None, logger=None))
    fence.uninstall()
    assert fence_allows_writes()


def test_the_elector_s_own_client_is_not_fenced(server, monkeypatch):
    from monarch_operator.controller.leader.lease import KubernetesLeaseApi

    fence.install(lambda: False)
    monkeypatch.setattr(kubernetes.client.Configuration, "get_default_copy",
                        lambda: kubernetes.client.Configuration(host="http://127.0.0.1:9"))
    lease_api = KubernetesLeaseApi("ns", "monarch-operator")
    with pytest.raises(Exception) as error:
        lease_api.create("me", 15, timeout=0.2)
    assert not isinstance(error.value, fence.FencedError)  # it went to the network
    lease_api.close()


@pytest.mark.parametrize(("flags", "message"), [
    (["--leader-elect-lease-duration=10"], "must exceed the renew deadline"),
    (["--leader-elect-renew-deadline=2"], "1.2 x the retry period"),
    (["--leader-elect-retry-period=-1"], "retry period must be > 0"),
])
def test_invalid_election_flags_exit_2_naming_the_rule(flags, message, capsys):
    with pytest.raises(SystemExit) as exited:
        entry.main(["--leader-elect", "--leader-elect-namespace=ns", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_leader_elect_needs_a_namespace_outside_a_pod(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(settings.NAMESPACE_ENV, raising=False)
    monkeypatch.setattr(settings, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    with pytest.raises(SystemExit) as exited:
        entry.main(["--leader-elect"])
    assert exited.value.code == 2
    assert "--leader-elect-namespace" in capsys.readouterr().err
    monkeypatch.setenv(settings.NAMESPACE_ENV, "monarch-system")
    assert settings.default_namespace() == "monarch-system"


def test_sigterm_to_the_leader_sets_kopf_s_stop_flag_in_its_thread(server):
    """kopf runs off the main thread (it then sets no signal handlers of its own); SIGTERM
    sets its stop flag, and the Lease is released once it returned."""
    seen = {}

    def kopf(stop_flag: threading.Event) -> None:
        seen["main thread"] = threading.current_thread() is threading.main_thread()
        threading.Timer(3 * RP, os.kill, (os.getpid(), signal.SIGTERM)).start()
        seen["stopped"] = stop_flag.wait(5)

    before = signal.getsignal(signal.SIGTERM)
    assert run.run_elected(election(), kopf, api=FakeLeaseApi(server),
                           exit_process=pytest.fail) == 0
    assert seen == {"main thread": False, "stopped": True}
    assert server.record.holder is None
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_as_the_lease_is_won_releases_it_without_starting_kopf(server):
    """Field case (short chaos soak, 2026-12-05): a replica SIGTERMed 0.2 s after it took the
    Lease started kopf anyway, with no renewer and no stop flag set; it wrote until its renew
    deadline and did not exit until SIGKILLed 20 s later."""
    api = FakeLeaseApi(server)
    original = api.create

    def create(holder, duration, timeout):
        record = original(holder, duration, timeout)
        os.kill(os.getpid(), signal.SIGTERM)  # handled before acquire() returns
        return record

    api.create = create
    started: list[bool] = []

    def kopf(stop_flag: threading.Event) -> None:
        started.append(stop_flag.wait(3 * RD))

    before = signal.getsignal(signal.SIGTERM)
    assert run.run_elected(election(), kopf, api=api, exit_process=pytest.fail) == 0
    assert started == []
    assert signal.getsignal(signal.SIGTERM) is before
    assert server.record.holder is None
