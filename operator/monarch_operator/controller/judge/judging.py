"""The current attempt's launcher judged in a pass: its verdict (:mod:`.verdicts`) from what
happened to it and to its workers, waited for while reports may still come, and the attempt
ended by it (:mod:`.endings`): a lost worker, a launcher lost or stopped, a stall, an exit code
under the run policy. :mod:`..launch.launching` starts and follows the launcher and calls
:func:`judge_launcher` (or :func:`end_launcher_gone` when its pod is gone unseen)."""

from __future__ import annotations

from typing import Any

from monarch_operator.controller.judge import endings, hardware, recreated, stalls, verdicts
from monarch_operator.controller.k8s import nodes as k8s_nodes
from monarch_operator.controller.release import release
from monarch_operator.controller.spec import policy
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts, causes, lastseen, observe, timestamps
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Pass, short


def _lost_nodes(state: Pass, nodes: set[str]) -> frozenset[str]:
    """Those of ``nodes`` taken as lost: not Ready for
    :data:`.attempts.NODE_LOSS_CONFIRM_SECONDS` (a control-plane outage's NotReady blip is not
    a loss); a pass is asked for when one not Ready for less would be."""
    lost, recheck = attempts.confirmed_lost(
        {node: k8s_nodes.node_not_ready_since(node) for node in sorted(nodes)}, state.now)
    state.wake_in(recheck)
    return lost


def _cordoned(pods: list[dict[str, Any]]) -> frozenset[str]:
    """The cordoned nodes among those ``pods`` were evicted from through the Eviction API
    (:func:`.causes.api_evicted_nodes`; nodes are read only then): such an eviction is a
    drain of the node, and said so."""
    return frozenset(node for node in sorted(causes.api_evicted_nodes(pods))
                     if k8s_nodes.node_cordoned(node))


def end_launcher_gone(state: Pass, launcher_name: str,
                       worker_pods: list[dict[str, Any]]) -> str | None:
    """End the attempt whose launcher pod is gone without an ended state seen (deleted while
    it ran, as far as this operator knows: it may have been stopped meanwhile). A worker of
    the attempt lost too is what is known to have happened: the attempt is judged by it
    (``WorkerEvicted``/``WorkerRestarted``: found by the chaos soak, a worker deleted, the
    operator killed, its launcher gone when it came back); else ``LauncherLost``. Both are
    Infrastructure. Returns the class when the job restarts, else None."""
    snapshot = state.status.get("attemptWorkers") or []
    unready = _lost_nodes(state, attempts.nodes_to_check(snapshot, worker_pods))
    lost = attempts.lost_workers(snapshot, worker_pods, unready, _cordoned(worker_pods))
    if lost:
        restarted = all(worker.in_place for worker in lost)
        reason = st.REASON_WORKER_RESTARTED if restarted else st.REASON_WORKER_EVICTED
        return endings.end_attempt(state, policy.INFRASTRUCTURE, reason,
                                   f"worker {short([worker.describe() for worker in lost])} "
                                   f"lost mid-run (launcher pod {launcher_name} gone too)",
                                   None, list(lost))
    # How it went, as the watch last delivered it (evicted, drained ...), else "deleted".
    last = lastseen.launcher(state.job.namespace, state.job.name, int(state.status["attempt"]),
                            state.job.uid)
    stopped = causes.of_pod(last, _cordoned([last])) if last is not None else None
    return endings.end_attempt(state, policy.INFRASTRUCTURE, st.REASON_LAUNCHER_LOST,
                               f"launcher pod {launcher_name} was "
                               f"{stopped.words() if stopped else 'deleted'} while it ran")


def judge_launcher(state: Pass, launcher: dict[str, Any], outcome: observe.LauncherOutcome,
           worker_pods: list[dict[str, Any]], record: dict[str, Any]) -> str | None:
    """End the attempt as :mod:`.verdicts` judges what happened to its launcher and workers
    (or wait: it runs, or late reports may still come). Returns the class of the failure that
    restarted the job, else None."""
    job = state.job
    attempt = int(state.status["attempt"])
    launcher_name = launcher["metadata"]["name"]
    pods = [launcher]
    snapshot = state.status.get("attemptWorkers") or []
    unready_nodes = _lost_nodes(state, attempts.nodes_to_check(snapshot, worker_pods))
    cordoned = _cordoned([launcher, *worker_pods])
    lost = attempts.lost_workers(snapshot, worker_pods, unready_nodes, cordoned)
    verdict = verdicts.judge(launcher, outcome.finished, outcome.succeeded, lost, snapshot,
                             worker_pods, state.now, timestamps.parse(record.get("launchTime")),
                             cordoned)
    if (verdict.kind == verdicts.WORKER_LOST and not outcome.finished
            and _checkpoint_first(state, launcher, list(verdict.lost), worker_pods)):
        return None
    if verdict.kind == verdicts.WORKER_LOST:
        restarted = all(worker.in_place for worker in verdict.lost)
        reason = st.REASON_WORKER_RESTARTED if restarted else st.REASON_WORKER_EVICTED
        message = lost_mid_run_message(state.job, list(verdict.lost))
        return endings.end_attempt(state, policy.INFRASTRUCTURE, reason, message, outcome,
                                   list(verdict.lost), pods)
    if verdict.kind == verdicts.LAUNCHER_STOPPED:  # an exit code is a claim
        return endings.end_attempt(state, policy.INFRASTRUCTURE, st.REASON_LAUNCHER_LOST,
                                   f"launcher pod {launcher_name} {verdict.stopped} while it ran"
                                   f"{_claimed(outcome)}", outcome, None, pods)
    if verdict.kind == verdicts.SETTLING:  # reports of what happened before its end may come
        state.wake_in(verdict.wait_seconds)
        return None
    stalled = stalls.stall_in(outcome.message) if outcome.finished else None
    if stalled:  # the launcher stopped a run that reported no progress for the deadline; its
        # program's exit code (0 when it exits 0 on the SIGTERM) does not say how it ended
        what, stacks = stalled
        restarted = endings.end_attempt(state, policy.INFRASTRUCTURE, st.REASON_PROGRESS_STALLED,
                                        what, outcome, None, pods)
        state.status = stalls.attach_stacks(state.status, attempt, stacks)
        return restarted
    if verdict.kind == verdicts.SUCCEEDED:
        endings.succeed(state, outcome)
        return None
    if not outcome.finished:
        ended, restarted = hardware.end_if_unhealthy(state, worker_pods, outcome, pods)
        if ended:  # a device turned Unhealthy mid-run: its worker is replaced (C34)
            return restarted
        return _end_if_stalled(state, outcome, pods) or _end_if_launcher_lost(state, outcome, pods)
    if outcome.exit_code is None:  # no container ever ended: the pod itself was lost
        return endings.end_attempt(state, policy.INFRASTRUCTURE, st.REASON_LAUNCHER_LOST,
                                   f"launcher pod lost: {outcome.message}", outcome, None, pods)
    down = _workers_nodes_down(launcher, worker_pods, snapshot)
    if down:  # a host lost made the launcher fail, whatever the node does now
        reason = (st.REASON_WORKER_EVICTED if any(worker.node_lost for worker in down)
                  else st.REASON_WORKER_RESTARTED)
        return endings.end_attempt(state, policy.INFRASTRUCTURE, reason,
                                   f"worker {short([worker.describe() for worker in down])} "
                                   f"lost around the launcher's end (it exited "
                                   f"{outcome.exit_code})", outcome, down, pods)
    if _awaiting_heartbeats(state, launcher, outcome, worker_pods, snapshot):
        return None
    for end_if in (lambda: hardware.end_if_unhealthy(state, worker_pods, outcome, pods),
                   lambda: hardware.end_if_hardware_error(state, outcome, pods)):
        ended, restarted = end_if()
        if ended:  # the hardware failed, not the program (C34): never the Application budget
            return restarted
    unreachable = recreated.recreated_workers_unreachable(
        outcome.message, job.name, record, worker_pods)
    if unreachable:  # the program never ran: not its failure (C20)
        return endings.end_attempt(
            state, policy.INFRASTRUCTURE, st.REASON_WORKER_UNREACHABLE,
            f"pre-flight could not reach {'recreated' if attempt > 1 else 'new'} worker "
            f"{short(unreachable)}: "
            f"{observe.launcher_failure_message(outcome)}", outcome, None, pods)
    skewed = recreated.version_skew_hosts(outcome.message)
    if skewed:  # C27: no restart can make the versions match
        return endings.end_attempt(
            state, policy.FATAL, st.REASON_VERSION_SKEW,
            f"pre-flight refused worker {short(skewed)} (versions differ from the launcher's): "
            f"{observe.launcher_failure_message(outcome)}", outcome, None, pods)
    judged = policy.classify_exit_code(job.run_policy, outcome.exit_code)
    reason = (st.REASON_FATAL_EXIT_CODE if judged.failure_class == policy.FATAL
              else st.REASON_LAUNCHER_FAILED)
    message = observe.launcher_failure_message(outcome)
    if judged.rule_index is not None:
        message += f" ({judged.describe(outcome.exit_code)})"
    return endings.end_attempt(state, judged.failure_class, reason, message, outcome, None, pods)


def _described(job: JobSpec, lost: list[attempts.LostWorker]) -> str:
    """The ``lost`` workers in a few words, each with its group when the job has groups."""
    return short([worker.describe(job.group_of_pod(worker.name)) for worker in lost])


def lost_mid_run_message(job: JobSpec, lost: list[attempts.LostWorker]) -> str:
    """The message of an attempt ended by ``lost`` workers, e.g. ``worker demo-worker-1
    (deleted) lost mid-run``; a worker of one of ``spec.workerGroups`` is named with its group:
    ``worker rl-generator-1 (group generator, deleted) lost mid-run``."""
    return f"worker {_described(job, lost)} lost mid-run"


def _checkpoint_first(state: Pass, launcher: dict[str, Any], lost: list[attempts.LostWorker],
                      worker_pods: list[dict[str, Any]]) -> bool:
    """Whether the attempt, whose ``lost`` workers are being stopped from outside with a grace
    period (a node drain, a preemption: :func:`.attempts.leaving_gracefully`), waits while its
    launcher, asked to stop first, lets the program save its state (issue 21 item 4, with
    ``runPolicy.checkpointGracePeriodSeconds`` above 0). The workers' pods keep their open
    sessions meanwhile (images/worker/entrypoint.sh). The attempt ends as for any lost worker
    once the launcher ended (its checkpoint harvested) or the period passed."""
    if (state.job.run_policy.checkpoint_grace_seconds <= 0
            or not attempts.leaving_gracefully(lost, worker_pods)):
        return False
    _, workers_may_go = release.stop_launcher_first(state, launcher)
    if workers_may_go:
        return False
    state.condition(st.RUNNING, True, st.REASON_CHECKPOINT_BEFORE_DISRUPTION,
                    f"worker {_described(state.job, lost)} is being stopped; "
                    f"launcher {launcher['metadata']['name']} asked to stop first so that the "
                    f"program can save its state (up to "
                    f"{state.job.run_policy.checkpoint_grace_seconds}s)")
    return True


def _workers_nodes_down(launcher: dict[str, Any], worker_pods: list[dict[str, Any]],
                        snapshot: list[dict[str, Any]]) -> list[attempts.LostWorker]:
    """The attempt's workers on a node that was not Ready at some moment since the failed
    launcher's end (:func:`.verdicts.nodes_down_since`), in snapshot order; ``[]`` when none
    or when nodes may not be read. A worker whose node is still not Ready is ``node_lost``
    (its pod is to be recreated elsewhere); one whose node is back keeps its pod."""
    readiness = k8s_nodes.node_readiness()
    down = set(verdicts.nodes_down_since(snapshot, worker_pods, readiness,
                                         verdicts.launcher_end(launcher)))
    if not down or readiness is None:
        return []
    node_of = {pod["metadata"]["name"]: (pod.get("spec") or {}).get("nodeName")
               for pod in worker_pods}
    uid_of = {pod["metadata"]["name"]: str(pod["metadata"].get("uid") or "")
              for pod in worker_pods}
    lost = []
    for entry in snapshot:
        node = node_of.get(entry["name"])
        if node in down:
            still = not readiness.get(str(node), (False, None))[0]
            kind = causes.NODE_NOT_READY if still else causes.NODE_WAS_NOT_READY
            lost.append(attempts.LostWorker(entry["name"], causes.Cause(kind, str(node)).words(),
                                            node_lost=still, uid=uid_of[entry["name"]]))
    return lost


def _awaiting_heartbeats(state: Pass, launcher: dict[str, Any], outcome: observe.LauncherOutcome,
                        worker_pods: list[dict[str, Any]], snapshot: list[dict[str, Any]]) -> bool:
    """Whether the failed launcher's verdict waits for a node of its workers that has not
    heartbeated since the launcher ended (:func:`.verdicts.heartbeat_hold`): a host lost with
    its node makes the launcher fail long before the node is NotReady. The Running condition
    says so meanwhile, and a pass comes back every few seconds."""
    ended = verdicts.launcher_end(launcher)
    waiting = verdicts.heartbeat_hold(snapshot, worker_pods, k8s_nodes.node_heartbeats(), ended,
                                      state.now)
    if not waiting:
        return False
    state.condition(st.RUNNING, True, st.REASON_AWAITING_NODE_HEARTBEAT,
                    f"launcher {launcher['metadata']['name']} exited with code "
                    f"{outcome.exit_code}; judged once node {short(waiting)} heartbeats again "
                    f"or is marked NotReady (at most {verdicts.NODE_SILENCE_HOLD_SECONDS:.0f} s "
                    f"after its end)")
    state.wake_in(verdicts.HEARTBEAT_RECHECK_SECONDS)
    return True


def _claimed(outcome: observe.LauncherOutcome) -> str:
    """What the stopped launcher's exit code claimed, not believed (`` (it exited 0)``)."""
    return "" if outcome.exit_code is None else f" (it exited {outcome.exit_code})"


def _end_if_stalled(state: Pass, outcome: observe.LauncherOutcome,
                    pods: list[dict[str, Any]]) -> str | None:
    """The operator's backstop for a stalled attempt whose launcher did not stop the run
    itself (:func:`.stalls.overdue_seconds`): end it (Infrastructure, ProgressStalled; the
    launcher pod is stopped). Asks for a pass when it would become overdue. Returns the class
    when the job restarts, else None (also when it is not overdue)."""
    job = state.job
    left = stalls.overdue_seconds(state.status, state.now, job.run_policy.progress_deadline_seconds,
                                  job.progress_interval_seconds)
    if left is None:
        return None
    if left > 0:
        state.wake_in(left)
        return None
    idle = stalls.reported_idle_seconds(state.status, state.now) or 0.0
    return endings.end_attempt(
        state, policy.INFRASTRUCTURE, st.REASON_PROGRESS_STALLED,
        f"no progress report for {idle:.0f}s (runPolicy.progressDeadlineSeconds="
        f"{job.run_policy.progress_deadline_seconds}); the launcher did not stop the run "
        f"itself: stopped by the operator", outcome, None, pods)


def _end_if_launcher_lost(state: Pass, outcome: observe.LauncherOutcome,
                          pods: list[dict[str, Any]]) -> str | None:
    """End the attempt (Infrastructure, LauncherLost) when its running launcher pod is not
    Ready on a node that is not Ready (:func:`.attempts.lost_launcher`), long before the
    taint-based eviction would end it. The pod is deleted by :func:`.endings.end_attempt`; stuck
    Terminating while its node is away, it is force-deleted by the next attempt's wait for it
    (:func:`.launching._waiting_for_earlier_launcher`). While a launcher pod is not Ready a
    pass is asked for again (:func:`.attempts.launcher_recheck_in`). Returns the failure class
    when the job restarts, else None."""
    unready_nodes = _lost_nodes(state, attempts.launcher_nodes_to_check(pods))
    lost = attempts.lost_launcher(pods, unready_nodes)
    if lost is None:  # a launcher lost before it was ever Ready gets no pod event: look again
        state.wake_in(attempts.launcher_recheck_in(pods, state.now))
        return None
    pod_name, node = lost
    return endings.end_attempt(state, policy.INFRASTRUCTURE, st.REASON_LAUNCHER_LOST,
                               f"launcher pod {pod_name} lost with its node {node} (NotReady)",
                               outcome, None, pods)
