"""Where a batch's "submit -> workers Ready" goes, step by step, from the API server's audit log
of a ``bench/operator_scale.py --state-dir DIR`` run (issue 36 item 4)::

    .venv/bin/python bench/worker_timeline.py DIR/logs/audit.log --kind monarchjobs
    .venv/bin/python bench/worker_timeline.py DIR/logs/audit.log --kind mpijobs

Per job (p50 / p95 / max seconds over the batch's jobs): submit -> the operator's first create
for it, -> its worker pods created (by the StatefulSet controller for ours, by the operator
itself for the MPI Operator), -> bound by the scheduler, -> the first and the last status patch
of the pod (kwok's simulated kubelet: Running with an IP, then Ready). Worker pods are
``<job>-worker-<n>`` for both operators. Only writes are in the log (its policy:
``localcluster/cluster.py``, ``AUDIT_POLICY``), which is all this needs.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import statistics
import sys
from pathlib import Path


def _seconds(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _job_of(pod: str) -> str:
    return pod.rsplit("-worker", 1)[0]


def steps(audit_log: Path, kind: str) -> dict[str, list[float]]:
    """Seconds per job for each step (see the module's docstring), from ``audit_log`` (JSON
    lines of ``audit.k8s.io/v1`` Events); jobs of resource ``kind`` (``monarchjobs``)."""
    submitted: dict[str, float] = {}
    creates: list[tuple[str, str, float]] = []  # (user, name, when) of every other create
    created: dict[str, list[float]] = collections.defaultdict(list)
    bound: dict[str, float] = {}
    patched: dict[str, list[float]] = collections.defaultdict(list)
    operator_users: set[str] = set()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if event.get("stage") != "ResponseComplete" or not ref:
            continue
        # Both operators' jobs may share a cluster (and job names): namespace/name throughout.
        at, verb = _seconds(event["requestReceivedTimestamp"]), event["verb"]
        name = f"{ref.get('namespace', '')}/{ref.get('name', '')}"
        resource, subresource = ref.get("resource"), ref.get("subresource")
        user = event["user"]["username"]
        if resource == kind and verb == "create" and subresource is None:
            submitted.setdefault(name, at)
        elif resource == kind and verb in ("patch", "update") and subresource == "status":
            operator_users.add(user)  # the operator writes its jobs' status
        elif resource == "pods" and "-worker-" in name:
            if verb == "create" and subresource is None:
                created[_job_of(name)].append(at)
            elif subresource == "binding":
                bound.setdefault(name, at)
            elif subresource == "status" and verb == "patch":
                patched[name].append(at)
        if verb == "create" and resource not in (kind, "events") and subresource is None:
            creates.append((user, name, at))
    firsts: dict[str, float] = {}
    for user, name, at in creates:  # the children are named after their job
        if user in operator_users:
            for candidate in (name, _job_of(name), name.rsplit("-", 1)[0]):
                if candidate in submitted:
                    firsts[candidate] = min(at, firsts.get(candidate, at))
                    break
    jobs = [job for job in submitted if created.get(job)]
    pods = {job: [pod for pod in bound if _job_of(pod) == job] for job in jobs}
    ready = {job: [patched[pod][-1] for pod in pods[job] if patched[pod]] for job in jobs}
    running = {job: [patched[pod][0] for pod in pods[job] if patched[pod]] for job in jobs}
    return {
        "submit -> the operator's first create": [firsts[job] - submitted[job]
                                                   for job in jobs if job in firsts],
        "submit -> last worker pod created": [max(created[job]) - submitted[job]
                                              for job in jobs],
        "last pod created -> last bound": [max(bound[pod] for pod in pods[job])
                                           - max(created[job]) for job in jobs if pods[job]],
        "last bound -> last Running (first status patch)": [
            max(running[job]) - max(bound[pod] for pod in pods[job])
            for job in jobs if running[job]],
        "last Running -> last Ready (last status patch)": [
            max(ready[job]) - max(running[job]) for job in jobs if ready[job]],
        "submit -> last worker Ready": [max(ready[job]) - submitted[job]
                                        for job in jobs if ready[job]],
    }


def _row(values: list[float]) -> str:
    if not values:
        return "- / - / -"
    ordered = sorted(values)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    return f"{statistics.median(ordered):.1f} / {p95:.1f} / {ordered[-1]:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Print one Markdown row per step; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("audit_log", type=Path)
    parser.add_argument("--kind", default="monarchjobs",
                        help="the jobs' resource: monarchjobs or mpijobs")
    args = parser.parse_args(argv)
    found = steps(args.audit_log, args.kind)
    print(f"| step ({args.kind}, p50 / p95 / max s) | jobs | seconds |\n|---|---:|---|")
    for step, values in found.items():
        print(f"| {step} | {len(values)} | {_row(values)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
