#!/usr/bin/env bash
# All tests: unit, launcher over loopback sshd, cluster (operator on the local control plane),
# images and end to end (the sample MonarchJob to Succeeded on real nodes). The end of the
# output has a phase table (set-up, each test folder) and the 40 slowest tests with --durations=40.
#   MONARCH_TEST_WORKERS=N   N pytest-xdist workers (default 2; 0: one test at a time). Each
#                            worker runs whole modules on a kwok cluster of its own, all the
#                            real-node tests run in one worker, longest modules first, the
#                            machine-alone modules last (tests/parallel.py). One at a time the
#                            suite takes about 70 minutes, and a fresh machine's set-up 31 more:
#                            over CI's 90 (docs/development.md, "How the suite runs in parallel").
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help)  # this script's own words (no set-up first), then pytest's options
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    echo "pytest's own options: .venv/bin/python -m pytest --help (once scripts/setup.sh made .venv)."
    exit 0 ;;
esac
# The set-up (scripts/setup.sh --images) goes on beside the tests: they start once the venv is
# there, and a test folder that needs a part still building (the Go builds, the images) gets its
# tests once that part is done (tests/parallel.py: SETUP_NEEDS); a fixture that asks for a binary
# or an image first waits for its build. On a fresh machine that puts the unit and launcher
# tests in the 15-20 minutes of Go builds; on a warm one the set-up ends in seconds. Every part
# but the venv runs at nice 19 (scripts/setup.sh): the venv comes first, then the tests keep
# their speed and deadlines and the builds take the CPU the tests leave.
t0=$SECONDS
state=$(mktemp -d "${TMPDIR:-/tmp}/monarch-setup-state.XXXXXX")
export MONARCH_SETUP_STATE="$state"
scripts/setup.sh --images 2>"$state/setup.log" &
setup_pid=$!
shown=0
show_setup() {  # the set-up's lines not shown yet
  local lines
  lines=$(wc -l <"$state/setup.log")
  if [ "$lines" -gt "$shown" ]; then
    sed -n "$((shown + 1)),${lines}p" "$state/setup.log" >&2
    shown=$lines
  fi
}
until [ -e "$state/venv.done" ]; do
  show_setup
  if ! kill -0 "$setup_pid" 2>/dev/null; then
    code=0
    wait "$setup_pid" || code=$?
    show_setup
    echo "[test] the set-up ended (exit $code) before the venv was ready" >&2
    exit $((code == 0 ? 1 : code))
  fi
  sleep 1
done
show_setup
export MONARCH_SETUP_SECONDS=$((SECONDS - t0))
if kill -0 "$setup_pid" 2>/dev/null; then
  echo "[test] the tests start; the rest of the set-up goes on beside them (its log: $state/setup.log)" >&2
fi
workers="${MONARCH_TEST_WORKERS:-2}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadscope --no-loadscope-reorder)
tests=0
.venv/bin/python -m pytest "${parallel[@]}" "$@" || tests=$?
if kill -0 "$setup_pid" 2>/dev/null; then
  echo "[test] the tests are done; waiting for the set-up to end" >&2
fi
setup=0
wait "$setup_pid" || setup=$?
if [ "$(wc -l <"$state/setup.log")" -gt "$shown" ]; then
  echo "[test] the set-up beside the tests:" >&2
  show_setup
fi
if [ "$setup" != 0 ]; then
  echo "[test] the set-up failed (exit $setup): see its lines above" >&2
  [ "$tests" != 0 ] || tests=$setup
fi
rm -rf "$state"
exit "$tests"
