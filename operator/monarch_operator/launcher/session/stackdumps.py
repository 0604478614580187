"""Every rank's stack, read: the collector's output parsed, each rank summed up, the odd one out
named (issue 35 item 3). Pure: text in, values and lines out.

The collector (:mod:`.rankstacks`) prints, per host, one block per rank::

    @@monarch-stacks rank=2 pid=4242 part=stack
    <faulthandler's dump: "Thread 0x... (most recent call first):" then "  File ..., line N in f">
    @@monarch-stacks rank=2 pid=4242 part=fr
    <PyTorch flight recorder JSON (``_dump_fr_trace_json``/``_dump_nccl_trace_json``), or {}>

or ``@@monarch-stacks rank=2 pid=4242 part=gone`` for a rank whose process no longer runs (or
whose pid no longer holds its stack file: another process got it). The collector of role mode
(:mod:`.procstacks`) ends each marker with `` role=<role>``: a rank is then one of a role. A
rank whose process is stopped (SIGSTOP) or holds the GIL in native code still gets its Python
stack (faulthandler's handler is C and needs no GIL) but no flight recorder part (that needs a
Python thread to run); a rank that wrote nothing has neither.

Where a rank is in its collectives comes from the flight recorder's ``pg_status``: a process
group whose ``last_enqueued_collective`` is past its ``last_completed_collective`` waits in that
collective (its op from the entry with that ``collective_seq_id``). That is what gloo records
(entries stay ``scheduled``; torch 2.13 CPU, measured); NCCL also records ``started``.
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass, field
from typing import Any

MARKER = "@@monarch-stacks "
_MARKER_LINE = re.compile(r"^@@monarch-stacks rank=(?P<rank>\d+) pid=(?P<pid>\d*) "
                          r"part=(?P<part>stack|fr|gone)(?: role=(?P<role>\S+))?\s*$")
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>\S+)')
# Frames that are not the user's: the interpreter's own library, installed packages (torch,
# Monarch), our bootstrap (``python -c``), frozen modules, and our own machinery in a role
# proc (the rank probe, the stack server) where monarch_operator is not installed as a package.
_NOT_USER = ("/site-packages/", "/dist-packages/", "<string>", "<frozen ",
             "/monarch_operator/launcher/session/", "/monarch_operator/launcher/programs/rankside",
             "/monarch_operator/launcher/programs/distributed")
_STDLIB = re.compile(r"/lib/python3\.\d+/")
MAX_LINE = 200  # characters of one summary line
MAX_RANK_LINES = 16  # summary lines in status; the rest are counted in one more line


@dataclass(frozen=True)
class Frame:
    """One Python frame: file path, line number, function name."""

    file: str
    line: int
    name: str

    def short(self) -> str:
        """``train.py:88 load_batch``."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} {self.name}"


@dataclass(frozen=True)
class Collective:
    """Where a rank is in its collectives: ``op`` (``all_reduce``) and ``seq`` (the flight
    recorder's ``collective_seq_id``); ``waiting`` True when it is inside that collective,
    False when that was its last one and it completed."""

    op: str
    seq: int
    waiting: bool


@dataclass
class RankDump:
    """One rank's dump: its host, pid, threads (each innermost frame first; the main thread
    first), flight recorder reading, and whether its process was gone; in role mode its role
    and the role's place in the job (``order``, for sorting)."""

    rank: int
    host: str
    pid: int | None = None
    role: str = ""
    order: int = 0
    threads: list[list[Frame]] = field(default_factory=list)
    collective: Collective | None = None
    fr_error: str = ""
    gone: bool = False
    raw: str = ""

    def user_frame(self) -> Frame | None:
        """The innermost frame that is the user's code (not the standard library, an installed
        package or our own machinery) of the first thread that has one, the main thread first
        (a Monarch proc runs its endpoints in other threads), else the main thread's innermost
        frame."""
        for frames in self.threads:
            for frame in frames:
                if not any(part in frame.file for part in _NOT_USER) and not _STDLIB.search(
                        frame.file):
                    return frame
        return self.threads[0][0] if self.threads and self.threads[0] else None

    @property
    def name(self) -> str:
        """``rank 2``, or ``trainer rank 2`` in role mode."""
        return f"{self.role} rank {self.rank}" if self.role else f"rank {self.rank}"


def parse_host_output(host: str, text: str) -> list[RankDump]:
    """The rank dumps in one host's collector output (see the module doc); lines before the
    first marker are ignored. Ranks in the order they appear."""
    dumps: dict[tuple[str, int], RankDump] = {}
    part, lines, current = "", [], None

    def close() -> None:
        if current is not None and part:
            _fill(current, part, "\n".join(lines))

    for line in text.splitlines():
        match = _MARKER_LINE.match(line)
        if match is None:
            lines.append(line)
            continue
        close()
        rank, role = int(match["rank"]), match["role"] or ""
        current = dumps.setdefault((role, rank), RankDump(rank, host, role=role))
        if match["pid"]:
            current.pid = int(match["pid"])
        part, lines = match["part"], []
    close()
    return list(dumps.values())


def _fill(dump: RankDump, part: str, body: str) -> None:
    if part == "gone":
        dump.gone = True
    elif part == "stack":
        dump.raw = body.strip("\n")
        dump.threads = parse_faulthandler(body)
    else:
        dump.collective, dump.fr_error = parse_flight_recorder(body)


def parse_faulthandler(text: str) -> list[list[Frame]]:
    """Threads of one :func:`faulthandler.dump_traceback` output (each most recent call first,
    as it prints them), the main thread first: the one whose outermost frame is not
    ``threading.py``'s bootstrap (every other thread starts there)."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (match := _FRAME.match(line)):
            threads[-1].append(Frame(match["file"], int(match["line"]), match["name"]))
    threads = [frames for frames in threads if frames]
    main = [index for index, frames in enumerate(threads)
            if not frames[-1].file.endswith("threading.py")]
    if main:
        threads.insert(0, threads.pop(main[0]))
    return threads


def parse_flight_recorder(text: str) -> tuple[Collective | None, str]:
    """``(collective, error)`` from a flight recorder JSON dump: the process group that waits
    in a collective (enqueued past completed), else the default group's last completed one;
    None when the dump has no collectives. ``error`` is what the dump could not say, or ""."""
    text = text.strip()
    if not text:
        return None, "no flight recorder dump"
    try:
        data = json.loads(text)
    except ValueError:
        return None, "flight recorder dump is not JSON"
    if not isinstance(data, dict):
        return None, "flight recorder dump is not an object"
    if data.get("error"):
        return None, str(data["error"])[:MAX_LINE]
    status = data.get("pg_status") or {}
    entries = [entry for entry in data.get("entries") or [] if isinstance(entry, dict)]
    best: Collective | None = None
    for pg_id, numbers in sorted(status.items(), key=lambda item: str(item[0])):
        enqueued = _int(numbers.get("last_enqueued_collective"))
        completed = _int(numbers.get("last_completed_collective"))
        if enqueued is None or enqueued <= 0:
            continue
        waiting = completed is None or enqueued > completed
        seq = enqueued if waiting else completed
        assert seq is not None
        found = Collective(_op_of(entries, str(pg_id), seq), seq, waiting)
        if waiting:
            return found, ""
        best = best or found
    return best, ""


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _op_of(entries: list[dict[str, Any]], pg_id: str, seq: int) -> str:
    for entry in reversed(entries):
        if (str(entry.get("pg_id", "0")) == pg_id and _int(entry.get("collective_seq_id")) == seq
                and not _int(entry.get("p2p_seq_id"))):
            name = str(entry.get("profiling_name") or "collective")
            return name.rsplit(":", 1)[-1]  # "gloo:all_reduce", "nccl:all_reduce"
    return "collective"


def rank_line(dump: RankDump) -> str:
    """One rank in one line, at most :data:`MAX_LINE` characters:
    ``rank 0 on host-a: in all_reduce #3 at train.py:20 main`` (``trainer rank 0 ...`` in role
    mode)."""
    where = f"{dump.name} on {dump.host}"
    if dump.gone:
        return f"{where}: its process was gone"[:MAX_LINE]
    frame = dump.user_frame()
    at = f" at {frame.short()}" if frame else " (no Python stack: process stopped or silent)"
    if dump.collective is None:
        state = "no collective known"
    elif dump.collective.waiting:
        state = f"in {dump.collective.op} #{dump.collective.seq}"
    else:
        state = f"not in a collective (last {dump.collective.op} #{dump.collective.seq})"
    return f"{where}: {state}{at}"[:MAX_LINE]


def odd_one_out(dumps: list[RankDump]) -> str:
    """One sentence naming the rank(s) that hold the others up: those not in the collective
    most ranks wait in (``rank 2 on h is not in all_reduce #3 where 3 ranks wait: train.py:88
    load_batch``; a rank outside a collective others wait in is what keeps it from
    completing), else, without collectives, those at another frame than most ranks; "" when
    no rank stands out."""
    waiting = collections.Counter(
        (dump.collective.op, dump.collective.seq) for dump in dumps
        if dump.collective and dump.collective.waiting)
    if waiting:
        (op, seq), count = waiting.most_common(1)[0]
        odd = [dump for dump in dumps if not (dump.collective and dump.collective.waiting
                                              and (dump.collective.op, dump.collective.seq)
                                              == (op, seq))]
        if not odd:
            return ""
        where = f"in {op} #{seq} where {count} rank{'s wait' if count > 1 else ' waits'}"
        return _name_odd(odd, f"not {where}")
    frames = collections.Counter(_frame_text(dump) for dump in dumps)
    if len(frames) < 2:
        return ""
    common, count = frames.most_common(1)[0]
    odd = [dump for dump in dumps if _frame_text(dump) != common]
    if count <= len(odd):
        return ""
    return _name_odd(odd, f"not at {common} where {count} ranks are")


def _frame_text(dump: RankDump) -> str:
    frame = dump.user_frame()
    return frame.short() if frame else "no stack"


def _name_odd(odd: list[RankDump], what: str) -> str:
    first = odd[0]
    if len(odd) == 1:
        return f"{first.name} on {first.host} is {what}: {_frame_text(first)}"
    ranks = ", ".join(str(dump.rank) for dump in odd[:8]) + (", ..." if len(odd) > 8 else "")
    role = f"{first.role} " if first.role else ""
    return f"{role}ranks {ranks} are {what}; {first.name} on {first.host}: {_frame_text(first)}"


def summary_lines(dumps: list[RankDump], limit: int = MAX_RANK_LINES) -> list[str]:
    """At most ``limit`` lines for status: every rank by :func:`rank_line`, in rank order;
    past the limit one line counts the rest."""
    lines = [rank_line(dump) for dump in sorted(dumps, key=_order)]
    if len(lines) <= limit:
        return lines
    return [*lines[:limit - 1], f"... and {len(lines) - limit + 1} more ranks"]


def full_text(dumps: list[RankDump]) -> str:
    """Every rank's whole dump, for the launcher's output (``kubectl monarch logs``)."""
    blocks = []
    for dump in sorted(dumps, key=_order):
        blocks.append(f"--- {rank_line(dump)}")
        if dump.raw:
            blocks.append(dump.raw)
        if dump.fr_error:
            blocks.append(f"(flight recorder: {dump.fr_error})")
    return "\n".join(blocks)


def _order(dump: RankDump) -> tuple[int, str, int]:
    return dump.order, dump.role, dump.rank
