#!/usr/bin/env bash
# Usage: scripts/test.sh [PYTEST ARGUMENTS...]   e.g. scripts/test.sh tests/unit -k hostfile
# All tests: unit, launcher over loopback sshd, cluster (operator on the local control plane),
# images and end to end (the sample MonarchJob to Succeeded on real nodes). The end of the
# output has a phase table (set-up, each test folder) and the 40 slowest tests with --durations=40.
#   MONARCH_TEST_WORKERS=N   N pytest-xdist workers (default 3; 0: one test at a time). Each
#                            worker runs whole modules on a kwok cluster of its own, all the
#                            real-node tests run in one worker, longest modules first, the
#                            machine-alone modules last (tests/parallel.py). With 3 workers the
#                            tests take about 38 minutes on 2 cores with warm caches (2 workers:
#                            about 45), and a fresh machine's set-up about 17 more; one at a time
#                            about 70 minutes (docs/development.md, "How the suite runs in
#                            parallel").
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help)  # this script's own words (no set-up first), then pytest's options
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    echo "pytest's own options: .venv/bin/python -m pytest --help (once scripts/setup.sh made .venv)."
    exit 0 ;;
esac
t0=$SECONDS
scripts/setup.sh --images
export MONARCH_SETUP_SECONDS=$((SECONDS - t0))
workers="${MONARCH_TEST_WORKERS:-3}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadscope --no-loadscope-reorder)
exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
