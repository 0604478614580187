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
    """

    cluster_domain: str = "cluster.local"
    worker_user_id: int = 1000

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``MONARCH_OPERATOR_CLUSTER_DOMAIN`` and ``MONARCH_OPERATOR_WORKER_UID``; unset
        ones keep the defaults above.

        Raises:
            ValueError: a value that is not a number where one is expected.
        """
        return cls(
            cluster_domain=os.environ.get("MONARCH_OPERATOR_CLUSTER_DOMAIN", cls.cluster_domain),
            worker_user_id=int(os.environ.get("MONARCH_OPERATOR_WORKER_UID", cls.worker_user_id)),
        )
