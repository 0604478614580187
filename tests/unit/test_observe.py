"""Why a worker pod is not Ready, in the words Kubernetes used (startup-timeout messages)."""

from __future__ import annotations

from typing import Any

import pytest

from monarch_operator.controller.observe import why_not_ready

UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available:\n 3 Insufficient nvidia.com/gpu.",
}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (None, "not created"),
        (
            {"status": {"phase": "Pending", "conditions": [UNSCHEDULABLE]}},
            "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        ),
        (
            {
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "state": {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": "no such image",
                                }
                            }
                        }
                    ],
                }
            },
            "ImagePullBackOff: no such image",
        ),
        (
            {
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}],
                }
            },
            "ContainerCreating",
        ),
        ({"status": {"phase": "Running"}}, "sshd not accepting connections yet (readiness probe)"),
        ({"status": {"phase": "Failed"}}, "Failed"),
        (
            {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {}},
            "being deleted",
        ),
    ],
    ids=["missing", "unschedulable", "image", "creating", "probe", "failed", "deleting"],
)
def test_why_not_ready(pod: dict[str, Any] | None, expected: str) -> None:
    assert why_not_ready(pod) == expected
