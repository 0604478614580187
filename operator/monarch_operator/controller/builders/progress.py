"""What lets a launcher report the program's progress, and nothing more (issue 22 item 1).

The launcher writes the program's reports to the job's ConfigMap ``<job>-progress``
(``launcher/progress.py``); the operator copies them to ``status.progress``
(``controller/launch/reported.py``). The launcher pods run as the job's own ServiceAccount
``<job>-launcher`` (or the one ``spec.launcher.template`` names), bound by the RoleBinding
``<job>-progress`` to the Role ``<job>-progress``: ``get`` and ``patch`` of that one ConfigMap
(``resourceNames``), nothing else; not the job, not its status, not another job's reports. The
least privilege that works, as Kubernetes' RBAC docs advise ("Using RBAC Authorization":
referring to resources by name); Kubeflow Trainer's progress proposal (KEP-2779) reaches the
same end with a token checked by its controller.
"""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.spec.spec import JobSpec

ROLE_PROGRESS = "progress"  # the role label of the ConfigMap (its events wake the job)
REPORT_KEY = constants.PROGRESS_REPORT_KEY  # the ConfigMap's key; launcher/progress.py writes it


def launcher_service_account(job: JobSpec) -> str:
    """The ServiceAccount the launcher pods run as: ``spec.launcher.template``'s, else the
    job's own :func:`names.launcher_account`."""
    template_spec = (job.launcher_template or {}).get("spec") or {}
    return str(template_spec.get("serviceAccountName") or names.launcher_account(job.name))


def build_launcher_account(job: JobSpec) -> dict[str, Any]:
    """The job's own ServiceAccount ``<job>-launcher`` (no token mounted by default: only the
    launcher pod asks for one). Made even when ``spec.launcher.template`` names another (then
    unused), so that changing the template never needs it."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": child_metadata(job, names.launcher_account(job.name),
                                       constants.ROLE_LAUNCHER),
            "automountServiceAccountToken": False}


def build_progress_configmap(job: JobSpec) -> dict[str, Any]:
    """The ConfigMap ``<job>-progress``, empty: the launcher writes its key
    :data:`REPORT_KEY`."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": child_metadata(job, names.progress_configmap(job.name), ROLE_PROGRESS)}


def build_progress_role(job: JobSpec) -> dict[str, Any]:
    """The Role ``<job>-progress``: ``get`` and ``patch`` of the job's progress ConfigMap
    alone (``resourceNames``). In attach mode also ``get``, ``list`` and ``watch`` of pods in
    the namespace: Monarch's ``KubernetesJob`` in the launcher lists and watches the role
    meshes' pods by label selector. RBAC cannot restrict a list or watch by label (nor by
    ``resourceNames`` in a useful way), so the launcher then reads every pod of its namespace:
    their specs and statuses, not their logs, Secrets or exec."""
    name = names.progress_configmap(job.name)
    rules: list[dict[str, Any]] = [{"apiGroups": [""], "resources": ["configmaps"],
                                    "resourceNames": [name], "verbs": ["get", "patch"]}]
    if job.attach:
        rules.append({"apiGroups": [""], "resources": ["pods"],
                      "verbs": ["get", "list", "watch"]})
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": child_metadata(job, name, ROLE_PROGRESS),
            "rules": rules}


def build_progress_binding(job: JobSpec) -> dict[str, Any]:
    """The RoleBinding ``<job>-progress`` of that Role to the launcher's ServiceAccount
    (:func:`launcher_service_account`)."""
    name = names.progress_configmap(job.name)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": child_metadata(job, name, ROLE_PROGRESS),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": launcher_service_account(job),
                          "namespace": job.namespace}]}
