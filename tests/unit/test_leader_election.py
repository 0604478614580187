"""The elector's state machine (operator/monarch_operator/controller/leader/elector.py) on a
fake clock and a fake Lease API: acquire, renew, lose at the renew deadline, release on stop,
take an expired or released Lease, lose a race on the resourceVersion (issue 34, field case
C32). Each test can fail: a wrong deadline, a write after it, or a missed conflict shows."""

from __future__ import annotations

import logging

import pytest

from monarch_operator.controller.leader.elector import Elector, boottime
from monarch_operator.controller.leader.lease import LeaseConflict, micro_time
from monarch_operator.controller.leader.settings import ElectionSettings, validate
from tests.leaderfakes import (
    FakeClock,
    FakeLeaseApi,
    FakeServer,
    FakeWatchingLeaseApi,
    ScheduledClock,
)

LD, RD, RP = 15.0, 10.0, 2.0


def settings(identity: str) -> ElectionSettings:
    return ElectionSettings(namespace="monarch-system", identity=identity, lease_duration=LD,
                            renew_deadline=RD, retry_period=RP)


def elector(server: FakeServer, identity: str, **kwargs) -> Elector:
    return Elector(FakeLeaseApi(server), settings(identity), clock=server.clock,
                   wait=server.clock.advance, **kwargs)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer(FakeClock())


def test_acquire_creates_the_lease_and_writes_until_the_renew_deadline(server):
    a = elector(server, "a")
    assert a.try_acquire_or_renew()
    assert server.record.holder == "a" and server.record.duration == LD
    assert a.may_write() and a.seconds_left() == RD
    server.clock.advance(RD - 0.001)
    assert a.may_write()
    server.clock.advance(0.001)
    assert not a.may_write()  # the deadline: start of the last renewal + RD


def test_renew_moves_the_deadline_and_keeps_the_transitions(server):
    a = elector(server, "a")
    a.try_acquire_or_renew()
    first = server.record
    server.clock.advance(RP)
    assert a.try_acquire_or_renew()
    assert server.record.resource_version != first.resource_version
    assert server.record.transitions == first.transitions == 0
    assert server.record.acquire_time == first.acquire_time
    assert a.seconds_left() == RD


def test_a_standby_waits_a_lease_duration_from_its_own_observation(server):
    a, b = elector(server, "a"), elector(server, "b")
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # held: b observes it now
    assert b.holder == "a" and not b.may_write()
    server.clock.advance(LD - 0.1)
    assert not b.try_acquire_or_renew()
    server.clock.advance(0.1)
    assert b.try_acquire_or_renew()  # a did not renew for LD: expired
    assert server.record.holder == "b" and server.record.transitions == 1
    assert not a.may_write()  # a's own deadline passed long before (RD < LD)


def test_a_renewal_seen_by_the_standby_restarts_its_wait(server):
    a, b = elector(server, "a"), elector(server, "b")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    server.clock.advance(LD - 1)
    a.try_acquire_or_renew()
    server.clock.advance(1)
    assert not b.try_acquire_or_renew()  # b saw a new resourceVersion: a lives
    server.clock.advance(LD - 1)
    assert not b.try_acquire_or_renew()


def test_a_released_lease_is_taken_at_once(server):
    a, b = elector(server, "a"), elector(server, "b")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    assert a.release()
    assert server.record.holder is None and server.record.duration == 1
    assert not a.may_write()
    assert b.try_acquire_or_renew()  # no wait for the lease duration
    assert server.record.holder == "b"


def test_the_loser_of_a_race_on_the_resource_version_does_not_lead(server):
    a, b = elector(server, "a"), elector(server, "b")
    a.try_acquire_or_renew()
    assert a.release()
    record = server.record
    # Both read the released Lease; b writes first, a's replace carries the old version.
    b.try_acquire_or_renew()
    with pytest.raises(LeaseConflict):
        a.api.replace(record, "a", LD, record.transitions + 1, acquired=True, timeout=1)
    assert server.record.holder == "b"
    # In a's loop the conflict is a loss of the try, not a win.
    a2 = elector(server, "a2")
    server.record, stale = record, server.record
    server.version += 1  # the Lease changed between a2's read and its write
    original = a2.api.replace

    def racing_replace(previous, *args, **kwargs):
        server.record = stale
        return original(previous, *args, **kwargs)

    a2.api.replace = racing_replace
    with pytest.raises(LeaseConflict):
        a2.try_acquire_or_renew()
    assert not a2.may_write()


def test_the_leader_loses_at_its_renew_deadline_and_writes_nothing_after_it(server, caplog):
    a = elector(server, "a")
    assert a.acquire()
    renewed_at = server.clock.now
    server.clock.advance(RP)
    a.try_acquire_or_renew()  # a renewal at t0 + RP: the deadline is t0 + RP + RD
    deadline = server.clock.now + RD
    server.down = True  # a partition: every request hangs until its timeout
    with caplog.at_level(logging.INFO, "monarch_operator.leader"):
        why = a.lead()
    assert why is not None and "renew deadline" in why, why
    assert server.clock.now == pytest.approx(deadline)  # lost at the deadline, not later
    assert not a.may_write()
    assert all(timeout < RD for timeout in server.timeouts)
    assert all(time <= deadline for time, _, _ in server.writes)
    assert renewed_at < deadline
    assert "leader election lost by a" in caplog.text and "renew deadline" in caplog.text
    # Healthy again: a lost elector stays lost (it may not write until a new process wins).
    server.down = False
    assert not a.may_write() and not a.release()


def test_each_try_of_the_leader_is_bounded_by_the_time_left(server):
    a = elector(server, "a")
    a.try_acquire_or_renew()
    server.clock.advance(RD - RP - 1)  # the next try comes 1 s before the deadline
    server.down = True
    server.timeouts.clear()
    assert a.lead() is not None
    assert server.timeouts == [pytest.approx(1.0)]  # not the 5 s a try may take otherwise


def test_a_renewal_that_ends_after_the_deadline_extends_nothing(server):
    a = elector(server, "a")
    a.try_acquire_or_renew()
    server.clock.advance(RD - 0.5)
    original = a.api.read

    def slow_read(timeout):
        server.clock.advance(1.0)  # the answer comes after the deadline
        return original(timeout)

    a.api.read = slow_read
    a.try_acquire_or_renew()
    assert not a.may_write()


def test_a_new_process_with_the_same_identity_waits_the_old_one_out(server):
    old = elector(server, "a")
    old.try_acquire_or_renew()
    new = elector(server, "a")  # e.g. a fixed --leader-elect-identity, the process restarted
    assert not new.try_acquire_or_renew() and not new.may_write()
    server.clock.advance(LD)
    assert new.try_acquire_or_renew() and new.may_write()
    assert server.record.transitions == 1


def test_the_leader_whose_lease_was_taken_stops(server):
    a, b = elector(server, "a"), elector(server, "b")
    a.try_acquire_or_renew()
    # An outside writer gives the Lease to b (e.g. an operator of another version).
    server._write("b", LD, 1, None)
    why = a.lead()
    assert why is not None and "held by b" in why
    assert not a.may_write()
    assert b.holder is None  # b has not looked yet


def test_stop_ends_the_loops_and_release_gives_the_lease_up(server):
    a = elector(server, "a")
    assert a.acquire()
    a.stop()
    assert a.lead() is None  # stopped, not lost
    assert a.may_write()  # still leading until released
    assert a.release()
    assert server.record.holder is None and not a.may_write()
    assert not a.release()  # once


def test_a_standby_stopped_before_leading_returns(server):
    a, b = elector(server, "a"), elector(server, "b")
    a.try_acquire_or_renew()
    calls = []

    def wait(seconds):
        calls.append(seconds)
        server.clock.advance(seconds)
        return len(calls) >= 3  # SIGTERM during the third wait

    b._wait_for = wait
    assert not b.acquire()
    assert calls == [RP, RP, RP]  # one try per retry period


def test_transitions_are_reported_once_each(server):
    seen = []
    a = elector(server, "a")
    b = elector(server, "b", on_transition=lambda holder, why: seen.append(holder))
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.release()
    b.try_acquire_or_renew()
    assert seen == ["a", None, "b"]  # a seen, released seen, b took it
    server.down = True
    b.lead()
    assert seen == ["a", None, "b", None]


@pytest.mark.parametrize(("ld", "rd", "rp", "rule"), [
    (10, 10, 2, "must exceed the renew deadline"),
    (15, 2.4, 2, "must exceed 1.2 x the retry period"),
    (15, 10, 0, "retry period must be > 0"),
    (-1, 10, 2, "lease duration must be > 0"),
])
def test_invalid_timings_are_refused_naming_the_rule(ld, rd, rp, rule):
    with pytest.raises(ValueError, match=rule.replace(".", r"\.")):
        validate(ld, rd, rp)
    with pytest.raises(ValueError, match="leader election"):
        ElectionSettings(namespace="ns", lease_duration=ld, renew_deadline=rd,
                         retry_period=rp)


def test_defaults_are_client_gos_and_leave_a_margin():
    defaults = ElectionSettings(namespace="ns")
    assert (defaults.lease_duration, defaults.renew_deadline, defaults.retry_period) == (
        15, 10, 2)
    assert defaults.margin == 5 and defaults.request_timeout == 5 < defaults.renew_deadline
    assert defaults.identity and defaults.identity != ElectionSettings(namespace="ns").identity


def test_micro_time_has_six_fractional_digits_and_utc():
    import datetime as dt

    assert micro_time(dt.datetime(2026, 12, 4, 17, 0, tzinfo=dt.UTC)) == (
        "2026-12-04T17:00:00.000000Z")


def test_boottime_never_goes_back():
    first = boottime()
    assert boottime() >= first


def killed_leader(server: FakeServer, last_renewal: float) -> Elector:
    """Replica ``a`` leads from now and renews every retry period until ``last_renewal``
    (clock), then says nothing more (SIGKILL)."""
    a = elector(server, "a")
    assert a.try_acquire_or_renew()
    moment = server.clock.now + RP
    while moment <= last_renewal:
        server.clock.at(moment, a.try_acquire_or_renew)
        moment += RP
    return a


@pytest.mark.parametrize("watching", [True, False])
def test_a_watching_standby_takes_over_a_lease_duration_after_the_last_renewal(watching):
    """C32's kill -9: the standby that watches the Lease sees the last renewal when it
    happens and tries at the expiry itself, so it leads lease_duration after that renewal;
    one that only reads every retry period observes it up to a retry period late and tries
    up to one later again (what the failover bench measured: 15-17 s)."""
    server = FakeServer(ScheduledClock())
    start = server.clock.now
    killed_leader(server, last_renewal=start + 3 * RP)
    api = (FakeWatchingLeaseApi if watching else FakeLeaseApi)(server)
    server.clock.advance(0.1)
    b = Elector(api, settings("b"), clock=server.clock, wait=server.clock.advance)
    assert b.acquire()
    took_over = server.writes[-1][0] - (start + 3 * RP)
    if watching:
        assert LD <= took_over < LD + 0.01, took_over
        assert api.watches and min(api.watches) >= 1.0  # no watch shorter than the server's
    else:
        assert LD + 0.1 <= took_over <= LD + 2 * RP, took_over
    assert server.record.holder == "b" and server.record.transitions == 1


def test_a_watching_standby_takes_a_released_lease_when_it_is_released():
    """A SIGTERM'd leader's release is seen by the watch at once, not at the next try."""
    server = FakeServer(ScheduledClock())
    a = elector(server, "a")
    assert a.try_acquire_or_renew()
    released_at = server.clock.now + 0.7
    server.clock.at(released_at, a.release)
    b = Elector(FakeWatchingLeaseApi(server), settings("b"), clock=server.clock,
                wait=server.clock.advance)
    server.clock.at(server.clock.now + 0.5, a.try_acquire_or_renew)  # a renewal first
    assert b.acquire()
    assert server.record.holder == "b"
    assert server.writes[-1][0] == pytest.approx(released_at), "taken at the release"
