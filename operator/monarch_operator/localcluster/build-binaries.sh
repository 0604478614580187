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
# Most binaries are built in two groups, one `go build` each (below): the first ask for a binary
# of a group builds the whole group, and the others find it built.
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
# module_file MODULE@VERSION FIELD: a field of `go mod download -json` (GoMod: its go.mod's
# path; Dir: its files), the module downloaded first if it is not yet.
module_file() {
  go mod download -json "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

# Groups: binaries built from one module graph in one `go build`, so that a package two of them
# use compiles once. Built each from its own module, each got its own versions of the Kubernetes
# API types, apimachinery, client-go, gRPC and more, and compiled them again. One module of a
# group leads: the wrapper pins every module of the lead's build list at the version the lead
# selects, so the lead's binaries are those of an upstream build; the others build on those
# versions, and on their own for the modules only they use.
#   kube     lead k8s.io/kubernetes (control plane and node commands); kwok, Kueue's manager.
#            Not etcd: Kubernetes' build list has etcd's server (its tests run one) at another
#            release than ours.
#   runtime  lead containerd (containerd, its runc shim, ctr); Helm, CoreDNS.
# `go list -deps`: 107 MB of Go source instead of 203 MB for the first, 84 instead of 128 MB
# for the second; the time saved is in docs/development.md ("Set-up and demo times").
KUBE_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
# shellcheck disable=SC2034  # each group's settings are read by name (local -n, ${!name})
{
  GROUP_kube_PACKAGES=("${KUBE_TOOLS[@]/#/k8s.io/kubernetes/cmd/}" sigs.k8s.io/kwok/cmd/kwok
                       sigs.k8s.io/kueue/cmd/kueue)
  GROUP_kube_BINARIES=("${KUBE_TOOLS[@]}" kwok kueue)
  GROUP_kube_REQUIRES=("k8s.io/kubernetes $KUBE_VERSION" "sigs.k8s.io/kwok $KWOK_VERSION"
                       "sigs.k8s.io/kueue $KUEUE_VERSION")
  GROUP_kube_TAGS=""
  GROUP_kube_DIR="$WORK/group-k8s-$KUBE_VERSION-kwok-$KWOK_VERSION-kueue-$KUEUE_VERSION"
  CONTAINERD="github.com/containerd/containerd/v2"
  GROUP_runtime_PACKAGES=("$CONTAINERD/cmd/containerd" "$CONTAINERD/cmd/containerd-shim-runc-v2"
                          "$CONTAINERD/cmd/ctr" helm.sh/helm/v3/cmd/helm github.com/coredns/coredns)
  GROUP_runtime_BINARIES=(containerd containerd-shim-runc-v2 ctr helm coredns)
  GROUP_runtime_REQUIRES=("$CONTAINERD $CONTAINERD_VERSION" "helm.sh/helm/v3 $HELM_VERSION"
                          "github.com/coredns/coredns $COREDNS_VERSION")
  # containerd without its btrfs snapshotter (we use overlayfs; CGO is off).
  GROUP_runtime_TAGS="no_btrfs"
  GROUP_runtime_DIR="$WORK/group-containerd-$CONTAINERD_VERSION-helm-$HELM_VERSION"
  GROUP_runtime_DIR+="-coredns-$COREDNS_VERSION"
}

# The version of a module that a build uses: a replace directive's, else the required one.
SELECTED='{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}'

# lead_module_kube DIR: k8s.io/kubernetes alone as a module in DIR, each staging module
# k8s.io/X => ./staging/src/k8s.io/X mapped to its published version.
lead_module_kube() {
  local gomod
  gomod=$(module_file "k8s.io/kubernetes@$KUBE_VERSION" GoMod)
  {
    echo "module local/lead"
    echo
    grep -E '^go [0-9]' "$gomod"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    grep -oE 'k8s.io/[a-z0-9-]+ => \./staging/src/k8s.io/[a-z0-9-]+' "$gomod" |
      awk -v v="$STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
    for n in "${KUBE_TOOLS[@]}"; do echo "tool k8s.io/kubernetes/cmd/$n"; done
  } > "$1/go.mod"
}

# lead_module_runtime DIR: containerd alone as a module in DIR.
lead_module_runtime() {
  local gomod
  gomod=$(module_file "$CONTAINERD@$CONTAINERD_VERSION" GoMod)
  {
    echo "module local/lead"
    echo
    grep -E '^go [0-9]' "$gomod"
    echo
    echo "require $CONTAINERD $CONTAINERD_VERSION"
    echo
    for p in "${GROUP_runtime_PACKAGES[@]:0:3}"; do echo "tool $p"; done
  } > "$1/go.mod"
}

# group_module NAME: the group's wrapper module (go.mod, go.sum) in its directory, made once.
group_module() {
  local name="$1" dir lead pins line
  local -n packages="GROUP_${name}_PACKAGES" requires="GROUP_${name}_REQUIRES"
  dir="GROUP_${name}_DIR"; dir="${!dir}"
  [ -f "$dir/go.mod.done" ] && return 0
  lead="$dir/lead"
  mkdir -p "$lead"
  "lead_module_$name" "$lead"
  (cd "$lead" && go mod tidy)
  pins=$(cd "$lead" && go list -m -f "{{if not .Main}}{{.Path}} $SELECTED{{end}}" all |
    awk 'NF == 2 {print "\t" $1 " => " $1 " " $2}')
  {
    echo "module local/group-$name"
    echo
    grep -E '^go [0-9]' "$lead/go.mod"
    echo
    echo "require ("
    for line in "${requires[@]}"; do echo "	$line"; done
    echo ")"
    echo
    echo "replace ("
    echo "$pins"
    echo ")"
    for line in "${packages[@]}"; do echo "tool $line"; done
  } > "$dir/go.mod"
  (cd "$dir" && go mod tidy)
  touch "$dir/go.mod.done"
}

# group_ldflags NAME: the -ldflags of the group's build. An -X of a package that a binary does
# not link is ignored, so one string serves every binary of the group.
group_ldflags() {
  local ld="-s -w" pkg
  case "$1" in
    kube)
      local ts minor
      ts=$(date -u +%Y-%m-%dT%H:%M:%SZ)
      minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
      for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$ts"
      done
      ld+=" -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
      ;;
    runtime)
      ld+=" -X $CONTAINERD/version.Version=$CONTAINERD_VERSION"
      ld+=" -X $CONTAINERD/version.Package=$CONTAINERD"
      # Helm's own Makefile sets these: its version, and the Kubernetes version that `helm
      # template` and `helm lint` assume without a cluster (that of the client-go it links).
      local kube_minor
      kube_minor=$(cd "$GROUP_runtime_DIR" && go list -m -f "$SELECTED" k8s.io/client-go |
        sed -E 's/^v0\.([0-9]+)\..*/\1/')
      ld+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
      ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
      done
      ;;
  esac
  echo "$ld"
}

# build_group NAME: every binary of the group not built yet, in one `go build`, into its bin/;
# static binaries (CGO off, GOFLAGS above).
build_group() {
  local name="$1" dir tags n missing=() t0=$SECONDS
  local -n packages="GROUP_${name}_PACKAGES" binaries="GROUP_${name}_BINARIES"
  dir="GROUP_${name}_DIR"; dir="${!dir}"
  tags="GROUP_${name}_TAGS"; tags="${!tags}"
  for n in "${binaries[@]}"; do [ -x "$dir/bin/$n" ] || missing+=("$n"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "building ${binaries[*]} in one go build (first time: 5-10 min on 2 cores)"
  group_module "$name"
  rm -rf "$dir/bin.tmp" && mkdir -p "$dir/bin.tmp" "$dir/bin"
  (cd "$dir" && go build -trimpath -tags "$tags" -ldflags "$(group_ldflags "$name")" \
    -o "$dir/bin.tmp/" "${packages[@]}")
  mv "$dir/bin.tmp"/* "$dir/bin/" && rmdir "$dir/bin.tmp"
  log "built ${binaries[*]} in $((SECONDS - t0)) s"
}

# group_copy NAME DEST BINARY...: the group's named binaries in DEST, the group built first if
# one is missing there.
group_copy() {
  local name="$1" dest="$2" dir n missing=()
  shift 2
  dir="GROUP_${name}_DIR"; dir="${!dir}"
  for n in "$@"; do [ -x "$dest/$n" ] || missing+=("$n"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  locked "group-$name" build_group "$name"
  mkdir -p "$dest"
  for n in "${missing[@]}"; do
    cp "$dir/bin/$n" "$dest/$n.tmp"
    mv "$dest/$n.tmp" "$dest/$n"
  done
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

# build_kueue: Kueue's manager (group kube) with the CRDs and webhook manifests of its release.
build_kueue() {
  local dest="$CACHE/bin/kueue-$KUEUE_VERSION" src
  group_copy kube "$dest" kueue
  if [ ! -f "$dest/webhooks.yaml" ]; then
    src=$(module_file "sigs.k8s.io/kueue@$KUEUE_VERSION" Dir)
    mkdir -p "$dest/crds"
    cp "$src"/config/components/crd/bases/*.yaml "$dest/crds/"
    cp "$src/config/components/webhook/manifests.yaml" "$dest/webhooks.yaml.tmp"
    chmod u+w "$dest"/crds/*.yaml "$dest/webhooks.yaml.tmp"
    mv "$dest/webhooks.yaml.tmp" "$dest/webhooks.yaml"
  fi
  echo "$dest"
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

case "${1:-}" in
  kueue)
    build_kueue
    ;;
  helm)
    group_copy runtime "$CACHE/bin/helm-$HELM_VERSION" helm
    echo "$CACHE/bin/helm-$HELM_VERSION"
    ;;
  node)
    NODE_BIN="$CACHE/bin/node-k8s-$KUBE_VERSION-containerd-$CONTAINERD_VERSION-coredns-$COREDNS_VERSION"
    mkdir -p "$NODE_BIN"
    group_copy runtime "$NODE_BIN" containerd containerd-shim-runc-v2 ctr coredns
    group_copy kube "$NODE_BIN" kubelet kube-proxy
    locked kube-router build_kube_router "$NODE_BIN"
    locked gpu-plugin build_gpu_plugin "$NODE_BIN"
    echo "$NODE_BIN"
    ;;
  "")
    locked etcd build_etcd
    group_copy kube "$BIN" kwok kube-apiserver kube-controller-manager kube-scheduler kubectl
    echo "$BIN"
    ;;
  *)
    echo "usage: $0 [helm|node|kueue]" >&2
    exit 2
    ;;
esac
