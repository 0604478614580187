"""The chaos soak's leader check (one replica acts at a time, judged from audited writes and
the Lease's readings) and its schedule of global faults (issue 34 item 6)."""

from __future__ import annotations

import random

import pytest

from monarch_operator.testing.chaos import checks, faults
from monarch_operator.testing.chaos.checks import AuditWrite

A, B = "chaos-op-r0", "chaos-op-r1"
# The Lease as the soak read it, once a second: A leads until 110, B from 126 (A killed at 110).
HOLDERS = [(100.0 + i, A) for i in range(11)] + [(111.0 + i, A) for i in range(15)] + [
    (126.0 + i, B) for i in range(10)]
ENDS = {A: (110.0, "SIGKILL")}


def write(at: float, user: str) -> AuditWrite:
    return AuditWrite(at, user, "patch monarchjobs/status chaos-1/c000")


def test_writes_of_the_holder_before_it_ends_and_of_its_successor_after_are_clean():
    writes = [write(101.2, A), write(110.3, A), write(126.4, B), write(135.0, B)]
    assert checks.leader_problems(writes, HOLDERS, ENDS) == []


def test_a_write_after_the_replica_ended_names_it_and_its_end():
    problems = checks.leader_problems([write(112.0, A)], HOLDERS, ENDS)
    assert len(problems) == 1
    expected, seen = problems[0]
    assert "after its SIGKILL" in expected and A in seen and "00:01:52.000" in seen


def test_a_write_while_another_held_the_lease_is_a_violation():
    # B writes between two readings that both name A (A had not ended).
    problems = checks.leader_problems([write(105.0, B)], HOLDERS, {})
    assert problems == [(f"no write by {B} while {A} held the Lease", problems[0][1])]


def test_a_write_at_a_hand_over_is_not_judged_on_readings_that_disagree():
    # Readings at 125 (A) and 126 (B): B's first write at 125.7 is within the hand-over.
    assert checks.leader_problems([write(125.7, B)], HOLDERS, {}) == []


def test_a_replica_that_never_held_the_lease_writes_nothing():
    problems = checks.leader_problems([write(130.0, "chaos-op-r2")], HOLDERS, {})
    assert len(problems) == 1 and "never held the Lease" in problems[0][0]


def test_audit_events_become_writes_leases_and_reads_do_not():
    event = {"verb": "patch", "user": {"username": A},
             "objectRef": {"resource": "monarchjobs", "subresource": "status",
                           "namespace": "chaos-1", "name": "c000"},
             "requestReceivedTimestamp": "2026-12-04T22:00:01.250000Z"}
    found = checks.audit_write(event)
    assert found is not None and found.user == A
    assert found.what == "patch monarchjobs/status chaos-1/c000"
    assert found.at == pytest.approx(1796421601.25)
    lease = {**event, "objectRef": {"resource": "leases", "namespace": "chaos-1"}}
    assert checks.audit_write(lease) is None
    assert checks.audit_write({**event, "verb": "get"}) is None


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
