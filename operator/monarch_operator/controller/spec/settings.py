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
    """

    cluster_domain: str = "cluster.local"
    worker_user_id: int = 1000
    network_policy: bool = True
    kueue: bool = False

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``MONARCH_OPERATOR_CLUSTER_DOMAIN``, ``MONARCH_OPERATOR_WORKER_UID`` and
        ``MONARCH_OPERATOR_NETWORK_POLICY`` and ``MONARCH_OPERATOR_KUEUE`` (``true`` or
        ``false``); unset ones keep the defaults above.

        Raises:
            ValueError: a ``MONARCH_OPERATOR_WORKER_UID`` that is not a non-root uid
                (1-2147483647), or a ``MONARCH_OPERATOR_NETWORK_POLICY`` other than
                ``true``/``false``; the message names the variable and the rule.
        """
        return cls(
            cluster_domain=os.environ.get("MONARCH_OPERATOR_CLUSTER_DOMAIN", cls.cluster_domain),
            worker_user_id=_non_root_uid("MONARCH_OPERATOR_WORKER_UID", cls.worker_user_id),
            network_policy=_boolean("MONARCH_OPERATOR_NETWORK_POLICY", cls.network_policy),
            kueue=_boolean("MONARCH_OPERATOR_KUEUE", cls.kueue),
        )


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
