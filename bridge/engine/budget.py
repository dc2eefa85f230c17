"""Per-webhook lanes: the concurrency limit of each webhook, and telling a busy webhook from a
stalled one (whose deliveries are then parked instead of holding the in-flight budget)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

TURN_AWAY_BATCH = 25


TURN_AWAY_INTERVAL_S = 0.01


class Lane:
    """A per-webhook concurrency limit that tells a busy webhook from a stalled one.

    Deliveries wait in FIFO order for a slot while the webhook keeps answering. When it has
    answered nothing (no HTTP status at all: a timeout frees a slot without being an answer) for
    ``patience`` seconds with every slot taken, the lane is stalled: waiters give up and new
    deliveries do not wait, so a stalled webhook cannot hold the process-wide in-flight budget
    that healthy webhooks need. It stays stalled until it answers again: meanwhile a delivery
    only starts when a slot is free (a probe, one per slot and per timeout) and never waits. One
    timer per lane watches for a stall, however many deliveries wait.
    """

    __slots__ = (
        "active",
        "hurry",
        "is_stalled",
        "last_answer",
        "limit",
        "patience",
        "waiters",
        "watch",
    )

    def __init__(
        self, limit: int, patience: float, hurry: Callable[[], bool] = lambda: False
    ) -> None:
        self.limit = limit
        self.patience = patience
        self.hurry = hurry  # true while waiters hold up others (the in-flight limit is reached)
        self.active = 0
        self.is_stalled = False
        self.last_answer = time.monotonic()
        self.waiters: deque[asyncio.Future[bool]] = deque()
        self.watch: asyncio.TimerHandle | None = None

    def try_acquire(self) -> bool:
        """Take a slot at once if one is free and nobody is waiting."""
        if self.active < self.limit and not self.waiters:
            if self.active == 0 and not self.is_stalled:
                self.last_answer = time.monotonic()  # an idle lane is not a stalled one
            self.active += 1
            return True
        return False

    def stalled(self) -> bool:
        """Stalled before, and not answered since; or every slot taken and no answer for
        ``patience`` seconds."""
        if not self.is_stalled and self.active >= self.limit:
            self.is_stalled = time.monotonic() - self.last_answer >= self.patience
        return self.is_stalled

    async def acquire(self) -> bool:
        """Wait for a slot while the webhook keeps answering; False once it is stalled."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiters.append(waiter)
        if self.watch is None:
            self.watch = loop.call_at(self._stall_at(loop), self._check)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release(answered=False)  # the slot was handed over as we were cancelled
            raise

    def _stall_at(self, loop: asyncio.AbstractEventLoop) -> float:
        """The loop time at which the lane counts as stalled unless the webhook answers."""
        return loop.time() + max(0.0, self.last_answer + self.patience - time.monotonic())

    def _check(self) -> None:
        self.watch = None
        if not self.waiters:
            return
        if time.monotonic() - self.last_answer >= self.patience:
            self.is_stalled = True
            self._turn_away()
            return
        loop = asyncio.get_running_loop()
        self.watch = loop.call_at(self._stall_at(loop), self._check)

    def _turn_away(self) -> None:
        """Tell the waiters of a stalled lane not to wait, a batch every ``TURN_AWAY_INTERVAL_S``
        (at most 2,500 a second): parking the thousand or more deliveries that piled up during
        the patience all at once saturated two cores (the bridge, and the broker writing them)
        and held up the other webhooks' deliveries by up to 100 ms (docs/PERFORMANCE.md). While
        ``hurry()`` (the waiters fill the in-flight limit, so nothing else moves) a batch every
        turn of the event loop."""
        for _ in range(TURN_AWAY_BATCH):
            if not self.waiters:
                return
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
        if not self.waiters:
            return
        loop = asyncio.get_running_loop()
        if self.is_stalled and self.hurry():
            loop.call_soon(self._turn_away)
        elif self.is_stalled:
            loop.call_later(TURN_AWAY_INTERVAL_S, self._turn_away)
        elif self.watch is None:  # it answered meanwhile: the rest wait, watched again
            self.watch = loop.call_at(self._stall_at(loop), self._check)

    def release(self, answered: bool) -> None:
        """Free a slot (to the first live waiter, if any); ``answered`` if an HTTP status came."""
        if answered:
            self.last_answer = time.monotonic()
            self.is_stalled = False
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.active -= 1
