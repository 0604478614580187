"""The per-job pass scheduler: coalesced wake-ups, one pass at a time, a timer at the deadline."""

from __future__ import annotations

import asyncio

from monarch_operator.controller.engine.wakeups import Wakeups

KEY = ("ns", "job")


def run(coroutine):
    return asyncio.run(coroutine)


async def until(predicate, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds (checked every millisecond); fail after ``timeout`` s.

    Tests wait for what they need instead of sleeping a guessed few milliseconds, so a loaded
    machine makes them slower, never wrong.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def test_wakeups_during_a_pass_coalesce_into_one_more_pass():
    async def scenario():
        calls: list[tuple[str, str]] = []
        release = asyncio.Event()

        async def run_pass(key):
            calls.append(key)
            if len(calls) == 1:
                await release.wait()
            return None

        wakeups = Wakeups(run_pass)
        wakeups.wake(KEY)
        await asyncio.sleep(0)
        for _ in range(10):  # a burst of pod events while the first pass runs
            wakeups.wake(KEY)
        release.set()
        while not wakeups.is_idle():
            await asyncio.sleep(0.01)
        return calls

    assert run(scenario()) == [KEY, KEY]


def test_passes_of_one_job_never_overlap_but_jobs_run_side_by_side():
    async def scenario():
        running: set[tuple[str, str]] = set()
        overlaps, concurrent = [], []

        async def run_pass(key):
            if key in running:
                overlaps.append(key)
            running.add(key)
            concurrent.append(len(running))
            await asyncio.sleep(0.01)
            running.discard(key)
            return None

        wakeups = Wakeups(run_pass)
        for _ in range(5):
            wakeups.wake(KEY)
            wakeups.wake(("ns", "other"))
            await asyncio.sleep(0.003)
        while not wakeups.is_idle():
            await asyncio.sleep(0.01)
        return overlaps, max(concurrent)

    overlaps, most = run(scenario())
    assert overlaps == []
    assert most == 2


def test_the_pass_sets_a_timer_at_its_deadline_and_a_later_pass_replaces_it():
    async def scenario():
        calls = []
        delays = iter([0.3, None])

        async def run_pass(key):
            calls.append(asyncio.get_running_loop().time())
            return next(delays)

        wakeups = Wakeups(run_pass)
        wakeups.wake(KEY)
        await until(lambda: len(calls) == 1 and KEY in wakeups.pending_timers())
        await until(lambda: len(calls) == 2 and wakeups.is_idle())
        assert wakeups.pending_timers() == {}, "the second pass had no deadline"
        return calls

    calls = run(scenario())
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.3


def test_forget_cancels_the_timer():
    async def scenario():
        calls = []

        async def run_pass(key):
            calls.append(key)
            return 0.5

        wakeups = Wakeups(run_pass)
        wakeups.wake(KEY)
        await until(lambda: len(calls) == 1 and KEY in wakeups.pending_timers())
        wakeups.forget(KEY)
        await asyncio.sleep(0.7)  # past the 0.5 s timer the pass asked for
        return calls

    assert run(scenario()) == [KEY]


def test_a_failing_pass_does_not_stop_later_wakeups():
    async def scenario():
        calls = []

        async def run_pass(key):
            calls.append(key)
            if len(calls) == 1:
                raise RuntimeError("bug")
            return None

        wakeups = Wakeups(run_pass)
        wakeups.wake(KEY)
        await until(lambda: len(calls) == 1 and wakeups.is_idle())
        wakeups.wake(KEY)
        await until(lambda: len(calls) == 2 and wakeups.is_idle())
        return calls

    assert run(scenario()) == [KEY, KEY]


def test_at_most_concurrency_passes_run_and_a_waiting_job_reads_what_woke_it_once():
    async def scenario():
        calls: list[tuple[str, str]] = []
        running, most = set(), [0]
        release = asyncio.Event()

        async def run_pass(key):
            calls.append(key)
            running.add(key)
            most[0] = max(most[0], len(running))
            await release.wait()
            running.discard(key)
            return None

        wakeups = Wakeups(run_pass, concurrency=2)
        keys = [("ns", f"job-{index}") for index in range(4)]
        for key in keys:
            wakeups.wake(key)
        await until(lambda: len(calls) == 2)
        # job-2 and job-3 wait for a slot; more events for them are served by that pass.
        for _ in range(5):
            wakeups.wake(keys[3])
        release.set()
        await until(wakeups.is_idle)
        return calls, most[0], keys

    calls, most, keys = run(scenario())
    assert most == 2
    assert sorted(calls) == sorted(keys)  # one pass each: job-3's extra wake-ups coalesced
    assert calls[:2] == keys[:2]  # served in the order woken


def test_urgent_jobs_get_the_next_slot_even_when_they_became_urgent_while_waiting():
    async def scenario():
        calls: list[tuple[str, str]] = []
        urgent: set[tuple[str, str]] = set()
        release = asyncio.Event()

        async def run_pass(key):
            calls.append(key)
            await release.wait()
            return None

        wakeups = Wakeups(run_pass, concurrency=1, urgent=lambda key: key in urgent)
        keys = [("ns", f"job-{index}") for index in range(4)]
        for key in keys:
            wakeups.wake(key)
        await until(lambda: calls == keys[:1])
        urgent.add(keys[3])
        wakeups.wake(keys[3])  # e.g. its last worker became Ready while it waited
        release.set()
        await until(wakeups.is_idle)
        return calls, keys

    calls, keys = run(scenario())
    assert calls == [keys[0], keys[3], keys[1], keys[2]]


def test_a_job_cancelled_while_it_waits_for_a_slot_gives_nothing_away():
    async def scenario():
        release = asyncio.Event()
        calls: list[tuple[str, str]] = []

        async def run_pass(key):
            calls.append(key)
            await release.wait()
            return None

        wakeups = Wakeups(run_pass, concurrency=1)
        first, second, third = ("ns", "a"), ("ns", "b"), ("ns", "c")
        wakeups.wake(first)
        wakeups.wake(second)
        await until(lambda: calls == [first])
        wakeups._running[second].cancel()  # the operator stopping
        await asyncio.sleep(0)
        wakeups.wake(third)
        release.set()
        await until(wakeups.is_idle)
        return calls, wakeups._free

    calls, free = run(scenario())
    assert calls == [("ns", "a"), ("ns", "c")]
    assert free == 1  # the slot came back


def test_the_wait_for_a_slot_is_measured_per_urgency():
    from prometheus_client import REGISTRY

    def count(urgent: str) -> float:
        return REGISTRY.get_sample_value("monarch_operator_reconcile_wait_seconds_count",
                                         {"urgent": urgent}) or 0.0

    async def scenario():
        async def run_pass(key):
            await asyncio.sleep(0.01)
            return None

        wakeups = Wakeups(run_pass, concurrency=1, urgent=lambda key: key[1] == "hot")
        for name in ("cold", "hot", "cold-2"):
            wakeups.wake(("ns", name))
        await until(wakeups.is_idle)

    before = count("true"), count("false")
    run(scenario())
    assert (count("true") - before[0], count("false") - before[1]) == (1, 2)
