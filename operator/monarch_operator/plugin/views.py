"""Pure: what ``kubectl monarch`` shows, from objects as kubectl returns them (no I/O).

Ranks are placed as the launcher places them (:func:`.placement.plan_placement` over the job's
hostfile, workers in ordinal order): role mode gives each role's ranks on its mesh's hosts, one
per GPU, host by host; SPMD mode gives ranks ``ordinal * nproc + local`` on worker ``ordinal``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from monarch_operator import names
from monarch_operator.controller.builders.hostfile import hostfile_hosts
from monarch_operator.controller.spec.groups import role_ordinals
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st
from monarch_operator.launcher.hosts.placement import plan_placement

# A rank's output line in SPMD mode: "[role/host/rank] text" (launcher/programs/spmd_actor.py).
_SPMD_LINE = re.compile(r"^\[(?P<role>[^/\]]+)/(?P<host>[^/\]]+)/(?P<rank>\d+)\] ")
# Role mode: the launcher's and the example's lines that name a rank ("trainer rank 3/4 ...",
# "placement trainer rank=3 ...").
_ROLE_LINE = re.compile(r"\b(?P<role>[a-z][\w-]*) rank[= ](?P<rank>\d+)\b")


@dataclass(frozen=True)
class RankPlace:
    """Where one rank runs: its role, rank, worker ordinal, local rank and GPU index."""

    role: str
    rank: int
    ordinal: int
    local_rank: int
    gpu: int


def rank_places(body: dict[str, Any], settings: Settings | None = None) -> list[RankPlace]:
    """Every rank of the job, role by role (trainer, ref; or ``spmd``), in rank order.

    Raises:
        monarch_operator.launcher.hosts.placement.PlacementError: the spec cannot be placed
            (the operator would have refused it).
    """
    job = JobSpec.from_body(body)
    settings = settings or Settings()
    hosts = hostfile_hosts(job, settings)
    ordinal_of = {host.name: index for index, host in enumerate(hosts)}
    if job.roles:
        return _role_places(job)
    if job.spmd is not None:
        per_node = job.spmd.nproc_per_node or job.gpus_per_worker
        return [RankPlace("spmd", ordinal * per_node + local, ordinal, local, local)
                for ordinal in range(job.replicas) for local in range(per_node)]
    plan = plan_placement(hosts, job.trainer_hosts, job.ref_hosts, job.colocate,
                          job.trainer_gpus, job.ref_gpus)
    places = []
    for role in plan.roles:
        mesh = plan.mesh(role.mesh)
        gpus = role.gpus or tuple(range(role.procs_per_host))
        for host_index, host in enumerate(mesh.hosts[:role.hosts]):
            for local in range(role.procs_per_host):
                places.append(RankPlace(role.role, host_index * role.procs_per_host + local,
                                        ordinal_of[host], local, gpus[local]))
    return places


def _role_places(job: JobSpec) -> list[RankPlace]:
    """Ranks of a job with ``spec.roles`` (docs/roles.md): each role's workers from
    :func:`.groups.role_ordinals`, ``procs`` (else ``gpus``, else the group's slots) ranks per
    host; a role colocated with another counts its GPUs after those of the roles before it in
    that set (a display: the launcher places them). ``ordinal`` is the worker's index in the
    hostfile (every group's workers, group by group)."""
    first, count = {}, 0  # group -> hostfile index of its worker 0
    for group in job.groups:
        first[group.name], count = count, count + group.replicas
    by_group = {group.name: group for group in job.groups}
    gpu_offset: dict[str, int] = {}
    places = []
    for role, ordinals in zip(job.roles, role_ordinals(job.worker_groups, job.roles).values(),
                              strict=True):
        base = role.colocate_with or role.name
        offset = gpu_offset.get(base, 0)
        gpu_offset[base] = offset + (role.gpus or 0)
        per_host = role.procs or role.gpus or by_group[role.group].slots
        for host_index, ordinal in enumerate(ordinals):
            index = first[role.group] + ordinal
            places += [RankPlace(role.name, host_index * per_host + local, index, local,
                                 offset + local) for local in range(per_host)]
    return places


def find_rank(places: list[RankPlace], rank: int, role: str | None) -> RankPlace:
    """The place of ``rank`` of ``role`` (default: the trainer, or the SPMD ranks).

    Raises:
        LookupError: no such rank, naming the ranks the role has.
    """
    wanted = role if role is not None else (places[0].role if places else "trainer")
    matching = [place for place in places if place.role == wanted]
    for place in matching:
        if place.rank == rank:
            return place
    raise LookupError(f"{wanted} has no rank {rank} (ranks 0..{len(matching) - 1})")


def finished(body: dict[str, Any]) -> bool:
    """Whether the job ended (Succeeded or Failed, :func:`.status.is_finished`): its workers
    are released unless ``cleanupPolicy: KeepAll`` kept them."""
    return st.is_finished(body.get("status") or {})


def releases_workers(body: dict[str, Any]) -> bool:
    """Whether the job finished and its worker pods go (:meth:`.JobSpec.releases_workers`, as
    :func:`.release.clean_up` does)."""
    return finished(body) and JobSpec.from_body(body).releases_workers(
        st.reason_of(body.get("status") or {}, st.FAILED) == st.REASON_DEADLINE_EXCEEDED)


def hosts_table(body: dict[str, Any], pods: list[dict[str, Any]],
                settings: Settings | None = None) -> list[list[str]]:
    """Rows ``ROLE RANK HOST POD NODE GPU`` (header first): rank -> host -> pod -> node.

    A pod that is gone is ``(released)`` once the job finished (its workers deleted), else
    ``(missing)``. A pod still there is ``(releasing)`` when the finished job's workers are
    to go (:func:`releases_workers`: the operator deleted their StatefulSet, the pods follow
    within their grace period), ``(terminating)`` when it is being deleted before that (as
    ``kubectl get pods`` shows ``Terminating``); its node is still shown."""
    job = JobSpec.from_body(body)
    settings = settings or Settings()
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    # A finished job's workers are released (deleted): not missing.
    gone = "released" if finished(body) else "missing"
    releasing = releases_workers(body)
    rows = [["ROLE", "RANK", "LOCAL", "HOST", "POD", "NODE", "GPU"]]
    pod_names = job.worker_pod_names()
    hosts = hostfile_hosts(job, settings)
    for place in rank_places(body, settings):
        pod_name = pod_names[place.ordinal]
        pod = by_name.get(pod_name) or {}
        rows.append([place.role, str(place.rank), str(place.local_rank),
                     hosts[place.ordinal].name,
                     f"{pod_name} ({gone})" if not pod else
                     f"{pod_name} (releasing)" if releasing else
                     f"{pod_name} (terminating)" if pod["metadata"].get("deletionTimestamp")
                     else pod_name,
                     str((pod.get("spec") or {}).get("nodeName") or "-"), str(place.gpu)])
    return rows


def attempts_table(status: dict[str, Any]) -> list[list[str]]:
    """Rows ``ATTEMPT CLASS REASON EXIT ROLE RANK HOST STARTED ENDED`` (header first)."""
    rows = [["ATTEMPT", "CLASS", "REASON", "EXIT", "FAILING", "STARTED", "ENDED",
             "LAST STEP", "CHECKPOINT"]]
    for record in status.get("attempts") or []:
        failing = ""
        if record.get("rank") is not None:
            failing = f"{record.get('role') or 'rank'} {record['rank']}"
            if record.get("host"):
                failing += f" on {str(record['host']).split('.')[0]}"
        rows.append([str(record.get("number", "")),
                     str(record.get("class") or ("running" if not record.get("endTime")
                                                 else "")),
                     str(record.get("reason") or ""),
                     "" if record.get("exitCode") is None else str(record["exitCode"]),
                     failing, str(record.get("startTime") or ""),
                     str(record.get("endTime") or ""),
                     "" if record.get("lastStep") is None else str(record["lastStep"]),
                     str(record.get("checkpoint") or "")])
    return rows


def status_lines(body: dict[str, Any]) -> list[str]:
    """The job's state in a few lines: phase and message, workers, restarts, queue, the
    program's last progress report, the last checkpoint."""
    status = body.get("status") or {}
    meta = body["metadata"]
    lines = [f"{meta.get('namespace')}/{meta['name']}: {status.get('phase') or 'Pending'}"
             + (f": {status['message']}" if status.get("message") else ""),
             f"attempt {status.get('attempt', 1)}, restarts {status.get('restartCount', 0)}, "
             f"workers Ready {status.get('readyWorkers') or '-'}"]
    queue = status.get("queue") or {}
    if queue.get("name"):
        lines.append(f"queue {queue['name']} (Workload {queue.get('workload')}), queued "
                     f"{queue.get('queuedSeconds', 0)}s, admissions {queue.get('admissions', 0)}")
    progress = status.get("progress") or {}
    if progress.get("step") is not None:
        total = f"/{progress['totalSteps']}" if progress.get("totalSteps") else ""
        extra = [f"{progress['percent']}" if progress.get("percent") else "",
                 f"{progress['stepsPerSecond']:g} steps/s" if progress.get("stepsPerSecond")
                 else "", f"ETA {progress['eta']}" if progress.get("eta") else "",
                 ", ".join(f"{metric['name']}={metric['value']}"
                           for metric in progress.get("metrics") or [])]
        lines.append(f"progress: step {progress['step']}{total} (attempt "
                     f"{progress.get('attempt')}, reported {progress.get('lastUpdatedTime')})"
                     + "".join(f"; {item}" for item in extra if item))
        if progress.get("runURL"):
            lines.append(f"run {progress['runURL']}")
    if (status.get("lastCheckpoint") or {}).get("location"):
        lines.append(f"last checkpoint {status['lastCheckpoint']['location']} (attempt "
                     f"{status['lastCheckpoint'].get('attempt')})")
    return lines


def launcher_pod_name(body: dict[str, Any], attempt: int | None) -> str:
    """The launcher pod of ``attempt`` (default: the current one), as the status records it."""
    status = body.get("status") or {}
    number = attempt or int(status.get("attempt") or 1)
    for record in status.get("attempts") or []:
        if record.get("number") == number and record.get("launcherPod"):
            return str(record["launcherPod"])
    return names.launcher_pod(body["metadata"]["name"], number)


def no_launcher_message(body: dict[str, Any], attempt: int | None, pod: str) -> str:
    """Why ``kubectl monarch logs`` has nothing to show when launcher pod ``pod`` does not
    exist: the job has not started one yet (its phase and message say why), or the attempt's
    launcher pod is gone (the status keeps its last lines); instead of kubectl's NotFound."""
    status = body.get("status") or {}
    name = body["metadata"]["name"]
    number = attempt or int(status.get("attempt") or 1)
    record = next((entry for entry in status.get("attempts") or []
                   if entry.get("number") == number), {})
    phase = str(status.get("phase") or "Pending")
    because = f" ({status['message']})" if status.get("message") else ""
    if record.get("launchTime"):
        return (f"launcher pod {pod} of job {name} (attempt {number}) no longer exists: phase "
                f"{phase}{because}; its last lines are in the attempt's record "
                f"(kubectl get monarchjob {name} -o jsonpath='{{.status.attempts}}'), see "
                f"kubectl monarch status {name}")
    return (f"job {name} has no launcher pod yet: phase {phase}{because}, see kubectl monarch "
            f"status {name}")


def filter_lines(lines: Iterable[str], role: str | None, rank: int | None) -> Iterable[str]:
    """The lines of the launcher's output that belong to ``role`` and/or ``rank`` (both None:
    every line). A rank's line is ``[role/host/rank] ...`` (SPMD) or names ``<role> rank N``."""
    for line in lines:
        if role is None and rank is None:
            yield line
            continue
        found = _SPMD_LINE.match(line) or _ROLE_LINE.search(line)
        if found is None:
            continue
        if role is not None and found["role"] != role:
            continue
        if rank is not None and int(found["rank"]) != rank:
            continue
        yield line


def table(rows: list[list[str]]) -> str:
    """Rows as kubectl prints them: columns padded to their widest cell, three spaces apart."""
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip() for row in rows)
