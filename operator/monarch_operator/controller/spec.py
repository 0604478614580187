"""The MonarchJob spec as a typed value, with the CRD's defaults applied.

The CRD schema validates and defaults at admission; :func:`JobSpec.from_body` applies the same
defaults so that builders and tests can take a bare manifest too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monarch_operator import names

# Defaults mirror crds/monarchjobs.monarch-operator.dev.yaml (a unit test compares them).
DEFAULT_REPLICAS = 2
DEFAULT_GPUS_PER_WORKER = 8
DEFAULT_STEPS = 3
DEFAULT_MESH_HOSTS = 1
DEFAULT_STARTUP_TIMEOUT_SECONDS = 600


class InvalidSpecError(ValueError):
    """The MonarchJob cannot be run as written; the message names the field and the rule."""


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
        return cls(
            name=metadata["name"],
            namespace=metadata.get("namespace", "default"),
            uid=metadata.get("uid", ""),
            generation=int(metadata.get("generation", 1)),
            image=image,
            replicas=int(workers.get("replicas", DEFAULT_REPLICAS)),
            gpus_per_worker=int(workers.get("gpusPerWorker", DEFAULT_GPUS_PER_WORKER)),
            trainer_hosts=int((meshes.get("trainer") or {}).get("hosts", DEFAULT_MESH_HOSTS)),
            ref_hosts=int((meshes.get("ref") or {}).get("hosts", DEFAULT_MESH_HOSTS)),
            colocate=bool(meshes.get("colocate", False)),
            startup_timeout_seconds=int(
                spec.get("startupTimeoutSeconds", DEFAULT_STARTUP_TIMEOUT_SECONDS)
            ),
            steps=int(launcher.get("steps", DEFAULT_STEPS)),
            launcher_image=launcher.get("image") or image,
            launcher_command=launcher.get("command"),
            worker_template=workers.get("template") or {},
        )
