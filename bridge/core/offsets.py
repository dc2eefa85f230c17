"""Which offset of a partition may be committed: the end of the contiguous prefix of finished
records.

Records of a partition finish out of order (deliveries run concurrently); an offset is safe to
commit only when every record before it is finished. Pure bookkeeping, no Kafka calls.
"""

from __future__ import annotations

import time
from collections import deque


class OffsetTracker:
    """Tracks the records of one partition in flight and the offset that is safe to commit."""

    __slots__ = ("_done", "_pending", "committable", "moved_at")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._done: set[int] = set()
        self.committable: int | None = None
        self.moved_at = 0.0  # monotonic: when the commit last moved, or work began waiting

    def commit_age(self, now: float) -> float:
        """Seconds the committable offset has not moved while records are unfinished (0 when
        none is): how long this partition's commit has been held back."""
        return max(0.0, now - self.moved_at) if self._pending else 0.0

    def __len__(self) -> int:
        return len(self._pending)

    def started(self, offset: int) -> None:
        """A record was accepted for processing (offsets arrive in increasing order)."""
        if not self._pending:
            self.moved_at = time.monotonic()
        self._pending.append(offset)

    def finished(self, offset: int) -> bool:
        """A record is finished; returns True when the committable offset moved forward."""
        pending = self._pending
        if not pending or offset < pending[0]:
            return False  # unknown or already finished: a record of a revoked assignment
        if offset != pending[0]:
            self._done.add(offset)
            return False
        pending.popleft()
        last = offset
        done = self._done
        while pending and pending[0] in done:
            last = pending.popleft()
            done.discard(last)
        self.committable = pending[0] if pending else last + 1
        if pending:
            self.moved_at = time.monotonic()
        return True
