"""``kubectl monarch stacks JOB``: every rank's stack of a job (issue 35 item 4), pure parts.

On a running job (SPMD, role mode or the job API) the plugin asks the launcher for a dump (SIGUSR1 to the launcher's
process in its pod, ``kubectl exec``: no ptrace, so it works under Pod Security 'restricted') and
waits for a new dump in the job's ``<job>-progress`` ConfigMap (key ``stacks.txt``); the run
goes on. On a finished job, or when the launcher cannot be asked, it shows the last dump kept
there, else the bounded per-rank lines of the last attempt whose record has them
(``status.attempts[].stacks``, written when a stalled attempt ended).
"""

from __future__ import annotations

from typing import Any

from monarch_operator import constants

# What the plugin runs in the launcher container: SIGUSR1 to the pid the launcher wrote
# (constants.STACKS_PID_FILE), else to the container's first process (the launcher, or its stop
# guard, which passes SIGUSR1 on).
REQUEST_COMMAND = ["sh", "-c", f'f="{constants.STACKS_PID_FILE}"; if [ -s "$f" ]; then '
                   'kill -USR1 "$(cat "$f")"; else kill -USR1 1; fi']


def stored_dump(configmap: dict[str, Any] | None) -> str:
    """The last stack dump in the job's progress ConfigMap (``kubectl get -o json`` of it), ""
    when none."""
    data = (configmap or {}).get("data") or {}
    text = data.get(constants.STACKS_DUMP_KEY) or ""
    return text if text.startswith(constants.STACKS_DUMP_HEADER) else ""


def dump_header(text: str) -> str:
    """The first line of a stored dump (it names the attempt and the moment), "" for none."""
    return text.split("\n", 1)[0] if text else ""


def recorded_lines(body: dict[str, Any]) -> list[str]:
    """The per-rank lines of the latest attempt whose record holds stacks, headed by the
    attempt's number and message; [] when no record has any."""
    records = (body.get("status") or {}).get("attempts") or []
    for record in reversed(records):
        if record.get("stacks"):
            head = f"attempt {record.get('number')}: {record.get('message') or ''}".rstrip(": ")
            return [head, *(f"  {line}" for line in record["stacks"])]
    return []
