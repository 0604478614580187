"""The launcher's message when Monarch's attach config push times out (CI run of stop 15)."""

from __future__ import annotations

from monarch_operator.launcher.session.attaching import attach_timeout_message

# torchmonarch's words, as a loaded CI machine printed them (backtrace cut).
PUSH_TIMED_OUT = (
    "attach failed: config push failed during attach on 1 host(s): - tcp:127.0.0.2:43621: reply "
    "timed out after MESH_ATTACH_CONFIG_TIMEOUT Stack backtrace: 0: <anyhow::Error>::msg::<alloc"
    "::string::String> 1: monarch_hyperactor::bootstrap::attach_to_workers::{closure#1}"
)


def test_names_the_silent_host_as_the_hostfile_does_and_the_flag_to_raise() -> None:
    message = attach_timeout_message("spmd", "15s", PUSH_TIMED_OUT, {"127.0.0.2": "node-0"})

    assert message == (
        "mesh spmd did not attach within 15s: no answer from the worker on node-0 "
        "(raise --attach-timeout if workers start slowly)"
    )


def test_lists_every_silent_host_once_sorted() -> None:
    error = (
        "config push failed during attach on 2 host(s): - tcp:127.0.0.9:5000: reply timed out "
        "after MESH_ATTACH_CONFIG_TIMEOUT - tcp:127.0.0.3:5000: reply timed out after "
        "MESH_ATTACH_CONFIG_TIMEOUT - tcp:127.0.0.3:5000: again"
    )

    message = attach_timeout_message("trainer", "35s", error, {})

    assert "no answer from the worker on 127.0.0.3, 127.0.0.9 " in message


def test_without_an_address_it_still_says_what_happened() -> None:
    message = attach_timeout_message("ref", "35s", "reply timed out after X", {})

    assert message.startswith("mesh ref did not attach within 35s: no answer from a worker (")
