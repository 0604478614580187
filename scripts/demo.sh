#!/usr/bin/env bash
# The main job end to end: local control plane up, CRD installed, operator running, the sample
# MonarchJob applied; waits for it, prints `kubectl get monarchjobs` and the trainer/ref output,
# then stops everything (pass --keep to leave the cluster and operator running).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m monarch_operator.localcluster.demo "$@"
