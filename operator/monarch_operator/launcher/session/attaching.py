"""Waiting for a session's workers: first each worker's host agent up, then each mesh attached.

Monarch's worker opens its port before its host agent is bound (``Host::new_with_gateway``
listens first; ``HostAgent::init`` binds later, hyperactor_mesh, torchmonarch 0.7.0): 1-16 ms
apart on a loaded 2-core machine. A client message that arrives in between can come back
undeliverable, and the attach config push is sent only once: its mesh then waits out the attach
limit and fails, though the worker came up a moment later. The sample job on the real nodes
failed so in CI (stop 56: the ref worker's host-agent line came after Monarch's undeliverable
report, 2 s into the attach; earlier loaded runs timed out at the push the same way). So
:func:`wait_workers_up` holds the attach until every worker said its host agent is up
(:data:`launcher.session.sshjob.HOST_AGENT_UP` on its output), and :func:`wait_attached` then
waits for the mesh. Both check the ssh clients meanwhile: a worker that dies first fails the
launch at once, naming its host, instead of at the attach timeout. And should Monarch still
report a message to a host agent of the attaching mesh undeliverable (the push is lost, the
attach doomed), :func:`attach_all` attaches that mesh once more at once, rather than fail the
launch at the attach timeout for a worker that is up (re-attaching to a serving worker works:
Monarch's ``attach_to_workers`` docs; checked on torchmonarch 0.7.0).

Imported only with Monarch (no Monarch import here, but the job it works on is Monarch's).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING

from monarch_operator.launcher.session.workerloss import WorkerStartFailed

if TYPE_CHECKING:
    from monarch.actor import HostMesh

    from monarch_operator.launcher.report import Reporter
    from monarch_operator.launcher.session.sshjob import LauncherSSHJob

# How often the ssh clients are checked while the workers start and the meshes attach, seconds:
# a worker that dies before it attached (port taken, import error, crash) fails the launch at
# once instead of at the attach timeout.
ATTACH_POLL_S = 0.25
# Beyond the launcher's attach limit, the slack both waits allow, seconds (the limit counts from
# the meshes' creation, after the ssh logins).
ATTACH_SLACK_S = 5
# Monarch's words when a worker did not answer the config push in time, and its address in them.
_CONFIG_PUSH_TIMEOUT = "MESH_ATTACH_CONFIG_TIMEOUT"
_PUSH_ADDRESS = re.compile(r"tcp:\[?([0-9A-Za-z.:_-]+?)\]?:\d+")
_SLOW_HINT = "(raise --attach-timeout if workers start slowly)"
# Monarch's fault report when a message to a worker's host agent came back: what it says of the
# lost attach config push (seen in CI: "undeliverable message to host_agent.service<..>:<..>@
# tcp://10.244.2.10:22222: description: delivery of message from sender to dest failed ...").
_BOUNCED = "undeliverable message to host_agent"
_HOST_AGENT_LOCATION = re.compile(r"host_agent[^@\s]*@(\w+://\S+?:\d+)")


class AttachBounced(Exception):
    """Monarch reported a message to a host agent of the mesh being attached undeliverable.

    Attributes:
        mesh: the mesh.
        hosts: the hosts (as the hostfile names them) whose host agent it was.
    """

    def __init__(self, mesh: str, hosts: Sequence[str]) -> None:
        self.mesh = mesh
        self.hosts = list(hosts)
        super().__init__(
            f"mesh {mesh}: Monarch could not deliver the attach to the worker on "
            f"{', '.join(self.hosts)}"
        )


def bounced_hosts(reports: Sequence[str], locations: Mapping[str, str]) -> list[str]:
    """The hosts whose host agent one of Monarch's fault ``reports`` could not reach.

    Args:
        reports: fault reports (:class:`launcher.session.lifecycle.FaultRecorder`), whole.
        locations: ``{host: its worker's location}``, such as ``"tcp://10.244.1.3:22222"``.

    Returns:
        Those hosts, in the order of ``locations``.
    """
    agents = {
        location
        for report in reports
        if _BOUNCED in report
        for location in _HOST_AGENT_LOCATION.findall(report)
    }
    return [host for host, location in locations.items() if location in agents]


def attach_all(
    job: LauncherSSHJob,
    host_meshes: MutableMapping[str, HostMesh],
    timeout_s: float,
    names: Mapping[str, str],
    reports: Callable[[], Sequence[str]],
    reporter: Reporter,
) -> None:
    """Wait until every mesh of ``host_meshes`` attached, in order, reporting each; a mesh whose
    attach bounced (:class:`AttachBounced`) is attached once more, its entry replaced.

    Args:
        job: the job, its meshes created (``job.state()``).
        host_meshes: ``{mesh name: HostMesh}``; updated in place on a re-attach.
        timeout_s: the launcher's attach limit, seconds, for each attach.
        names: host name by address.
        reports: Monarch's fault reports of this session so far (those from before the attach
            left out).

    Raises:
        What :func:`wait_attached` raises; a second bounce ends as its attach timeout.
    """
    for name in list(host_meshes):
        locations = {
            names.get(address, address): location
            for address, location in job.worker_locations(name).items()
        }

        def bounced(locations: Mapping[str, str] = locations) -> list[str]:
            return bounced_hosts(reports(), locations)

        try:
            wait_attached(job, name, host_meshes[name], timeout_s, names, bounced=bounced)
        except AttachBounced as bounce:
            reporter.warning(f"{bounce}; attaching mesh {name} again")
            host_meshes[name] = job.attach_again(name)
            wait_attached(job, name, host_meshes[name], timeout_s, names)
        reporter.progress(f"mesh {name} attached")


def wait_workers_up(
    job: LauncherSSHJob,
    meshes: Sequence[tuple[str, Sequence[str]]],
    addresses: Mapping[str, str],
    timeout_s: float,
    names: Mapping[str, str],
) -> None:
    """Wait until the worker on every host of ``meshes`` has its host agent up.

    Args:
        job: the applied job (its ssh sessions started).
        meshes: ``(mesh name, host names)`` pairs, as given to the job.
        addresses: ``{host name: IPv4 address}``; the job knows hosts by address.
        timeout_s: the launcher's attach limit, seconds (``--attach-timeout``); the wait allows
            ``ATTACH_SLACK_S`` more.
        names: host name by address, to name hosts as the hostfile does.

    Raises:
        WorkerStartFailed: a worker's ssh client exited first, naming its host, ssh's exit
            status and the worker's last output (the mesh named is the first still waiting).
        TimeoutError: a worker did not come up in time; names its mesh and host.
    """
    deadline = time.monotonic() + timeout_s + ATTACH_SLACK_S
    for name, hosts in meshes:
        while waiting := job.workers_not_up([addresses[host] for host in hosts]):
            _raise_if_workers_exited(job, name, names)
            if time.monotonic() > deadline:
                silent = ", ".join(names.get(address, address) for address in waiting)
                raise TimeoutError(
                    f"mesh {name} did not attach within {timeout_s + ATTACH_SLACK_S:g}s: the "
                    f"worker on {silent} did not come up {_SLOW_HINT}"
                )
            time.sleep(ATTACH_POLL_S / 5)


def wait_attached(
    job: LauncherSSHJob,
    name: str,
    host_mesh: HostMesh,
    timeout_s: float,
    names: Mapping[str, str],
    bounced: Callable[[], Sequence[str]] | None = None,
) -> None:
    """Wait until ``host_mesh`` attached, checking the ssh clients every ``ATTACH_POLL_S``.

    ``bounced``, when given, is asked as often which of the mesh's hosts Monarch could not
    deliver the attach to (:func:`bounced_hosts`).

    Raises:
        AttachBounced: ``bounced`` named a host.
        WorkerStartFailed: a worker's ssh client exited first (any mesh's: the launch cannot
            go on), naming its host, ssh's exit status and the worker's last output.
        TimeoutError: not attached within ``timeout_s`` plus ``ATTACH_SLACK_S`` seconds, or
            Monarch's own config push to a worker timed out (the message then names the hosts
            that did not answer and ``--attach-timeout``).
    """
    attached = host_mesh.initialized  # one Future: a get() that times out does not consume it
    deadline = time.monotonic() + timeout_s + ATTACH_SLACK_S
    limit = f"{timeout_s + ATTACH_SLACK_S:g}s"
    while True:
        polled = time.monotonic()
        try:
            attached.get(timeout=ATTACH_POLL_S)
            return
        except Exception as error:
            _raise_if_workers_exited(job, name, names, cause=error)
            # A TimeoutError before the poll's time is up is Monarch's own answer, not the poll's.
            early = time.monotonic() - polled < ATTACH_POLL_S / 2
            if _CONFIG_PUSH_TIMEOUT in str(error):
                raise TimeoutError(attach_timeout_message(name, limit, str(error), names)) from None
            if not isinstance(error, TimeoutError) or early:
                raise
            if bounced is not None and (hosts := bounced()):
                raise AttachBounced(name, hosts) from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"mesh {name} did not attach within {limit}") from None


def attach_timeout_message(
    name: str, limit: str, monarch_error: str, names: Mapping[str, str]
) -> str:
    """Say which hosts of mesh ``name`` did not answer Monarch's attach config push.

    Args:
        name: the mesh.
        limit: the launcher's attach limit as shown to users, e.g. ``"35s"``.
        monarch_error: Monarch's error text, which lists the silent workers as
            ``tcp:<address>:<port>``.
        names: host name by address, to name hosts as the hostfile does.

    Returns:
        One line such as ``mesh spmd did not attach within 35s: no answer from the worker on
        node-0 (raise --attach-timeout if workers start slowly)``.
    """
    addresses = _PUSH_ADDRESS.findall(monarch_error)
    silent = sorted({names.get(address, address) for address in addresses})
    where = f" from the worker on {', '.join(silent)}" if silent else " from a worker"
    return f"mesh {name} did not attach within {limit}: no answer{where} {_SLOW_HINT}"


def _raise_if_workers_exited(
    job: LauncherSSHJob,
    name: str,
    names: Mapping[str, str],
    cause: BaseException | None = None,
) -> None:
    exited = job.exited_ssh()
    if exited:
        exits = {
            names.get(address, address): (code, job.output_tail(address))
            for address, code in exited.items()
        }
        raise WorkerStartFailed(name, exits) from cause
