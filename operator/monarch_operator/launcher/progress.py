"""The program's progress reports, forwarded by the launcher to its MonarchJob (issue 22).

A program reports with :func:`report` (``monarch_operator.job.report``), from the launcher's
process or from any rank; a script that imports nothing of ours prints a line instead::

    print('MONARCH_PROGRESS {"step": 120, "totalSteps": 1000, "metrics": {"loss": 0.31}}',
          flush=True)

:func:`report` called in a rank's process prints that same line (in the launcher's process
without a MonarchJob, a run on a hostfile, it goes nowhere). Every line of the
workers' output passes the launcher (``session/sshjob.py``), which hands those with the marker
to :func:`feed_line`. In a MonarchJob's launcher pod (``MONARCH_PROGRESS_CONFIGMAP`` set) a
:class:`Forwarder` keeps the latest state (the last step, total, metrics, checkpoint and run
URL each report gave, the time of the last one, the recent rate of steps) and writes it to the
job's ``<job>-progress`` ConfigMap at most once per ``MONARCH_PROGRESS_INTERVAL_SECONDS``: a
thread waits on a condition for a new report (nothing is polled), then for the interval since
its last write. The last report is written when the launcher ends (:func:`close`, also at
exit), so the final step is never lost. The operator copies it to ``status.progress``
(``controller/launch/reported.py``). A write that fails is said once on stderr and never fails the
run. Without a ConfigMap (the launcher on a hostfile) reports go nowhere but the output.

**Hang detection** (``runPolicy.progressDeadlineSeconds``, ``MONARCH_PROGRESS_DEADLINE_SECONDS``):
a program that reported once and then not for that long has stalled (a collective waiting on a
dead peer, a stuck generator). The forwarder's thread, which waits for reports anyway, notices
it: the launcher prints its threads' stacks, stops the run as a SIGTERM would, and ends with
``ProgressStalled: ...; threads: ...`` (its termination message), which the operator judges
(``controller/judge/stalls.py``). A program that registered a taker of its ranks' stacks
(:func:`set_stall_stacks`; SPMD mode does, issue 35) gets every rank's stack taken first: the
message then names the odd rank out and its threads are one line per rank. Standalone (no
MonarchJob) the same deadline applies when ``MONARCH_PROGRESS_DEADLINE_SECONDS`` is set: the
reports then go nowhere but the stall is still caught.
"""

from __future__ import annotations

import atexit
import collections
import datetime as dt
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from monarch_operator import constants
from monarch_operator.launcher import stopsignal, termination
from monarch_operator.launcher.configmapwriter import ConfigMapWriter, end_with_job

MARKER = constants.PROGRESS_LINE_MARKER
DEFAULT_INTERVAL_SECONDS = 10.0
CLOSE_TIMEOUT_SECONDS = 5.0  # the last write at the end waits at most this long
RATE_WINDOW_SECONDS = 300.0  # the rate of steps is taken over about the last 5 minutes

_lock = threading.Lock()
_forwarder: Forwarder | None = None
_writer: ConfigMapWriter | None = None  # the forwarder's, kept for end_if_job_gone
_closed = False  # close() ran: no new Forwarder at the launcher's end
_in_launcher = False  # this process starts the workers (mark_launcher): never print reports
# set_stall_stacks: () -> (odd one out, one line per rank), or None when none could be taken.
_stall_stacks: Callable[[], tuple[str, list[str]] | None] | None = None
MAX_STALL_MESSAGE = 3600  # characters: a termination message holds 4096 bytes
MAX_STACKS_DUMP = 512 * 1024  # characters of a stack dump kept in the ConfigMap (1 MiB limit)


def mark_launcher() -> None:
    """This process is the launcher (it starts the workers over ssh): a report without a
    MonarchJob to go to (a run on a hostfile) goes nowhere, rather than into the output as a
    ``MONARCH_PROGRESS`` line."""
    global _in_launcher
    _in_launcher = True


def report(step: int | None = None, *, total_steps: int | None = None,
           metrics: Mapping[str, float | int | str] | None = None,
           checkpoint: str | None = None, run_url: str | None = None) -> None:
    """Report the program's progress: it reaches ``status.progress`` of its MonarchJob and the
    STEP, PROGRESS and ETA columns of ``kubectl get monarchjobs``. Cheap enough to call every
    step: reports are coalesced and written at most once per ``spec.progress.
    reportIntervalSeconds`` (10 s by default). Fields left out keep their last value.

    Args:
        step: training steps done (an int >= 0).
        total_steps: the steps the run will do (an int > 0): gives the percentage and ETA.
        metrics: name -> value (numbers or short strings), e.g. ``{"loss": 0.31}``; the first
            is the ``-o wide`` METRIC column. Replaces the last report's metrics.
        checkpoint: where the program last saved its state (a path or URL).
        run_url: the experiment-tracking run (Weights & Biases, MLflow), kept in the attempt's
            record.

    Raises:
        TypeError, ValueError: a field of the wrong type or range, named.
    """
    fields = _fields(step, total_steps, metrics, checkpoint, run_url)
    forwarder = _forwarder or install()
    if forwarder is not None:
        forwarder.offer(fields)
    elif not _in_launcher:  # a rank: the line reaches the launcher through the output
        print(MARKER + json.dumps(fields, separators=(",", ":")), flush=True)


def _fields(step: Any, total_steps: Any, metrics: Any, checkpoint: Any,
            run_url: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, value, key, least in (("step", step, "step", 0),
                                    ("total_steps", total_steps, "totalSteps", 1)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"report({name}=...): an int, not {type(value).__name__}")
        if value < least:
            raise ValueError(f"report({name}={value}): at least {least}")
        fields[key] = value
    if metrics is not None:
        if not isinstance(metrics, Mapping):
            raise TypeError("report(metrics=...): a mapping of name -> number or string")
        fields["metrics"] = {str(name): _metric(name, value) for name, value in metrics.items()}
    for name, value, key in (("checkpoint", checkpoint, "checkpoint"),
                             ("run_url", run_url, "runURL")):
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise TypeError(f"report({name}=...): a non-empty string")
        fields[key] = value.strip()
    return fields


def _metric(name: Any, value: Any) -> float | int | str:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return value
    item = getattr(value, "item", None)  # a 0-d tensor or numpy scalar
    if callable(item):
        return float(item())
    raise TypeError(f"report(metrics={{{name!r}: ...}}): a number or string, "
                    f"not {type(value).__name__}")


def note_checkpoint(location: str) -> None:
    """The program named a checkpoint (``checkpoint_saved``): the next write carries it as the
    report's ``checkpoint``. Only in the launcher's process (nothing is printed)."""
    forwarder = _forwarder or install()
    if forwarder is not None:
        forwarder.offer({"checkpoint": location})


def feed_line(text: str) -> None:
    """Take the report in one output line of the program (anything before :data:`MARKER`, a
    rank prefix, is ignored; so is a line whose JSON is not an object). Does nothing unless a
    :class:`Forwarder` can be (:func:`install`) in this process."""
    forwarder = _forwarder or install()
    if forwarder is None:
        return
    _, found, payload = text.partition(MARKER)
    if not found:
        return
    try:
        fields = json.loads(payload)
    except ValueError:
        return
    if isinstance(fields, dict):
        forwarder.offer(fields)


class Forwarder:
    """Keeps the program's latest progress and writes it with ``write`` (a JSON text) at most
    once per ``interval`` seconds, on a thread of its own; see the module doc.

    ``clock``: monotonic seconds (the interval, the rate); ``now``: the report's wall time.
    """

    def __init__(self, write: Callable[[str], None], interval: float,
                 attempt: int | None = None, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 deadline: float | None = None,
                 on_stall: Callable[[float, dict[str, Any]], None] | None = None) -> None:
        self._write = write
        self._interval = max(0.0, interval)
        # Hang detection: ``on_stall(seconds idle, last state)`` once, when a report came and
        # then none for ``deadline`` seconds (runPolicy.progressDeadlineSeconds).
        self._deadline, self._on_stall = deadline, on_stall
        self._last_report: float | None = None
        self.stalled = False
        self._clock, self._now = clock, now
        self._state: dict[str, Any] = {} if attempt is None else {"attempt": attempt}
        self._history: collections.deque[tuple[float, int]] = collections.deque(maxlen=256)
        self._pending = False
        self._closed = False
        self._last_write: float | None = None
        self._condition = threading.Condition()
        self.writes = 0
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()

    def offer(self, fields: Mapping[str, Any]) -> None:
        """Merge one report (the JSON names: ``step``, ``totalSteps``, ``metrics``,
        ``checkpoint``, ``runURL``) into the state; the next write carries it."""
        moment = self._clock()
        with self._condition:
            for key in ("step", "totalSteps", "metrics", "checkpoint", "runURL"):
                if key in fields:
                    self._state[key] = fields[key]
            step = fields.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                if self._history and step < self._history[-1][1]:
                    self._history.clear()  # resumed from an earlier step: a new run of steps
                self._history.append((moment, step))
                while len(self._history) > 2 and moment - self._history[1][0] > RATE_WINDOW_SECONDS:
                    self._history.popleft()
                rate = self._rate()
                if rate is None:
                    self._state.pop("stepsPerSecond", None)
                else:
                    self._state["stepsPerSecond"] = rate
            self._state["time"] = self._now().strftime("%Y-%m-%dT%H:%M:%SZ")
            if "checkpoint" in fields:  # when the program said it saved its state there
                self._state["checkpointTime"] = self._state["time"]
            self._last_report = moment
            self._pending = True
            self._condition.notify()

    def _rate(self) -> float | None:
        (start, first), (end, last) = self._history[0], self._history[-1]
        if end - start <= 0 or last <= first:
            return None
        rate = (last - first) / (end - start)
        return round(rate, 6) if math.isfinite(rate) else None

    def _stall_left(self) -> float | None:
        """Seconds until the run counts as stalled; None when it cannot (no deadline, no
        report yet, or already stalled)."""
        if (self._deadline is None or self._on_stall is None or self._last_report is None
                or self.stalled):
            return None
        return self._last_report + self._deadline - self._clock()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._pending and not self._closed:
                    left = self._stall_left()
                    if left is not None and left <= 0:
                        break
                    self._condition.wait(left)
                if not self._pending and not self._closed:  # no report for the deadline
                    self.stalled = True
                    assert self._last_report is not None
                    idle, state = self._clock() - self._last_report, dict(self._state)
                else:
                    idle = None
            if idle is not None:
                assert self._on_stall is not None
                self._on_stall(idle, state)
                continue
            with self._condition:
                if not self._pending:
                    return  # closed, nothing left to write
                if not self._closed and self._last_write is not None:
                    left = self._last_write + self._interval - self._clock()
                    if left > 0:
                        self._condition.wait(left)  # a close cuts the wait short
                        continue
                text = json.dumps(self._state, separators=(",", ":"))  # report order kept
                self._pending = False
            self._write(text)
            with self._condition:
                # The interval counts from the end of a write: a slow one (the first loads the
                # client) never lets the next follow it sooner than the interval.
                self._last_write = self._clock()
                self.writes += 1
                self._condition.notify_all()

    def close(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Write what is pending now (not waiting for the interval), then stop the thread;
        waits at most ``timeout`` seconds."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        self._thread.join(timeout)


STALL_REASON = "ProgressStalled"  # the operator judges a launcher that ends with it
MAX_THREADS = 12
MAX_FRAMES = 6


def thread_stacks(skip: int | None = None) -> list[str]:
    """This process's threads as one line each, innermost frame first
    (``MainThread: wait (threading.py:320) < get (actor.py:88) < main (train.py:12)``), at
    most :data:`MAX_THREADS` threads of :data:`MAX_FRAMES` frames; ``skip``: a thread ident
    left out (the caller's)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        frames = traceback.extract_stack(frame)[-MAX_FRAMES:]
        where = " < ".join(f"{item.name} ({os.path.basename(item.filename)}:{item.lineno})"
                           for item in reversed(frames))
        lines.append(f"{names.get(ident, ident)}: {where}"[:400])
    return lines[:MAX_THREADS]


def stall_message(idle: float, deadline: float, state: Mapping[str, Any],
                  stacks: list[str], odd: str = "") -> str:
    """``ProgressStalled: no progress report for 65s (runPolicy.progressDeadlineSeconds=60;
    last step 120)[; ODD]; threads: A | B`` (one line: it ends the termination message), at
    most :data:`MAX_STALL_MESSAGE` characters: the last threads are left out first."""
    last = f"; last step {state['step']}" if "step" in state else ""
    head = (f"{STALL_REASON}: no progress report for {idle:.0f}s "
            f"(runPolicy.progressDeadlineSeconds={deadline:g}{last})"
            + (f"; {odd}" if odd else "") + "; threads: ")
    kept = list(stacks)
    while kept and len(head) + len(" | ".join(kept)) > MAX_STALL_MESSAGE:
        kept.pop()
    return (head + " | ".join(kept))[:MAX_STALL_MESSAGE]


def set_stall_stacks(take: Callable[[], tuple[str, list[str]] | None] | None) -> None:
    """Register what a stalled run does before it is stopped: ``take()`` gathers every rank's
    stack (printing the whole dumps itself) and returns ``(odd one out, one line per rank)``,
    or None when it got none; None unregisters. An exception in it is reported and the stall
    goes on with the launcher's own threads."""
    global _stall_stacks
    _stall_stacks = take


def _rank_stacks() -> tuple[str, list[str]] | None:
    take = _stall_stacks
    if take is None:
        return None
    try:
        return take()
    except Exception as error:  # noqa: BLE001 - a failed dump never keeps the run from stopping
        print(f"monarch-launch: could not take the ranks' stacks: {error}", file=sys.stderr,
              flush=True)
        return None


def _stop_stalled(deadline: float) -> Callable[[float, dict[str, Any]], None]:
    """What a launcher does once its program stalled: print its threads' stacks, then stop the
    run as a SIGTERM would (its ranks stopped), its final line the stall
    (:func:`.stopsignal.record_stall`)."""
    def stop(idle: float, state: dict[str, Any]) -> None:
        ranks = _rank_stacks()
        if ranks is not None:  # every rank's stack, taken before anything is stopped
            odd, stacks = ranks
            what = "its ranks"
        else:
            odd, stacks = "", thread_stacks(skip=threading.get_ident())
            what = "its threads, innermost frame first"
        message = stall_message(idle, deadline, state, stacks, odd)
        print(f"monarch-launch: {message.split('; threads:')[0]}; stopping the run; {what}:",
              file=sys.stderr, flush=True)
        for line in stacks:
            print(f"monarch-launch:   {line}", file=sys.stderr, flush=True)
        stopsignal.record_stall(message)
        # Also for a program run without our launcher's handlers, which SIGTERM ends at once.
        termination.write_termination_message(f"monarch-launch: failed: {message}")
        os.kill(os.getpid(), signal.SIGTERM)
    return stop


def install(environ: Mapping[str, str] | None = None) -> Forwarder | None:
    """In a MonarchJob's launcher (``MONARCH_PROGRESS_CONFIGMAP`` and the job's namespace in
    the environment), start this process's :class:`Forwarder` (once; later calls return it)
    and write its last report at exit. None elsewhere: reports are then printed as lines."""
    global _forwarder, _writer
    environ = os.environ if environ is None else environ
    name = environ.get(constants.ENV_PROGRESS_CONFIGMAP)
    namespace = environ.get(constants.ENV_NAMESPACE)
    if not name or not namespace:
        return _install_standalone(environ)
    with _lock:
        if _forwarder is None and not _closed:
            try:
                interval = float(environ.get(constants.ENV_PROGRESS_INTERVAL, ""))
            except ValueError:
                interval = DEFAULT_INTERVAL_SECONDS
            attempt = environ.get(constants.ENV_ATTEMPT, "")
            deadline = environ.get(constants.ENV_PROGRESS_DEADLINE, "")
            _writer = ConfigMapWriter(namespace, name, end_with_job(namespace, name))
            _forwarder = Forwarder(
                _writer, interval,
                int(attempt) if attempt.isdigit() else None,
                deadline=float(deadline) if deadline.isdigit() else None,
                on_stall=_stop_stalled(float(deadline)) if deadline.isdigit() else None)
            atexit.register(close)
        return _forwarder


def _install_standalone(environ: Mapping[str, str]) -> Forwarder | None:
    """In a launcher without a MonarchJob but with ``MONARCH_PROGRESS_DEADLINE_SECONDS`` (a
    positive integer): a :class:`Forwarder` that writes nowhere, for its hang detection. None
    elsewhere (a rank's process: its reports are printed as lines)."""
    global _forwarder
    deadline = environ.get(constants.ENV_PROGRESS_DEADLINE, "")
    if not _in_launcher or not deadline.isdigit() or int(deadline) < 1:
        return None
    with _lock:
        if _forwarder is None and not _closed:
            _forwarder = Forwarder(lambda _text: None, DEFAULT_INTERVAL_SECONDS,
                                   deadline=float(deadline),
                                   on_stall=_stop_stalled(float(deadline)))
            atexit.register(close)
        return _forwarder


def close() -> None:
    """Write the last report now and stop forwarding (the launcher is ending); a report after
    this is printed as a line."""
    global _forwarder, _closed
    with _lock:
        forwarder, _forwarder, _closed = _forwarder, None, True
    if forwarder is not None:
        forwarder.close()


def store_stacks(text: str) -> bool:
    """Keep ``text`` (every rank's stack dump) in the job's ConfigMap under
    :data:`constants.STACKS_DUMP_KEY`, at most :data:`MAX_STACKS_DUMP` characters (its end cut);
    False without a MonarchJob (standalone: the dump is in the output only)."""
    writer = _writer
    if writer is None:
        return False
    if len(text) > MAX_STACKS_DUMP:
        text = text[:MAX_STACKS_DUMP] + "\n... (cut: the whole dump is in the launcher's log)\n"
    writer.write_key(constants.STACKS_DUMP_KEY, text)
    return True


def end_if_job_gone() -> None:
    """End the launcher at once if its MonarchJob is being deleted
    (:meth:`.ConfigMapWriter.end_if_job_gone`); nothing without a job to report to."""
    if _writer is not None:
        _writer.end_if_job_gone()
