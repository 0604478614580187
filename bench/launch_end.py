"""How long a standalone run takes from its last timeline line ("torn down") to its exit.

Starts 3 loopback sshd hosts (127.0.0.2-4) and runs ``monarch-launch spmd`` over two of them,
each rank running a script that exits 0 at once, ``--runs`` times per setting, alternating:
the launcher as installed (``MONARCH_FLUSH_S``, the cap on Monarch's final client flushes) and
the same launcher with the old cap of 2.0 s. Prints per setting the median and range of the
whole run, of apply-to-"torn down", and of "torn down"-to-exit, in seconds.

Run: ``.venv/bin/python bench/launch_end.py --runs 5`` as root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monarch_operator.launcher import report
from monarch_operator.testing.loopback_sshd import LoopbackSshd, free_port

OLD_FLUSH_S = 2.0
# The launcher's own entry point with the flush cap set first (the A/B's only difference).
ENTRY = ("import sys; from monarch_operator.launcher import report; "
         "report.MONARCH_FLUSH_S = float(sys.argv.pop(1)); "
         "from monarch_operator.launcher.cli import main; sys.exit(main())")


def one_run(state: Path, cluster, flush_s: float) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """One launch; returns (seconds to "torn down", seconds from it to exit, exit status)."""
    a, b, _ = cluster.hosts
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["MONARCH_CLIENT_ADDRESS"] = "tcp://127.0.0.1:0"
    command = [sys.executable, "-c", ENTRY, str(flush_s), "spmd",
               "--hostfile", str(state / "hostfile"), "--ssh-key", str(cluster.key),
               "--known-hosts", str(cluster.known_hosts), "--ssh-port", str(cluster.port),
               "--ssh-user", "root", "--monarch-port", str(free_port(cluster.hosts)),
               str(state / "exit0.py")]
    started = time.monotonic()
    torn_down = None
    with subprocess.Popen(command, env=env, cwd=state, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if "torn down" in line:
                torn_down = time.monotonic() - started
        status = process.wait()
    total = time.monotonic() - started
    if torn_down is None:
        raise SystemExit(f"no 'torn down' line (exit {status}); is the launcher installed?")
    return torn_down, total - torn_down, status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per setting")
    args = parser.parse_args()
    settings = {f"now ({report.MONARCH_FLUSH_S:g} s)": report.MONARCH_FLUSH_S,
                f"old ({OLD_FLUSH_S:g} s)": OLD_FLUSH_S}
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as folder, LoopbackSshd(3, Path(folder)) as cluster:
        state = Path(folder)
        a, b, _ = cluster.hosts
        (state / "hostfile").write_text(f"{a} slots=1\n{b} slots=1\n")
        (state / "exit0.py").write_text("import sys\nsys.exit(0)\n")
        for _ in range(args.runs):
            for name, flush_s in settings.items():
                results[name].append(one_run(state, cluster, flush_s))
    print(f"{'setting':<14}{'runs':>5}{'whole s':>16}{'to torn down s':>18}{'to exit s':>16}"
          f"{'exit':>6}")
    for name, runs in results.items():
        columns = []
        for values in ([t + e for t, e, _ in runs], [t for t, _, _ in runs], [e for _, e, _ in runs]):
            columns.append(f"{statistics.median(values):.2f} [{min(values):.1f}-{max(values):.1f}]")
        statuses = ",".join(sorted({str(s) for _, _, s in runs}))
        print(f"{name:<14}{len(runs):>5}{columns[0]:>16}{columns[1]:>18}{columns[2]:>16}"
              f"{statuses:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
