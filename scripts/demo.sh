#!/usr/bin/env bash
# The main job end to end: local control plane with two real nodes up, CRD installed, operator
# running, the sample MonarchJob applied; waits for it, prints `kubectl get monarchjobs` and the trainer/ref output,
# then stops everything (pass --keep to leave the cluster and operator running).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  case "$arg" in
    -h|--help)
      cat <<'USAGE'
usage: scripts/demo.sh [--keep] [--dir DIR] [--namespace NS] [--timeout SECONDS] [--nodes N] [--simulated]

Sets up everything first (scripts/setup.sh: Debian packages, Python packages, control-plane and
node binaries), builds the worker image if it changed, then runs the sample MonarchJob
(crds/samples/demo.yaml) to Succeeded on a local control plane with two real nodes (kubelet,
containerd, kube-proxy, CoreDNS; needs root).

  --keep            leave the cluster and operator running afterwards (how to use and stop
                    them is printed), with the examples image imported too
  --nodes N         real nodes (default 2)
  --simulated       kwok nodes whose pods run as host processes, instead of real nodes
  --dir DIR         state directory: kubeconfig, logs, pod output (default .localcluster in
                    this checkout, or $MONARCH_LOCALCLUSTER_DIR)
  --namespace NS    namespace of the sample job (default team-a)
  --timeout SECONDS how long to wait for the job to finish (default 600)
USAGE
      exit 0 ;;
  esac
done
# The arguments are checked before the set-up (a first one takes 35 minutes): the demo's own
# parser, run by the machine's python3 (standard library only).
python3 operator/monarch_operator/localcluster/args.py demo "$@"
scripts/setup.sh
exec .venv/bin/python -m monarch_operator.localcluster.demo "$@"
