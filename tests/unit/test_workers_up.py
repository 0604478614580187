"""The attach waits for each worker's host agent (launcher.session.attaching, CI of stop 56).

A worker's port opens before its host agent is bound; the attach config push that reaches it in
between bounces, and the mesh then fails at the attach timeout. So the launcher attaches only
once every worker printed Monarch's line from ``HostAgent::init``; these tests hold that wait to
its contract with a stand-in job (the real line, printed by real workers, is what every launcher
test's attach now passes through).
"""

from __future__ import annotations

import mmap
import os
import threading
import time

import pytest

from monarch_operator.launcher.session import attaching
from monarch_operator.launcher.session.attaching import wait_workers_up
from monarch_operator.launcher.session.sshjob import HOST_AGENT_UP, _OutputTail
from monarch_operator.launcher.session.workerloss import WorkerStartFailed

MESHES = [("trainer", ["node-0", "node-1"]), ("ref", ["node-2"])]
ADDRESSES = {"node-0": "10.244.1.1", "node-1": "10.244.1.2", "node-2": "10.244.1.3"}
NAMES = {address: host for host, address in ADDRESSES.items()}


class StandInJob:
    """What the wait reads of a LauncherSSHJob: which workers are up, which ssh clients exited."""

    def __init__(self) -> None:
        self.up: set[str] = set()
        self.exited: dict[str, int] = {}
        self.asked: list[list[str]] = []

    def workers_not_up(self, hosts: list[str]) -> list[str]:
        self.asked.append(list(hosts))
        return [host for host in hosts if host not in self.up]

    def exited_ssh(self) -> dict[str, int]:
        return dict(self.exited)

    def output_tail(self, host: str) -> list[str]:
        return [f"last words of {host}"]


def later(seconds: float, action) -> threading.Timer:  # type: ignore[no-untyped-def]
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_returns_only_once_the_last_worker_is_up() -> None:
    job = StandInJob()
    job.up = {"10.244.1.1", "10.244.1.3"}
    timer = later(0.4, lambda: job.up.add("10.244.1.2"))
    started = time.monotonic()

    wait_workers_up(job, MESHES, ADDRESSES, 10, NAMES)  # type: ignore[arg-type]

    timer.join()
    assert time.monotonic() - started >= 0.4
    assert job.workers_not_up(list(ADDRESSES.values())) == []


def test_a_worker_that_dies_first_fails_at_once_naming_its_host() -> None:
    job = StandInJob()
    job.up = {"10.244.1.1", "10.244.1.2"}
    later(0.2, lambda: job.exited.update({"10.244.1.3": 1}))
    started = time.monotonic()

    with pytest.raises(WorkerStartFailed) as failed:
        wait_workers_up(job, MESHES, ADDRESSES, 30, NAMES)  # type: ignore[arg-type]

    assert time.monotonic() - started < 10
    assert failed.value.mesh == "ref"
    assert failed.value.exits == {"node-2": (1, ["last words of 10.244.1.3"])}


def test_a_worker_that_never_comes_up_times_out_naming_its_mesh_and_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attaching, "ATTACH_SLACK_S", 0)
    job = StandInJob()
    job.up = {"10.244.1.1", "10.244.1.3"}

    with pytest.raises(TimeoutError) as timed_out:
        wait_workers_up(job, MESHES, ADDRESSES, 0.3, NAMES)  # type: ignore[arg-type]

    assert str(timed_out.value) == (
        "mesh trainer did not attach within 0.3s: the worker on node-1 did not come up "
        "(raise --attach-timeout if workers start slowly)"
    )


def test_the_output_tail_marks_the_host_agent_up_on_monarchs_line_only() -> None:
    read_end, write_end = os.pipe()
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        with os.fdopen(read_end, "rb") as source:
            tail = _OutputTail(source, sink)
            os.write(write_end, b"Monarch internal logs are being written")  # no newline yet
            time.sleep(0.2)
            assert not tail.agent_up.is_set()
            os.write(write_end, b" to /tmp/root/monarch_log.log; execution id x\nmore\n")
            assert tail.agent_up.wait(5)
            os.close(write_end)
            write_end = -1
            assert tail.last_lines(5)[0].startswith(HOST_AGENT_UP.decode())
    finally:
        os.close(sink)
        if write_end >= 0:
            os.close(write_end)


def test_the_pinned_monarch_still_prints_the_line_the_launcher_waits_for() -> None:
    import monarch

    extension = next(
        os.path.join(os.path.dirname(monarch.__file__), name)
        for name in os.listdir(os.path.dirname(monarch.__file__))
        if name.startswith("_rust_bindings") and name.endswith(".so")
    )
    with open(extension, "rb") as binary:
        text = mmap.mmap(binary.fileno(), 0, prot=mmap.PROT_READ)
    with text:
        assert text.find(HOST_AGENT_UP) >= 0, f"{extension} no longer prints {HOST_AGENT_UP!r}"


# Monarch's fault report from the CI run that failed (stop 56), cut where it was printed.
BOUNCE = (
    "The actor <monarch._src.actor.actor_mesh.RootClientActor client> and all its descendants "
    "have failed: undeliverable message to host_agent.service<hV59pGM38eb>:<gmkDYMTEV4b>@tcp://"
    "10.244.2.10:22222: description: delivery of message from sender to dest failed sender: "
    "client.local<czprDtXge14>@tcp://10.244.2.11:39615 dest: host_agent.service<hV59pGM38eb>:"
    "<gmkDYMTEV4b>@tcp://10.244.2.10:22222 messa"
)


def test_a_bounce_names_the_host_whose_host_agent_it_was_and_no_other() -> None:
    locations = {
        "worker-1": "tcp://10.244.2.1:22222",  # a prefix of worker-2's address
        "worker-2": "tcp://10.244.2.10:22222",
        "launcher": "tcp://10.244.2.11:39615",  # the sender, not a host agent
    }

    assert attaching.bounced_hosts([BOUNCE], locations) == ["worker-2"]
    assert attaching.bounced_hosts(["mesh ref: some other fault @tcp://10.244.2.10:22222:"],
                                   locations) == []
    assert attaching.bounced_hosts([BOUNCE], {"w": "tcp://10.244.2.10:2222"}) == []


class Attaching:
    """A HostMesh stand-in whose ``initialized`` answers after ``attached_after`` seconds, or
    never (None)."""

    def __init__(self, attached_after: float | None) -> None:
        self._at = None if attached_after is None else time.monotonic() + attached_after
        self.initialized = self

    def get(self, timeout: float) -> None:
        if self._at is not None and time.monotonic() + timeout >= self._at:
            time.sleep(max(0.0, self._at - time.monotonic()))
            return
        time.sleep(timeout)
        raise TimeoutError


class AttachingJob(StandInJob):
    def __init__(self, again: Attaching) -> None:
        super().__init__()
        self.again = again
        self.attached_again: list[str] = []

    def worker_locations(self, mesh: str) -> dict[str, str]:
        hosts = dict(MESHES)[mesh]
        return {ADDRESSES[host]: f"tcp://{ADDRESSES[host]}:22222" for host in hosts}

    def attach_again(self, mesh: str) -> Attaching:
        self.attached_again.append(mesh)
        return self.again


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, text: str) -> None:
        self.lines.append(f"warning: {text}")

    def progress(self, text: str) -> None:
        self.lines.append(text)


def test_a_bounced_attach_is_attached_again_at_once_and_only_that_mesh() -> None:
    again = Attaching(attached_after=0.1)
    job = AttachingJob(again)
    meshes = {"trainer": Attaching(attached_after=0.2), "ref": Attaching(attached_after=None)}
    reports: list[str] = []
    later(0.5, lambda: reports.append(BOUNCE.replace("10.244.2.10", "10.244.1.3")))
    reporter = Lines()
    started = time.monotonic()

    attaching.attach_all(job, meshes, 30, NAMES, lambda: reports, reporter)  # type: ignore[arg-type]

    assert time.monotonic() - started < 10  # not the attach timeout
    assert job.attached_again == ["ref"]
    assert meshes["ref"] is again
    assert reporter.lines == [
        "mesh trainer attached",
        "warning: mesh ref: Monarch could not deliver the attach to the worker on node-2; "
        "attaching mesh ref again",
        "mesh ref attached",
    ]


def test_an_attach_that_bounces_twice_ends_at_the_attach_timeout_naming_the_mesh() -> None:
    job = AttachingJob(Attaching(attached_after=None))
    meshes = {"ref": Attaching(attached_after=None)}
    reports = [BOUNCE.replace("10.244.2.10", "10.244.1.3")]

    with pytest.raises(TimeoutError, match=r"^mesh ref did not attach within 1\.5s$"):
        attaching.attach_all(job, meshes, 1.5 - attaching.ATTACH_SLACK_S, NAMES,  # type: ignore[arg-type]
                             lambda: reports, Lines())

    assert job.attached_again == ["ref"]
