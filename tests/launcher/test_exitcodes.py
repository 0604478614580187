"""The launcher's exit status rule (field case C9), on Monarch's failure wording. Pure."""

from __future__ import annotations

import pytest

from monarch_operator.launcher.exitcodes import (
    FAILURE,
    exit_code_for_failure,
    exit_code_from_message,
)

# Shapes of torchmonarch 0.7.0 supervision messages, as seen in launcher runs.
EXITED_3 = (
    "Endpoint call trainer.step() failed, The actor <root>.<Trainer trainer{'hosts': 0/2, "
    "'gpus': 0/2}> and all its descendants have failed:\n  the process this actor was running "
    "on exited with non-zero code 3"
)
KILLED_9 = "the process this actor was running on failed: Killed(sig=9)"


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (EXITED_3, 3),
        ("... exited with non-zero code 17", 17),
        (KILLED_9, 137),
        ("worker killed by signal 15", 143),
        ("exited with non-zero code 3; later Killed(sig=9)", 3),
        ("Killed(sig=9) first, then exited with non-zero code 3", 137),
        ("exited with non-zero code 300", FAILURE),
        ("Actor call info.boom failed. ValueError: deliberate", None),
        ("attach failed: reply timed out after MESH_ATTACH_CONFIG_TIMEOUT", None),
    ],
)
def test_exit_code_from_message(message: str, code: int | None) -> None:
    assert exit_code_from_message(message) == code


def test_first_message_that_implies_a_code_wins() -> None:
    messages = ["actor raised ValueError", EXITED_3, KILLED_9]

    assert exit_code_for_failure(messages) == 3


def test_no_code_anywhere_gives_generic_failure() -> None:
    assert exit_code_for_failure(["attach timed out", "lost connection"]) == FAILURE
    assert exit_code_for_failure([]) == FAILURE


def test_monarch_failure_is_described_by_role_host_and_rank() -> None:
    from monarch_operator.hostfile import Host
    from monarch_operator.launcher.hosts.placement import plan_placement
    from monarch_operator.launcher.programs.roles import describe_failure

    plan = plan_placement([Host("a", 2), Host("b", 2), Host("c", 1)], 2, 1)
    message = (
        "SupervisionError: Endpoint call trainer.step() failed, The actor <root>.<monarch_operator"
        ".launcher.workload.Trainer trainer{'hosts': 1/2, 'gpus': 1/2}> and all its descendants "
        "have failed: the process this actor was running on exited with non-zero code 3"
    )

    assert describe_failure(plan, message) == (
        "trainer rank 3 (host b, local rank 1): the process this actor was running on exited "
        "with non-zero code 3"
    )
    ref = message.replace(
        "Trainer trainer{'hosts': 1/2, 'gpus': 1/2}", "Reference ref{'hosts': 0/1, 'gpus': 0/1}"
    )
    assert describe_failure(plan, ref) is not None
    assert describe_failure(plan, ref).startswith("ref rank 0 (host c, local rank 0):")  # type: ignore[union-attr]
    assert describe_failure(plan, "timeout waiting for message") is None
