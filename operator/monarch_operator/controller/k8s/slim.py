"""What the cache keeps of each watched object: only the fields a pass reads (client-go's
informers take a transform function for the same reason, ``cache.TransformFunc``;
kubernetes/client-go ``tools/cache/controller.go``).

A worker pod as the API server sends it is about 4 KB of JSON (25 KB as Python objects), its
StatefulSet as much again, the job's Secret 2.5 KB of key material; with 200 jobs that was
most of the operator's memory above its imports (docs/performance.md, "Operator weight, round
2"). What each kind keeps, and who reads it:

- every kind: ``apiVersion``, ``kind`` and ``metadata`` without ``managedFields`` (names,
  uids, labels, annotations, owner references, deletion marks: ownership checks, deletes by
  uid, the job label, attempts);
- ``Pod``: all of ``status`` (readiness, phases, container states and termination messages,
  image ids, device health) and of ``spec`` only ``nodeName`` (lost nodes, verdicts) and each
  container's ``name`` and ``readinessProbe`` (what a Running worker that is not Ready waits
  for, :func:`.observe.worker_problem`);
- ``ConfigMap``: ``data`` too (the launcher's progress report, :mod:`.reported`);
- ``StatefulSet``, ``Secret``, ``Service``, ``NetworkPolicy``: nothing more (a pass only
  asks whether they exist, whose they are and whether they are being deleted);
- any other kind (the job itself): everything but ``managedFields``.

``tests/unit/test_slim_fields.py`` runs the passes over recording views and fails when one
reads a field that :func:`slim` drops; a new read goes into :data:`POD_SPEC_FIELDS`,
:data:`POD_CONTAINER_FIELDS` or :data:`KEPT_SECTIONS` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Kind = tuple[str, str]  # (apiVersion, kind)

# Top-level sections kept besides apiVersion, kind and metadata, per kind; a kind not named
# here keeps every section.
KEPT_SECTIONS: dict[Kind, frozenset[str]] = {
    ("v1", "Pod"): frozenset({"spec", "status"}),
    ("v1", "ConfigMap"): frozenset({"data", "binaryData"}),
    ("apps/v1", "StatefulSet"): frozenset(),
    ("v1", "Secret"): frozenset(),
    ("v1", "Service"): frozenset(),
    ("networking.k8s.io/v1", "NetworkPolicy"): frozenset(),
}
# Of a pod's spec: the node it is bound to, and its containers (with only these fields).
POD_SPEC_FIELDS = frozenset({"nodeName", "containers"})
POD_CONTAINER_FIELDS = frozenset({"name", "readinessProbe"})
_ALWAYS = ("apiVersion", "kind", "metadata")


def slim(kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` (an object of ``kind``, as a watch delivered it) as the cache keeps it: a new
    dict sharing the kept values with ``body`` (never changed by a pass), ``metadata``
    without ``managedFields``. Objects without ``metadata`` are returned as they are, copied.

    Args:
        kind: ``(apiVersion, kind)``, as in a manifest.
        body: the object; not modified.
    """
    kept = KEPT_SECTIONS.get(kind)
    cached = {key: value for key, value in body.items()
              if key in _ALWAYS or kept is None or key in kept}
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        cached["metadata"] = {key: value for key, value in metadata.items()
                              if key != "managedFields"}
    spec = cached.get("spec")
    if kind == ("v1", "Pod") and isinstance(spec, Mapping):
        cached["spec"] = _pod_spec(spec)
    return cached


def _pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    kept = {key: value for key, value in spec.items() if key in POD_SPEC_FIELDS}
    containers = kept.get("containers")
    if isinstance(containers, list):
        kept["containers"] = [
            {key: value for key, value in container.items() if key in POD_CONTAINER_FIELDS}
            if isinstance(container, Mapping) else container for container in containers]
    return kept
