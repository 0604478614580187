"""Operator-wide settings, read once from the environment at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass


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
    """

    cluster_domain: str = "cluster.local"
    worker_user_id: int = 1000
    network_policy: bool = True
    kueue: bool = False
    watch_renew_seconds: int = 30
    force_delete_after_seconds: int = 15

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``MONARCH_OPERATOR_CLUSTER_DOMAIN``, ``MONARCH_OPERATOR_WORKER_UID`` and
        ``MONARCH_OPERATOR_NETWORK_POLICY`` and ``MONARCH_OPERATOR_KUEUE`` (``true`` or
        ``false``), ``MONARCH_OPERATOR_WATCH_RENEW_SECONDS``,
        ``MONARCH_OPERATOR_FORCE_DELETE_AFTER_SECONDS``; unset ones keep the defaults above.

        Raises:
            ValueError: a ``MONARCH_OPERATOR_WORKER_UID`` that is not a non-root uid
                (1-2147483647), a ``MONARCH_OPERATOR_NETWORK_POLICY`` other than
                ``true``/``false``, a ``MONARCH_OPERATOR_WATCH_RENEW_SECONDS`` that is not
                a whole number of seconds in 5-300, or a
                ``MONARCH_OPERATOR_FORCE_DELETE_AFTER_SECONDS`` not in 1-3600; the message
                names the variable and the rule.
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
