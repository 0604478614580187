"""Whose child an object is: a job's name and labels are reused by a job of the same name
created after it, its uid never."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monarch_operator import constants


def controller_uid(body: Mapping[str, Any]) -> str | None:
    """uid of the object's controller owner reference, if any."""
    reference = _controller(body)
    return None if reference is None else str(reference.get("uid"))


def _controller(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def owned_by_another_job(body: Mapping[str, Any], job_uid: str) -> bool:
    """Whether ``body``'s controller is a MonarchJob other than ``job_uid`` (a job of the same
    name deleted before, whose children are still going): never this job's, whatever its name
    and labels say. A view leaves such objects out, of every kind: a job re-created at once
    under the same name (a MultiKueue re-dispatch after a suspend) took the old job's launcher
    pod, still running, for its own and judged its attempt by that pod's exit (143: Failed; 0
    would have been a Succeeded that never ran); the old job's progress ConfigMap would give
    the new one its steps and checkpoint, and stop it from making its own launcher's access.
    ``job_uid`` empty: the job is not known, nothing is left out."""
    reference = _controller(body)
    return (reference is not None and bool(job_uid) and reference.get("kind") == constants.KIND
            and str(reference.get("uid")) != job_uid)
