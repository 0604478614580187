"""The MonarchJob spec as a typed value, with the CRD's defaults applied.

The CRD schema validates and defaults at admission; :func:`JobSpec.from_body` applies the same
defaults so that builders and tests can take a bare manifest too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.spec.groups import GroupRuleError, Role, WorkerGroup, parse_groups
from monarch_operator.controller.spec.policy import RunPolicy
from monarch_operator.controller.spec.rules import (
    InvalidSpecError,
    check_launcher_rules,
    check_mode_rules,
    kueue_object_label,
    pod_template,
)

# Defaults mirror crds/monarchjobs.monarch-operator.dev.yaml (a unit test compares them).
DEFAULT_REPLICAS = 2
DEFAULT_GPUS_PER_WORKER = 8
DEFAULT_STEPS = 3
DEFAULT_MESH_HOSTS = 1
DEFAULT_STARTUP_TIMEOUT_SECONDS = 600

DEFAULT_PROGRESS_INTERVAL_SECONDS = 10
# spec.cleanupPolicy: what a finished job (Succeeded or Failed) keeps of its children.
# Workers always hold GPUs, so only KeepAll leaves them; the default keeps the launcher pod
# for `kubectl logs`, as Kubernetes Jobs keep theirs.
CLEANUP_DELETE_WORKERS = "DeleteWorkers"  # default: worker pods go, the launcher pod stays
CLEANUP_DELETE_ALL = "DeleteAll"  # every child goes; the job keeps its status
CLEANUP_KEEP_ALL = "KeepAll"  # nothing is deleted (debugging; the workers keep their GPUs)
CLEANUP_POLICIES = (CLEANUP_DELETE_WORKERS, CLEANUP_DELETE_ALL, CLEANUP_KEEP_ALL)
DEFAULT_CLEANUP_POLICY = CLEANUP_DELETE_WORKERS


@dataclass(frozen=True)
class SpmdSpec:
    """``spec.spmd``: a torchrun-style script run by ``monarch-torchrun`` over the workers.

    Exactly one of ``script`` and ``module`` is set; ``nproc_per_node`` ``None`` means one rank
    per GPU of a worker (``spec.workers.gpusPerWorker``).
    """

    script: str | None
    module: str | None
    args: list[str]
    nproc_per_node: int | None


@dataclass(frozen=True)
class JobSpec:
    """What the operator needs from one MonarchJob: identity plus its spec with defaults."""

    name: str
    namespace: str
    uid: str
    generation: int
    image: str
    replicas: int
    gpus_per_worker: int
    trainer_hosts: int
    ref_hosts: int
    colocate: bool
    startup_timeout_seconds: int
    steps: int
    launcher_image: str
    launcher_command: list[str] | None
    worker_template: dict[str, Any] = field(default_factory=dict)
    # spec.launcher: your own program (run by `monarch-launch run`), its arguments, extra env
    # (after the operator's MONARCH_* variables), resources, and a pod template merged last.
    launcher_program: str | None = None
    launcher_args: list[str] = field(default_factory=list)
    launcher_env: list[dict[str, Any]] = field(default_factory=list)
    launcher_resources: dict[str, Any] = field(default_factory=dict)
    launcher_template: dict[str, Any] = field(default_factory=dict)
    # Colocated roles: GPUs per host of each role, None when the job leaves it to the launcher.
    trainer_gpus: int | None = None
    ref_gpus: int | None = None
    spmd: SpmdSpec | None = None
    # spec.suspend: no workers and no launcher while True (field case C10).
    suspend: bool = False
    # spec.runPolicy: restart budgets and exit-code rules (controller/spec/policy.py).
    run_policy: RunPolicy = field(default_factory=RunPolicy)
    # The job's own labels and annotations, passed on to its pods (e.g. Kueue's queue name).
    pod_labels: dict[str, str] = field(default_factory=dict)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    # spec.activeDeadlineSeconds: the whole job, from status.startTime (None: no limit).
    active_deadline_seconds: int | None = None
    # spec.ttlSecondsAfterFinished: the MonarchJob is deleted this long after it finished.
    ttl_seconds_after_finished: int | None = None
    cleanup_policy: str = DEFAULT_CLEANUP_POLICY
    # spec.progress.reportIntervalSeconds: the launcher writes the program's reports at most
    # this often (controller/launch/reported.py, launcher/progress.py).
    progress_interval_seconds: int = DEFAULT_PROGRESS_INTERVAL_SECONDS
    # Kueue (controller/kueue/): labels kueue.x-k8s.io/queue-name and /priority-class. They
    # stay on the job, never on its pods: Kueue would queue each pod on its own (C23).
    queue_name: str | None = None
    priority_class: str | None = None
    # spec.mode: "ssh" (workers run sshd, the launcher starts Monarch over ssh) or "attach"
    # (workers run Monarch's worker loop; a KubernetesJob program attaches, docs/attach.md).
    mode: str = constants.MODE_SSH
    # spec.workerGroups and spec.roles (controller/spec/groups.py, docs/roles.md); empty for a job
    # given by spec.workers and spec.meshes alone.
    worker_groups: tuple[WorkerGroup, ...] = ()
    roles: tuple[Role, ...] = ()
    # spec.managedBy: None or constants.MANAGED_BY_OPERATOR (we run it) or
    # constants.MANAGED_BY_MULTIKUEUE (controller/kueue/multikueue.py: only its Workload here).
    managed_by: str | None = None
    # On a MultiKueue worker's copy: the Workload MultiKueue made for it (annotation, else
    # label kueue.x-k8s.io/prebuilt-workload-name), adopted instead of making one.
    prebuilt_workload: str | None = None
    # Annotation monarch-operator.dev/resume-checkpoint: the checkpoint an attempt without a
    # status.lastCheckpoint of its own starts from (a MultiKueue copy dispatched again).
    resume_checkpoint: str | None = None

    @property
    def groups(self) -> tuple[WorkerGroup, ...]:
        """The job's worker groups in hostfile order: ``spec.workerGroups``, or the one
        unnamed group of ``spec.workers`` (StatefulSet ``<job>-worker``)."""
        if self.worker_groups:
            return self.worker_groups
        return (WorkerGroup(names.LEGACY_GROUP, self.replicas, self.gpus_per_worker,
                            self.image, labelled=False),)

    @property
    def worker_count(self) -> int:
        """Workers of every group together (READY's denominator)."""
        return sum(group.replicas for group in self.groups)

    def worker_pod_names(self) -> list[str]:
        """Every worker pod's name in hostfile order: group by group, ordinal order."""
        return [names.group_pod(self.name, group.name, ordinal)
                for group in self.groups for ordinal in range(group.replicas)]

    def group_of_pod(self, pod_name: str) -> str | None:
        """The name of the group (``spec.workerGroups``) whose worker pod is ``pod_name``;
        None for a job without worker groups or a pod of none of its groups."""
        for group in self.worker_groups:
            if any(names.group_pod(self.name, group.name, ordinal) == pod_name
                   for ordinal in range(group.replicas)):
                return group.name
        return None

    @property
    def attach(self) -> bool:
        """Whether the job runs in attach mode (``spec.mode: attach``)."""
        return self.mode == constants.MODE_ATTACH

    def releases_workers(self, deadline_exceeded: bool) -> bool:
        """Whether the finished job's worker pods go (``spec.cleanupPolicy``): always unless
        KeepAll, and also then when ``deadline_exceeded`` (a deadline releases everything)."""
        return self.cleanup_policy != CLEANUP_KEEP_ALL or deadline_exceeded

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> JobSpec:
        """Build from a MonarchJob object (``dict`` as kopf or the API returns it).

        Raises:
            InvalidSpecError: a missing ``spec.image`` or an invalid ``metadata.name`` (see
                :func:`monarch_operator.names.validate_job_name`).
        """
        metadata = body.get("metadata", {})
        spec = body.get("spec") or {}
        workers = spec.get("workers") or {}
        launcher = spec.get("launcher") or {}
        meshes = spec.get("meshes") or {}
        image = spec.get("image")
        if not image:
            raise InvalidSpecError("spec.image is required: the worker image with sshd and Monarch")
        try:
            names.validate_job_name(metadata["name"])
        except ValueError as error:
            raise InvalidSpecError(str(error)) from error
        check_launcher_rules(spec)
        check_mode_rules(spec)
        try:
            worker_groups, roles = parse_groups(spec, metadata["name"], image, pod_template)
        except GroupRuleError as error:
            raise InvalidSpecError(str(error)) from error
        trainer = meshes.get("trainer") or {}
        ref = meshes.get("ref") or {}
        try:
            run_policy = RunPolicy.from_spec(spec.get("runPolicy"))
        except ValueError as error:
            raise InvalidSpecError(str(error)) from error
        return cls(
            name=metadata["name"],
            namespace=metadata.get("namespace", "default"),
            uid=metadata.get("uid", ""),
            generation=int(metadata.get("generation", 1)),
            image=image,
            replicas=int(workers.get("replicas", DEFAULT_REPLICAS)),
            gpus_per_worker=int(workers.get("gpusPerWorker", DEFAULT_GPUS_PER_WORKER)),
            trainer_hosts=int(trainer.get("hosts", DEFAULT_MESH_HOSTS)),
            ref_hosts=int(ref.get("hosts", DEFAULT_MESH_HOSTS)),
            colocate=bool(meshes.get("colocate", False)),
            startup_timeout_seconds=int(
                spec.get("startupTimeoutSeconds", DEFAULT_STARTUP_TIMEOUT_SECONDS)
            ),
            steps=int(launcher.get("steps", DEFAULT_STEPS)),
            launcher_image=launcher.get("image") or image,
            launcher_command=launcher.get("command"),
            worker_template=pod_template(workers.get("template"), "spec.workers.template"),
            launcher_program=launcher.get("program") or None,
            launcher_args=[str(arg) for arg in launcher.get("args") or []],
            launcher_env=list(launcher.get("env") or []),
            launcher_resources=launcher.get("resources") or {},
            launcher_template=pod_template(launcher.get("template"), "spec.launcher.template"),
            trainer_gpus=_optional_int(trainer.get("gpus")),
            ref_gpus=_optional_int(ref.get("gpus")),
            spmd=_spmd(spec.get("spmd")),
            suspend=bool(spec.get("suspend", False)),
            run_policy=run_policy,
            pod_labels=_passed_on(metadata.get("labels")),
            pod_annotations=_passed_on(metadata.get("annotations")),
            active_deadline_seconds=_optional_int(spec.get("activeDeadlineSeconds")),
            ttl_seconds_after_finished=_optional_int(spec.get("ttlSecondsAfterFinished")),
            cleanup_policy=_cleanup_policy(spec.get("cleanupPolicy")),
            progress_interval_seconds=max(1, int((spec.get("progress") or {}).get(
                "reportIntervalSeconds", DEFAULT_PROGRESS_INTERVAL_SECONDS))),
            queue_name=kueue_object_label(metadata, KUEUE_QUEUE_LABEL),
            priority_class=kueue_object_label(metadata, KUEUE_PRIORITY_LABEL),
            mode=str(spec.get("mode") or constants.MODE_SSH),
            worker_groups=worker_groups,
            roles=roles,
            managed_by=spec.get("managedBy") or None,
            prebuilt_workload=((metadata.get("annotations") or {}).get(KUEUE_PREBUILT_WORKLOAD)
                               or (metadata.get("labels") or {}).get(KUEUE_PREBUILT_WORKLOAD)
                               or None),
            resume_checkpoint=((metadata.get("annotations") or {}).get(
                constants.ANNOTATION_RESUME_CHECKPOINT) or None),
        )

    @property
    def dispatched(self) -> bool:
        """Whether Kueue's MultiKueue runs this job on a worker cluster (``spec.managedBy``)."""
        return self.managed_by == constants.MANAGED_BY_MULTIKUEUE


# Metadata of the job that is about the MonarchJob object itself, not about its pods: kubectl's
# copy of the applied manifest, and the operator's (and kopf's) own bookkeeping.
# Kueue's labels and annotations too: the job is queued as one Workload (controller/kueue/), and
# a pod or StatefulSet carrying the queue name would be queued again on its own (C23).
_NOT_PASSED_ON = ("kubectl.kubernetes.io/", f"{constants.GROUP}/", "kopf.zalando.org/",
                  "kueue.x-k8s.io/")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue's name for a job's ready-made Workload (pkg/controller/constants of Kueue v0.19;
# an annotation with the gate WorkloadIdentifierAnnotations, on by default, else a label).
KUEUE_PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"


def _passed_on(entries: dict[str, Any] | None) -> dict[str, str]:
    """The job's labels or annotations that its pods get too (all but :data:`_NOT_PASSED_ON`)."""
    return {str(key): str(value) for key, value in (entries or {}).items()
            if not str(key).startswith(_NOT_PASSED_ON)}


def _cleanup_policy(value: Any) -> str:
    if value is None:
        return DEFAULT_CLEANUP_POLICY
    if value not in CLEANUP_POLICIES:
        raise InvalidSpecError(
            f"spec.cleanupPolicy {value!r} must be one of {', '.join(CLEANUP_POLICIES)}")
    return str(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _spmd(spmd: dict[str, Any] | None) -> SpmdSpec | None:
    if spmd is None:
        return None
    return SpmdSpec(
        script=spmd.get("script"),
        module=spmd.get("module"),
        args=[str(arg) for arg in spmd.get("args") or []],
        nproc_per_node=_optional_int(spmd.get("nprocPerNode")),
    )
