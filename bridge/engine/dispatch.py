"""Starting the deliveries of a record under the process-wide in-flight limit.

:class:`InFlight` counts deliveries from the moment they are started until their task is done
(also when it is cancelled before it ever ran), and says how many more the consume loop may
start. :class:`Dispatcher` starts the deliveries of one record: each to its webhook's lane;
those whose webhook refuses work now (stalled, or its unanswered credit spent) parked together
in one record of the parking topic (:data:`PARK_GROUP` webhooks at most); those whose webhook is
gone dead-lettered. A record is finished when each of these has settled
(:class:`bridge.engine.partition.RecordWork`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from bridge.core.envelope import PendingDelivery
from bridge.core.webhook import Webhook
from bridge.engine.budget import Lanes
from bridge.engine.partition import PartitionState, RecordWork
from bridge.engine.recovery import Recovery
from bridge.ops.metrics import Metrics

log = logging.getLogger("bridge.engine.pipeline")  # the logger ``record.crashed`` always had

RESUME_FRACTION = 0.75
BACKPRESSURE_WAIT_S = 0.25
PARK_GROUP = 256
"""The most webhooks parked in one parking record: their ids ride in one header (at most 65
bytes each: 16.6 KB), which must leave the body room under the topic's record size."""

Deliver = Callable[[PendingDelivery, Webhook, RecordWork], Coroutine[Any, Any, None]]


class InFlight:
    """Deliveries started and not finished, against the process-wide limit.

    At the limit no more records are taken until a quarter of the limit is free again
    (back-pressure), so turns of the consume loop do not crawl one record at a time."""

    __slots__ = ("_room_freed", "backpressure", "count", "limit")

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.count = 0  # deliveries spawned and not finished, counted when spawned
        self.backpressure = False
        self._room_freed: asyncio.Event | None = None
        metrics.in_flight.set_function(self._count)  # read at a scrape, nothing per delivery

    def _count(self) -> float:
        return self.count

    def room(self) -> int:
        """How many deliveries the next turn may start (records are fetched up to that many and
        taken while their fan-out fits): none from the in-flight limit until enough deliveries
        finished (a quarter of the limit), so turns do not crawl one record at a time."""
        if self.count >= self.limit:
            self.backpressure = True
        elif self.count <= self.limit * RESUME_FRACTION:
            self.backpressure = False
        return 0 if self.backpressure else self.limit - self.count

    def at_limit(self) -> bool:
        """Whether the in-flight limit holds records back (back-pressure is on)."""
        return self.backpressure or self.count >= self.limit

    def fits(self, deliveries: int) -> bool:
        """Whether a record with this many deliveries may be taken now: its whole fan-out fits,
        or nothing else is in flight (a fan-out alone beyond the limit goes alone)."""
        return not self.count or self.count + deliveries <= self.limit

    async def wait_for_room(self) -> None:
        """Wait for finished deliveries to make room, at most one polling interval: offsets are
        stored and holds expire meanwhile. Records are not taken, so nothing is paused or
        fetched again: they wait in the consumer's bounded prefetch."""
        self._room_freed = asyncio.Event()
        try:
            await asyncio.wait_for(self._room_freed.wait(), BACKPRESSURE_WAIT_S)
        except TimeoutError:
            pass
        finally:
            self._room_freed = None

    def started(self) -> None:
        """One more delivery in flight."""
        self.count += 1

    def ended(self, _task: asyncio.Task[None]) -> None:
        """A delivery's task is done (the done-callback of :meth:`started`'s task)."""
        self.count -= 1
        freed = self._room_freed
        if freed is not None and self.count <= self.limit * RESUME_FRACTION:
            freed.set()


class Dispatcher:
    """Starts the deliveries of consumed records, each as a task of the record's partition."""

    def __init__(
        self, in_flight: InFlight, lanes: Lanes, deliver: Deliver, recovery: Recovery
    ) -> None:
        self.in_flight = in_flight
        self.lanes = lanes
        self.deliver = deliver
        self.recovery = recovery

    def dispatch(
        self,
        partition: PartitionState,
        offset: int,
        record: PendingDelivery,
        wanted: Sequence[Webhook],
        gone: list[tuple[str, str]],
    ) -> None:
        """Start the deliveries of one record (all of one event, at one attempt) to the
        ``wanted`` webhooks. Those whose webhook refuses work now (stalled, or its unanswered
        credit spent) are parked together, :data:`PARK_GROUP` to a record; the webhooks ``gone``
        (id, reason) are dead-lettered.

        ``record`` is the record's delivery to any one webhook: each delivery is made from it
        only when it is started or written (:meth:`PendingDelivery.to`), so a record parked for
        nine webhooks makes one delivery and one ``webhook-id``, not nine."""
        go: list[Webhook] = []
        refused: list[str] = []
        came_back = record.came_back
        for webhook in wanted:
            if self.lanes.refusing(webhook.id, came_back):
                refused.append(webhook.id)
            else:
                go.append(webhook)
        parks = [
            refused[start : start + PARK_GROUP] for start in range(0, len(refused), PARK_GROUP)
        ]
        work = RecordWork(partition, offset, len(go) + len(gone) + len(parks))
        for webhook in go:  # counted in flight until its task is done
            self._counted(partition, self.deliver(record.to(webhook.id), webhook, work))
        for webhook_id, reason in gone:
            dead = self.recovery.dead_letter(record.to(webhook_id), reason)
            partition.spawn(settled(work, dead))
        for group in parks:  # counted in flight like a delivery: a body until the broker has it
            park = self.recovery.park(record.to(group[0]), tuple(group[1:]))
            self._counted(partition, settled(work, park))

    def settle(
        self, partition: PartitionState, offset: int, step: Coroutine[Any, Any, None]
    ) -> None:
        """Finish a record by ``step`` alone (a dead-letter write of the whole record)."""
        partition.spawn(settled(RecordWork(partition, offset, 1), step))

    def _counted(self, partition: PartitionState, work: Coroutine[Any, Any, None]) -> None:
        self.in_flight.started()
        partition.spawn(work).add_done_callback(self.in_flight.ended)


async def settled(work: RecordWork, step: Coroutine[Any, Any, None]) -> None:
    """Run ``step`` (a write to a bridge topic); the record is finished only if it completes."""
    try:
        await step
    except Exception:
        log.exception(
            "record.crashed",
            extra={"fields": {"partition": work.partition.tp, "offset": work.offset}},
        )
        return
    work.done()
