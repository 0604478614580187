"""Field case C9, repeated: how often does the launcher exit with the failing rank's own code?

Starts 3 loopback sshd hosts (127.0.0.2-4), then runs ``monarch-launch`` N times, each run with
every trainer process exiting with code 3 at step 2 (role mode, the built-in example) or, with
``--program``, the examples/rl_kl controller's ``--exit-at-step 2 --exit-code 3``. With
``--load K`` it keeps K busy-looping processes running meanwhile (a 2-core machine under load is
where Monarch's supervision loses the exit status). Prints the exit-code histogram and the wall
time and the machine's busy CPU seconds per run (every process: the launcher, sshd, the Monarch
workers and procs; so run it on an otherwise quiet machine); the target is every run exiting 3.

``--env KEY=VALUE`` sets a variable in the launcher's environment (the allow-listed ones reach
the workers too); ``--ab KEY=VALUE`` alternates runs without and with it (A, B, A, B ...) and
prints both arms: e.g. ``--ab ENABLE_OTEL_TRACING=true,ENABLE_OTEL_METRICS=true`` for what
Monarch's own telemetry defaults cost (docs/performance.md).

Run: ``.venv/bin/python bench/c9_exit_codes.py --runs 50 --load 2`` as root.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from monarch_operator.testing.loopback_sshd import LoopbackSshd, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_hosts import busy_cpu_seconds  # noqa: E402  (bench/ is not a package)


def _burn() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--load", type=int, default=0, help="busy processes running meanwhile")
    parser.add_argument("--program", action="store_true", help="the rl_kl user program")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="set in the launcher's environment (repeatable)")
    parser.add_argument("--ab", metavar="K=V[,K=V...]",
                        help="alternate runs without (A) and with (B) these variables")
    args = parser.parse_args()
    arms = {"A": _assignments(args.env)}
    if args.ab:
        arms["B"] = {**arms["A"], **_assignments(args.ab.split(","))}
    launcher = Path(sys.executable).parent / "monarch-launch"
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    codes: Counter[int] = Counter()
    walls: list[float] = []
    per_arm: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    last_lines: Counter[str] = Counter()
    try:
        with tempfile.TemporaryDirectory() as state, LoopbackSshd(3, Path(state)) as cluster:
            hostfile = Path(state) / "hostfile"
            hostfile.write_text("".join(f"{host} slots=1\n" for host in cluster.hosts))
            mode = (
                ["run"] if args.program else ["--fail-at-step", "2", "--fail-exit-code", "3"]
            )
            program = (
                ["rl_kl.controller:main", "--exit-at-step", "2", "--exit-code", "3"]
                if args.program
                else []
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
            env["MONARCH_CLIENT_ADDRESS"] = "tcp://127.0.0.1:0"
            for run in range(1, args.runs + 1):
                command = [
                    str(launcher), *mode, "--hostfile", str(hostfile),
                    "--ssh-key", str(cluster.key), "--ssh-port", str(cluster.port),
                    "--known-hosts", str(cluster.known_hosts),
                    "--ssh-user", "root", "--monarch-port", str(free_port(cluster.hosts)),
                    "--trainer-hosts", "2", "--quiet", *program,
                ]
                arm = "AB"[(run - 1) % 2] if len(arms) == 2 else "A"
                started, busy = time.monotonic(), busy_cpu_seconds()
                result = subprocess.run(
                    command, env={**env, **arms[arm]}, capture_output=True, text=True,
                    timeout=300, check=False,
                )
                walls.append(time.monotonic() - started)
                per_arm[arm].append((walls[-1], busy_cpu_seconds() - busy))
                codes[result.returncode] += 1
                tail = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["-"]
                last_lines[tail[0]] += 1
                print(f"run {run}/{args.runs} ({arm}): exit {result.returncode} in "
                      f"{walls[-1]:.1f}s, {per_arm[arm][-1][1]:.1f} CPU-s", flush=True)
    finally:
        for burner in burners:
            burner.terminate()
    print(f"\nmode: {'program rl_kl' if args.program else 'role (built-in)'}, "
          f"load: {args.load} busy processes, {os.cpu_count()} cores")
    print("exit codes: " + ", ".join(f"{code}: {count}" for code, count in sorted(codes.items())))
    print(f"exit 3 in {codes[3]} of {args.runs} runs")
    print(f"wall per run: median {statistics.median(walls):.1f}s, max {max(walls):.1f}s")
    for arm, samples in per_arm.items():
        if samples:
            print(f"arm {arm} {arms[arm] or '(as given)'}: {len(samples)} runs, wall median "
                  f"{statistics.median(w for w, _ in samples):.2f}s, machine busy median "
                  f"{statistics.median(c for _, c in samples):.2f} CPU-s")
    for line, count in last_lines.most_common(3):
        print(f"  {count}x {line}")
    return 0 if codes[3] == args.runs else 1


def _assignments(items: list[str]) -> dict[str, str]:
    """``["K=V", ...]`` -> ``{K: V}``; raises SystemExit naming an item without ``=``."""
    pairs = {}
    for item in items:
        key, has_value, value = item.partition("=")
        if not key or not has_value:
            raise SystemExit(f"--env/--ab {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


if __name__ == "__main__":
    sys.exit(main())
