"""An attempt ended by its hardware (issue 35 items 1 and 2, field case C34), never charged
to the program:

- a device of one of its workers reported Unhealthy (:mod:`..state.devicehealth`): the attempt
  ends as Infrastructure with reason ``GPUUnhealthy`` naming node, pod and device, at once
  while it runs or when its launcher failed; that worker's pod is deleted so that the
  StatefulSet recreates it, and the new pod cannot get the device (the device plugin's Unhealthy
  devices are out of the node's allocatable); the other workers keep their pods;
- a failed launcher whose failure line (``monarch-launch`` marks it, naming the host) or whose
  log's tail has a line that means a hardware fault (:mod:`monarch_operator.hwerrors`, the
  job's ``spec.runPolicy.hardwareErrors``): Infrastructure with reason ``GPUHardwareError``
  naming host and rank; the workers keep their pods (which device is to blame is not known).

The functions ``unhealthy_*``/``hardware_*`` are pure; :func:`end_if_unhealthy` and
:func:`end_if_hardware_error` end the attempt (:func:`.endings.end_attempt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monarch_operator import hwerrors
from monarch_operator.controller.builders.launcher import LAUNCHER_CONTAINER
from monarch_operator.controller.judge import endings
from monarch_operator.controller.k8s import reads
from monarch_operator.controller.spec import policy
from monarch_operator.controller.state import attempts, devicehealth, observe
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Pass, short

# How many lines of a failed launcher's log are scanned for a hardware line: a rank's last
# words come before its traceback, Monarch's fault reports and the teardown's lines.
HARDWARE_SCAN_LINES = 200


def unhealthy_workers(devices: list[devicehealth.UnhealthyDevice],
                      worker_pods: list[dict[str, Any]]) -> list[attempts.LostWorker]:
    """One lost worker per pod of ``devices``, its cause the devices (``nvidia.com/gpu device 1
    Unhealthy``), marked to be recreated (``node_lost``: the ended attempt's
    ``recreatedWorkers`` names its pod by its uid in ``worker_pods``, the pods the devices were
    read from, and :func:`.release.recreate_lost_workers` deletes it once that is stored)."""
    uid_of = {pod["metadata"]["name"]: str(pod["metadata"].get("uid") or "")
              for pod in worker_pods}
    by_pod: dict[str, list[devicehealth.UnhealthyDevice]] = {}
    for device in devices:
        by_pod.setdefault(device.pod, []).append(device)
    return [attempts.LostWorker(
        pod, f"{found[0].resource} device {', '.join(d.device for d in found)} Unhealthy"
        f"{' on node ' + found[0].node if found[0].node else ''}", node_lost=True,
        uid=uid_of.get(pod, ""))
        for pod, found in by_pod.items()]


def unhealthy_message(devices: list[devicehealth.UnhealthyDevice], launcher_said: str = "") -> str:
    """The attempt's message: each device named (:meth:`.UnhealthyDevice.describe`), that its
    pod is recreated, then what the launcher said when it had ended (``launcher_said``)."""
    pods = sorted({device.pod for device in devices})
    text = (f"{short([device.describe() for device in devices])}; pod {short(pods)} recreated "
            f"so that the next attempt gets another device")
    return f"{text}; {launcher_said}" if launcher_said else text


@dataclass(frozen=True)
class HardwareFault:
    """A hardware line found for a failed launcher: the ``host`` it came from (``""`` when not
    known), the failing ``rank`` and its ``role`` as the failure line names them (None, ""
    when not), and the line (:class:`monarch_operator.hwerrors.HardwareLine`)."""

    host: str
    rank: int | None
    role: str
    found: hwerrors.HardwareLine

    def describe(self) -> str:
        """E.g. ``hardware error (ECCUncorrectable) on host demo-worker-1 (trainer rank 2):
        CUDA error: uncorrectable ECC error encountered``."""
        where = f" on host {self.host}" if self.host else ""
        who = " ".join(part for part in (self.role, f"rank {self.rank}"
                                         if self.rank is not None else "") if part)
        return (f"hardware error ({self.found.pattern}){where}{f' ({who})' if who else ''}: "
                f"{self.found.line}")


def hardware_fault(message: str, log_tail: str,
                   patterns: tuple[hwerrors.Pattern, ...]) -> HardwareFault | None:
    """The hardware fault a failed launcher's ``message`` (its failure line) and ``log_tail``
    show, else None: the launcher's own mark (``[GPUHardwareError on host H: ...]``, naming
    the host whose output had it) first, then a line of either matching ``patterns``. The rank
    and host come from the failure line (:func:`.attempts.failing_rank`)."""
    rank = attempts.failing_rank(message)
    marked = hwerrors.MARKER.search(message or "")
    if marked is not None:
        found = hwerrors.HardwareLine(marked["pattern"], marked["line"].strip())
        return HardwareFault(marked["host"], rank.get("rank"), str(rank.get("role") or ""), found)
    line = hwerrors.find([message or "", log_tail or ""], patterns)
    if line is None:
        return None
    return HardwareFault(str(rank.get("host") or ""), rank.get("rank"),
                         str(rank.get("role") or ""), line)


def end_if_unhealthy(state: Pass, worker_pods: list[dict[str, Any]],
                     outcome: observe.LauncherOutcome,
                     launcher_pods: list[dict[str, Any]]) -> tuple[bool, str | None]:
    """End the attempt (Infrastructure, ``GPUUnhealthy``) when a device of one of its workers
    is reported Unhealthy; that worker's pod is deleted (recreated by its StatefulSet), the
    running launcher stopped. Returns ``(ended, class when the job restarts)``."""
    snapshot = state.status.get("attemptWorkers") or []
    devices = devicehealth.attempt_unhealthy(snapshot, worker_pods)
    if not devices:
        return False, None
    said = observe.launcher_failure_message(outcome) if outcome.finished else ""
    return True, endings.end_attempt(state, policy.INFRASTRUCTURE, st.REASON_GPU_UNHEALTHY,
                                     unhealthy_message(devices, said), outcome,
                                     unhealthy_workers(devices, worker_pods), launcher_pods)


def end_if_hardware_error(state: Pass, outcome: observe.LauncherOutcome,
                          launcher_pods: list[dict[str, Any]]) -> tuple[bool, str | None]:
    """End the attempt of a failed launcher (Infrastructure, ``GPUHardwareError``) when its
    failure line or its log's last :data:`HARDWARE_SCAN_LINES` lines show a hardware fault
    (:func:`hardware_fault`). Returns ``(ended, class when the job restarts)``."""
    log_tail = ""
    if hwerrors.MARKER.search(outcome.message or "") is None:
        for pod in launcher_pods:  # one log read, only for a failed launcher
            log_tail = reads.pod_log_tail(pod["metadata"].get("namespace", ""),
                                          pod["metadata"]["name"], LAUNCHER_CONTAINER,
                                          HARDWARE_SCAN_LINES) or ""
            break
    fault = hardware_fault(outcome.message, log_tail, state.job.run_policy.hardware_patterns)
    if fault is None:
        return False, None
    message = f"{fault.describe()}; {observe.launcher_failure_message(outcome)}"
    return True, endings.end_attempt(state, policy.INFRASTRUCTURE, st.REASON_GPU_HARDWARE_ERROR,
                                     message, outcome, None, launcher_pods)
