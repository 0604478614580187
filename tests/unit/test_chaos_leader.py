"""The chaos soak's leader check (one replica acts at a time, judged from the audit log: each
replica's writes against its tenures of the Lease, from the Lease's own audited writes) and its
schedule of global faults (issue 34 item 6)."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from monarch_operator.localcluster import certs, cluster
from monarch_operator.testing.chaos import faults, tenure

A, B, C = "chaos-op-r0", "chaos-op-r1", "chaos-op-r2"
NS, LEASE, RD = "chaos-1", "monarch-operator", 10.0
BASE = 1796421600.0  # 2026-12-04T22:00:00Z


def stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(BASE + at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_event(at: float, user: str, holder: str | None, code: int = 200,
                took: float = 0.01) -> dict:
    """An audit event of a Lease update as the API server logs it at RequestResponse level."""
    body = {"kind": "Lease", "spec": {"holderIdentity": holder.removeprefix("chaos-op-")
                                      if holder else None, "leaseDurationSeconds": 15}}
    return {"verb": "update", "user": {"username": user}, "stage": "ResponseComplete",
            "objectRef": {"resource": "leases", "namespace": NS, "name": LEASE,
                          "apiGroup": "coordination.k8s.io"},
            "responseStatus": {"code": code}, "requestObject": body,
            **({"responseObject": body} if code == 200 else {}),
            "requestReceivedTimestamp": stamp(at), "stageTimestamp": stamp(at + took)}


def write_event(at: float, user: str, what: str = "c000-launcher") -> dict:
    return {"verb": "create", "user": {"username": user}, "stage": "ResponseComplete",
            "objectRef": {"resource": "pods", "namespace": NS, "name": what},
            "responseStatus": {"code": 201}, "requestReceivedTimestamp": stamp(at),
            "stageTimestamp": stamp(at + 0.01)}


def judge(events: list[dict], ends: dict | None = None,
          resumed: dict | None = None) -> list[tuple[str, str]]:
    """The leader check over audit ``events`` as the soak runs it."""
    leases = [w for e in events if (w := tenure.lease_write(e, NS, LEASE, "chaos-op-"))]
    writes = [w for e in events if (w := tenure.audit_write(e))]
    ends = {user: (BASE + at, why) for user, (at, why) in (ends or {}).items()}
    resumed = {user: BASE + at for user, at in (resumed or {}).items()}
    return tenure.leader_problems(writes, tenure.tenures(leases, RD), ends, resumed=resumed)


def renewals(user: str, start: float, end: float) -> list[dict]:
    """``user`` acquires at ``start`` and renews every 2 s up to ``end``."""
    return [lease_event(start + 2 * i, user, user) for i in range(int((end - start) / 2) + 1)]


def test_a_replica_that_led_300_ms_between_two_polls_of_the_lease_wrote_rightly():
    # The field case (run b3 of the short soak): A releases on SIGTERM at 105.2, B takes the
    # Lease at 105.3, writes, is SIGTERMed and releases at 105.6, C takes it at 105.7. A soak
    # reading the Lease at 105.0 (A) and 106.0 (C) never saw B hold it.
    events = [*renewals(A, 100, 104), lease_event(105.2, A, None), lease_event(105.3, B, B),
              write_event(105.45, B), lease_event(105.6, B, None), lease_event(105.7, C, C),
              write_event(106.5, C, "c001-launcher")]
    assert judge(events, {A: (105.25, "SIGTERM (exited)"), B: (105.65, "SIGTERM (exited)")}) \
        == []


def test_the_holder_writes_until_its_renew_deadline_and_not_after():
    # A renews up to 104 and then cannot (partitioned): its deadline is 114, the Lease still
    # names it until it expires (119), so a soak reading the Lease would see A hold it.
    events = [*renewals(A, 100, 104), write_event(114.3, A)]
    assert judge(events) == []
    problems = judge([*events, write_event(114.8, A, "c001-launcher")])
    assert len(problems) == 1
    expected, seen = problems[0]
    assert expected == "no write by chaos-op-r0 after its tenure ended (its renew deadline " \
        "at 22:01:54.000)"
    assert "c001-launcher" in seen and "22:01:54.800" in seen


def test_a_write_outside_every_tenure_of_its_replica_is_a_violation():
    # B held the Lease from 100 to its release at 101; it writes at 103 while C holds it.
    events = [lease_event(100, B, B), lease_event(101, B, None), *renewals(C, 102, 110),
              write_event(103, B)]
    problems = judge(events)
    assert [p[0] for p in problems] == [f"no write by {B} while {C} held the Lease"]
    # ... and before its first tenure, with no one holding it.
    problems = judge([write_event(99, B), lease_event(100, B, B)])
    assert [p[0] for p in problems] == [f"no write by {B} before it acquired the Lease "
                                        "(22:01:40.000)"]


def test_two_replicas_writing_in_one_tenure_is_a_violation():
    # A leads from 100 to 120 (renewing); B, which led before (90 to its release at 95), writes
    # at 108 too.
    events = [*renewals(B, 90, 94), lease_event(95, B, None), *renewals(A, 100, 120),
              write_event(108, A), write_event(108.2, B, "c000-worker")]
    problems = judge(events)
    assert [p[0] for p in problems] == [f"no write by {B} while {A} held the Lease"]
    assert problems[0][1].startswith(f"{B}: create pods {NS}/c000-worker at 22:01:48.200")


def test_a_refused_try_is_no_tenure_and_a_late_renewal_extends_nothing():
    # B's try at 104 is refused (409: A renewed first): B never held the Lease.
    events = [*renewals(A, 100, 110), lease_event(104, B, B, code=409), write_event(105, B)]
    assert [p[0] for p in judge(events)] == [f"no write by {B}, which never held the Lease"]
    # A's renewal sent at 109.9 is answered at 110.2, after its deadline (110): the elector has
    # lost, the renewal does not make the tenure longer.
    late = [lease_event(100, A, A), lease_event(109.9, A, A, took=0.3), write_event(111, A)]
    assert [p[0] for p in judge(late)] == [
        f"no write by {A} after its tenure ended (its renew deadline at 22:01:50.000)"]


def test_no_write_after_the_replica_ended_even_within_its_tenure():
    events = [*renewals(A, 100, 110), write_event(105.2, A), write_event(106.0, A, "c001")]
    problems = judge(events, {A: (105.0, "SIGKILL")})
    assert len(problems) == 1
    expected, seen = problems[0]
    assert expected == f"no write by {A} after its SIGKILL at 22:01:45.000" and "c001" in seen


def test_a_write_received_while_its_replica_was_stopped_was_sent_before_the_stop():
    # A leads (renewing up to 110) and is SIGSTOPped at 105.0; the API server, paused itself,
    # reads A's write at 109.0, before A's SIGCONT at 118: A sent it before 105.0, as leader.
    stopped = {A: (105.0, "SIGSTOP (partitioned)")}
    events = [*renewals(A, 100, 104), write_event(109.0, A)]
    assert judge(events, stopped, resumed={A: 118.0}) == []
    # The same write received after the SIGCONT was sent after it: a write past A's end.
    late = [*renewals(A, 100, 104), write_event(118.2, A)]
    assert [p[0] for p in judge(late, stopped, resumed={A: 118.0})] == [
        f"no write by {A} after its SIGSTOP (partitioned) at 22:01:45.000"]
    # Not resumed yet (or never stopped): no write after the end at all.
    assert len(judge(events, stopped)) == 1
    # Sent before the stop still has to fall in a tenure: B stopped at 105 had none then.
    other = [*renewals(A, 100, 110), lease_event(90, B, B), lease_event(92, B, None),
             write_event(108.0, B)]
    assert [p[0] for p in judge(other, {B: (105.0, "SIGSTOP (partitioned)")},
                                resumed={B: 112.0})] == [
        f"no write by {B} while {A} held the Lease"]


def test_the_tenures_of_a_lease_its_acquisitions_releases_and_deadlines():
    writes = [tenure.LeaseWrite(100, 100.01, A, A), tenure.LeaseWrite(102, 102.01, A, A),
              tenure.LeaseWrite(103, 103.01, A, None), tenure.LeaseWrite(103.5, 103.51, B, B),
              tenure.LeaseWrite(120, 120.01, C, C)]
    assert tenure.tenures(writes, RD) == [
        tenure.Tenure(A, 100, 103, "its release"),
        tenure.Tenure(B, 103.5, 113.5, "its renew deadline"),
        tenure.Tenure(C, 120, 130, "its renew deadline")]


def test_audit_events_become_writes_and_lease_writes():
    event = {"verb": "patch", "user": {"username": A},
             "objectRef": {"resource": "monarchjobs", "subresource": "status",
                           "namespace": "chaos-1", "name": "c000"},
             "requestReceivedTimestamp": "2026-12-04T22:00:01.250000Z"}
    found = tenure.audit_write(event)
    assert found is not None and found.user == A
    assert found.what == "patch monarchjobs/status chaos-1/c000"
    assert found.at == pytest.approx(BASE + 1.25)
    assert tenure.audit_write({**event, "verb": "get"}) is None
    lease = lease_event(1.5, B, B)
    assert tenure.audit_write(lease) is None
    assert tenure.lease_write(lease, NS, LEASE, "chaos-op-") == tenure.LeaseWrite(
        pytest.approx(BASE + 1.5), pytest.approx(BASE + 1.51), B, B)
    assert tenure.lease_write(lease_event(2, B, None), NS, LEASE, "chaos-op-").holder is None
    assert tenure.lease_write(lease, "other", LEASE, "chaos-op-") is None
    assert tenure.lease_write(lease_event(2, B, B, code=409), NS, LEASE, "chaos-op-") is None
    # A create names its object in the body only.
    created = lease_event(0.5, A, A)
    created = {**created, "verb": "create", "objectRef": {**created["objectRef"], "name": ""},
               "responseObject": {**created["responseObject"], "metadata": {"name": LEASE}}}
    assert tenure.lease_write(created, NS, LEASE, "chaos-op-").holder == A
    assert tenure.lease_write(created, NS, "another", "chaos-op-") is None


def test_the_audit_policy_logs_lease_writes_of_the_lease_group_only(tmp_path):
    rules = cluster.audit_policy(("bench-op",))["rules"]
    lease_rules = [r for r in rules if any("leases" in x.get("resources", [])
                                           for x in r.get("resources", []))]
    assert lease_rules[0]["userGroups"] == [cluster.AUDIT_LEASES_GROUP]
    assert lease_rules[0]["level"] == "RequestResponse"
    assert lease_rules[1]["level"] == "None" and "userGroups" not in lease_rules[1]
    certs.write_pki(tmp_path)
    certs.write_client_cert(tmp_path, "chaos-op-r0", ("system:masters",
                                                      cluster.AUDIT_LEASES_GROUP))
    cert = x509.load_pem_x509_certificate((tmp_path / "chaos-op-r0.crt").read_bytes())
    groups = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert groups == ["system:masters", cluster.AUDIT_LEASES_GROUP]


def test_the_first_global_faults_are_the_given_ones_in_order_then_drawn():
    first = tuple(faults.LEADER_FAULTS)
    weights = {**faults.LEADER_FAULTS, faults.APISERVER_PAUSED: 2}
    rng = random.Random(1)
    picked = [faults.pick_global(rng, weights, first, n) for n in range(len(first))]
    assert picked == list(first)
    assert random.Random(1).random() == rng.random()  # no draw spent on them
    drawn = {faults.pick_global(rng, weights, first, len(first) + n) for n in range(200)}
    assert drawn == set(weights)


def test_a_first_fault_not_among_the_weights_is_refused():
    with pytest.raises(ValueError, match="leader_sigkill"):
        faults.pick_global(random.Random(1), {faults.APISERVER_PAUSED: 1},
                           (faults.LEADER_SIGKILL,), 0)
    with pytest.raises(ValueError, match="none to pick"):
        faults.pick_global(random.Random(1), {}, (), 0)
