#!/usr/bin/env bash
# The whole path on a real (kind) cluster, for machines with Docker: create a kind cluster from a
# pinned node image, build images/ with docker and load them into it, advertise fake GPUs on the
# nodes, helm install the chart (and helm test it), apply the sample MonarchJob, wait for
# Succeeded while printing progress, show `kubectl get monarchjobs` and the launcher's output,
# then delete the cluster. Exit status 0 only when the job Succeeded.
#
# Not run on the development machine (it has no Docker daemon); .github/workflows/kind-e2e.yaml
# runs it on a CI runner that has one.
#
# Needs docker, and go 1.26+ to build what is missing (kind from the Go module proxy; kubectl and
# helm with operator/monarch_operator/localcluster/build-binaries.sh, as scripts/setup.sh).
# Environment: KIND_CLUSTER (name, default monarch-e2e), KIND_E2E_TIMEOUT (seconds the job may
# take, default 1200), KIND_E2E_KEEP=1 (keep the cluster for a look; delete it with
# `kind delete cluster --name monarch-e2e`).
set -euo pipefail
cd "$(dirname "$0")/.."

KIND_VERSION=v0.33.0
# The image kind v0.33.0 was released with for Kubernetes 1.36 (kind's release notes: use the
# digest, node images are built per kind release).
NODE_IMAGE="kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed"
CLUSTER="${KIND_CLUSTER:-monarch-e2e}"
TIMEOUT="${KIND_E2E_TIMEOUT:-1200}"
NAMESPACE=team-a
JOB=demo
APP_VERSION="$(awk -F'"' '/^appVersion:/ {print $2}' charts/monarch-operator/Chart.yaml)"
OPERATOR_IMAGE="ghcr.io/monarch-operator/operator:${APP_VERSION}"
WORKER_IMAGE="ghcr.io/monarch-operator/worker:${APP_VERSION}"
CACHE="${MONARCH_OPERATOR_CACHE:-$HOME/.cache/monarch-operator}"

log() { printf '[kind-e2e %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (docker info failed)"

# Tools: kind pinned, from the Go module proxy; kubectl and helm as the tests pin them.
if ! command -v kind >/dev/null || [ "$(kind version -q 2>/dev/null)" != "$KIND_VERSION" ]; then
  kind_dir="$CACHE/bin/kind-$KIND_VERSION"
  if [ ! -x "$kind_dir/kind" ]; then
    log "go install sigs.k8s.io/kind@$KIND_VERSION"
    GOBIN="$kind_dir" go install "sigs.k8s.io/kind@$KIND_VERSION"
  fi
  PATH="$kind_dir:$PATH"
fi
if ! command -v kubectl >/dev/null; then
  log "building kubectl (build-binaries.sh)"
  PATH="$(bash operator/monarch_operator/localcluster/build-binaries.sh | tail -n 1):$PATH"
fi
helm="$(bash operator/monarch_operator/localcluster/build-binaries.sh helm | tail -n 1)/helm"

cleanup() {
  local status=$?
  if [ "${KIND_E2E_KEEP:-0}" = 1 ]; then
    log "keeping cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
  else
    log "deleting cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  exit "$status"
}
trap cleanup EXIT

log "creating kind cluster $CLUSTER ($NODE_IMAGE)"
kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --wait 180s
kubectl config use-context "kind-$CLUSTER" >/dev/null

log "building $OPERATOR_IMAGE and $WORKER_IMAGE"
docker build -f images/operator/Dockerfile -t "$OPERATOR_IMAGE" .
docker build -f images/worker/Dockerfile -t "$WORKER_IMAGE" .
log "loading the images into the cluster's nodes"
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$WORKER_IMAGE"

# kind nodes have no GPUs; the sample asks 2 per worker. Advertise 8 as an extended resource
# ("Advertise Extended Resources for a Node", kubernetes.io docs): the scheduler counts them,
# nothing uses them, and the sample's trainer and reference meshes run on CPU (gloo).
for node in $(kubectl get nodes -o name); do
  kubectl patch "$node" --subresource=status --type=json \
    -p '[{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}]' >/dev/null
done
log "nodes: $(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.allocatable.nvidia\.com/gpu} {end}')"

log "helm install (the chart installs the CRD from its crds/)"
"$helm" install monarch-operator charts/monarch-operator -n monarch-system --create-namespace \
  --wait --timeout 5m
"$helm" test monarch-operator -n monarch-system

kubectl create namespace "$NAMESPACE"
# The job's pods must pass Pod Security "restricted" (the API server refuses them otherwise).
kubectl label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/warn=restricted >/dev/null
kubectl apply -n "$NAMESPACE" -f crds/samples/demo.yaml

log "waiting up to ${TIMEOUT}s for monarchjob/$JOB to finish"
deadline=$((SECONDS + TIMEOUT))
phase=""
while [ "$SECONDS" -lt "$deadline" ]; do
  phase="$(kubectl get monarchjob "$JOB" -n "$NAMESPACE" -o jsonpath='{.status.phase}')"
  ready="$(kubectl get monarchjob "$JOB" -n "$NAMESPACE" -o jsonpath='{.status.readyWorkers}')"
  log "phase=${phase:-<none>} readyWorkers=${ready:-0}"
  case "$phase" in Succeeded|Failed) break ;; esac
  sleep 10
done

kubectl get monarchjobs -n "$NAMESPACE" -o wide
kubectl get pods -n "$NAMESPACE" -o wide
echo "--- launcher output ---"
kubectl logs -n "$NAMESPACE" -l "monarch-operator.dev/job=$JOB,monarch-operator.dev/role=launcher" \
  --tail=50 || true
if [ "$phase" != Succeeded ]; then
  kubectl describe monarchjob "$JOB" -n "$NAMESPACE" || true
  kubectl logs -n monarch-system deploy/monarch-operator --tail=100 || true
  die "monarchjob/$JOB ended ${phase:-without a phase} (timeout ${TIMEOUT}s)"
fi
log "monarchjob/$JOB Succeeded"
