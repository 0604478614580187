#!/usr/bin/env bash
# All tests: unit, launcher over loopback sshd, cluster (operator on the local control plane) and
# end to end (the sample MonarchJob to Succeeded). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
