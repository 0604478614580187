"""The test resolver's zone: a late record appears counted from its name's first query.

A clock started with the server let CI's loaded launcher (over 2 s to start) see a record meant
to appear "late" at its very first query, so the default host wait passed where it had to fail
(tests/launcher/test_host_wait_dns.py, CI of stop 57).
"""

from __future__ import annotations

from monarch_operator.testing.fake_dns import CachingZone

NAME = "late-worker.monarch.test"


def test_a_late_record_is_absent_at_the_first_query_however_late_that_comes() -> None:
    zone = CachingZone(negative_ttl_s=0.0)
    zone.set(NAME, "10.244.1.7", appears_after_s=2)
    assert zone.answer(NAME, now=1000.0) is None  # the asker came 1000 s after the set
    assert zone.answer(NAME, now=1001.9) is None
    assert zone.answer(NAME, now=1002.0) == "10.244.1.7"


def test_the_negative_answer_stands_for_its_ttl_from_the_first_query() -> None:
    zone = CachingZone(negative_ttl_s=30.0)
    zone.set(NAME, "10.244.1.7", appears_after_s=2)
    assert zone.answer(NAME, now=50.0) is None
    assert zone.answer(NAME, now=79.9) is None  # due since 52, but the cached NXDOMAIN stands
    assert zone.answer(NAME, now=80.0) == "10.244.1.7"


def test_a_changed_address_counts_from_the_first_query_and_waits_out_the_cache() -> None:
    zone = CachingZone(positive_ttl_s=3.0)
    zone.set(NAME, "10.244.1.7")
    zone.set(NAME, "10.244.1.8", appears_after_s=1)
    assert zone.answer(NAME, now=10.0) == "10.244.1.7"
    assert zone.answer(NAME, now=12.9) == "10.244.1.7"  # cached
    assert zone.answer(NAME, now=13.0) == "10.244.1.8"


def test_names_never_set_are_unknown_and_not_cached() -> None:
    zone = CachingZone()
    assert zone.answer("other.monarch.test", now=0.0) is None
    assert not zone.knows("other.monarch.test")
    zone.set("Other.Monarch.Test.", "10.244.1.9")
    assert zone.knows("other.monarch.test")
    assert zone.answer("other.monarch.test", now=1.0) == "10.244.1.9"
