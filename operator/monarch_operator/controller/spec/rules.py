"""The spec's rules that the operator checks itself, each error naming the field.

The CRD's schema and CEL rules refuse most of these at admission; these checks cover objects
admitted under an older CRD (Helm never upgrades ``crds/``), and what a CRD cannot say: the
shape of a user's pod template and its quantities, and the values of Kueue's labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from monarch_operator import constants

# A resource quantity (k8s.io/apimachinery resource.Quantity's syntax), as the CRD's pattern for
# spec.launcher.resources (a unit test compares them). The API server refuses a malformed one in
# a template without naming the field ("quantities must match the regular expression ...").
QUANTITY_PATTERN = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?([0-9]+(\.[0-9]*)?"
    r"|\.[0-9]+))?$")


class InvalidSpecError(ValueError):
    """The MonarchJob cannot be run as written; the message names the field and the rule."""


def check_launcher_rules(spec: dict[str, Any]) -> None:
    """Refuse what would make the launcher's command or environment ambiguous.

    The CRD's CEL rules refuse these at admission; this second check keeps the operator from
    building a wrong launcher for an object admitted under an older CRD (Helm never upgrades
    ``crds/``).

    Raises:
        InvalidSpecError: naming the field and the rule.
    """
    launcher = spec.get("launcher") or {}
    spmd = spec.get("spmd")
    given = [
        path
        for path, value in [
            ("spec.launcher.program", launcher.get("program")),
            ("spec.launcher.command", launcher.get("command")),
            ("spec.spmd", spmd),
        ]
        if value is not None
    ]
    if len(given) > 1:
        raise InvalidSpecError(
            f"at most one of spec.launcher.program, spec.launcher.command and spec.spmd may be "
            f"set (each says what the launcher pod runs); got {' and '.join(given)}"
        )
    if spmd is not None and (spmd.get("script") is None) == (spmd.get("module") is None):
        raise InvalidSpecError("spec.spmd needs exactly one of script and module")
    if spmd is not None and launcher.get("args"):
        raise InvalidSpecError(
            "spec.launcher.args does not apply with spec.spmd: give the arguments in spec.spmd.args"
        )
    for item in launcher.get("env") or []:
        if str(item.get("name", "")) in constants.LAUNCHER_RESERVED_ENV:
            raise InvalidSpecError(
                f"spec.launcher.env: {item.get('name')} is set by the operator from the spec "
                "and cannot be given in launcher.env"
            )


def check_mode_rules(spec: dict[str, Any]) -> None:
    """Refuse a ``spec.mode`` the operator cannot run: an unknown one, or attach mode with what
    only the ssh mode can run (``spec.spmd``, which starts ranks over ssh, the built-in example,
    which starts Monarch workers over ssh, and a ``module:function`` program, which is given
    the ssh-mode job). The CRD refuses these at admission, this
    covers objects admitted under an older CRD.

    Raises:
        InvalidSpecError: naming the field and the rule.
    """
    mode = spec.get("mode") or constants.MODE_SSH
    if mode not in constants.MODES:
        raise InvalidSpecError(f"spec.mode {mode!r} must be one of {', '.join(constants.MODES)}")
    if mode != constants.MODE_ATTACH:
        return
    launcher = spec.get("launcher") or {}
    if spec.get("spmd") is not None:
        raise InvalidSpecError("spec.spmd needs spec.mode ssh: monarch-torchrun starts its "
                               "ranks over ssh")
    if launcher.get("program") is None and launcher.get("command") is None:
        raise InvalidSpecError("spec.mode attach needs spec.launcher.program or "
                               "spec.launcher.command: the built-in example starts its "
                               "workers over ssh")
    if ":" in str(launcher.get("program") or ""):
        raise InvalidSpecError("spec.launcher.program module:function needs spec.mode ssh (the "
                               "function gets the ssh job); in attach mode give a script or a "
                               "module")


def pod_template(template: Any, path: str) -> dict[str, Any]:
    """A user's pod template (``spec.workers.template``, ``spec.launcher.template``), checked
    for the shape the builders merge it into: an object whose ``metadata`` and ``spec``, when
    given, are objects, and whose ``metadata.labels`` and ``metadata.annotations`` map names to
    strings. What lies deeper is left to the API server (a refusal fails the job naming the
    field). The CRD schema refuses these at admission; this check covers objects admitted under
    an older CRD (Helm never upgrades ``crds/``).

    Returns:
        The template (``{}`` for none).

    Raises:
        InvalidSpecError: naming the field (``path`` and below) and what it must be.
    """
    if template is None:
        return {}
    if not isinstance(template, dict):
        raise InvalidSpecError(f"{path} must be an object (a pod template), "
                               f"not {_json_type(template)}")
    for key in ("metadata", "spec"):
        if key in template and not isinstance(template[key], dict):
            raise InvalidSpecError(f"{path}.{key} must be an object, "
                                   f"not {_json_type(template[key])}")
    metadata = template.get("metadata") or {}
    for key in ("labels", "annotations"):
        entries = metadata.get(key)
        if key in metadata and not (isinstance(entries, dict) and all(
                isinstance(value, str) for value in entries.values())):
            raise InvalidSpecError(f"{path}.metadata.{key} must map names to strings, "
                                   f"not {_json_type(entries)}")
    _check_quantities(template.get("spec") or {}, f"{path}.spec")
    return template


def resource_amounts(pod_spec: dict[str, Any], path: str = "spec"
                     ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The resource lists of a pod spec: ``(field path, amounts)`` for each ``limits`` and
    ``requests`` object of its own ``resources`` and of its containers' and init containers'
    (e.g. ``("spec.containers[0].resources.limits", {"cpu": "2"})``), the objects themselves,
    so a caller may change them. Shapes that are not lists and objects are skipped (the API
    server names those)."""
    holders: list[tuple[str, Any]] = [(path, pod_spec)]
    for key in ("containers", "initContainers"):
        containers = pod_spec.get(key)
        if isinstance(containers, list):
            holders += [(f"{path}.{key}[{index}]", container)
                        for index, container in enumerate(containers)]
    for where, holder in holders:
        resources = holder.get("resources") if isinstance(holder, dict) else None
        for kind in ("limits", "requests"):
            amounts = resources.get(kind) if isinstance(resources, dict) else None
            if isinstance(amounts, dict):
                yield f"{where}.resources.{kind}", amounts


def _check_quantities(pod_spec: dict[str, Any], path: str) -> None:
    """Raise InvalidSpecError naming the first resource quantity of ``pod_spec`` that is not
    one (``cpu: lots``); numbers are quantities."""
    for where, amounts in resource_amounts(pod_spec, path):
        for name, amount in amounts.items():
            if isinstance(amount, str) and not QUANTITY_PATTERN.match(amount):
                raise InvalidSpecError(f"{where}.{name} must be a quantity such as 2, 500m "
                                       f"or 8Gi, not {amount!r}")


def _json_type(value: Any) -> str:
    """The JSON type of a decoded value, as a schema error names it (``string``, ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "an object with a non-string value"


# An object name (DNS-1123 subdomain): what a LocalQueue or WorkloadPriorityClass may be called.
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def kueue_object_label(metadata: dict[str, Any], key: str) -> str | None:
    """The value of Kueue label ``key`` (queue name, priority class) of the job, or None.

    Both name a Kueue object, so the value must be a DNS-1123 subdomain, as Kueue's webhook
    requires of the jobs it integrates (``jobframework.ValidateQueueName``, kueue v0.19.2) and
    the Workload's ``spec.queueName`` pattern does. A CRD's CEL rules cannot read labels, so
    this is checked here, before any child or Workload exists: an invalid name otherwise
    surfaced only as an API error on the Workload, or never where Kueue is not installed.

    Raises:
        InvalidSpecError: naming ``metadata.labels[<key>]`` and the rule.
    """
    value = (metadata.get("labels") or {}).get(key)
    if not value:
        return None
    if len(value) > 253 or not _OBJECT_NAME.match(value):
        raise InvalidSpecError(
            f"metadata.labels[{key!r}] {value!r} must name a Kueue object: a DNS-1123 "
            "subdomain (lowercase letters, digits, '-' and '.', starting and ending with a "
            "letter or digit)")
    return str(value)
