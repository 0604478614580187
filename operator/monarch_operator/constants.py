"""Constants shared by the operator and the launcher: API coordinates, labels, ports, paths.

Everything here is a plain value; nothing imports kopf, Kubernetes or Monarch.
"""

# API group of MonarchJob. Our own group: monarch.pytorch.org belongs to Monarch's MonarchMesh.
GROUP = "monarch-operator.dev"
# The only served version for now; bump with a conversion plan, never in place.
VERSION = "v1alpha1"
# Plural used in URLs and by kopf.
PLURAL = "monarchjobs"
KIND = "MonarchJob"
API_VERSION = f"{GROUP}/{VERSION}"

# Labels set on every child so that `kubectl get all -l monarch-operator.dev/job=<name>` finds them.
LABEL_JOB = f"{GROUP}/job"
# Which part of the job a pod or child is: "worker" or "launcher".
LABEL_ROLE = f"{GROUP}/role"
ROLE_WORKER = "worker"
ROLE_LAUNCHER = "launcher"
# On the worker pods of a job with spec.workerGroups (and on their StatefulSet and Service): the
# pod's worker group. A job with spec.workers only has one unnamed group and no such label, so
# that its StatefulSet's pod template and selector stay as they were (docs/roles.md).
LABEL_GROUP = f"{GROUP}/group"
# On the launcher pod: the attempt (1, 2, ...) this launcher runs.
LABEL_ATTEMPT = f"{GROUP}/attempt"
# Standard recommended label, value of app.kubernetes.io/managed-by on every child.
MANAGED_BY = "monarch-operator"

# spec.managedBy of a MonarchJob (immutable; docs/kueue.md#multikueue). Absent or our own name:
# this operator runs the job. Kueue's MultiKueue controller name (apis/kueue/v1beta2,
# MultiKueueControllerName): the job is dispatched to a worker cluster; here the operator only
# makes its Workload, and the worker cluster's operator runs the copy.
MANAGED_BY_OPERATOR = f"{GROUP}/monarch-operator"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"

# Annotation on the hostfile ConfigMap: the job uid it was built for (stale-hostfile detection).
ANNOTATION_JOB_UID = f"{GROUP}/job-uid"
# Annotation on a MonarchJob: where its program last saved its state, for an attempt that has
# no status.lastCheckpoint of its own. The MultiKueue manager's operator sets it when a worker
# cluster's copy stopped with a checkpoint (controller/kueue/manager.py); MultiKueue copies
# annotations to the next copy, whose launcher then gets it as MONARCH_CHECKPOINT.
ANNOTATION_RESUME_CHECKPOINT = f"{GROUP}/resume-checkpoint"

# sshd listens here inside every worker container (non-root, so above 1024).
SSH_PORT = 2222
# Port each Monarch worker (run_worker_loop_forever) binds on its host; same for every host
# because SSHJob takes one port for all hosts.
MONARCH_WORKER_PORT = 22222

# Where the launcher pod finds its inputs (mount paths of the hostfile ConfigMap and key Secret).
HOSTFILE_DIR = "/etc/monarch/hostfile"
HOSTFILE_KEY = "hostfile"
# Beside the hostfile: each worker's name and the pod IP it had when the attempt's launcher was
# made ("<fqdn> <ip>" per line, ordinal order); the launcher waits until each name resolves to
# it, so a recreated worker is never reached at its old address (field case C20).
ADDRESSES_KEY = "addresses"
SSH_DIR = "/etc/monarch/ssh"
SSH_PRIVATE_KEY = "id_ed25519"
SSH_PUBLIC_KEY = "id_ed25519.pub"
SSH_AUTHORIZED_KEYS = "authorized_keys"
# The job's sshd host key (every worker of the job presents it) and the known_hosts file that
# pins it for the launcher: one line for every worker name of the job (see docs/security.md).
SSH_HOST_KEY = "ssh_host_ed25519_key"
SSH_HOST_PUBLIC_KEY = "ssh_host_ed25519_key.pub"
SSH_KNOWN_HOSTS = "known_hosts"
# A per-pod emptyDir in every worker and launcher container, writable whatever uid the pod runs
# as (field case C38): the worker entrypoint keeps sshd's files under its "sshd" folder, and a
# uid the image's passwd does not know gets its passwd entry and its home ("home") there
# (launcher/userentry.py). Never derived from HOME, which is "/" for such a uid.
RUNTIME_DIR = "/run/monarch"
ENV_RUNTIME_DIR = "MONARCH_RUNTIME_DIR"
# The entrypoint's sshd state directory (host key copy, sshd_config, pid file, pod-env.json).
SSHD_STATE_DIR = f"{RUNTIME_DIR}/sshd"

# spec.mode: how the launcher reaches the workers. "ssh" (the default): each worker runs sshd and
# the launcher starts Monarch workers over ssh (Monarch's SSHJob). "attach": each worker runs
# Monarch's worker loop itself and a program written against Monarch's KubernetesJob attaches
# to the role meshes (docs/attach.md).
MODE_SSH = "ssh"
MODE_ATTACH = "attach"
MODES = (MODE_SSH, MODE_ATTACH)
# Attach mode: the worker loop's port, Monarch KubernetesJob's default (_DEFAULT_MONARCH_PORT),
# given to the worker as a literal MONARCH_PORT in its first container, the one place
# KubernetesJob reads it from (it ignores valueFrom).
MONARCH_ATTACH_PORT = 26600
ENV_MONARCH_PORT = "MONARCH_PORT"
# Attach mode, on the worker: the DNS domain of its headless Service
# (<service>.<namespace>.svc.<cluster domain>); the worker advertises <hostname>.<domain>.
ENV_WORKER_DOMAIN = "MONARCH_WORKER_DOMAIN"
# Attach mode, on each worker pod: its rank in a role's mesh, label <GROUP>/<mesh>-rank (set by
# the operator in hostfile order; a pod of two colocated roles carries both).
RANK_LABEL_SUFFIX = "-rank"
# Attach mode: pods in the job's namespace labelled <GROUP>/attach-to=<job> may reach its
# workers through the job's NetworkPolicy (a Monarch client outside the job, docs/attach.md).
LABEL_ATTACH_TO = f"{GROUP}/attach-to"

# Resource name Kubernetes uses for NVIDIA GPUs (device plugin).
GPU_RESOURCE = "nvidia.com/gpu"

# Environment variables the operator sets on the launcher and monarch-launch reads as defaults.
ENV_HOSTFILE = "MONARCH_HOSTFILE"
ENV_HOST_ADDRESSES = "MONARCH_HOST_ADDRESSES"
ENV_SSH_KEY = "MONARCH_SSH_KEY"
ENV_SSH_PORT = "MONARCH_SSH_PORT"
# known_hosts file the launcher checks every worker's host key against (strict checking).
ENV_KNOWN_HOSTS = "MONARCH_KNOWN_HOSTS"
ENV_TRAINER_HOSTS = "MONARCH_TRAINER_HOSTS"
ENV_REF_HOSTS = "MONARCH_REF_HOSTS"
ENV_COLOCATE = "MONARCH_COLOCATE"
ENV_CLIENT_ADDRESS = "MONARCH_CLIENT_ADDRESS"
# Attach mode: the role meshes as a JSON list (status.meshes: role, meshName, labelSelector,
# podRankLabel, replicas, port) and the namespace to give Monarch's KubernetesJob.
ENV_OPERATOR_MESHES = "MONARCH_OPERATOR_MESHES"
ENV_OPERATOR_NAMESPACE = "MONARCH_OPERATOR_NAMESPACE"
# How long each name of MONARCH_HOST_ADDRESSES must keep resolving to its address before the
# launcher connects, seconds (default 30, one DNS cache lifetime; field case C20).
ENV_DNS_STABLE = "MONARCH_DNS_STABLE"
# Colocated roles only, and only when the job gives them: each role's GPUs per host.
ENV_TRAINER_GPUS = "MONARCH_TRAINER_GPUS"
ENV_REF_GPUS = "MONARCH_REF_GPUS"
ENV_ROLES = "MONARCH_ROLES"
# The MonarchJob a launcher pod belongs to, for programs that label their own output or metrics.
ENV_JOB_NAME = "MONARCH_JOB_NAME"
ENV_NAMESPACE = "MONARCH_JOB_NAMESPACE"
# The attempt the launcher pod runs: 1 for the first, n+1 after n restarts (status.attempt).
ENV_ATTEMPT = "MONARCH_ATTEMPT"
# The MonarchJob's uid: with the attempt, it marks every process an attempt starts on the
# workers, so that the next attempt's pre-flight stops what this one left (issue 20).
ENV_JOB_UID = "MONARCH_JOB_UID"
# Restarts after failures before this attempt (status.restartCount when it started; a resume
# after a suspend is not one), and the most the run policy allows (backoffLimit +
# infrastructureBackoffLimit): monarch-torchrun gives them to every rank as
# TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS (field case C21).
ENV_RESTART_COUNT = "MONARCH_RESTART_COUNT"
ENV_MAX_RESTARTS = "MONARCH_MAX_RESTARTS"
# Checkpoint before a stop (launcher/stoprequest.py): runPolicy.checkpointGracePeriodSeconds
# when above 0, and the last checkpoint an earlier attempt's launcher named (status.lastCheckpoint).
ENV_STOP_GRACE = "MONARCH_STOP_GRACE_SECONDS"
ENV_CHECKPOINT = "MONARCH_CHECKPOINT"
# Progress in status (launcher/progress.py): the ConfigMap the launcher writes the program's
# reports to (its own job's, the only object its ServiceAccount may write), and at most how
# often, seconds (spec.progress.reportIntervalSeconds).
ENV_PROGRESS_CONFIGMAP = "MONARCH_PROGRESS_CONFIGMAP"
ENV_PROGRESS_INTERVAL = "MONARCH_PROGRESS_INTERVAL_SECONDS"
# runPolicy.progressDeadlineSeconds: the launcher dumps its stacks and stops a stalled run.
ENV_PROGRESS_DEADLINE = "MONARCH_PROGRESS_DEADLINE_SECONDS"
PROGRESS_REPORT_KEY = "progress.json"  # the ConfigMap's key the launcher writes
# The same ConfigMap's key holding the ranks' last stack dump (launcher/programs/spmdstacks.py;
# `kubectl monarch stacks` reads it, also once the pods are gone). Its first line is
# STACKS_DUMP_HEADER, the attempt, the moment and why it was taken.
STACKS_DUMP_KEY = "stacks.txt"
STACKS_DUMP_HEADER = "# monarch stacks"
# Where a MonarchJob's SPMD launcher keeps its pid while it takes dumps on request, so that
# `kubectl monarch stacks` signals it (kubectl exec has the launcher container's environment;
# pid 1 is not the launcher where pods share a PID namespace or an init runs first).
STACKS_PID_FILE = "/tmp/monarch-launcher-${MONARCH_JOB_UID}-${MONARCH_ATTEMPT}.pid"
# A program's report as one output line from any rank: this marker, then a JSON object.
PROGRESS_LINE_MARKER = "MONARCH_PROGRESS "
# The launcher pod variables the operator owns; spec.launcher.env may not set them (CRD rule,
# which lists the same names: a unit test keeps the two equal). Other MONARCH_* names stay the
# user's: Monarch's own MONARCH_FILE_LOG, the launcher's MONARCH_TERMINATION_LOG and so on.
LAUNCHER_RESERVED_ENV = (
    "POD_IP",
    ENV_JOB_NAME,
    ENV_NAMESPACE,
    ENV_ATTEMPT,
    ENV_JOB_UID,
    ENV_RESTART_COUNT,
    ENV_MAX_RESTARTS,
    ENV_STOP_GRACE,
    ENV_CHECKPOINT,
    ENV_PROGRESS_CONFIGMAP,
    ENV_PROGRESS_INTERVAL,
    ENV_PROGRESS_DEADLINE,
    ENV_HOSTFILE,
    ENV_HOST_ADDRESSES,
    ENV_SSH_KEY,
    ENV_SSH_PORT,
    ENV_KNOWN_HOSTS,
    ENV_TRAINER_HOSTS,
    ENV_REF_HOSTS,
    ENV_COLOCATE,
    ENV_TRAINER_GPUS,
    ENV_REF_GPUS,
    ENV_ROLES,
    ENV_CLIENT_ADDRESS,
    ENV_OPERATOR_MESHES,
    ENV_OPERATOR_NAMESPACE,
)

# Set by the worker entrypoint for every ssh session (sshd SetEnv): a JSON object holding the
# worker container's own environment, because sshd starts sessions with a clean one (field
# case C16). Workers started over ssh load it.
ENV_POD_ENV_FILE = "MONARCH_POD_ENV_FILE"
# Its file name inside the entrypoint's sshd state directory.
POD_ENV_FILE_NAME = "pod-env.json"
