"""Long work on the event loop, done in slices that give the loop and the other threads their turn.

The event loop makes every tenant's deliveries, so work that runs on it for long (rendering
``/metrics`` with 1,000 tracked webhooks, taking in a reload of thousands of new webhooks) is
cut into slices of at most :data:`SLICE_S`, each followed by a wait of :data:`GAP_S`.

The wait is a wait, not only a turn of the loop. A turn (``asyncio.sleep(0)``) polls with no
timeout, and the loop's thread gives up the interpreter's lock only for the instant of the poll:
a thread waiting for that lock is woken, finds it taken again, and starts a new switch interval
(5 ms), so while slices come faster than that it never gets it. The Kafka consumer's thread
(every fetch is one call to its executor) is such a thread: on asyncio's loop and on uvloop's, an
executor call made during 0.19 s of 2 ms slices separated by turns began 187 ms later, and a
``/metrics`` render so cut stopped deliveries for 177 ms; with any real wait between the slices
(0.1 ms to 1 ms) the call began within 0.1-2.4 ms (docs/PERFORMANCE.md, "A scrape with 1,000
tracked webhooks").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final

SLICE_S: Final = 0.002
"""The longest a slice holds the event loop (give or take the piece of work that ends it)."""
GAP_S: Final = 0.001
"""How long the loop is given after a slice: long enough that a poll waits and the interpreter's
lock goes to a thread waiting for it."""

Pause = Callable[[], Awaitable[None]]


async def _give_way() -> None:
    await asyncio.sleep(GAP_S)


class Slices:
    """Call :meth:`after_piece` after each piece of a long piece of work: once the current slice
    has lasted :data:`SLICE_S`, it gives the loop away (``pause``: a wait of :data:`GAP_S`).
    :attr:`held` is the time the work held the loop so far (its slices, not the waits)."""

    def __init__(
        self,
        pause: Pause = _give_way,
        clock: Callable[[], float] = time.perf_counter,
        slice_s: float = SLICE_S,
    ) -> None:
        self._pause = pause
        self._clock = clock
        self._slice_s = slice_s
        self._started = clock()
        self._held = 0.0

    async def after_piece(self) -> bool:
        """Give the loop away if the current slice has lasted long enough; whether it did (what
        the work read before may have changed meanwhile)."""
        elapsed = self._clock() - self._started
        if elapsed < self._slice_s:
            return False
        self._held += elapsed
        await self._pause()
        self._started = self._clock()
        return True

    @property
    def held(self) -> float:
        """Seconds the work has held the loop, the current slice included."""
        return self._held + self._clock() - self._started
