"""500 generated MonarchJob specs, valid and invalid, against the local control plane with the
operator running (issue 9 item 9); prints how each ended and every broken property.

Starts its own local cluster of ``--nodes`` nodes (run it under the cluster-test lock), installs the CRD and starts
the operator, then applies the specs of ``monarch_operator.testing.specgen.generate_specs`` in
batches (one namespace each) and checks them with ``monarch_operator.testing.speccheck``:
refused at admission naming the field, or a status within seconds (Running, Succeeded,
Suspended, a reasoned wait, Failed naming the field); tracebacks in the operator's log, jobs
without status, children without a controller owner, the operator's writes per job (audit
log). Pods are simulated by kwok (workers Ready after 1 s, most launchers Succeeded 1 s later);
a quarter of the launchers run ``sh -c 'exit N'`` for real on the node agent.

Run::

    flock /tmp/monarch-tests.lock .venv/bin/python bench/generated_specs.py            # 500
    flock /tmp/monarch-tests.lock .venv/bin/python bench/generated_specs.py --specs 60 --seed 7

Exits 1 when a property was broken.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds, start_operator, stop_process
from monarch_operator.testing import speccheck, specgen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", type=int, default=500, help="how many specs (default 500)")
    parser.add_argument("--seed", type=int, default=None,
                        help="hypothesis seed (default: derandomized, the CI test's specs first)")
    parser.add_argument("--batch", type=int, default=25, help="specs applied at once")
    parser.add_argument("--problems", type=int, default=20, help="problems to print in full")
    parser.add_argument("--nodes", type=int, default=12, help="kwok nodes of 8 GPUs each")
    args = parser.parse_args()

    started = time.monotonic()
    specs = specgen.generate_specs(args.specs, seed=args.seed)
    print(f"generated {len(specs)} specs in {time.monotonic() - started:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="generated-specs-") as state:
        # kwok nodes cost little; enough GPUs that valid jobs of a batch do not all queue.
        cluster = LocalCluster(Path(state), nodes=args.nodes, gpus_per_node=8)
        cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
        operator = None
        try:
            kubectl = Kubectl(cluster.env())
            install_crds(kubectl)
            operator = start_operator(cluster.state_dir, cluster.env())
            begun = time.monotonic()
            report = speccheck.check_specs(
                speccheck.Kubectl(kubectl.env), specs, audit_log=cluster.audit_log,
                operator_log=cluster.state_dir / "logs" / "operator.log",
                batch_size=args.batch, progress=lambda line: print(line, flush=True))
            elapsed = time.monotonic() - begun
        finally:
            if operator is not None:
                stop_process(operator)
            cluster.down(quiet=True)
    for problem in report.problems[:args.problems]:
        print(f"\nPROBLEM {problem}")
    print(f"\n{report.summary()}")
    print(f"flaws applied: {len(report.flaws) - 1} kinds, "
          f"{report.flaws['(valid)']} specs without a flaw")
    print(f"checked in {elapsed:.0f} s ({elapsed / max(len(specs), 1):.2f} s per spec)")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
