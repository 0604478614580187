"""When a job needs its next pass without a watch event."""

from __future__ import annotations

import datetime as dt

from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import deadlines
from monarch_operator.controller.state import status as st

START = "2026-01-01T00:00:00Z"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def job(**spec):
    return JobSpec.from_body({"metadata": {"name": "demo", "namespace": "ns", "uid": "u"},
                              "spec": {"image": "img", **spec}})


def with_condition(status, condition_type, reason="R"):
    return st.set_condition(status, condition_type, True, reason, "", 1, START)


def test_startup_deadline_while_not_running():
    status = {"startTime": START}
    remaining = deadlines.seconds_until_next_deadline(job(startupTimeoutSeconds=60), status,
                                                      T0 + dt.timedelta(seconds=20))
    assert remaining == 40 + deadlines.DEADLINE_SLACK_SECONDS


def test_past_deadline_means_now():
    status = {"startTime": START}
    assert deadlines.seconds_until_next_deadline(job(startupTimeoutSeconds=60), status,
                                                 T0 + dt.timedelta(hours=1)) == 0.0


def test_running_or_finished_job_without_deadlines_sleeps():
    running = with_condition({"startTime": START}, st.RUNNING)
    assert deadlines.seconds_until_next_deadline(job(), running, T0) is None
    failed = with_condition({"startTime": START}, st.FAILED)
    assert deadlines.seconds_until_next_deadline(job(), failed, T0) is None


def test_a_restarted_attempt_times_its_own_gate_and_a_suspended_job_none():
    from monarch_operator.controller.state import attempts

    later = (T0 + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    restarted = attempts.begin(attempts.begin({"startTime": START}, 1, START), 2, later)
    remaining = deadlines.seconds_until_next_deadline(
        job(startupTimeoutSeconds=60), restarted, T0 + dt.timedelta(hours=1, seconds=20))
    assert remaining == 40 + deadlines.DEADLINE_SLACK_SECONDS
    suspended = with_condition({"startTime": START}, st.SUSPENDED)
    assert deadlines.seconds_until_next_deadline(job(), suspended, T0) is None


def test_active_deadline_until_finished_and_the_earliest_wins():
    running = with_condition({"startTime": START}, st.RUNNING)
    later = T0 + dt.timedelta(seconds=100)
    assert deadlines.seconds_until_next_deadline(job(activeDeadlineSeconds=300), running,
                                                 later) == 200 + deadlines.DEADLINE_SLACK_SECONDS
    waiting = {"startTime": START}
    assert deadlines.seconds_until_next_deadline(
        job(activeDeadlineSeconds=60, startupTimeoutSeconds=600), waiting, T0) == (
        60 + deadlines.DEADLINE_SLACK_SECONDS)
    failed = with_condition(running, st.FAILED)
    assert deadlines.seconds_until_next_deadline(job(activeDeadlineSeconds=300), failed,
                                                 later) is None


def test_ttl_counts_from_completion():
    done = with_condition({"startTime": START, "completionTime": "2026-01-01T00:10:00Z"},
                          st.SUCCEEDED)
    now = T0 + dt.timedelta(minutes=10, seconds=5)
    assert deadlines.seconds_until_next_deadline(job(ttlSecondsAfterFinished=60), done, now) == (
        55 + deadlines.DEADLINE_SLACK_SECONDS)
    assert deadlines.seconds_until_next_deadline(job(), done, now) is None


def test_deadlines_up_to_int64_max_count_as_none_instead_of_overflowing():
    """Found by the generated specs (issue 9 item 9): activeDeadlineSeconds and
    ttlSecondsAfterFinished of 2^63-1 are valid (int64) but overflow datetime arithmetic; such
    a deadline is never reached and must not fail every pass."""
    huge = 2**63 - 1
    running = with_condition({"startTime": START}, st.RUNNING)
    assert deadlines.seconds_until_next_deadline(job(activeDeadlineSeconds=huge), running,
                                                 T0) is None
    finished = {**with_condition({"startTime": START}, st.FAILED), "completionTime": START}
    for ttl in (huge, 10**12, deadlines.MAX_DEADLINE_SECONDS + 1):
        assert deadlines.seconds_until_next_deadline(job(ttlSecondsAfterFinished=ttl), finished,
                                                     T0) is None
    # The startup timeout still counts next to a huge active deadline.
    waiting = {"startTime": START}
    assert deadlines.seconds_until_next_deadline(
        job(activeDeadlineSeconds=huge, startupTimeoutSeconds=60), waiting,
        T0) == 60 + deadlines.DEADLINE_SLACK_SECONDS
    assert deadlines.seconds_until_next_deadline(
        job(ttlSecondsAfterFinished=deadlines.MAX_DEADLINE_SECONDS), finished,
        T0) == deadlines.MAX_DEADLINE_SECONDS + deadlines.DEADLINE_SLACK_SECONDS


def test_status_times_are_written_and_read_back_alike():
    # One format for every time the status holds (startTime, notBefore, conditions): what the
    # operator writes must parse back to the same second, in UTC.
    moment = dt.datetime(2026, 11, 30, 15, 4, 5, 999_000, tzinfo=dt.UTC)
    text = st.format_time(moment)
    assert text == "2026-11-30T15:04:05Z"
    assert deadlines.parse_time(text) == moment.replace(microsecond=0)
