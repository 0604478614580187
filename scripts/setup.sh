#!/usr/bin/env bash
# One-time set-up on a fresh Debian/Ubuntu machine (idempotent, safe to re-run):
# openssh (sshd for worker pods and SSH tests), util-linux (unshare), what the real nodes need
# from Debian (runc, the CNI plugins, iptables, ipset, conntrack; buildah, debootstrap and gcc
# to build the images), then these parts at once, each with a line when it ends:
#   wheelhouse     every pinned wheel (torch and its CUDA wheels: ~3 GB), once per machine
#   venv           a virtualenv in .venv with monarch-operator and its pinned dependencies
#                    (after the wheelhouse, which it installs from)
#   control-plane  etcd, kube-apiserver, ... built from the Go module proxy into
#   node             ~/.cache/monarch-operator (10-15 min the first time, seconds after),
#   helm, kueue      the Helm client and Kueue the tests use
#   scanners       the pinned linters and scanners (scripts/scanners.txt) in their own virtualenv
#   base           the images' Debian base (debootstrap), with --images
#   images         the container images of the real nodes (after the wheelhouse; CoreDNS's
#                    after node), with --images
# Different builds run side by side (while one compiles, another downloads or links); two asks
# for one binary never build it twice (build-binaries.sh holds a lock per build).
#   scripts/setup.sh            the above without the images (built on first use)
#   scripts/setup.sh --images   the images too (scripts/test.sh: the end-to-end tests need them)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
with_images=false
[ "${1:-}" = "--images" ] && with_images=true
started=$SECONDS

need_apt=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
# nss_wrapper: the worker entrypoint and the launcher give a uid without a passwd entry a name
# with it (field case C38), on the simulated nodes (this machine plays the image) and in
# tests/images/test_worker_entrypoint_any_uid.py.
dpkg -s libnss-wrapper >/dev/null 2>&1 || need_apt+=(libnss-wrapper)
# Real nodes (localcluster/node) and the images they run (localcluster/images.py).
[ -x /usr/sbin/runc ] || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
command -v ipset >/dev/null 2>&1 || need_apt+=(ipset)
command -v conntrack >/dev/null 2>&1 || need_apt+=(conntrack)
command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v buildah >/dev/null 2>&1 || need_apt+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
dpkg -s libc6-dev >/dev/null 2>&1 || need_apt+=(libc6-dev)  # the pause image is linked static
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  t0=$SECONDS
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  log "apt: done in $((SECONDS - t0)) s"
fi
# A non-root login user like the worker image's "monarch": tests/images runs the worker
# entrypoint's sshd as this user (non-root sshd logs in only the user it runs as).
id monarch >/dev/null 2>&1 || $SUDO useradd --create-home --shell /bin/bash monarch
command -v go >/dev/null 2>&1 || { log "Go is required (1.26+) to build the control plane"; exit 1; }

# The venv's python runs the stdlib-only modules below (wheelhouse, images) from the source
# tree before the project is installed into it.
[ -x .venv/bin/python ] || python3 -m venv .venv
venv_stamp=".venv/.installed-$(cat pyproject.toml examples/pyproject.toml | sha256sum | cut -c1-16)"

# torch and its CUDA wheels (about 3 GB) come from the machine's wheelhouse, which the image
# builds read too (localcluster/wheelhouse.py): downloaded once per machine, not per clone.
fetch_wheels() {
  [ -f "$venv_stamp" ] || .venv/bin/pip install -q --upgrade pip
  PYTHONPATH=operator .venv/bin/python -m monarch_operator.localcluster.wheelhouse
}

install_venv() {
  [ -f "$venv_stamp" ] && return 0
  local wheels
  wheels=$(PYTHONPATH=operator .venv/bin/python -m monarch_operator.localcluster.wheelhouse)
  .venv/bin/pip install -q --no-index --find-links "$wheels" -r "$wheels/requirements.txt"
  .venv/bin/pip install -q -e '.[dev]'
  # The example programs (examples/: rl_kl, torchrun_demo), as their image has them: importable
  # by the launcher and by every worker (loopback test hosts and local-cluster pods share this venv).
  .venv/bin/pip install -q -e examples
  touch "$venv_stamp"
}

build() { bash operator/monarch_operator/localcluster/build-binaries.sh "$@" >/dev/null; }
# -S: the images module is stdlib only and runs while pip fills the venv's site-packages
# (no .pth file read half-written).
images() {
  PYTHONPATH=operator .venv/bin/python -S -m monarch_operator.localcluster.images "$@" >/dev/null
}
# The images that need only the wheelhouse, and the one that needs the node binaries.
wheel_images=(worker operator examples mpi-peer pause)
node_images=(coredns)

# part NAME CMD...: run CMD in the background, its output in $parts/NAME.log; one line when it
# ends (its seconds), and its log's end if it failed.
parts=$(mktemp -d "${TMPDIR:-/tmp}/monarch-setup.XXXXXX")
trap 'rm -rf "$parts"' EXIT
declare -A pid_of=() awaited=()
part() {
  local name="$1"; shift
  log "$name: started"
  (
    t0=$SECONDS
    if "$@" >"$parts/$name.log" 2>&1; then
      log "$name: done in $((SECONDS - t0)) s"
    else
      code=$?
      log "$name: FAILED (exit $code) after $((SECONDS - t0)) s; the end of its output:"
      tail -n 40 "$parts/$name.log" | sed "s/^/[setup] $name| /" >&2
      exit "$code"
    fi
  ) &
  pid_of[$name]=$!
}
# await NAME...: wait for the parts; a failed one ends the set-up with its exit status.
await() {
  local name code
  for name in "$@"; do
    [ -n "${awaited[$name]:-}" ] && continue
    awaited[$name]=1
    code=0
    wait "${pid_of[$name]}" || code=$?
    if [ "$code" != 0 ]; then
      log "set-up failed in part '$name' (see above)"
      exit "$code"
    fi
  done
}

part wheelhouse fetch_wheels
part control-plane build
part node build node
part helm build helm
part kueue build kueue
part scanners bash scripts/install-scanners.sh
# The Debian base needs only apt's debootstrap; the images only the wheelhouse (their pip
# installs read it), not the venv: on a fresh machine they start 6 minutes sooner than after
# the venv's install (2026-12-07). The CoreDNS image copies the node's CoreDNS, so it waits
# for the node.
$with_images && part base images base
await wheelhouse
part venv install_venv
if $with_images; then
  part images images build "${wheel_images[@]}"
  await node
  part coredns-image images build "${node_images[@]}"
fi
await wheelhouse venv control-plane node helm kueue scanners
$with_images && await base images coredns-image
log "ready in $((SECONDS - started)) s"
