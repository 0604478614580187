"""A short seeded chaos soak (issue 20 item 7; ``bench/chaos.py`` runs 30 minutes): three
minutes of jobs on the local cluster while worker and launcher pods are lost, the operator
is run as two replicas under leader election whose leader is killed (SIGKILL, SIGTERM),
partitioned (SIGSTOP past its renew deadline) and rolled over, whose standby is killed, the API
server paused and jobs suspended (issue 34 item 6); no invariant may break (each attempt's class
is the one its fault makes it, budgets exact, one live launcher, no survivor of an ended
attempt, a truthful final state in time, nothing left after deletion, a SIGTERMed replica exits
0, a partitioned one 3, and one replica acts at a time: no write in the audit log of a replica
after it ended or while another held the Lease)."""

from __future__ import annotations

import pytest

from monarch_operator.testing.chaos import checks, faults, plan
from monarch_operator.testing.chaos.leaders import ReplicatedOperator
from monarch_operator.testing.chaos.soak import Soak
from tests.conftest import OPERATOR_ENV, OPERATOR_NAMESPACES

pytestmark = pytest.mark.cluster

SEED = 1
MINUTES = 3.0
# Every scenario and fault, node loss included: a node that crashes under a job is seen by its
# launcher (ssh exits 255, the pre-flight cannot connect) seconds before the node controller
# marks it NotReady (20 s here, 50 s on a real cluster); the verdict waits for the node's
# heartbeat (controller/judge/verdicts.py heartbeat_hold), so the attempt is Infrastructure.
SCENARIOS = plan.SCENARIOS
GLOBAL_FAULTS = (*faults.GLOBAL_FAULTS, *faults.LEADER_FAULTS)
# Each leader fault once, first (then drawn by weight), 10-15 s apart so that all five fit in
# the three minutes (the soak injects them after its window if they do not): after a SIGKILL
# the next leader fault waits for the standby to take over (15 s), and the rolling update (a new
# replica is ready in 5-40 s, twice) and the partition (12-19 s, then the exit) go on while the
# soak does, the next leader fault waiting for them.
FIRST_FAULTS = (faults.LEADER_SIGKILL, faults.ROLLING_UPDATE, faults.STANDBY_SIGKILL,
                faults.LEADER_SIGTERM, faults.LEADER_PARTITION)
GLOBAL_EVERY_S = (10.0, 15.0)


def test_a_short_chaos_soak_breaks_no_invariant(local_cluster, kubectl, operator_process):
    # The soak kills the operator's replicas as its faults: it runs its own, and the tests'
    # operator comes back after it. The Lease lives in the soak's namespace.
    operator_process.stop()
    namespace = f"chaos-{SEED}"
    kubectl("create", "namespace", namespace, check=False)
    operator = ReplicatedOperator(local_cluster, namespace, OPERATOR_NAMESPACES, OPERATOR_ENV)
    try:
        report = Soak(local_cluster, operator, namespace, SEED, MINUTES,
                      scenarios=SCENARIOS, global_faults=GLOBAL_FAULTS,
                      first_faults=FIRST_FAULTS, global_every_s=GLOBAL_EVERY_S,
                      progress=lambda line: print(line, flush=True)).run()
    finally:
        operator.close()
        operator_process.ensure_default()
    print(report.table())

    assert not report.interrupted
    # The soak did what it is for: jobs ran, faults of several kinds hit them, checks ran.
    assert sum(report.jobs.values()) >= 8, report.table()
    assert len(report.faults) >= 4, report.table()
    # Each leader fault happened, and was judged: every invariant was checked.
    assert all(report.faults[kind] >= 1 for kind in FIRST_FAULTS), report.table()
    unchecked = [name for name in checks.INVARIANTS if not report.ledger.checks[name]]
    assert unchecked == [], report.table()
    assert report.ledger.violations == [], report.table()
