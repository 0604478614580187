"""An infrastructure restart asks for its own next pass (found by the chaos soak,
``bench/chaos.py``): when the operator comes back after a running launcher's pod was deleted
while it was stopped, its first pass ends the attempt (LauncherLost) and starts the next one's
gate, and no watch event may follow (the pod is long gone, the workers unchanged). Without a
pass of its own the job sat Restarting with every worker Ready until the startup timeout's
timer, 10 minutes later."""

from __future__ import annotations

from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import status as st
from tests.unit.test_launch_pass import api, make_view, run_pass, running_status

__all__ = ["api"]  # the fixture, used by name


def test_a_launcher_pod_gone_while_the_operator_was_away_restarts_at_once(api):
    settings = Settings.from_env()
    status = running_status(settings)
    report = run_pass(settings, make_view(settings, status))  # no launcher pod any more

    [written] = api["status"]
    first = written["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", st.REASON_LAUNCHER_LOST)
    assert written["attempt"] == 2 and not st.is_true(written, st.WORKERS_READY)
    assert report.next_pass_seconds is not None
    wait = report.next_pass_seconds
    assert wait <= reconcile.INFRASTRUCTURE_RECHECK_SECONDS, f"next pass in {wait:.0f}s"
