"""What the launcher prints: human lines, or JSON lines with ``--json``; less with ``--quiet``.

Every line the launcher itself writes goes through :class:`Reporter`. Kinds of output:

- ``plan``, ``progress`` and ``hosts_ready`` lines: how far the launch is (hidden by ``--quiet``);
- ``event`` lines: results of the run, e.g. the ranks and per-step losses (``--quiet`` keeps
  the ones marked ``essential``);
- ``warning`` and the final ``result``: always shown, on stderr in text mode when failing.

In JSON mode each line on stdout is one object with ``"event"`` and ``"t"`` (seconds since the
launcher started), and the workers' own output is sent to stderr so that stdout stays parseable.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from monarch_operator.launcher import stopguard, stopsignal
from monarch_operator.launcher.termination import write_termination_message

PREFIX = "monarch-launch:"


class Reporter:
    """Writes the launcher's output in the chosen mode; see the module doc."""

    def __init__(
        self,
        json_mode: bool = False,
        quiet: bool = False,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        prefix: str = PREFIX,
    ) -> None:
        """Args:
        json_mode: one JSON object per line on ``out``.
        quiet: only essential events, warnings and the result.
        out, err: streams (default: sys.stdout / sys.stderr at call time).
        prefix: starts every launcher line, e.g. ``monarch-torchrun:``.
        """
        self.prefix = prefix
        self.json_mode = json_mode
        self.quiet = quiet
        self._out = out
        self._err = err
        self._start = time.monotonic()

    @property
    def out(self) -> IO[str]:
        """The stream for normal output."""
        return self._out or sys.stdout

    @property
    def err(self) -> IO[str]:
        """The stream for warnings and failures."""
        return self._err or sys.stderr

    @property
    def worker_stream(self) -> IO[str] | None:
        """Where worker (ssh) output should go: stderr in JSON mode, else inherited (None)."""
        return self.err if self.json_mode else None

    def elapsed(self) -> float:
        """Seconds since this reporter was created."""
        return time.monotonic() - self._start

    def _json(self, event: str, fields: Mapping[str, Any]) -> None:
        record = {"event": event, "t": round(self.elapsed(), 3), **fields}
        print(json.dumps(record, default=str), file=self.out, flush=True)

    def plan(self, lines: list[str], data: Mapping[str, Any], essential: bool = False) -> None:
        """Report the placement plan: ``lines`` in text mode, ``data`` in JSON mode; with
        ``essential`` (a dry run, where the plan is the answer) even when quiet."""
        if self.json_mode:
            self._json("plan", {"plan": data})
        elif essential or not self.quiet:
            for line in lines:
                print(line, file=self.out, flush=True)

    def progress(self, phase: str) -> None:
        """Report a phase reached, e.g. ``mesh trainer attached``, with the elapsed time."""
        if self.json_mode:
            self._json("progress", {"phase": phase})
        elif not self.quiet:
            print(f"{self.prefix} {phase} (+{self.elapsed():.1f}s)", file=self.out, flush=True)

    def hosts_ready(self, ready: int, total: int) -> None:
        """Report how many hosts passed pre-flight so far: ``hosts ready 3/4``."""
        if self.json_mode:
            self._json("hosts_ready", {"ready": ready, "total": total})
        elif not self.quiet:
            print(
                f"{self.prefix} hosts ready {ready}/{total} (+{self.elapsed():.1f}s)",
                file=self.out,
                flush=True,
            )

    def event(self, name: str, text: str, essential: bool = False, **fields: Any) -> None:
        """Report a result line: ``text`` in text mode, ``{"event": name, **fields}`` in JSON."""
        if self.json_mode:
            self._json(name, fields)
        elif essential or not self.quiet:
            print(text, file=self.out, flush=True)

    def warning(self, text: str) -> None:
        """Report a problem that does not stop the launch."""
        if self.json_mode:
            self._json("warning", {"message": text})
        else:
            print(f"{self.prefix} warning: {text}", file=self.err, flush=True)

    def result(self, exit_code: int, reason: str | None = None, **fields: Any) -> int:
        """Report the final outcome and return ``exit_code``.

        Text mode: ``monarch-launch: succeeded`` on stdout, or ``monarch-launch: failed:
        <reason>`` on stderr. JSON mode: ``{"event": "result", "status", "exit_code",
        "reason", ...fields}`` on stdout. A failure's reason also goes to the container's
        termination log (:mod:`launcher.termination`). After a stop signal the outcome is
        ``128 + signal`` whatever the run's (:mod:`launcher.stopsignal`).
        """
        close_monarch_client(self)
        exit_code, reason = stopsignal.final_result(exit_code, reason)
        stopguard.note_final(exit_code)  # the guard checks the process ends with this status
        status = "succeeded" if exit_code == 0 else "failed"
        if exit_code != 0 and reason:
            write_termination_message(reason)  # Kubernetes: the pod's state.terminated.message
        if self.json_mode:
            self._json(
                "result", {"status": status, "exit_code": exit_code, "reason": reason, **fields}
            )
        elif exit_code == 0:
            if fields.get("dry_run"):
                print(
                    f"{self.prefix} dry run: plan only, nothing started", file=self.out, flush=True
                )
            elif not self.quiet:
                print(f"{self.prefix} succeeded", file=self.out, flush=True)
        else:
            print(f"{self.prefix} failed: {reason}", file=self.err, flush=True)
        return exit_code


# How long the launcher waits for this process's Monarch client to shut down before its final
# line, seconds; Monarch's own shutdown at interpreter exit allows 1 s.
MONARCH_CLIENT_SHUTDOWN_S = 15.0
# Monarch's `host_timeout` for that shutdown, seconds: it caps each of the client's final
# gateway flushes (two of them in torchmonarch 0.7.0). By the final line the meshes are torn
# down and their workers gone, so the flushes wait for answers that cannot come and always use
# the whole cap: at 2.0 s every run ended 4.0 s after "torn down" (bench/launch_end.py). What
# the launcher still had to say to its workers was said and answered during the teardown.
MONARCH_FLUSH_S = 0.25


def close_monarch_client(reporter: Reporter, timeout_s: float = MONARCH_CLIENT_SHUTDOWN_S) -> None:
    """Shut down this process's Monarch client, if the run made one, before the final line.

    Monarch shuts its client down at interpreter exit with a 1 s limit
    (``monarch/_src/actor/actor_mesh.py``, ``atexit.register(... .get(timeout=1.0))``); on a
    loaded machine that limit passes and Python prints "Exception ignored in atexit callback
    ... TimeoutError" after the launcher's final line, which then is not the last one. Done
    here with a longer limit, Monarch's own call finds the shutdown claimed and returns at once.
    A client that does not finish in ``timeout_s`` seconds is named in a warning; the run's
    outcome stands. Without Monarch imported (a usage error, a dry run) it does nothing.
    """
    if "monarch.actor" not in sys.modules:
        return
    from monarch.actor import shutdown_context

    try:
        shutdown_context(host_timeout=MONARCH_FLUSH_S).get(timeout=timeout_s)
    except TimeoutError:
        reporter.warning(f"Monarch's client did not shut down within {timeout_s:g}s")
