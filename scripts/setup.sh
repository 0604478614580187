#!/usr/bin/env bash
# One-time set-up on a fresh Debian/Ubuntu machine (idempotent, safe to re-run):
# openssh (sshd for worker pods and SSH tests), util-linux (unshare), what the real nodes need
# from Debian (runc, the CNI plugins, iptables, ipset, conntrack; buildah, debootstrap and gcc
# to build the images), a virtualenv in .venv with monarch-operator and its pinned
# dependencies, and the control-plane and node binaries built from the Go module proxy into
# ~/.cache/monarch-operator (15-30 min the first time, seconds after), and the pinned helm
# client the chart's tests use, and the pinned linters and scanners (hadolint, shellcheck,
# checkov: scripts/scanners.txt) in their own virtualenv there. The images themselves are
# built on first use (monarch-localcluster up --real-nodes, the demo, the e2e tests).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

need_apt=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
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
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# A non-root login user like the worker image's "monarch": tests/images runs the worker
# entrypoint's sshd as this user (non-root sshd logs in only the user it runs as).
id monarch >/dev/null 2>&1 || $SUDO useradd --create-home --shell /bin/bash monarch
command -v go >/dev/null 2>&1 || { log "Go is required (1.26+) to build the control plane"; exit 1; }

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml examples/pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "installing monarch-operator[dev] into .venv (first time: torch + CUDA wheels, several minutes)"
  .venv/bin/pip install -q --upgrade pip
  # torch and its CUDA wheels (about 3 GB) come from the machine's wheelhouse, which the image
  # builds read too (localcluster/wheelhouse.py): downloaded once per machine, not per clone.
  wheels=$(PYTHONPATH=operator .venv/bin/python -m monarch_operator.localcluster.wheelhouse)
  .venv/bin/pip install -q --no-index --find-links "$wheels" -r "$wheels/requirements.txt"
  .venv/bin/pip install -q -e '.[dev]'
  # The example programs (examples/: rl_kl, torchrun_demo), as their image has them: importable by the
  # launcher and by every worker (loopback test hosts and local-cluster pods share this venv).
  .venv/bin/pip install -q -e examples
  touch "$stamp"
fi

log "control-plane binaries"
bash operator/monarch_operator/localcluster/build-binaries.sh >/dev/null
log "node binaries (kubelet, kube-proxy, containerd, CoreDNS, fake GPU plugin)"
bash operator/monarch_operator/localcluster/build-binaries.sh node >/dev/null
log "helm (the chart's tests)"
bash operator/monarch_operator/localcluster/build-binaries.sh helm >/dev/null
log "kueue (the Kueue cluster tests: tests/cluster/test_kueue_*.py)"
bash operator/monarch_operator/localcluster/build-binaries.sh kueue >/dev/null
log "linters and scanners (tests/scan)"
bash scripts/install-scanners.sh >/dev/null
log "ready"
