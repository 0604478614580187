"""Named roles as the user or the operator write them, read into :class:`.layout.RoleSpec` s.

Three forms, one meaning (the fields of :mod:`.layout`):

- ``MONARCH_ROLES`` (set by the operator on its launcher pod; docs/launcher-contract.md): a JSON
  list in start order of ``{"name", "hosts": N | ["host", ...], "gpus"?, "procs"?,
  "colocateWith"?}``;
- ``--roles FILE`` (the same list as JSON or YAML) or ``--roles '[...]'`` (the JSON inline);
- ``--role NAME=HOSTS[,gpus=G][,procs=P]``, repeated in start order, where HOSTS is a count
  (``2``: the next two hosts), host names joined by ``+`` (``node1+node2``), or ``@ROLE``
  (colocate with role ROLE, usually an earlier one, on its hosts).

:func:`choose_roles` decides which source a run uses: ``--role``/``--roles`` over
``MONARCH_ROLES`` (flags win over the environment, with a warning), ``MONARCH_ROLES`` over the
trainer/ref variables (warned about when both are set); ``--role`` with a trainer/ref flag is
refused. No Monarch, no network; reads only the ``--roles`` file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monarch_operator import constants
from monarch_operator.launcher.hosts.layout import RoleSpec, check_role_name
from monarch_operator.launcher.hosts.plans import PlacementError

# The keys of one role object in MONARCH_ROLES and --roles files.
ROLE_KEYS = ("name", "hosts", "gpus", "procs", "colocateWith")
# The trainer/ref placement's variables, which MONARCH_ROLES replaces.
LEGACY_ENV = (constants.ENV_TRAINER_HOSTS, constants.ENV_REF_HOSTS, constants.ENV_COLOCATE,
              constants.ENV_TRAINER_GPUS, constants.ENV_REF_GPUS)
# The trainer/ref placement's flags, which --role/--roles replace.
LEGACY_FLAGS = ("--trainer-hosts", "--ref-hosts", "--colocate", "--trainer-gpus", "--ref-gpus")
ROLE_FLAG_SYNTAX = "NAME=HOSTS[,gpus=G][,procs=P] with HOSTS a count, host+host+... or @ROLE"


class RolesFormatError(ValueError):
    """Roles that cannot be read; the message names the source, the role and the rule."""


def _integer(value: object, where: str, key: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise RolesFormatError(f"{where}: {key} must be an integer of at least {least}, got "
                               f"{value!r}")
    return value


def role_from_object(item: object, source: str, index: int) -> RoleSpec:
    """One role object (a ``dict`` from JSON or YAML) as a :class:`RoleSpec`.

    Raises:
        RolesFormatError: not an object, an unknown key, a missing or badly typed field, a name
            that breaks the mesh name rule; the message starts ``<source>: role <name>:``.
    """
    if not isinstance(item, Mapping):
        raise RolesFormatError(f"{source}: role #{index + 1} must be an object with keys "
                               f"{', '.join(ROLE_KEYS)}, got {item!r}")
    name = item.get("name")
    where = f"{source}: role {name!r}" if name is not None else f"{source}: role #{index + 1}"
    unknown = sorted(set(item) - set(ROLE_KEYS))
    if unknown:
        raise RolesFormatError(f"{where}: unknown key {', '.join(map(str, unknown))} (a role "
                               f"has {', '.join(ROLE_KEYS)})")
    try:
        check_role_name(name)
    except PlacementError as error:
        raise RolesFormatError(f"{source}: {error}") from None
    hosts: Any = item.get("hosts")
    if isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts):
        hosts = tuple(hosts)
    elif hosts is not None or "colocateWith" not in item:
        hosts = _integer(hosts, where, "hosts (a count, or a list of host names)", 1)
    partner = item.get("colocateWith")
    if partner is not None and not isinstance(partner, str):
        raise RolesFormatError(f"{where}: colocateWith must be another role's name, got "
                               f"{partner!r}")
    gpus, procs = item.get("gpus"), item.get("procs")
    return RoleSpec(
        name=str(name),
        hosts=hosts,
        gpus=None if gpus is None else _integer(gpus, where, "gpus", 0),
        procs=None if procs is None else _integer(procs, where, "procs", 1),
        colocate_with=partner,
    )


def roles_from_data(data: object, source: str) -> list[RoleSpec]:
    """A list of role objects (parsed JSON or YAML) as specs, in order.

    Raises:
        RolesFormatError: not a non-empty list, or a bad role (:func:`role_from_object`).
    """
    if not isinstance(data, list) or not data:
        raise RolesFormatError(f"{source}: expected a non-empty list of roles "
                               f"({{\"name\", \"hosts\", ...}} each), got {data!r}")
    return [role_from_object(item, source, index) for index, item in enumerate(data)]


def roles_from_json(text: str, source: str) -> list[RoleSpec]:
    """Parse a JSON list of roles (``MONARCH_ROLES``, ``--roles '[...]'``).

    Raises:
        RolesFormatError: not JSON, or bad roles (:func:`roles_from_data`).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise RolesFormatError(f"{source}: not JSON ({error})") from None
    return roles_from_data(data, source)


def roles_from_option(value: str) -> tuple[list[RoleSpec], str]:
    """``--roles`` VALUE: inline JSON when it starts with ``[``, else a JSON or YAML file.

    Returns:
        The specs and the source's description (``--roles FILE``).

    Raises:
        RolesFormatError: unreadable file, or bad roles.
    """
    if value.lstrip().startswith("["):
        return roles_from_json(value, "--roles"), "--roles"
    source = f"--roles {value}"
    try:
        text = Path(value).expanduser().read_text()
    except OSError as error:
        raise RolesFormatError(f"{source}: cannot read it ({error.strerror or error})") from None
    if Path(value).suffix in (".yaml", ".yml"):
        import yaml

        try:
            return roles_from_data(yaml.safe_load(text), source), source
        except yaml.YAMLError as error:
            raise RolesFormatError(f"{source}: not YAML ({error})") from None
    return roles_from_json(text, source), source


def role_from_flag(text: str) -> RoleSpec:
    """One ``--role`` value (syntax in the module doc) as a spec.

    Raises:
        RolesFormatError: the value breaks the syntax or the name rule (naming both).
    """
    where = f"--role {text}"
    name, equals, rest = text.partition("=")
    if not equals or not rest:
        raise RolesFormatError(f"{where}: expected {ROLE_FLAG_SYNTAX}")
    try:
        check_role_name(name)
    except PlacementError as error:
        raise RolesFormatError(f"{where}: {error}") from None
    first, *options = rest.split(",")
    hosts: int | tuple[str, ...] | None = None
    partner = None
    if first.startswith("@"):
        partner = first[1:]
    elif first.isdigit():
        hosts = int(first)
    elif first and all(first.split("+")):
        hosts = tuple(first.split("+"))
    else:
        raise RolesFormatError(f"{where}: HOSTS {first!r} is not a count, host+host+... or "
                               f"@ROLE (expected {ROLE_FLAG_SYNTAX})")
    values: dict[str, int] = {}
    for option in options:
        key, equals, value = option.partition("=")
        if key not in ("gpus", "procs") or not equals or not value.isdigit():
            raise RolesFormatError(f"{where}: {option!r} is not gpus=G or procs=P (whole "
                                   f"numbers; expected {ROLE_FLAG_SYNTAX})")
        values[key] = int(value)
    return RoleSpec(name, hosts, gpus=values.get("gpus"), procs=values.get("procs"),
                    colocate_with=partner)


def role_to_object(spec: RoleSpec) -> dict[str, Any]:
    """``spec`` as a ``MONARCH_ROLES`` role object (fields left to their defaults omitted)."""
    item: dict[str, Any] = {"name": spec.name}
    if spec.hosts is not None:
        item["hosts"] = list(spec.hosts) if isinstance(spec.hosts, tuple) else spec.hosts
    for key, value in (("gpus", spec.gpus), ("procs", spec.procs),
                       ("colocateWith", spec.colocate_with)):
        if value is not None:
            item[key] = value
    return item


def roles_argv(roles: Sequence[str | Mapping[str, Any] | RoleSpec]) -> list[str]:
    """Flags for roles given in code: ``--role`` per string, else ``--roles`` with the JSON of
    the role objects and :class:`RoleSpec` s (``Job.from_args(roles=...)``)."""
    if all(isinstance(role, str) for role in roles):
        return [flag for role in roles for flag in ("--role", str(role))]
    objects = [role_to_object(role) if isinstance(role, RoleSpec) else role for role in roles]
    return ["--roles", json.dumps(objects)]


def choose_roles(
    role_flags: Sequence[str] | None,
    roles_option: str | None,
    legacy_flags: Sequence[str],
    environ: Mapping[str, str],
) -> tuple[list[RoleSpec] | None, str, list[str]]:
    """Which named roles a run uses, if any (precedence in the module doc).

    Args:
        role_flags: the ``--role`` values, in order; ``roles_option``: ``--roles`` VALUE.
        legacy_flags: the trainer/ref flags given on the command line (not from variables).
        environ: where ``MONARCH_ROLES`` and the trainer/ref variables are read.

    Returns:
        ``(specs or None for the trainer/ref placement, source description, warnings)``.

    Raises:
        RolesFormatError: ``--role`` with ``--roles`` or with a trainer/ref flag, or roles that
            cannot be read.
    """
    from_env = environ.get(constants.ENV_ROLES, "").strip()
    if role_flags or roles_option:
        given = "--role" if role_flags else "--roles"
        if role_flags and roles_option:
            raise RolesFormatError("give roles with --role or with --roles, not both")
        if legacy_flags:
            raise RolesFormatError(
                f"{given} names every role, so it cannot be combined with "
                f"{', '.join(legacy_flags)}; give the trainer and ref as roles too (e.g. "
                "--role trainer=2 --role ref=1, or --role trainer=1 --role ref=@trainer)")
        warnings = [f"{given} wins over {constants.ENV_ROLES}, which is ignored"] if from_env \
            else []
        if roles_option:
            specs, source = roles_from_option(roles_option)
            return specs, source, warnings
        return [role_from_flag(text) for text in role_flags or ()], "--role", warnings
    if not from_env:
        return None, "", []
    if legacy_flags:
        return None, "", [f"{', '.join(legacy_flags)} given: {constants.ENV_ROLES} is ignored"]
    shadowed = [name for name in LEGACY_ENV if environ.get(name, "").strip()]
    warnings = [f"{constants.ENV_ROLES} is set, so {', '.join(shadowed)} "
                f"{'is' if len(shadowed) == 1 else 'are'} ignored"] if shadowed else []
    return roles_from_json(from_env, constants.ENV_ROLES), constants.ENV_ROLES, warnings
