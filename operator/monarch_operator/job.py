"""The public job API: your own Monarch program on a trainer mesh and a reference-model mesh.

A :class:`Job` gets its hosts from a MonarchJob's launcher pod (``Job.from_env()``), a hostfile,
a host list or a Slurm allocation, places the two roles (separate hosts, or colocated with
disjoint GPU sets), and, as a context manager, gives your controller Monarch objects::

    from monarch.actor import Actor, endpoint
    from monarch_operator.job import Job, RankFailure

    class Policy(Actor):
        @endpoint
        def step(self, batch): ...

    with Job.from_env() as job:              # or Job.from_args(hostfile="hosts", trainer_hosts=2)
        policy = job.trainer.spawn("policy", Policy)      # a ProcMesh: one proc per GPU
        reference = job.ref.spawn("reference", Reference)
        try:
            job.get(policy.step.call(batch))
        except RankFailure as failure:       # role, rank, host, exit_code, traceback
            print(failure.summary)

Entering runs the pre-flight (a reason per failing host), starts one Monarch worker per host over
ssh (so it sees the host's GPUs) and spawns each role's procs with ``CUDA_VISIBLE_DEVICES`` set
to the role's GPUs. Leaving (normally, by an exception, by SIGTERM or SIGHUP) shuts everything
down. ``job.host_meshes`` and ``job.plan`` are there for programs that step down the abstraction
ladder; ``job.ranks[role]`` lists where every rank runs (:class:`RankInfo`).

**Each role a torch.distributed group.** Every proc of a role has ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` (within the role), ``MASTER_ADDR`` (the role's first host)
and ``MASTER_PORT`` (a free port there, one per role) in its environment, so DDP or FSDP inside
an actor needs only :func:`init_process_group` (or torch's own with ``env://``)::

    from monarch_operator.job import init_process_group

    class Policy(Actor):
        def __init__(self):
            init_process_group()             # gloo on CPU, NCCL on GPUs: the trainer's group
            self.model = DistributedDataParallel(make_model())

``job.groups[role]`` (:class:`RoleGroup`) says where each group meets.

**Named roles.** Beyond trainer and ref, a job can have any roles (``--role``, ``--roles``,
``MONARCH_ROLES``, ``Job.from_args(roles=[...])``; :class:`RoleSpec`): ``job.roles[name]`` is
each role's ProcMesh, in start order, a group of its own like the trainer's; a role with
``gpus=0`` runs CPU-only. ``job.trainer`` / ``job.ref`` raise :class:`RoleNotFound` when the
layout has no such role::

    roles = ["generator=2", "trainer=1", "reward=1,gpus=0"]   # or [{"name": ..., "hosts": 2}]
    with Job.from_args(hostfile="hosts", roles=roles) as job:
        generator = job.roles["generator"].spawn("generator", Generator)

**Checkpoint before a stop.** When the job is suspended or evicted (Kueue) while it runs and
its ``runPolicy.checkpointGracePeriodSeconds`` is set, a program that called :func:`on_stop`
gets that long before it is stopped: :func:`stop_requested` turns True (the callback runs),
it saves its state, names it with :func:`checkpoint_saved` and returns. The next attempt finds
the location in :func:`resume_checkpoint`::

    from monarch_operator.job import checkpoint_saved, on_stop, resume_checkpoint, stop_requested

    on_stop()                                  # or on_stop(callback)
    start = load(resume_checkpoint()) if resume_checkpoint() else 0
    for step in range(start, steps):
        train(step)
        if stop_requested():
            checkpoint_saved(save(step))       # "/ckpt/step-120" or "s3://bucket/run/120"
            break

**Progress.** :func:`report` shows how far the program is in the MonarchJob's status and in
``kubectl get monarchjobs`` (STEP, PROGRESS, ETA; ``-o wide`` the first metric)::

    from monarch_operator.job import report

    report(step, total_steps=steps, metrics={"loss": loss}, run_url=wandb.run.url)

Run it with ``monarch-launch run module:function`` (the function receives the entered job), or
``python my_program.py`` with ``Job.from_env()`` / ``Job.from_args(...)``. docs/own-program.md
("Write your own trainer and reference model") walks through it.

**Attach mode.** In a MonarchJob with ``spec.mode: attach`` the workers run Monarch's worker
loop and a program written against Monarch's own ``KubernetesJob`` attaches to the role meshes;
:func:`kubernetes_job` returns that ``KubernetesJob`` with every role mesh added
(docs/attach.md)::

    from monarch_operator.job import kubernetes_job

    state = kubernetes_job().state(cached_path=None)
    policy = state.trainer.spawn_procs(per_host={"procs": 1}).spawn("policy", Policy)

This module is the stable surface: names imported from here keep working across releases of
monarch-operator; the modules under ``monarch_operator.launcher`` may change.
"""

from monarch_operator.launcher.hosts.layout import RoleSpec
from monarch_operator.launcher.hosts.placement import PlacementError, Plan, RoleNotFound, RolePlan
from monarch_operator.launcher.programs.attach import (
    AttachError,
    AttachMesh,
    kubernetes_job,
    parse_meshes,
)
from monarch_operator.launcher.programs.distributed import RoleGroup, init_process_group
from monarch_operator.launcher.programs.job import Job, JobConfig, JobError, RankFailure
from monarch_operator.launcher.programs.rankside import RankInfo
from monarch_operator.launcher.progress import report
from monarch_operator.launcher.session.lifecycle import Terminated, WorkerLost
from monarch_operator.launcher.session.preflight import PreflightError
from monarch_operator.launcher.stoprequest import (
    checkpoint_saved,
    on_stop,
    resume_checkpoint,
    stop_requested,
    wait_for_stop,
)

__all__ = [
    "AttachError",
    "AttachMesh",
    "Job",
    "JobConfig",
    "JobError",
    "PlacementError",
    "Plan",
    "PreflightError",
    "RankFailure",
    "RankInfo",
    "RoleGroup",
    "RoleNotFound",
    "RolePlan",
    "RoleSpec",
    "Terminated",
    "WorkerLost",
    "checkpoint_saved",
    "init_process_group",
    "kubernetes_job",
    "on_stop",
    "parse_meshes",
    "report",
    "resume_checkpoint",
    "stop_requested",
    "wait_for_stop",
]
