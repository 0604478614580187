"""The node agent's lease keeper (localcluster/leasekeeper.py): a node that is up and whose
Lease kwok stopped renewing has it renewed, as kwok's holder; a fresh Lease, a node that is
down and a Lease never renewed are left alone (CI 2026-12-07: kwok stopped renewing two nodes'
Leases and they flapped NotReady)."""

from __future__ import annotations

import copy
import datetime as dt
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException

from monarch_operator.localcluster import cluster, leasekeeper

NOW = 1_800_000_000.0


def lease(age_s: float | None, holder: str | None = "kwok-id") -> SimpleNamespace:
    renew = None if age_s is None else dt.datetime.fromtimestamp(NOW - age_s, dt.UTC)
    return SimpleNamespace(spec=SimpleNamespace(renew_time=renew, holder_identity=holder),
                           metadata=SimpleNamespace(resource_version="7"))


class FakeLeases:
    """``read_namespaced_lease`` / ``replace_namespaced_lease`` over a dict of Leases."""

    def __init__(self, leases: dict[str, SimpleNamespace], conflict: bool = False) -> None:
        self.leases, self.conflict = leases, conflict
        self.replaced: list[tuple[str, dt.datetime, str]] = []

    def read_namespaced_lease(self, name, namespace, _request_timeout=None):
        assert namespace == "kube-node-lease" and _request_timeout
        if name not in self.leases:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.leases[name])  # a new object per read, as the API's

    def replace_namespaced_lease(self, name, namespace, body, _request_timeout=None):
        assert namespace == "kube-node-lease" and _request_timeout
        if self.conflict:
            raise ApiException(status=409, reason="Conflict")
        self.replaced.append((name, body.spec.renew_time, body.spec.holder_identity))
        return body


def test_a_stale_lease_of_a_node_that_is_up_is_renewed_as_its_holder(caplog):
    api = FakeLeases({"kwok-gpu-0": lease(30.0), "kwok-gpu-1": lease(1.0),
                      "kwok-gpu-2": lease(None), "kwok-gpu-3": lease(30.0, holder=None)})
    keeper = leasekeeper.LeaseKeeper(api, clock=lambda: NOW)
    renewed = keeper.keep(["kwok-gpu-0", "kwok-gpu-1", "kwok-gpu-2", "kwok-gpu-3", "gone"])
    assert renewed == ["kwok-gpu-0"]
    assert api.replaced == [("kwok-gpu-0", dt.datetime.fromtimestamp(NOW, dt.UTC), "kwok-id")]
    assert "node kwok-gpu-0: Lease last renewed 30.0s ago by kwok-id" in caplog.text


def test_nodes_not_passed_as_up_are_never_renewed():
    api = FakeLeases({"kwok-gpu-0": lease(30.0)})
    assert leasekeeper.LeaseKeeper(api, clock=lambda: NOW).keep([]) == []
    assert api.replaced == []


def test_checks_are_spaced_and_a_conflict_is_left_for_the_next_check():
    clock = [NOW]
    api = FakeLeases({"kwok-gpu-0": lease(30.0)}, conflict=True)
    keeper = leasekeeper.LeaseKeeper(api, clock=lambda: clock[0])
    assert keeper.keep(["kwok-gpu-0"]) == []  # kwok wrote first: 409, nothing raised
    api.conflict = False
    clock[0] += leasekeeper.CHECK_EVERY_S / 2
    assert keeper.keep(["kwok-gpu-0"]) == []  # too soon
    clock[0] += leasekeeper.CHECK_EVERY_S
    assert keeper.keep(["kwok-gpu-0"]) == ["kwok-gpu-0"]


@pytest.mark.parametrize("age", [0.0, leasekeeper.STALE_AFTER_S])
def test_a_lease_kwok_renews_is_left_alone(age):
    api = FakeLeases({"kwok-gpu-0": lease(age)})
    assert leasekeeper.LeaseKeeper(api, clock=lambda: NOW).keep(["kwok-gpu-0"]) == []


def test_stale_after_is_two_of_kwoks_renewals_and_under_the_grace_period():
    assert leasekeeper.STALE_AFTER_S == cluster.NODE_LEASE_SECONDS / 2
    assert leasekeeper.STALE_AFTER_S < cluster.NODE_MONITOR_GRACE_SECONDS
