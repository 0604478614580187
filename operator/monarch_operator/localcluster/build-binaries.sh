#!/usr/bin/env bash
# Build the pinned upstream binaries of the local control plane from the Go module proxy:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok; with the
# argument `helm`, only the Helm client the chart tests use; with `node`, what a real node runs:
# kubelet and kube-proxy (same Kubernetes version), containerd 2.x with its runc shim and ctr,
# CoreDNS, kube-router (its NetworkPolicy firewall) and our fake GPU device plugin
# (localcluster/node/gpuplugin).
# Binaries land in ~/.cache/monarch-operator/bin/<versions>/ and are rebuilt only when missing.
# Prints the directory that holds them (`helm`: ~/.cache/monarch-operator/bin/helm-<version>/,
# `node`: ~/.cache/monarch-operator/bin/node-<versions>/); with `kueue`, Kueue's controller manager,
# its CRDs and webhook manifests (~/.cache/monarch-operator/bin/kueue-<version>/).
# Why wrapper modules: k8s.io/kubernetes and etcd's server module carry replace directives, so
# `go install pkg@version` refuses them (kubernetes/kubernetes#79384, #113302); a module of our own
# that requires them and maps each staging module to its published version builds fine.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
# The newest v0.19 patch the Go module proxy serves (v0.19.3 and later: 403 "not available").
KUEUE_VERSION="${KUEUE_VERSION:-v0.19.2}"
CACHE="${MONARCH_OPERATOR_CACHE:-$HOME/.cache/monarch-operator}"
BIN="$CACHE/bin/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
WORK="$CACHE/build"
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
# -dwarf=false: the compiler makes no debug info, which `-ldflags -w` (every build below) throws
# away at link time anyway; the binaries are the same size and run the same, and a cold build
# of every part takes 8 % less CPU (2036 CPU-s against 1880 on 2 cores, docs/development.md).
# GOFLAGS reaches only the go commands that know a flag (`go mod tidy` ignores -gcflags).
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -gcflags=all=-dwarf=false"
mkdir -p "$BIN" "$WORK"

log() { printf '[build-binaries] %s\n' "$*" >&2; }

# locked NAME CMD...: run CMD holding the lock of build NAME. One build of a thing at a time on
# this machine (set-up, a test fixture and an image build may ask at once, and two builds of one
# binary would write the same file); builds of different things run at once (scripts/setup.sh
# starts them together: while one compiles, another downloads or links).
locked() {
  local name="$1"; shift
  (
    exec 9>"$CACHE/bin/.build-$name.lock"
    if ! flock -n 9; then
      log "waiting for another build of $name to finish ($CACHE/bin/.build-$name.lock)"
      flock 9
    fi
    "$@"
  )
}
have() { [ -x "$BIN/$1" ]; }

# Every command of k8s.io/kubernetes we build, control plane and node: the wrapper module lists
# them all as tools, so that its go.sum covers each (a wrapper made before the node commands were
# added is made again).
KUBE_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

# build_kubernetes DEST NAME...: build the named commands of k8s.io/kubernetes into DEST.
build_kubernetes() {
  local dest="$1"; shift
  local names=("$@") missing=()
  for n in "${names[@]}"; do [ -x "$dest/$n" ] || missing+=("$n"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "building ${missing[*]} $KUBE_VERSION (first time: 10-20 min on 2 cores, all of ${KUBE_TOOLS[*]} at once)"
  local dir="$WORK/kubernetes-$KUBE_VERSION"
  mkdir -p "$dir"
  (
    cd "$dir"
    if [ "$(cat go.mod.done 2>/dev/null)" != "${KUBE_TOOLS[*]}" ]; then
      local gomod
      gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
      {
        echo "module local/kubebins"
        echo
        grep -E '^go [0-9]' "$gomod"
        echo
        echo "require k8s.io/kubernetes $KUBE_VERSION"
        echo
        echo "replace ("
        # every staging module k8s.io/X => ./staging/src/k8s.io/X becomes k8s.io/X => k8s.io/X <staging version>
        grep -oE 'k8s.io/[a-z0-9-]+ => \./staging/src/k8s.io/[a-z0-9-]+' "$gomod" |
          awk -v v="$STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
        echo ")"
        for n in "${KUBE_TOOLS[@]}"; do echo "tool k8s.io/kubernetes/cmd/$n"; done
      } > go.mod
      go mod tidy
      echo "${KUBE_TOOLS[*]}" > go.mod.done
    fi
    local ts; ts=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local ld="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$ts"
    done
    # Every command not built yet in one `go build`: the control plane's and the node's calls
    # both find them then. Cold with empty Go caches on 2 cores: 389 s for all six (one at a
    # time: 387 s, with the Go caches warm from etcd and kwok), 2026-12-04.
    local out="$dir/bin" pkgs=() t0=$SECONDS
    mkdir -p "$out"
    for n in "${KUBE_TOOLS[@]}"; do [ -x "$out/$n" ] || pkgs+=("k8s.io/kubernetes/cmd/$n"); done
    if [ ${#pkgs[@]} -gt 0 ]; then
      rm -rf "$out.tmp" && mkdir -p "$out.tmp"
      go build -trimpath -ldflags "$ld" -o "$out.tmp/" "${pkgs[@]}"
      mv "$out.tmp"/* "$out/" && rmdir "$out.tmp"
      log "built ${pkgs[*]##*/} in $((SECONDS - t0)) s"
    fi
    for n in "${missing[@]}"; do
      cp "$out/$n" "$dest/$n.tmp"
      mv "$dest/$n.tmp" "$dest/$n"
    done
  )
}

build_etcd() {
  have etcd && return 0
  log "building etcd $ETCD_VERSION"
  local dir="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  (
    cd "$dir"
    if [ ! -f go.mod.done ]; then
      printf 'module local/etcdbin\n\ngo 1.25.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n\ntool go.etcd.io/etcd/server/v3\n' "$ETCD_VERSION" > go.mod
      go mod tidy
      touch go.mod.done
    fi
    local t0=$SECONDS
    go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$BIN/etcd.tmp" "$BIN/etcd"
    log "built etcd in $((SECONDS - t0)) s"
  )
}

build_kwok() {
  have kwok && return 0
  log "building kwok $KWOK_VERSION"
  local t0=$SECONDS
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  log "built kwok in $((SECONDS - t0)) s"
}

build_helm() {
  # helm.sh/helm/v3 has no replace directives, so `go install` works. The -X flags are the ones
  # Helm's own Makefile sets: its version, and the Kubernetes version that `helm template` and
  # `helm lint` assume without a cluster (that of the client-go it is built with).
  local dir="$CACHE/bin/helm-$HELM_VERSION"
  if [ ! -x "$dir/helm" ]; then
    log "building helm $HELM_VERSION (first time: 2-6 min on 2 cores)"
    mkdir -p "$dir"
    local t0=$SECONDS kube_minor
    kube_minor=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | python3 -c '
import json, re, sys
gomod = open(json.load(sys.stdin)["GoMod"]).read()
print(re.search(r"k8s.io/client-go v0\.(\d+)\.", gomod).group(1))')
    local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
    done
    GOBIN="$dir" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    log "built helm in $((SECONDS - t0)) s"
  fi
  echo "$dir"
}

# build_containerd DEST: containerd, its runc shim (v2) and ctr. CGO off: no btrfs snapshotter
# (we use overlayfs) and a static binary; runc itself is Debian's package.
build_containerd() {
  local dest="$1" n missing=()
  for n in containerd containerd-shim-runc-v2 ctr; do [ -x "$dest/$n" ] || missing+=("$n"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "building containerd $CONTAINERD_VERSION (first time: about 2 min on 2 cores)"
  local t0=$SECONDS pkg="github.com/containerd/containerd/v2"
  local ld="-s -w -X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Package=$pkg"
  GOBIN="$dest" go install -trimpath -tags no_btrfs -ldflags "$ld" \
    "$pkg/cmd/containerd@$CONTAINERD_VERSION" "$pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$pkg/cmd/ctr@$CONTAINERD_VERSION"
  log "built containerd in $((SECONDS - t0)) s"
}

# build_coredns DEST: the CoreDNS server (run as a pod behind kube-dns; images/coredns).
build_coredns() {
  local dest="$1"
  [ -x "$dest/coredns" ] && return 0
  log "building coredns $COREDNS_VERSION (first time: about 4 min on 2 cores)"
  local t0=$SECONDS
  GOBIN="$dest" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
  log "built coredns in $((SECONDS - t0)) s"
}

# build_kube_router DEST: kube-router, of which the nodes run only the NetworkPolicy firewall
# (iptables and ipset in each node's network namespace); `kube-router` links to the pinned one.
build_kube_router() {
  local dest="$1" versioned="kube-router-$KUBE_ROUTER_VERSION"
  if [ ! -x "$dest/$versioned" ]; then
    log "building kube-router $KUBE_ROUTER_VERSION (first time: about 5 min on 2 cores)"
    local t0=$SECONDS tmp
    tmp=$(mktemp -d)
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w" \
      "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
    mv "$tmp/kube-router" "$dest/$versioned"
    rmdir "$tmp"
    log "built kube-router in $((SECONDS - t0)) s"
  fi
  ln -sf "$versioned" "$dest/kube-router"
}

# build_gpu_plugin DEST: our fake GPU device plugin, a module in this repository.
build_gpu_plugin() {
  local dest="$1" src hash
  src="$(cd "$(dirname "$0")" && pwd)/node/gpuplugin"
  hash=$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-12)
  [ -x "$dest/fake-gpu-plugin-$hash" ] && { ln -sf "fake-gpu-plugin-$hash" "$dest/fake-gpu-plugin"; return 0; }
  log "building the fake GPU device plugin"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$dest/fake-gpu-plugin-$hash.tmp" .)
  mv "$dest/fake-gpu-plugin-$hash.tmp" "$dest/fake-gpu-plugin-$hash"
  ln -sf "fake-gpu-plugin-$hash" "$dest/fake-gpu-plugin"
}

# build_kueue: Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) with the CRDs and webhook manifests
# of the same release. Its go.mod requires k8s.io/kubernetes, whose replace directives make
# `go install ...@version` refuse it; a writable copy of the downloaded module builds as its own
# main module (as bench/peer_mpi_operator.py does for the MPI Operator).
build_kueue() {
  local dest="$CACHE/bin/kueue-$KUEUE_VERSION"
  if [ ! -x "$dest/kueue" ]; then
    log "building kueue $KUEUE_VERSION (first time: 5-15 min on 2 cores)"
    local t0=$SECONDS src dir="$WORK/kueue-$KUEUE_VERSION"
    src=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    if [ ! -f "$dir/go.mod" ]; then
      mkdir -p "$dir"
      cp -r "$src/." "$dir/"
      chmod -R u+w "$dir"
    fi
    mkdir -p "$dest/crds"
    local ld="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "$ld" -o "$dest/kueue.tmp" ./cmd/kueue)
    cp "$dir"/config/components/crd/bases/*.yaml "$dest/crds/"
    cp "$dir/config/components/webhook/manifests.yaml" "$dest/webhooks.yaml"
    mv "$dest/kueue.tmp" "$dest/kueue"
    log "built kueue in $((SECONDS - t0)) s"
  fi
  echo "$dest"
}

case "${1:-}" in
  kueue)
    locked kueue build_kueue
    ;;
  helm)
    locked helm build_helm
    ;;
  node)
    NODE_BIN="$CACHE/bin/node-k8s-$KUBE_VERSION-containerd-$CONTAINERD_VERSION-coredns-$COREDNS_VERSION"
    mkdir -p "$NODE_BIN"
    locked containerd build_containerd "$NODE_BIN"
    locked kubernetes build_kubernetes "$NODE_BIN" kubelet kube-proxy
    locked coredns build_coredns "$NODE_BIN"
    locked kube-router build_kube_router "$NODE_BIN"
    locked gpu-plugin build_gpu_plugin "$NODE_BIN"
    echo "$NODE_BIN"
    ;;
  "")
    locked etcd build_etcd
    locked kwok build_kwok
    locked kubernetes build_kubernetes "$BIN" kube-apiserver kube-controller-manager kube-scheduler kubectl
    echo "$BIN"
    ;;
  *)
    echo "usage: $0 [helm|node|kueue]" >&2
    exit 2
    ;;
esac
