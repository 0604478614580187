"""Monarch's ``KubernetesJob`` whose ``kill()`` leaves a MonarchJob's pods to the operator.

Imports Monarch (and the Kubernetes client) at once: imported only by
:func:`.attach.kubernetes_job`. A module of its own so that a pickled job (``state()`` caches
one in ``.monarch/job_state.pkl``) finds its class again.
"""

from __future__ import annotations

import logging

from monarch.job.kubernetes import KubernetesJob

logger = logging.getLogger(__name__)


class OperatorKubernetesJob(KubernetesJob):
    """``KubernetesJob`` attached to the role meshes of a MonarchJob in attach mode.

    Everything is upstream's except ``kill()``: upstream's stops the client's port-forward and
    then raises ``NotImplementedError`` for meshes it did not create; this one does the same
    clean-up and returns, leaving the pods to the MonarchJob (its workers keep running for the
    next attempt, and are deleted with the job).
    """

    def _kill(self) -> None:
        """Stop this client's port-forward (if any); never delete or stop a pod."""
        try:
            super()._kill()
        except NotImplementedError:
            logger.info("kill(): the MonarchJob's workers in namespace %s are the operator's; "
                        "they keep running (the attempt ends when this program does)",
                        self._namespace)
