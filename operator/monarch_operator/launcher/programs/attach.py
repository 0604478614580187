"""Attach mode in the job API: Monarch's own ``KubernetesJob``, ready for a MonarchJob's role
meshes (docs/attach.md).

In a MonarchJob with ``spec.mode: attach`` every worker runs Monarch's worker loop, and the
operator publishes each role's mesh (``status.meshes``, and ``MONARCH_OPERATOR_MESHES`` with
``MONARCH_OPERATOR_NAMESPACE`` in the launcher pod). A program written against Monarch's
``KubernetesJob`` needs nothing from us: it calls ``add_mesh`` with those values.
:func:`kubernetes_job` does that for programs that want it done::

    from monarch_operator.job import kubernetes_job

    job = kubernetes_job()                 # in the launcher pod: from its environment
    state = job.state(cached_path=None)
    trainer_procs = state.trainer.spawn_procs(per_host={"gpus": 8})

Monarch is imported only when :func:`kubernetes_job` is called.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch_operator.launcher.programs.kubernetesjob import OperatorKubernetesJob

MESHES_ENV = "MONARCH_OPERATOR_MESHES"
NAMESPACE_ENV = "MONARCH_OPERATOR_NAMESPACE"
# The launcher pod's Monarch listen address, tcp://<pod IP>:0 (the operator sets it).
CLIENT_ADDRESS_ENV = "MONARCH_CLIENT_ADDRESS"
# How long state() waits for a mesh's pods to be Ready, seconds (KubernetesJob's timeout; its
# own default, None, waits for ever). The launcher starts once they are, so this only matters
# when a worker is replaced while the program runs: the default startupTimeoutSeconds.
DEFAULT_TIMEOUT_SECONDS = 600
# KubernetesJob.add_mesh's rule for mesh names (torchmonarch 0.7.0).
_MESH_NAME = re.compile(r"^[a-z][a-z0-9]{0,62}$")


class AttachError(ValueError):
    """The role meshes are missing or malformed; the message says what and where from."""


@dataclass(frozen=True)
class AttachMesh:
    """One role's mesh, as ``status.meshes`` publishes it: the arguments of
    ``KubernetesJob.add_mesh(mesh_name, replicas, label_selector, pod_rank_label, port)``."""

    role: str
    mesh_name: str
    label_selector: str
    pod_rank_label: str
    replicas: int
    port: int


def parse_meshes(meshes: str | Sequence[Mapping[str, Any]]) -> list[AttachMesh]:
    """The role meshes from ``MONARCH_OPERATOR_MESHES`` (a JSON string) or from a MonarchJob's
    ``status.meshes`` (a list of objects).

    Args:
        meshes: the JSON text, or the decoded list.

    Returns:
        One :class:`AttachMesh` per role, in the order given.

    Raises:
        AttachError: not a list of objects with every field, a mesh name Monarch refuses, a
            replica count or port out of range, or no mesh at all.
    """
    if isinstance(meshes, str):
        try:
            meshes = json.loads(meshes)
        except json.JSONDecodeError as error:
            raise AttachError(f"the role meshes are not JSON: {error}") from error
    if not isinstance(meshes, list) or not meshes:
        raise AttachError("the role meshes must be a non-empty list (status.meshes): is the "
                          "MonarchJob in attach mode (spec.mode: attach)?")
    return [_mesh(entry, index) for index, entry in enumerate(meshes)]


def _mesh(entry: Any, index: int) -> AttachMesh:
    where = f"mesh {index}"
    if not isinstance(entry, Mapping):
        raise AttachError(f"{where} must be an object, not {entry!r}")
    fields = {"role": str, "meshName": str, "labelSelector": str, "podRankLabel": str,
              "replicas": int, "port": int}
    for key, kind in fields.items():
        value = entry.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or value == "":
            raise AttachError(f"{where}: {key} must be a {kind.__name__}, not {value!r}")
    mesh = AttachMesh(role=entry["role"], mesh_name=entry["meshName"],
                      label_selector=entry["labelSelector"],
                      pod_rank_label=entry["podRankLabel"], replicas=entry["replicas"],
                      port=entry["port"])
    if not _MESH_NAME.match(mesh.mesh_name):
        raise AttachError(f"{where}: meshName {mesh.mesh_name!r} is no Monarch mesh name "
                          "(lowercase letters and digits, a letter first, at most 63)")
    if mesh.replicas < 1 or not 0 < mesh.port < 65536:
        raise AttachError(f"{where}: replicas {mesh.replicas} must be at least 1 and port "
                          f"{mesh.port} within 1-65535")
    return mesh


def meshes_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, list[AttachMesh]]:
    """The namespace and role meshes a MonarchJob's launcher pod has in its environment.

    Returns:
        ``(namespace, meshes)``.

    Raises:
        AttachError: ``MONARCH_OPERATOR_MESHES`` or ``MONARCH_OPERATOR_NAMESPACE`` is unset
            (not a launcher pod of an attach-mode MonarchJob) or malformed.
    """
    return _namespace_and_meshes(None, None, os.environ if environ is None else environ)


def _namespace_and_meshes(namespace: str | None,
                          meshes: str | Sequence[Mapping[str, Any]] | None,
                          environ: Mapping[str, str]) -> tuple[str, list[AttachMesh]]:
    """What :func:`kubernetes_job` was given, each missing one from ``environ``.

    Raises:
        AttachError: one is neither given nor in ``environ``, or the meshes are malformed.
    """
    namespace = namespace or environ.get(NAMESPACE_ENV)
    meshes = meshes if meshes is not None else environ.get(MESHES_ENV)
    if not namespace or not meshes:
        raise AttachError(f"{MESHES_ENV} and {NAMESPACE_ENV} are set only in the launcher pod "
                          "of a MonarchJob with spec.mode: attach; elsewhere pass meshes= "
                          "(the job's status.meshes) and namespace=")
    return namespace, parse_meshes(meshes)


def kubernetes_job(meshes: str | Sequence[Mapping[str, Any]] | None = None,
                   namespace: str | None = None, *,
                   timeout: int | None = DEFAULT_TIMEOUT_SECONDS,
                   kubeconfig: Any = None,
                   client_address: str | None = None) -> OperatorKubernetesJob:
    """Monarch's ``KubernetesJob`` with ``add_mesh`` called for each role mesh of a MonarchJob
    in attach mode; ``job.state()`` then attaches (``state.trainer``, ``state.ref``).

    Its ``kill()`` leaves the pods alone and does not raise (upstream's raises
    ``NotImplementedError`` for meshes it did not create): the MonarchJob owns them; the
    attempt ends when the launcher's program does.

    Args:
        meshes: the role meshes (the MonarchJob's ``status.meshes``, a list or its JSON); default
            the launcher pod's ``MONARCH_OPERATOR_MESHES``.
        namespace: the MonarchJob's namespace; default ``MONARCH_OPERATOR_NAMESPACE``.
        timeout: seconds ``state()`` waits for each mesh's pods to be Ready (None: for ever).
        kubeconfig: a ``monarch.job.kubernetes.KubeConfig`` for a client outside the cluster
            (Monarch then port-forwards to a worker); default the pod's ServiceAccount.
        client_address: where this client listens for the workers, e.g. ``tcp://<pod IP>:0``;
            default ``MONARCH_CLIENT_ADDRESS`` (the launcher pod's IP), else Monarch's choice
            (the address the pod's hostname resolves to, which Monarch refuses when it is a
            loopback one).

    Returns:
        The job, not yet applied.

    Raises:
        AttachError: the meshes or the namespace are missing or malformed.
    """
    namespace, parsed = _namespace_and_meshes(namespace, meshes, os.environ)
    from monarch_operator.launcher.programs.kubernetesjob import OperatorKubernetesJob

    job = OperatorKubernetesJob(namespace, timeout=timeout, kubeconfig=kubeconfig)
    client_address = client_address or os.environ.get(CLIENT_ADDRESS_ENV)
    if client_address:
        from monarch.config import configure

        # After the constructor, which sets the hostname transport (Monarch refuses a second
        # transport kind before that, as launcher/session/lifecycle.py found).
        configure(default_transport=client_address)
    for mesh in parsed:
        job.add_mesh(mesh.mesh_name, mesh.replicas, label_selector=mesh.label_selector,
                     pod_rank_label=mesh.pod_rank_label, port=mesh.port)
    return job
