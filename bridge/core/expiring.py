"""What the bridge remembers per host, webhook or kind of event for a while (name lookups, TLS
sessions, log summaries): entries that end at a time of their own, dropped once ended, never
because of how many there are.

The keys come from the configuration (hosts, webhooks), so the entries alive at once are bounded
by the webhooks configured and the time each entry lasts. A bound on the count instead (10,000
names and 1,024 TLS hosts, until 2026-11-27) was a cliff: past it the cache started again from
nothing, so a configuration with more hosts than that looked every name up again and made a full
TLS handshake where a session would have been resumed; and the log summary, past 20,000 kinds
(three per failing webhook), logged a line per failed delivery again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, TypeVar

K = TypeVar("K")
V = TypeVar("V")

PURGE_FLOOR: Final = 1024
"""Entries held before the first sweep for ended ones."""


class Expiring(OrderedDict[K, tuple[float, V]]):
    """``key -> (end, value)``, ``end`` a ``time.monotonic()`` time, in the order of their last
    :meth:`put`. Readers check ``end`` themselves (a lookup is one ``dict.get``).

    :meth:`put` first drops the ended entries at the front (put longest ago), and sweeps out
    every ended entry whenever the map has doubled since the last sweep, so the sweeps cost O(1)
    per put amortized and the map holds at most twice the entries alive at the last sweep (or
    :data:`PURGE_FLOOR`). With ``limit``, a full map drops the entry put longest ago (one, not
    all), also O(1)."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self._sweep_at = PURGE_FLOOR
        self.limit = limit

    def put(self, key: K, end: float, value: V, now: float) -> None:
        """Hold ``value`` for ``key`` until ``end``."""
        if key in self:
            self.move_to_end(key)
        else:
            while self and next(iter(self.values()))[0] <= now:
                self.popitem(last=False)
            if len(self) >= self._sweep_at:
                for ended in [k for k, (until, _) in self.items() if until <= now]:
                    del self[ended]
                self._sweep_at = max(PURGE_FLOOR, 2 * len(self))
            if self.limit is not None and len(self) >= self.limit:
                self.popitem(last=False)
        self[key] = (end, value)
