"""Conditions and the phase summary."""

from monarch_operator.controller.state import status as st


def test_transition_time_kept_while_status_unchanged():
    s1 = st.set_condition({}, st.WORKERS_READY, False, "Waiting", "0/2", 1, "t1")
    s2 = st.set_condition(s1, st.WORKERS_READY, False, "Waiting", "1/2", 2, "t2")
    (cond,) = s2["conditions"]
    assert cond["lastTransitionTime"] == "t1"
    assert cond["message"] == "1/2" and cond["observedGeneration"] == 2
    s3 = st.set_condition(s2, st.WORKERS_READY, True, "Ready", "2/2", 2, "t3")
    assert s3["conditions"][0]["lastTransitionTime"] == "t3"
    assert s1["conditions"][0]["message"] == "0/2"  # inputs untouched


def test_phase_is_derived_from_conditions():
    assert st.summarize_phase({}) == "Pending"
    s = st.set_condition({}, st.WORKERS_READY, False, "W", "", 1, "t")
    assert st.summarize_phase(s) == "Starting"
    s = st.set_condition(s, st.RUNNING, True, "L", "", 1, "t")
    assert st.summarize_phase(s) == "Running"
    done = st.set_condition(s, st.SUCCEEDED, True, "S", "", 1, "t")
    assert st.summarize_phase(done) == "Succeeded" and st.is_finished(done)
    failed = st.set_condition(s, st.FAILED, True, "F", "", 1, "t")
    assert st.summarize_phase(failed) == "Failed" and st.is_finished(failed)


def test_message_comes_from_the_condition_that_decided_the_phase():
    assert st.summarize_message({}) == ""
    waiting = st.set_condition({}, st.WORKERS_READY, False, st.REASON_WAITING_FOR_WORKERS,
                               "0/1 workers ready; waiting for w-0 (Unschedulable: ...)", 1, "t")
    assert st.summarize_message(waiting).startswith("0/1 workers ready; waiting for w-0")
    ready = st.set_condition(waiting, st.WORKERS_READY, True, "R", "1 of 1", 1, "t")
    running = st.set_condition(ready, st.RUNNING, True, "L", "launcher up", 1, "t")
    assert st.summarize_message(running) == "launcher up"
    # Restarting: the restart's own words, then the gate's wait once it names a worker.
    restarting = st.set_condition(st.set_condition(
        running, st.WORKERS_READY, False, st.REASON_RESTARTING, "re-checking", 1, "t"),
        st.RUNNING, False, st.REASON_RESTARTING, "attempt 1 failed (...); starting attempt 2", 1,
        "t")
    assert st.summarize_phase(restarting) == st.PHASE_RESTARTING
    assert st.summarize_message(restarting) == "attempt 1 failed (...); starting attempt 2"
    gate = st.set_condition(restarting, st.WORKERS_READY, False, st.REASON_WAITING_FOR_WORKERS,
                            "1/2 workers ready; waiting for w-1 (not created)", 1, "t")
    assert st.summarize_message(gate) == "1/2 workers ready; waiting for w-1 (not created)"
    failed = st.set_condition(gate, st.FAILED, True, "F", "x\n" * 300, 1, "t")
    message = st.summarize_message(failed)
    assert len(message) == st.SUMMARY_MESSAGE_LIMIT and message.endswith("...")
    assert "\n" not in message


def test_transitions_are_status_or_reason_changes_not_messages():
    before = st.set_condition({}, st.WORKERS_READY, False, st.REASON_WAITING_FOR_WORKERS,
                              "1/2 workers ready", 1, "2026-01-01T00:00:00Z")
    same_but_message = st.set_condition(before, st.WORKERS_READY, False,
                                        st.REASON_WAITING_FOR_WORKERS, "2/2", 1,
                                        "2026-01-01T00:00:05Z")
    assert st.condition_transitions(before, same_but_message) == []
    ready = st.set_condition(before, st.WORKERS_READY, True, st.REASON_ALL_WORKERS_READY,
                             "2 of 2", 1, "2026-01-01T00:00:05Z")
    assert st.condition_transitions(before, ready) == [
        st.Transition("Normal", st.REASON_ALL_WORKERS_READY, "2 of 2")]
    failed = st.set_condition(ready, st.FAILED, True, st.REASON_STARTUP_TIMEOUT, "late", 1,
                              "2026-01-01T00:00:09Z")
    assert st.condition_transitions(ready, failed) == [
        st.Transition("Warning", st.REASON_STARTUP_TIMEOUT, "late")]
    blocked = st.set_condition({}, st.WORKERS_READY, False, st.REASON_CHILD_NOT_OWNED,
                               "Secret x taken", 1, "2026-01-01T00:00:00Z")
    assert st.condition_transitions({}, blocked)[0].type == "Warning"
