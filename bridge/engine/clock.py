"""Wall-clock time in milliseconds, the unit of Kafka timestamps and of the ladder's due times."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock time in milliseconds (the unit of Kafka timestamps and due times)."""
    return time.time_ns() // 1_000_000


def now_ms_rounded_up() -> int:
    """Wall-clock time in milliseconds, rounded up: a due time counted from it is never before
    the exact moment plus the delay (a retry is taken once ``now_ms() >= due``)."""
    return -(-time.time_ns() // 1_000_000)
