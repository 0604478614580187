"""A short seeded chaos soak (issue 20 item 7; ``bench/chaos.py`` runs 30 minutes): three
minutes of jobs on the local cluster while worker and launcher pods are lost, the operator
is restarted, the API server paused and jobs suspended; no invariant may break (each attempt's
class is the one its fault makes it, budgets exact, one live launcher, no survivor of an ended
attempt, a truthful final state in time, nothing left after deletion)."""

from __future__ import annotations

import pytest

from monarch_operator.testing.chaos import checks, faults, plan
from monarch_operator.testing.chaos.faults import OperatorControl
from monarch_operator.testing.chaos.soak import Soak
from tests.conftest import OPERATOR_NAMESPACES

pytestmark = pytest.mark.cluster

SEED = 1
MINUTES = 3.0
# Every scenario and fault, node loss included: a node that crashes under a job is seen by its
# launcher (ssh exits 255, the pre-flight cannot connect) seconds before the node controller
# marks it NotReady (20 s here, 50 s on a real cluster); the verdict waits for the node's
# heartbeat (controller/judge/verdicts.py heartbeat_hold), so the attempt is Infrastructure.
SCENARIOS = plan.SCENARIOS
GLOBAL_FAULTS = faults.GLOBAL_FAULTS


def test_a_short_chaos_soak_breaks_no_invariant(local_cluster, operator_process):
    # The soak restarts the operator as one of its faults: it runs its own, and the tests'
    # operator comes back after it.
    operator_process.stop()
    operator = OperatorControl(local_cluster, OPERATOR_NAMESPACES)
    try:
        report = Soak(local_cluster, operator, f"chaos-{SEED}", SEED, MINUTES,
                      scenarios=SCENARIOS, global_faults=GLOBAL_FAULTS,
                      progress=lambda line: print(line, flush=True)).run()
    finally:
        operator.stop()
        operator_process.ensure_default()
    print(report.table())

    assert not report.interrupted
    # The soak did what it is for: jobs ran, faults of several kinds hit them, checks ran.
    assert sum(report.jobs.values()) >= 8, report.table()
    assert len(report.faults) >= 4, report.table()
    # Every invariant about jobs was checked (the operator's SIGTERM only when drawn).
    unchecked = [name for name in checks.INVARIANTS if not report.ledger.checks[name]]
    assert set(unchecked) <= {checks.OPERATOR_STOP}, report.table()
    assert report.ledger.violations == [], report.table()
