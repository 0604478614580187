#!/bin/sh
# Entrypoint of the monarch-operator worker image: run sshd in the foreground, in this (the GPU)
# container, as whatever user the pod runs as (non-root by default), on $SSH_PORT (2222).
# A fresh container has an empty /run and no host keys (field case C4, determined #4241), so
# everything sshd needs is created here, in a directory this user can write.
set -eu

SSH_PORT="${SSH_PORT:-2222}"
SSH_LISTEN_ADDRESS="${SSH_LISTEN_ADDRESS:-0.0.0.0}"
SSH_AUTHORIZED_KEYS="${SSH_AUTHORIZED_KEYS:-/etc/monarch/ssh/authorized_keys}"
SSHD_STATE_DIR="${SSHD_STATE_DIR:-${HOME:-/tmp}/.sshd}"
SSHD="${SSHD:-/usr/sbin/sshd}"

mkdir -p "$SSHD_STATE_DIR"
chmod 700 "$SSHD_STATE_DIR"
if [ ! -s "$SSHD_STATE_DIR/ssh_host_ed25519_key" ]; then
  ssh-keygen -q -t ed25519 -N '' -f "$SSHD_STATE_DIR/ssh_host_ed25519_key"
fi
chmod 600 "$SSHD_STATE_DIR/ssh_host_ed25519_key"
# sshd as root insists on its privilege separation directory.
if [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd && chmod 755 /run/sshd; fi
if [ ! -r "$SSH_AUTHORIZED_KEYS" ]; then
  echo "monarch-worker: authorized keys file $SSH_AUTHORIZED_KEYS is missing or unreadable" >&2
  exit 1
fi

cat > "$SSHD_STATE_DIR/sshd_config" <<CONFIG
ListenAddress $SSH_LISTEN_ADDRESS:$SSH_PORT
HostKey $SSHD_STATE_DIR/ssh_host_ed25519_key
PidFile $SSHD_STATE_DIR/sshd.pid
AuthorizedKeysFile $SSH_AUTHORIZED_KEYS
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
# Secret volumes are mounted with kubelet-chosen ownership and modes.
StrictModes no
UseDNS no
X11Forwarding no
PrintMotd no
# Monarch workers need the environment the image sets (PATH, LD_LIBRARY_PATH, CUDA/NCCL).
PermitUserEnvironment no
AcceptEnv LANG LC_* MONARCH_* NCCL_* CUDA_* HF_* PYTHONPATH
CONFIG

echo "monarch-worker: sshd listening on $SSH_LISTEN_ADDRESS:$SSH_PORT as $(id -un)" >&2
exec "$SSHD" -D -e -f "$SSHD_STATE_DIR/sshd_config"
