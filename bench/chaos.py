"""A chaos soak (issue 20 item 7): MonarchJobs on the local cluster (kwok nodes whose pods the
node agent runs as host processes) for ``--minutes`` while faults are injected, every invariant
checked after every step; then a table of faults, checks and violations.

Faults, drawn from ``--seed``: aimed at one job's running attempt (a worker pod deleted, a
worker container killed in place, the launcher pod deleted, the job's node lost and back, a
held suspension, a suspend flipped back at once, the job deleted), global (the operator
restarted by SIGTERM or SIGKILL, the API server paused for 2-6 s, any node lost), and in the
jobs themselves (launchers and torchrun ranks that exit non-zero, raise, hang into the job's
deadline, or leave a ``setsid sleep`` behind). With ``--leader-faults`` the operator runs as two
replicas under leader election and the operator's restarts give way to leader faults (the
leader killed by SIGKILL or SIGTERM, partitioned by SIGSTOP past its renew deadline, the standby
killed, a rolling update; ``--first-faults`` makes each happen first) with their checks (a
SIGTERMed replica exits 0, a partitioned leader 3, no write of a replica after it ended or while
another held the Lease). Invariants: each attempt's class is the one its
fault makes it; ``failureCounts`` and ``restartCount`` exact against ``runPolicy``; never two
live launcher pods (or launcher processes) of one job; no process of an ended attempt once a
later one runs, none of a launcher pod once it ended, none of a finished job; every job final
within 7 minutes and its status telling how; nothing (pods, ConfigMaps, Secrets, StatefulSets,
Services, NetworkPolicies, Workloads, ServiceAccounts, Roles, RoleBindings, processes) left 2
minutes after deletion. Details:
``monarch_operator.testing.chaos``.

Run as root (the node agent runs pods as other users)::

    MONARCH_LOCALCLUSTER_POD_CIDR=127.104.0.0/16 PYTHONPATH=$PWD/operator \\
        .venv/bin/python bench/chaos.py --minutes 30 --seed 1 [--leader-faults]

Exits 1 when any invariant was broken.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds
from monarch_operator.testing.chaos import faults, plan
from monarch_operator.testing.chaos.faults import OperatorControl
from monarch_operator.testing.chaos.leaders import ReplicatedOperator
from monarch_operator.testing.chaos.soak import Soak


def main(argv: list[str] | None = None) -> int:
    """Run the soak on a fresh local cluster; returns 1 when a violation was found."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="how long faults are injected (default 30); then every job ends")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--jobs", type=int, default=4, help="jobs at once (default 4)")
    parser.add_argument("--scenarios", nargs="*", choices=sorted(plan.SCENARIOS),
                        help="only these job scenarios (default: all)")
    parser.add_argument("--global-faults", nargs="*",
                        choices=sorted({**faults.GLOBAL_FAULTS, **faults.LEADER_FAULTS}),
                        help="only these global faults (default: all)")
    parser.add_argument("--leader-faults", action="store_true",
                        help="two operator replicas under leader election, and leader faults")
    parser.add_argument("--first-faults", action="store_true",
                        help="with --leader-faults: each leader fault once first, in turn")
    parser.add_argument("--dir", type=Path, default=None,
                        help="the cluster's state directory (default: a new temporary one)")
    args = parser.parse_args(argv)
    # SIGTERM (timeout, kill) ends the soak as Ctrl-C does: nodes back, the table printed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.minutes <= 0 or args.jobs < 1:
        parser.error("--minutes must be > 0 and --jobs >= 1")
    state_dir = args.dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    cluster = LocalCluster(state_dir, nodes=3, gpus_per_node=8, stop_with_owner=True)
    cluster.up(progress=lambda line: print(f"[localcluster] {line}", flush=True))
    namespace = f"chaos-{args.seed}"
    operator: OperatorControl | ReplicatedOperator = OperatorControl(cluster)
    try:
        kubectl = Kubectl(cluster.env())
        install_crds(kubectl)
        if args.leader_faults:  # the Lease lives in the soak's namespace
            kubectl("create", "namespace", namespace)
            operator = ReplicatedOperator(cluster, namespace)
        soak = Soak(cluster, operator, namespace, args.seed, args.minutes,
                    concurrency=args.jobs,
                    first_faults=(tuple(faults.LEADER_FAULTS)
                                  if args.leader_faults and args.first_faults else ()),
                    scenarios=tuple(args.scenarios) if args.scenarios else None,
                    global_faults=(tuple(args.global_faults) if args.global_faults is not None
                                   else None),
                    progress=lambda line: print(line, flush=True))
        report = soak.run()
    finally:
        operator.stop()
        cluster.down(quiet=True)
    print(report.table(), flush=True)
    print(f"operator log: {operator.log_path}")
    return 1 if report.ledger.violations or report.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
