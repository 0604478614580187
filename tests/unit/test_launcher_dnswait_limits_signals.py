"""Pure parts of issue 20's launcher items: expected host addresses (C20), locked-memory limits
(C26) and the exit status after a stop signal (item 1)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from monarch_operator.launcher import stopsignal
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.dnswait import (
    HostAddressError,
    host_address_lines,
    parse_host_addresses,
    wait_for_addresses,
)
from monarch_operator.launcher.session.limits import format_limit, memlock_lines, rdma_in_play
from monarch_operator.launcher.session.network import NetworkCheckError
from monarch_operator.launcher.session.preflight import HostCheck, PreflightError

# -- expected addresses ------------------------------------------------------------------------


class FakeDns:
    """Answers from a timeline ``[(from second, address or None)]`` on a fake clock."""

    def __init__(self, timeline: list[tuple[float, str | None]]) -> None:
        self.now = 0.0
        self.timeline = timeline
        self.asked: list[float] = []

    def resolve(self, name: str) -> str:
        self.asked.append(self.now)
        answer = [address for at, address in self.timeline if at <= self.now][-1]
        if answer is None:
            raise NetworkCheckError(f"host {name!r} does not resolve")
        return answer

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_until_the_name_gives_the_expected_address_for_the_stable_window() -> None:
    dns = FakeDns([(0, None), (3, "10.244.0.9"), (6, "10.244.0.5")])

    wait_for_addresses(
        {"w-1": "10.244.0.5"}, stable_s=30, wait_s=10, resolve=dns.resolve,
        clock=lambda: dns.now, sleep=dns.sleep,
    )  # fmt: skip

    assert dns.now >= 36, "first right answer at 6 s, then 30 s without a break"


def test_a_flip_back_to_the_old_address_restarts_the_stable_window() -> None:
    dns = FakeDns([(0, "10.244.0.9"), (2, "10.244.0.5"), (10, "10.244.0.9"), (12, "10.244.0.5")])

    wait_for_addresses(
        {"w-1": "10.244.0.5"}, stable_s=30, wait_s=10, resolve=dns.resolve,
        clock=lambda: dns.now, sleep=dns.sleep,
    )  # fmt: skip

    assert dns.now >= 42


def test_a_name_right_at_its_first_answer_is_taken_at_once() -> None:
    """The normal path (fresh or kept pods): no resolver showed an old record, no wait."""
    dns = FakeDns([(0, "10.244.0.5")])

    wait_for_addresses(
        {"w-1": "10.244.0.5"}, stable_s=30, wait_s=10, resolve=dns.resolve,
        clock=lambda: dns.now, sleep=dns.sleep,
    )  # fmt: skip

    assert dns.now == 0 and dns.asked == [0]


def test_a_name_that_stays_stale_fails_after_one_cache_lifetime_naming_both_addresses() -> None:
    dns = FakeDns([(0, "10.244.0.9")])

    with pytest.raises(PreflightError) as caught:
        wait_for_addresses(
            {"w-1": "10.244.0.5"}, stable_s=30, wait_s=5, resolve=dns.resolve,
            clock=lambda: dns.now, sleep=dns.sleep,
        )  # fmt: skip

    (failure,) = caught.value.failures
    assert (failure.host, failure.reason) == ("w-1", "DNSStale")
    assert "10.244.0.9" in failure.detail and "10.244.0.5" in failure.detail
    assert "--host-wait" in str(caught.value) and "until 30s passed" in str(caught.value)
    assert 30 <= dns.now < 33, "a cached answer lasts up to one lifetime: --host-wait 5 is less"


@pytest.mark.parametrize("old", ["10.244.0.9", None])
def test_a_cached_answer_shorter_than_a_lifetime_is_waited_out_whatever_the_host_wait(
        old: str | None) -> None:
    """A job deleted and applied again under its name: its new worker's name still gives the
    deleted job's pod (or "no such name") from the resolver's cache for 12 s. The default
    host wait (5 s) is not the bound; one cache lifetime is (it failed with DNSStale after 5 s)."""
    dns = FakeDns([(0, old), (12, "10.244.0.5")])
    mismatches: list[tuple[str, str | None, str]] = []

    wait_for_addresses(
        {"w-0": "10.244.0.4", "w-1": "10.244.0.5"}, stable_s=30, wait_s=5,
        resolve=lambda name: "10.244.0.4" if name == "w-0" else dns.resolve(name),
        clock=lambda: dns.now, sleep=dns.sleep,
        on_mismatch=lambda *answer: mismatches.append(answer),
    )  # fmt: skip

    assert dns.now >= 42, "the right answer at 12 s, then 30 s of it"
    assert mismatches == [("w-1", old, "10.244.0.5")], "said once, for the cached name only"


@pytest.mark.parametrize(
    ("item", "rule"),
    [
        ("w-1", "expected NAME=IP"),
        ("w-1=not-an-ip", "is not an IPv4 address"),
        ("w-9=10.244.0.1", "is not one of the run's hosts"),
        ("w-1=10.244.0.1,w-1=10.244.0.2", "given two addresses"),
    ],
)
def test_malformed_host_addresses_are_refused_naming_the_rule(item: str, rule: str) -> None:
    with pytest.raises(HostAddressError, match=rule):
        parse_host_addresses([item], ["w-0", "w-1"])


def test_host_addresses_from_flags_and_the_environment_variable() -> None:
    assert parse_host_addresses(["w-0=10.244.0.4, w-1=10.244.0.5", "", "w-1=10.244.0.5"],
                                ["w-0", "w-1"]) == {"w-0": "10.244.0.4", "w-1": "10.244.0.5"}


def test_the_operators_addresses_file_gives_the_same_mapping() -> None:
    # What the hostfile ConfigMap's "addresses" key holds: "<fqdn> <pod IP>" per worker.
    text = "# attempt 2\nd-worker-0.d-worker.ns.svc.cluster.local 10.244.0.4\n\n" \
        "d-worker-1.d-worker.ns.svc.cluster.local 10.244.0.5  # recreated\n"
    names = ["d-worker-0.d-worker.ns.svc.cluster.local", "d-worker-1.d-worker.ns.svc.cluster.local"]
    assert parse_host_addresses(host_address_lines(text, "addresses"), names) == {
        names[0]: "10.244.0.4",
        names[1]: "10.244.0.5",
    }
    with pytest.raises(HostAddressError, match="addresses:2: expected 'NAME IP'"):
        host_address_lines("a 10.244.0.1\nb\n", "addresses")


# -- locked memory (C26) ---------------------------------------------------------------------


def check(host: str, memlock: int, infiniband: bool = False) -> HostCheck:
    return HostCheck(host, "10.244.0.1", memlock=(memlock, memlock), infiniband=infiniband)


def test_the_plan_line_names_each_hosts_limit() -> None:
    summary, warning = memlock_lines([check("a", 65536), check("b", -1)], {})
    assert summary == "locked memory (ulimit -l) per host: 64 KiB on a; unlimited on b"
    assert warning is None, "no RDMA, no warning"


@pytest.mark.parametrize(
    ("environment", "infiniband", "why"),
    [
        ({"NCCL_IB_HCA": "mlx5"}, False, "NCCL_IB_HCA is set"),
        ({}, True, "/dev/infiniband exists on a"),
    ],
)
def test_rdma_with_a_limited_host_warns_naming_host_and_limit(
    environment: dict[str, str], infiniband: bool, why: str
) -> None:
    _, warning = memlock_lines([check("a", 65536, infiniband), check("b", -1)], environment)
    assert warning is not None
    assert why in warning and "a: 64 KiB" in warning and "b:" not in warning
    assert "container runtime" in warning


def test_rdma_disabled_or_unlimited_everywhere_does_not_warn() -> None:
    assert rdma_in_play({"NCCL_IB_HCA": "mlx5", "NCCL_IB_DISABLE": "1"}, []) is None
    assert memlock_lines([check("a", -1)], {"NCCL_IB_HCA": "mlx5"})[1] is None
    assert format_limit(8 << 20) == "8 MiB"


# -- stop signals ------------------------------------------------------------------------------


@pytest.fixture
def fresh_signal_state() -> Iterator[None]:
    stopsignal.reset()
    yield
    stopsignal.reset()


@pytest.mark.usefixtures("fresh_signal_state")
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_after_a_stop_signal_success_is_never_reported(
    number: int, capsys: pytest.CaptureFixture[str]
) -> None:
    stopsignal.record(number)
    stopsignal.record(signal.SIGTERM)  # a later one does not change the verdict

    code = Reporter().result(0)

    name = signal.Signals(number).name
    assert code == 128 + number
    assert capsys.readouterr().err.strip() == (
        f"monarch-launch: failed: terminated by signal {number} ({name})"
    )


@pytest.mark.usefixtures("fresh_signal_state")
def test_without_a_signal_the_result_is_unchanged() -> None:
    assert stopsignal.final_result(3, "rank 0 exited 3") == (3, "rank 0 exited 3")
