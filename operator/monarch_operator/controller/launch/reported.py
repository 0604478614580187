"""``status.progress``: the program's last report, as its launcher wrote it (issue 22 item 1).

The launcher writes the reports of the program it runs (``monarch_operator.job.report``, or
``MONARCH_PROGRESS {json}`` lines from any rank) to the job's ConfigMap ``<job>-progress``,
key ``progress.json``, at most once per ``spec.progress.reportIntervalSeconds``
(``launcher/progress.py``). Its events wake the job (``handlers.on_progress_report``); each
pass reads it from its view (no request) and, when it changed, copies it to
``status.progress`` with what follows from it: the percentage, the time left at the recent
rate (``estimatedRemainingSeconds`` and ``eta``), the first metric as ``mainMetric`` (the
printer columns STEP, PROGRESS, ETA and, with ``-o wide``, METRIC). The report's step and run
URL also go into the reporting attempt's record (``lastStep``, ``runURL``).

What a program wrote is not trusted: fields of the wrong type are dropped, strings and the
metric list are cut to bounded sizes, and a report that is not a JSON object is ignored, so a
report can neither fail a pass nor grow the status without bound. Field names follow Kubeflow
Trainer's progress status (KEP-2779: ``progressPercentage``, ``estimatedRemainingSeconds``,
``metrics`` as name/value strings, ``lastUpdatedTime``) where the meaning is the same.
"""

from __future__ import annotations

import json
import math
from typing import Any

from monarch_operator import names
from monarch_operator.controller.builders.progress import REPORT_KEY
from monarch_operator.controller.k8s import reads
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Pass

MAX_REPORT_BYTES = 16384  # a larger report is ignored
MAX_METRICS = 16
MAX_NAME = 63
MAX_VALUE = 64
MAX_TEXT = 512  # checkpoint, run URL
MAX_STEP = 2**62


def harvest(state: Pass) -> None:
    """Copy the job's last progress report into ``status.progress`` (and the reporting
    attempt's ``lastStep``/``runURL``) when it changed; nothing when there is none."""
    job = state.job
    configmap = reads.read("v1", "ConfigMap", job.namespace, names.progress_configmap(job.name))
    text = ((configmap or {}).get("data") or {}).get(REPORT_KEY)
    report = parse(text) if text else None
    if report is None:
        return
    progress = summarize(report)
    if progress == state.status.get("progress"):
        return
    state.status["progress"] = progress
    attempt = progress.get("attempt")
    extra = {key: value for key, value in (("lastStep", progress.get("step")),
                                           ("runURL", progress.get("runURL")))
             if value is not None}
    if attempt is not None and extra:
        state.status["attempts"] = [
            {**record, **extra} if record.get("number") == attempt else record
            for record in state.status.get("attempts") or []]


# What is only true while the program runs: the time left at its recent rate.
RUNNING_ONLY = ("estimatedRemainingSeconds", "eta")


def hide_eta_unless_running(state: Pass, previous: dict[str, Any]) -> None:
    """A job that is not running (queued after an eviction, suspended, restarting, finished)
    shows no time left (the ETA column empty): nothing advances it, and the last report's
    estimate would be stale by the time the job runs again. The status is merge-patched: a
    key the stored ``previous`` progress has is removed with None."""
    progress = state.status.get("progress")
    if not progress or st.is_true(state.status, st.RUNNING):
        return
    stored = previous.get("progress") or {}
    kept = {key: value for key, value in progress.items() if key not in RUNNING_ONLY}
    kept.update({key: None for key in RUNNING_ONLY if stored.get(key) is not None})
    state.status["progress"] = kept


def parse(text: str) -> dict[str, Any] | None:
    """The report in ``text`` (the ConfigMap's JSON) with only well-typed, bounded fields, or
    None when it is too large or not a JSON object."""
    if len(text) > MAX_REPORT_BYTES:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    report: dict[str, Any] = {}
    for key in ("step", "totalSteps", "attempt"):
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP:
            report[key] = value
    rate = raw.get("stepsPerSecond")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) \
            and rate > 0:
        report["stepsPerSecond"] = float(rate)
    for key in ("checkpoint", "runURL", "time", "checkpointTime"):
        value = raw.get(key)
        if isinstance(value, str) and value.strip():
            report[key] = value.strip()[:MAX_TEXT]
    if "runURL" in report and not report["runURL"].startswith(("https://", "http://")):
        del report["runURL"]
    metrics = raw.get("metrics")
    if isinstance(metrics, dict):
        report["metrics"] = [{"name": str(name)[:MAX_NAME], "value": _value(value)}
                             for name, value in list(metrics.items())[:MAX_METRICS]
                             if _value(value)]
    return report


def _value(value: Any) -> str:
    """A metric's value as the status shows it: numbers with 6 significant digits."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)[:MAX_VALUE] if isinstance(value, str) else ""


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """``status.progress`` from a parsed report: its fields, the percentage (step / total
    steps, at most 100), the seconds left at its rate and the same as a duration, the first
    metric as ``name=value``."""
    progress: dict[str, Any] = {}
    for key in ("attempt", "step", "totalSteps", "checkpoint", "runURL"):
        if key in report:
            progress[key] = report[key]
    if "stepsPerSecond" in report:
        progress["stepsPerSecond"] = round(report["stepsPerSecond"], 4)
    step, total = report.get("step"), report.get("totalSteps")
    if step is not None and total:
        percentage = min(100, step * 100 // total)
        progress["progressPercentage"] = percentage
        progress["percent"] = f"{percentage}%"
        rate = report.get("stepsPerSecond")
        if rate:
            left = max(0, math.ceil((total - step) / rate)) if step < total else 0
            progress["estimatedRemainingSeconds"] = left
            progress["eta"] = duration(left)
    if report.get("metrics"):
        progress["metrics"] = report["metrics"]
        first = report["metrics"][0]
        progress["mainMetric"] = f"{first['name']}={first['value']}"
    if "time" in report:
        progress["lastUpdatedTime"] = report["time"]
    if "checkpoint" in report and "checkpointTime" in report:
        progress["checkpointTime"] = report["checkpointTime"]
    return progress


def duration(seconds: int) -> str:
    """``seconds`` as kubectl shows ages: ``45s``, ``4m10s``, ``1h05m``, ``2d3h``."""
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s" if minutes < 10 else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"
