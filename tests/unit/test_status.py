"""Conditions and the phase summary."""

from monarch_operator.controller import status as st


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
