"""Timestamps as the API server writes them (RFC 3339), read as aware UTC datetimes.

Pure. The status's own times, written whole-second by :func:`.status.format_time`, are read
back strictly by :func:`.deadlines.parse_time`; this reader takes any timestamp of the API.
"""

from __future__ import annotations

import datetime as dt
from typing import Any


def parse(text: Any) -> dt.datetime | None:
    """An RFC 3339 timestamp of the API (``2026-01-02T03:04:05Z``, fractions allowed) as an
    aware UTC datetime; None when absent or malformed (then it decides nothing)."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
