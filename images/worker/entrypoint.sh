#!/bin/sh
# Entrypoint of the monarch-operator worker image: run sshd in the foreground, in this (the GPU)
# container, as whatever user the pod runs as (non-root by default), on $SSH_PORT (2222).
# A fresh container has an empty /run and no host keys (field case C4, determined #4241), so
# everything sshd needs is created here, in a directory this user can write.
# Host key: $SSH_HOST_KEY when given (a MonarchJob's worker gets the job's key from its Secret,
# and the launcher pins that key in its known_hosts); otherwise one is generated here.
# sshd logs to the container's stderr without the two lines each readiness probe causes
# (SSHD_LOG_PROBES=1 keeps them).
# Any uid works (field cases C36, C38: OpenShift's restricted-v2 runs the container as an
# arbitrary uid such as 1000680000, with no passwd entry and HOME=/): nothing here comes from
# HOME. sshd's files live in $MONARCH_RUNTIME_DIR/sshd (the operator mounts an emptyDir at
# /run/monarch); a uid the image does not know is given an entry named "monarch"
# ($MONARCH_USER_NAME) with a writable home through nss_wrapper, for sshd, which logs in only
# its own user and needs its name, and for the sessions (ranks calling getpass.getuser(),
# pwd.getpwuid() or writing under ~). launcher/userentry.py does the same for the launcher.
set -eu

SSH_PORT="${SSH_PORT:-2222}"
SSH_LISTEN_ADDRESS="${SSH_LISTEN_ADDRESS:-0.0.0.0}"
SSH_AUTHORIZED_KEYS="${SSH_AUTHORIZED_KEYS:-/etc/monarch/ssh/authorized_keys}"
SSHD="${SSHD:-/usr/sbin/sshd}"
SSH_HOST_KEY="${SSH_HOST_KEY:-}"
UID_NOW="$(id -u)"
if [ -n "${MONARCH_RUNTIME_DIR:-}" ]; then
  RUNTIME_DIR="$MONARCH_RUNTIME_DIR" RUNTIME_DIR_OURS=0
else  # the image run by hand: a folder of this uid's own under /tmp
  RUNTIME_DIR="${TMPDIR:-/tmp}/monarch-$UID_NOW" RUNTIME_DIR_OURS=1
fi
SSHD_STATE_DIR="${SSHD_STATE_DIR:-$RUNTIME_DIR/sshd}"

fail() {
  echo "monarch-worker: $*" >&2
  exit 1
}

# private_dir DIR OURS: DIR, made if missing, must be a directory this uid can write (never a
# symlink); with OURS=1 it must also be this uid's own (not made first by another uid under a
# shared /tmp), mode 0700. The operator's emptyDir is root's, mode 0777: OURS=0.
private_dir() {
  mkdir -p "$1"
  if [ -L "$1" ] || [ ! -d "$1" ] || [ ! -w "$1" ] || [ ! -x "$1" ]; then
    fail "$1 is not a directory uid $UID_NOW can write (MONARCH_RUNTIME_DIR, SSHD_STATE_DIR)"
  fi
  if [ "$2" = 1 ]; then
    [ "$(stat -c %u "$1")" = "$UID_NOW" ] || fail "$1 belongs to another uid than $UID_NOW"
    chmod 700 "$1"
  fi
}

# Field case C38: sshd, ssh-keygen and the sessions' programs need this uid to have a name.
give_this_uid_a_name() {
  name="${MONARCH_USER_NAME:-monarch}"
  gid="$(id -g)"
  lib="${NSS_WRAPPER_LIB:-}"
  if [ -z "$lib" ]; then
    for candidate in /usr/lib/*/libnss_wrapper.so /usr/lib64/libnss_wrapper.so \
        /usr/lib/libnss_wrapper.so; do
      if [ -f "$candidate" ]; then lib="$candidate"; break; fi
    done
  fi
  if [ -z "$lib" ] || [ ! -f "$lib" ]; then
    fail "uid $UID_NOW has no passwd entry and there is no libnss_wrapper.so to give it one" \
      "(install libnss-wrapper in the image, or run as a uid the image knows): sshd cannot" \
      "log in a user without a name"
  fi
  home="${HOME:-}"
  if [ -z "$home" ] || [ "$home" = / ] || [ ! -d "$home" ] || [ ! -w "$home" ]; then
    home="$RUNTIME_DIR/home"
    private_dir "$home" 1
  fi
  shell=/bin/sh
  if [ -x /bin/bash ]; then shell=/bin/bash; fi
  # The image's entries, less any other user of that name, then this uid's.
  awk -F: -v name="$name" '$1 != name' /etc/passwd >"$RUNTIME_DIR/passwd.partial"
  echo "$name:x:$UID_NOW:$gid:$name:$home:$shell" >>"$RUNTIME_DIR/passwd.partial"
  mv -f "$RUNTIME_DIR/passwd.partial" "$RUNTIME_DIR/passwd"
  cp /etc/group "$RUNTIME_DIR/group.partial"
  if ! awk -F: -v gid="$gid" '$3 == gid { found = 1 } END { exit !found }' /etc/group; then
    group_name="$name"
    if awk -F: -v name="$name" '$1 == name { found = 1 } END { exit !found }' /etc/group; then
      group_name="$name-$gid"
    fi
    echo "$group_name:x:$gid:" >>"$RUNTIME_DIR/group.partial"
  fi
  mv -f "$RUNTIME_DIR/group.partial" "$RUNTIME_DIR/group"
  # Colon-separated, so that a user's own LD_PRELOAD stays and no value holds a blank.
  export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
  export NSS_WRAPPER_PASSWD="$RUNTIME_DIR/passwd" NSS_WRAPPER_GROUP="$RUNTIME_DIR/group"
  export HOME="$home"
  echo "monarch-worker: uid $UID_NOW has no passwd entry: named $(id -un), home $home" \
    "(nss_wrapper)" >&2
}

# Files made here are this user's alone; the sessions sshd starts get the umask back.
CONTAINER_UMASK="$(umask)"
umask 077
private_dir "$RUNTIME_DIR" "$RUNTIME_DIR_OURS"
if ! id -un >/dev/null 2>&1; then
  give_this_uid_a_name
fi
private_dir "$SSHD_STATE_DIR" 1
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

SESSION_NSS_ENV=""
if [ -n "${NSS_WRAPPER_PASSWD:-}" ] && [ -n "${NSS_WRAPPER_GROUP:-}" ]; then
  SESSION_NSS_ENV=" \"LD_PRELOAD=${LD_PRELOAD:-}\" \"NSS_WRAPPER_PASSWD=$NSS_WRAPPER_PASSWD\""
  SESSION_NSS_ENV="$SESSION_NSS_ENV \"NSS_WRAPPER_GROUP=$NSS_WRAPPER_GROUP\""
fi
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
# The pod's own environment, saved above (field case C16); nss_wrapper, when this uid needed
# it, so that the sessions know their user too (sshd uses only the first SetEnv line).
SetEnv MONARCH_POD_ENV_FILE=$POD_ENV_FILE$SESSION_NSS_ENV
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
