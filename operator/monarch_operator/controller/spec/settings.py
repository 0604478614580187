"""Operator-wide settings, read once from the environment at start-up."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Settings:
    """Knobs of one operator deployment (not of one job).

    Attributes:
        cluster_domain: DNS suffix of Services (``cluster.local`` unless the cluster differs);
            worker FQDNs in the hostfile end with it.
        worker_user_id: UID the worker and launcher containers run as (the image's ``monarch``).
        network_policy: give each job a NetworkPolicy that admits only its own pods
            (``builders/networkpolicy.py``); off where the cluster's policies are managed
            elsewhere.
        kueue: Kueue runs on the cluster: a job without the queue label goes to its
            namespace's ``default`` LocalQueue when there is one (one read per new job; the
            chart's ``kueue.enabled``). A labelled job is queued either way.
        watch_renew_seconds: seconds after which the API server ends each watch request and
            the stream is renewed (``engine/watchhealth.py``: the stall cut, the reconnection
            backstop and ``/healthz``'s limit follow from it). 30 unless lowered, as the tests'
            clusters do to hear sooner of a broken stream.
        force_delete_after_seconds: how long after its grace period ended a pod still being
            deleted (its node lost, a finalizer) is force-deleted (``release/stuckpods.py``).
            15 unless lowered, as the tests' clusters do.
        worker_labels: extra labels on every worker pod this operator creates (the chart's
            ``workerDefaults.labels``), as sorted ``(key, value)`` pairs; the job's own pod
            labels and the operator's selector labels win over them.
        worker_env: extra environment variables of every worker container this operator
            creates (the chart's ``workerDefaults.env``), as sorted ``(name, value)`` pairs;
            the operator's own variables and the job's template win over them.

    ``worker_labels`` and ``worker_env`` reach a job's pods only through a worker
    StatefulSet the operator creates: one that exists is never changed, so a new default
    applies to new jobs and to a job's next StatefulSet, never to running pods
    (docs/install.md, "Upgrades and running jobs").
    """

    cluster_domain: str = "cluster.local"
    worker_user_id: int = 1000
    network_policy: bool = True
    kueue: bool = False
    watch_renew_seconds: int = 30
    force_delete_after_seconds: int = 15
    worker_labels: tuple[tuple[str, str], ...] = ()
    worker_env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``MONARCH_OPERATOR_CLUSTER_DOMAIN``, ``MONARCH_OPERATOR_WORKER_UID``,
        ``MONARCH_OPERATOR_NETWORK_POLICY`` and ``MONARCH_OPERATOR_KUEUE`` (``true`` or
        ``false``), ``MONARCH_OPERATOR_WATCH_RENEW_SECONDS``,
        ``MONARCH_OPERATOR_FORCE_DELETE_AFTER_SECONDS``, ``MONARCH_OPERATOR_WORKER_LABELS`` and
        ``MONARCH_OPERATOR_WORKER_ENV`` (JSON objects of strings); unset or empty ones keep the
        defaults above.

        Raises:
            ValueError: a ``MONARCH_OPERATOR_WORKER_UID`` that is not a non-root uid
                (1-2147483647), a ``MONARCH_OPERATOR_NETWORK_POLICY`` other than
                ``true``/``false``, a ``MONARCH_OPERATOR_WATCH_RENEW_SECONDS`` that is not
                a whole number of seconds in 5-300, a
                ``MONARCH_OPERATOR_FORCE_DELETE_AFTER_SECONDS`` not in 1-3600, worker labels or
                env that are not a JSON object of strings, a label key or value Kubernetes
                refuses, or an env name that is not a C identifier; the message names the
                variable and the rule.
        """
        return cls(
            cluster_domain=os.environ.get("MONARCH_OPERATOR_CLUSTER_DOMAIN", cls.cluster_domain),
            worker_user_id=_non_root_uid("MONARCH_OPERATOR_WORKER_UID", cls.worker_user_id),
            network_policy=_boolean("MONARCH_OPERATOR_NETWORK_POLICY", cls.network_policy),
            kueue=_boolean("MONARCH_OPERATOR_KUEUE", cls.kueue),
            watch_renew_seconds=_whole_seconds("MONARCH_OPERATOR_WATCH_RENEW_SECONDS",
                                               cls.watch_renew_seconds, WATCH_RENEW_RANGE),
            force_delete_after_seconds=_whole_seconds(
                "MONARCH_OPERATOR_FORCE_DELETE_AFTER_SECONDS", cls.force_delete_after_seconds,
                FORCE_DELETE_RANGE),
            worker_labels=_string_map("MONARCH_OPERATOR_WORKER_LABELS", _check_label),
            worker_env=_string_map("MONARCH_OPERATOR_WORKER_ENV", _check_env_name),
        )


# Watch renewal: under 5 s the renewals are most of the operator's requests; over 300 s a
# broken stream would go unnoticed for longer than a liveness probe should allow.
WATCH_RENEW_RANGE = (5, 300)
# Force deletion of a pod stuck past its grace period: at least a second (its kubelet may still
# report its end), at most an hour.
FORCE_DELETE_RANGE = (1, 3600)
# The largest runAsUser the Kubernetes API accepts (a 32-bit signed int).
MAX_UID = 2147483647


def _non_root_uid(variable: str, default: int) -> int:
    """The uid in ``variable``: the pods say ``runAsNonRoot`` and must pass Pod Security
    "restricted", so 0 is refused here rather than by every kubelet."""
    value = os.environ.get(variable)
    if value is None:
        return default
    if not value.strip().isdigit() or not 1 <= int(value) <= MAX_UID:
        raise ValueError(f"{variable}={value!r}: must be a non-root uid, 1-{MAX_UID} (the "
                         "worker and launcher pods run with runAsNonRoot)")
    return int(value)


def _boolean(variable: str, default: bool) -> bool:
    value = os.environ.get(variable)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"{variable}={value!r}: must be true or false")
    return value.lower() == "true"


def _whole_seconds(variable: str, default: int, bounds: tuple[int, int]) -> int:
    value = os.environ.get(variable)
    if value is None:
        return default
    low, high = bounds
    if not value.strip().isdigit() or not low <= int(value) <= high:
        raise ValueError(f"{variable}={value!r}: must be whole seconds, {low}-{high}")
    return int(value)
# Kubernetes label syntax ("Labels and Selectors"): an optional DNS-subdomain prefix and "/",
# a name of at most 63 characters; values of at most 63 characters, possibly empty.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# What a container's env name must be for every shell to read it (a C identifier).
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _string_map(variable: str, check: Any) -> tuple[tuple[str, str], ...]:
    """The JSON object of strings in ``variable`` as sorted pairs, each checked by
    ``check(variable, key, value)``; unset or empty: none."""
    value = os.environ.get(variable, "").strip()
    if not value:
        return ()
    try:
        parsed = json.loads(value)
    except ValueError as error:
        raise ValueError(f"{variable}: not JSON ({error})") from None
    if not isinstance(parsed, dict) or not all(
            isinstance(key, str) and isinstance(item, str) for key, item in parsed.items()):
        raise ValueError(f"{variable}={value!r}: must be a JSON object of strings")
    for key, item in parsed.items():
        check(variable, key, item)
    return tuple(sorted(parsed.items()))


def _check_label(variable: str, key: str, value: str) -> None:
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or (prefix and not _LABEL_PREFIX.match(prefix)):
        raise ValueError(f"{variable}: label key {key!r} is not a valid Kubernetes label key "
                         "([prefix/]name, name at most 63 alphanumerics, '-', '_', '.')")
    if not _LABEL_VALUE.match(value):
        raise ValueError(f"{variable}: label {key}={value!r}: a value is at most 63 "
                         "alphanumerics, '-', '_', '.', starting and ending alphanumeric")


def _check_env_name(variable: str, key: str, _value: str) -> None:
    if not _ENV_NAME.match(key):
        raise ValueError(f"{variable}: env name {key!r} must be letters, digits and '_', "
                         "not starting with a digit")
