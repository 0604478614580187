#!/bin/sh
# Entrypoint of the monarch-operator worker image: run sshd in the foreground, in this (the GPU)
# container, as whatever user the pod runs as (non-root by default), on $SSH_PORT (2222).
# A fresh container has an empty /run and no host keys (field case C4, determined #4241), so
# everything sshd needs is created here, in a directory this user can write.
# Host key: $SSH_HOST_KEY when given (a MonarchJob's worker gets the job's key from its Secret,
# and the launcher pins that key in its known_hosts); otherwise one is generated here.
# sshd logs to the container's stderr without the two lines each readiness probe causes
# (SSHD_LOG_PROBES=1 keeps them).
set -eu

SSH_PORT="${SSH_PORT:-2222}"
SSH_LISTEN_ADDRESS="${SSH_LISTEN_ADDRESS:-0.0.0.0}"
SSH_AUTHORIZED_KEYS="${SSH_AUTHORIZED_KEYS:-/etc/monarch/ssh/authorized_keys}"
SSHD_STATE_DIR="${SSHD_STATE_DIR:-${HOME:-/tmp}/.sshd}"
SSHD="${SSHD:-/usr/sbin/sshd}"
SSH_HOST_KEY="${SSH_HOST_KEY:-}"

# Files made here are this user's alone; the sessions sshd starts get the umask back.
CONTAINER_UMASK="$(umask)"
umask 077
mkdir -p "$SSHD_STATE_DIR"
chmod 700 "$SSHD_STATE_DIR"
HOST_KEY_FILE="$SSHD_STATE_DIR/ssh_host_ed25519_key"
if [ -n "$SSH_HOST_KEY" ]; then
  if [ ! -r "$SSH_HOST_KEY" ] || [ ! -s "$SSH_HOST_KEY" ]; then
    echo "monarch-worker: host key file $SSH_HOST_KEY (SSH_HOST_KEY) is missing, empty or" \
      "unreadable as $(id -un) (uid $(id -u), groups $(id -G))" >&2
    exit 1
  fi
  # sshd refuses a host key that its group can read, and a kubelet mounts Secret files under
  # fsGroup group-readable (0440/0640): install a private copy, owned by this user, mode 0600.
  cp "$SSH_HOST_KEY" "$HOST_KEY_FILE.partial"
  chmod 600 "$HOST_KEY_FILE.partial"
  mv -f "$HOST_KEY_FILE.partial" "$HOST_KEY_FILE"
  if ! ssh-keygen -y -f "$HOST_KEY_FILE" >/dev/null 2>&1; then
    echo "monarch-worker: host key file $SSH_HOST_KEY (SSH_HOST_KEY) is not an unencrypted" \
      "OpenSSH private key" >&2
    exit 1
  fi
elif [ ! -s "$HOST_KEY_FILE" ]; then
  ssh-keygen -q -t ed25519 -N '' -f "$HOST_KEY_FILE"
fi
chmod 600 "$HOST_KEY_FILE"
# sshd as root insists on its privilege separation directory.
if [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd && chmod 755 /run/sshd; fi
if [ ! -r "$SSH_AUTHORIZED_KEYS" ]; then
  echo "monarch-worker: authorized keys file $SSH_AUTHORIZED_KEYS is missing or unreadable" >&2
  exit 1
fi

# Field case C16: sshd starts every session with a clean environment, so what the pod sets
# (spec.workers.template env) and what the image sets would never reach the ranks. Save this
# container's environment as a JSON object; sessions find it through SetEnv below and the
# worker loads it. Left out: per-process shell state and this script's own sshd settings.
POD_ENV_FILE="$SSHD_STATE_DIR/pod-env.json"
if ! command -v python3 >/dev/null 2>&1; then
  echo "monarch-worker: python3 is needed to save the pod environment to $POD_ENV_FILE" >&2
  exit 1
fi
# `env -0` lists exactly what this container was started with (Python could add LC_CTYPE).
env -0 | python3 -I -c '
import json, os, sys
skip = {"HOME", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "_", "TERM",
        "SSHD", "SSH_LISTEN_ADDRESS", "SSH_PORT", "SSH_AUTHORIZED_KEYS", "SSH_HOST_KEY",
        "SSHD_LOG_PROBES"}
environment = {}
for entry in sys.stdin.buffer.read().split(b"\0"):
    name, sep, value = entry.decode("utf-8", "surrogateescape").partition("=")
    if sep and name not in skip and not name.startswith(("SSH_", "SSHD_")):
        environment[name] = value
path = sys.argv[1]
partial = path + ".partial"
fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as out:
    json.dump(environment, out, sort_keys=True)
    out.write("\n")
os.chmod(partial, 0o600)
os.replace(partial, path)
' "$POD_ENV_FILE"

cat > "$SSHD_STATE_DIR/sshd_config" <<CONFIG
ListenAddress $SSH_LISTEN_ADDRESS:$SSH_PORT
HostKey $HOST_KEY_FILE
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
# The pod's own environment, saved above (field case C16).
SetEnv MONARCH_POD_ENV_FILE=$POD_ENV_FILE
# Keepalives (issue 20): a launcher gone silent (its node lost, a NAT that forgot the flow) is
# dropped after 15 s x 4 = 60 s, which closes the session and so ends its Monarch worker; an
# idle session sends something every 15 s. The launcher's ssh uses the same values.
ClientAliveInterval 15
ClientAliveCountMax 4
CONFIG

echo "monarch-worker: sshd listening on $SSH_LISTEN_ADDRESS:$SSH_PORT as $(id -un)" >&2
umask "$CONTAINER_UMASK"
if [ "${SSHD_LOG_PROBES:-0}" = 1 ]; then
  exec "$SSHD" -D -e -f "$SSHD_STATE_DIR/sshd_config"
fi
# The readiness probe opens and closes a TCP connection every periodSeconds; sshd logs two lines
# for each (1800 an hour), burying the lines that matter. Drop exactly those: a connection closed
# (or reset, when sshd's banner reached the prober before it closed) before the ssh handshake
# began. A client that fails to log in is still logged ("Connection closed by authenticating
# user ..."), as is everything else. SSHD_LOG_PROBES=1 keeps them all. sshd stays the
# container's main process (exec) unless a stop grace period is set (below); the filter ends
# with it.
log_pipe="$SSHD_STATE_DIR/sshd.log.pipe"
rm -f "$log_pipe"
mkfifo -m 600 "$log_pipe"
cr=$(printf '\r')  # sshd -e ends its lines with CR LF
grep --line-buffered -v -E \
  "^(kex_exchange_identification: (Connection closed by remote host|read: Connection reset by peer)|Connection (closed|reset) by [0-9a-fA-F.:]+ port [0-9]+)$cr?\$" \
  <"$log_pipe" >&2 &
STOP_GRACE="${MONARCH_STOP_GRACE_SECONDS:-0}"
case "$STOP_GRACE" in ''|*[!0-9]*) STOP_GRACE=0 ;; esac
if [ "$STOP_GRACE" -eq 0 ]; then
  exec "$SSHD" -D -e -f "$SSHD_STATE_DIR/sshd_config" 2>"$log_pipe"
fi
# Checkpoint before a stop (MONARCH_STOP_GRACE_SECONDS, from the job's
# runPolicy.checkpointGracePeriodSeconds): a drain, a preemption or a deletion sends this
# container SIGTERM while its Monarch workers (children of sshd's sessions) may be saving the
# job's state for a launcher that was asked to stop. So sshd runs as a child here, and on
# SIGTERM the container stays while any ssh session is open, for at most that many seconds;
# then sshd is stopped. No session open: it stops at once, as without the variable.
"$SSHD" -D -e -f "$SSHD_STATE_DIR/sshd_config" 2>"$log_pipe" &
sshd_pid=$!
stopping=0
trap 'stopping=1' TERM INT
wait "$sshd_pid" && status=0 || status=$?
if [ "$stopping" = 0 ]; then
  exit "$status"  # sshd ended by itself
fi
sessions() {  # sshd's children: one per open ssh connection
  python3 -I -c '
import os, sys
parent, count = sys.argv[1], 0
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/status") as status:
                count += any(line.split()[1:2] == [parent] for line in status
                             if line.startswith("PPid:"))
        except OSError:
            pass
print(count)
' "$sshd_pid"
}
deadline=$(( $(date +%s) + STOP_GRACE ))
open_sessions=$(sessions)
if [ "$open_sessions" -gt 0 ]; then
  echo "monarch-worker: SIGTERM with $open_sessions ssh session(s) open: staying up to" \
    "${STOP_GRACE}s while they end (MONARCH_STOP_GRACE_SECONDS)" >&2
fi
while [ "$open_sessions" -gt 0 ] && [ "$(date +%s)" -lt "$deadline" ]; do
  sleep 1
  open_sessions=$(sessions)
done
if [ "$open_sessions" -gt 0 ]; then
  echo "monarch-worker: ${STOP_GRACE}s passed with $open_sessions ssh session(s) open;" \
    "stopping sshd" >&2
fi
kill -TERM "$sshd_pid" 2>/dev/null || true
wait "$sshd_pid" || true
exit 0
