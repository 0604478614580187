"""Output lines that mean a hardware fault (issue 35 item 2): one pattern list shared by the
launcher (which names the failing rank's host) and the operator (which classes the attempt).

A rank that dies because its GPU or its link failed exits with a code like any other failure;
only its last words say the device is to blame. A line matching one of these patterns makes
the failure Infrastructure (reason :data:`REASON`), never the program's. Pure: no I/O.

The default list (:data:`DEFAULT_PATTERNS`) holds only messages that mean a device or link
fault whatever the program did, taken from real output:

- CUDA's error strings (``cudaGetErrorString``): ``uncorrectable ECC error encountered``
  (``cudaErrorECCUncorrectable``), ``uncorrectable NVLink error was detected``
  (``cudaErrorNvlinkUncorrectable``); PyTorch prints them as ``RuntimeError: CUDA error: ...``;
- NVML's ``GPU is lost`` (``NVML_ERROR_GPU_IS_LOST``);
- the kernel driver's ``NVRM: Xid (PCI:...): N, ...`` for the Xids NVIDIA's device plugin treats
  as fatal and that mean hardware (48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen
  off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP
  timeout/error; https://docs.nvidia.com/deploy/xid-errors/), and ``GPU has fallen off the bus``
  however it is worded;
- NCCL's InfiniBand completion errors (``NET/IB : Got completion from peer ... with error 12``
  / ``status=12``: the NICs cannot reach each other; NVIDIA/nccl #1170, #1405).

Left out on purpose: ``CUDA out of memory``, ``device-side assert triggered``, ``unspecified
launch failure`` (seen both with a bad device and with a program's pinned-memory use,
pytorch #74235), ``unhandled cuda error`` (its cause is on the ``Last error`` line), Xids 13,
31 and 43 (a program's own faults). A cluster adds its own lines, or replaces the list, with
``spec.runPolicy.hardwareErrors`` (docs/gpu-health.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The reason an attempt (or a launch) ended by such a line gets.
REASON = "GPUHardwareError"
# The environment variable that gives the launcher the job's list (JSON, the shape of
# spec.runPolicy.hardwareErrors); monarch-launch's --hardware-error-pattern adds to it.
ENV = "MONARCH_HARDWARE_ERRORS"
# Limits, also in the CRD schema: a pattern is run over every scanned line, so keep it short.
MAX_PATTERNS = 32
MAX_PATTERN_CHARS = 256
# Only so much of each line is scanned and quoted (a progress bar can be one long line).
LINE_CHARS = 400

_FATAL_XIDS = "48|63|64|74|79|92|94|95|119|120"


@dataclass(frozen=True)
class Pattern:
    """One named pattern: ``name`` (shown in messages), ``regex`` (Python :mod:`re` syntax,
    searched anywhere in a line)."""

    name: str
    regex: str


DEFAULT_PATTERNS: tuple[Pattern, ...] = (
    Pattern("ECCUncorrectable", r"(?i)uncorrectable ECC error|CUDA_ERROR_ECC_UNCORRECTABLE"
                                r"|cudaErrorECCUncorrectable"),
    Pattern("NVLinkUncorrectable", r"(?i)uncorrectable NVLink error|cudaErrorNvlinkUncorrectable"),
    Pattern("FallenOffTheBus", r"(?i)fallen off the bus"),
    Pattern("GPULost", r"\bGPU is lost\b|NVML_ERROR_GPU_IS_LOST"),
    Pattern("FatalXid", rf"\bXid \([^)]*\): (?:{_FATAL_XIDS})\b"),
    Pattern("InfiniBandCompletionError",
            r"NET/IB ?: Got completion from peer \S+ with (?:error |status=)\d+"),
)


@dataclass(frozen=True)
class HardwareLine:
    """The first line found that means a hardware fault: the ``pattern`` that matched and the
    ``line`` itself (stripped, at most :data:`LINE_CHARS` characters)."""

    pattern: str
    line: str


def patterns(extra: Iterable[str] = (), replace_defaults: bool = False,
             field: str = "spec.runPolicy.hardwareErrors.patterns") -> tuple[Pattern, ...]:
    """The pattern list in force: :data:`DEFAULT_PATTERNS` (unless ``replace_defaults``), then
    each of ``extra`` named ``<field>[i]``.

    Raises:
        ValueError: more than :data:`MAX_PATTERNS`, an empty or too long pattern, or one that
            is not a valid regular expression; the message names ``field`` and the index.
    """
    extra = list(extra)
    if len(extra) > MAX_PATTERNS:
        raise ValueError(f"{field}: at most {MAX_PATTERNS} patterns, got {len(extra)}")
    own = []
    for index, regex in enumerate(extra):
        where = f"{field}[{index}]"
        if not isinstance(regex, str) or not regex.strip():
            raise ValueError(f"{where}: must be a non-empty string")
        if len(regex) > MAX_PATTERN_CHARS:
            raise ValueError(f"{where}: at most {MAX_PATTERN_CHARS} characters, got {len(regex)}")
        try:
            re.compile(regex)
        except re.error as error:
            raise ValueError(f"{where}: not a valid regular expression: {error}") from None
        own.append(Pattern(where.rpartition(".")[2], regex))
    return (*(() if replace_defaults else DEFAULT_PATTERNS), *own)


def from_spec(hardware_errors: Mapping[str, Any] | None,
              field: str = "spec.runPolicy.hardwareErrors") -> tuple[Pattern, ...]:
    """The list ``spec.runPolicy.hardwareErrors`` (``{patterns: [...], replaceDefaults:
    bool}``; None or ``{}``: the defaults) asks for.

    Raises:
        ValueError: as :func:`patterns`, or a field of the wrong type (named).
    """
    hardware_errors = hardware_errors or {}
    extra = hardware_errors.get("patterns") or []
    if not isinstance(extra, list):
        raise ValueError(f"{field}.patterns: must be a list of strings")
    replace = hardware_errors.get("replaceDefaults", False)
    if not isinstance(replace, bool):
        raise ValueError(f"{field}.replaceDefaults: must be true or false")
    return patterns(extra, replace, f"{field}.patterns")


def from_env(environ: Mapping[str, str], field: str = ENV) -> tuple[Pattern, ...]:
    """The list the environment variable :data:`ENV` gives (JSON of the spec's shape; unset or
    empty: the defaults).

    Raises:
        ValueError: not JSON of that shape, or a bad pattern (named after ``field``).
    """
    text = environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_PATTERNS
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{field}: not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field}: must be a JSON object with patterns and replaceDefaults")
    return from_spec(value, field)


def to_env(hardware_errors: Mapping[str, Any] | None) -> str:
    """The value of :data:`ENV` for ``spec.runPolicy.hardwareErrors`` ("" when it is unset)."""
    if not hardware_errors:
        return ""
    return json.dumps({"patterns": list(hardware_errors.get("patterns") or []),
                       "replaceDefaults": bool(hardware_errors.get("replaceDefaults", False))},
                      separators=(",", ":"))


def find(lines: Iterable[str], in_force: Iterable[Pattern] = DEFAULT_PATTERNS
         ) -> HardwareLine | None:
    """The first of ``lines`` (each may hold several lines) that a pattern of ``in_force``
    matches, in the order the lines come; None when none does. Each line is scanned up to
    :data:`LINE_CHARS` characters."""
    compiled = [(pattern.name, re.compile(pattern.regex)) for pattern in in_force]
    for text in lines:
        for line in str(text or "").splitlines():
            line = line.strip()[:LINE_CHARS]
            for name, regex in compiled:
                if regex.search(line):
                    return HardwareLine(name, line)
    return None


def describe(found: HardwareLine) -> str:
    """``hardware error (ECCUncorrectable): <the line>``: how a message quotes a match."""
    return f"hardware error ({found.pattern}): {found.line}"


# The launcher's words for a rank failure it classed by such a line (see describe), and how
# the operator finds them again in its termination message: "... [GPUHardwareError on host H:
# hardware error (ECCUncorrectable): <line>]".
# The line may hold brackets itself ("rank 0[0]"): the mark ends at the text's last one.
MARKER = re.compile(rf"\[{REASON} on host (?P<host>[^:\s]+): hardware error \((?P<pattern>[^)]+)\):"
                    r" (?P<line>.*)\]")


def marker(host: str, found: HardwareLine) -> str:
    """The launcher's marker for a failure classed by ``found`` on ``host`` (:data:`MARKER`)."""
    return f"[{REASON} on host {host}: {describe(found)}]"
