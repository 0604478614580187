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
        resync_seconds: how often each job is reconciled while nothing else happens (seconds).
        worker_user_id: UID the worker and launcher containers run as (the image's ``monarch``).
    """

    cluster_domain: str = "cluster.local"
    resync_seconds: float = 2.0
    worker_user_id: int = 1000

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``MONARCH_OPERATOR_CLUSTER_DOMAIN``, ``MONARCH_OPERATOR_RESYNC_SECONDS`` and
        ``MONARCH_OPERATOR_WORKER_UID``; unset ones keep the defaults above.

        Raises:
            ValueError: a value that is not a number where one is expected.
        """
        return cls(
            cluster_domain=os.environ.get("MONARCH_OPERATOR_CLUSTER_DOMAIN", cls.cluster_domain),
            resync_seconds=float(
                os.environ.get("MONARCH_OPERATOR_RESYNC_SECONDS", cls.resync_seconds)
            ),
            worker_user_id=int(os.environ.get("MONARCH_OPERATOR_WORKER_UID", cls.worker_user_id)),
        )
