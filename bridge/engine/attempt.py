"""One delivery attempt under the engine's own deadline: it always ends in an outcome.

The HTTP client has its own timer, but the engine does not rely on it: :func:`guarded_attempt`
runs the request under an outer deadline of the webhook's timeout plus :data:`ATTEMPT_GRACE_S`,
and turns anything unexpected (an exception of any kind from building or sending the request)
into a not-received outcome with a reason. The delivery then goes up the retry ladder like any
other failure, its lane slot is freed and its record's offset can be committed: a stuck or crashed
attempt is impossible by construction, whatever a receiver sends or a URL holds.

Reasons (the outcome's ``error``, and the ``kind`` label of ``bridge_delivery_errors_total``):

- ``deadline_exceeded``: the attempt had no outcome within timeout + grace (a client defect).
- ``internal_error``: building or sending the request raised; the detail names the exception
  type and where it was raised, never its message (which could carry a header or a secret).

:class:`Deliverer` runs one delivery around that attempt: a slot of the webhook's lane (or
parked, when the webhook is stalled or out of unanswered credit), the guarded attempt, then its
consequence: received, or the next rung of the ladder, or the dead letters after the last.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import traceback
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final

from bridge.core.envelope import PendingDelivery
from bridge.core.retry import GiveUp, RetryPolicy
from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Webhook
from bridge.engine.budget import Lanes
from bridge.engine.clock import now_ms, now_ms_rounded_up
from bridge.engine.partition import RecordWork
from bridge.engine.recovery import Recovery
from bridge.http.sender import DeliveryRequest, HttpSender, Outcome, build_request
from bridge.ops.metrics import Metrics, status_class

log = logging.getLogger("bridge.engine.attempt")
events = logging.getLogger("bridge.engine.pipeline")  # the logger delivery events always had

ATTEMPT_GRACE_S: Final = 1.0
"""How far past its own timeout an attempt may run before the engine ends it."""
DEADLINE_TICK_S: Final = 0.25
"""The resolution of the outer deadline: an attempt is ended at most this long after its limit."""
MAX_LIMIT_S: Final = 86_400.0
"""The longest outer deadline (webhook timeouts are at most 300 s)."""

DEADLINE_EXCEEDED: Final = "deadline_exceeded"
INTERNAL_ERROR: Final = "internal_error"

Send = Callable[[DeliveryRequest, float], Awaitable[Outcome]]


class _Watch:
    """One attempt's outer deadline: its task, cancelled if the deadline passes first."""

    __slots__ = ("bucket", "cancelling", "fired", "task")

    def __init__(self, task: asyncio.Task[Any], bucket: set[_Watch]) -> None:
        self.task = task
        self.bucket = bucket  # the watches of its tick, on its task's loop
        self.cancelling = task.cancelling()  # cancellations asked for before the watch began
        self.fired = False


_Buckets = dict[int, set[_Watch]]
"""The watches of one event loop, by tick."""


class Deadlines:
    """The outer deadlines of attempts, on one timer per tick of each event loop.

    ``asyncio.timeout`` arms and cancels a timer of the loop for every attempt (about 5 µs under
    uvloop, more than any other step of a delivery but the request itself). The outer deadline is
    a backstop, never an attempt's own timeout (the HTTP client keeps a precise one), so it can be
    coarse: watches are kept in buckets of :data:`DEADLINE_TICK_S`, and one timer per bucket
    cancels the tasks still in it, at most a tick after their limit. Each loop has buckets of its
    own, and each timer empties its own loop's, so one Deadlines may serve loops one after another
    or at once (tests, threads) without a watch being lost or a task cancelled by another loop.
    """

    __slots__ = ("_last", "_loops")

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Buckets]
        self._loops = weakref.WeakKeyDictionary()
        self._last: tuple[asyncio.AbstractEventLoop | None, _Buckets] = (None, {})  # one object:
        # read and replaced whole, so a loop in another thread never sees half of it

    def start(self, limit: float) -> _Watch:
        """Watch the current task: it is cancelled if still watched ``limit`` seconds from now
        (up to a tick later; a limit that is not a number, or over :data:`MAX_LIMIT_S`, counts
        as that)."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("an outer deadline needs a task")
        loop = task.get_loop()
        last_loop, buckets = self._last
        if last_loop is not loop:
            buckets = self._loops.setdefault(loop, {})
            self._last = (loop, buckets)
        if not limit <= MAX_LIMIT_S:  # also NaN: the tick must be an integer
            limit = MAX_LIMIT_S
        tick = math.ceil((loop.time() + limit) / DEADLINE_TICK_S)
        bucket = buckets.get(tick)
        if bucket is None:
            bucket = buckets[tick] = set()
            loop.call_at(tick * DEADLINE_TICK_S, _expire, buckets, tick)
        watch = _Watch(task, bucket)
        bucket.add(watch)
        return watch

    @staticmethod
    def stop(watch: _Watch) -> bool:
        """The attempt ended: forget its watch. True when the watch had cancelled the task and
        nobody else asked to since the watch began: the deadline ended the attempt."""
        watch.bucket.discard(watch)
        return watch.fired and watch.task.uncancel() <= watch.cancelling


def _expire(buckets: _Buckets, tick: int) -> None:
    """A tick's timer (on the loop whose ``buckets`` these are): cancel the tasks still in it."""
    for watch in buckets.pop(tick, ()):
        watch.fired = True
        watch.task.cancel()


_DEADLINES: Final = Deadlines()
"""The outer deadlines of attempts guarded without a :class:`Deadlines` of their own."""


async def guarded_attempt(
    send: Send,
    build: Callable[[], DeliveryRequest],
    timeout: float,
    on_error: Callable[[str], None],
    context: Callable[[], dict[str, object]] = dict,
    deadlines: Deadlines = _DEADLINES,
) -> Outcome:
    """Build and send one request; return its outcome within ``timeout + ATTEMPT_GRACE_S``
    (up to :data:`DEADLINE_TICK_S` more).

    Never raises except ``asyncio.CancelledError`` (a cancelled attempt is the caller's to hand
    off). ``on_error(kind)`` is called once for an attempt the guard had to end; ``context()``
    gives log fields naming the delivery.
    """
    started = time.perf_counter()
    limit = timeout + ATTEMPT_GRACE_S
    ended = False  # by the deadline
    try:
        watch = deadlines.start(limit)
        try:
            return await send(build(), timeout)
        finally:
            ended = deadlines.stop(watch)
    except (asyncio.CancelledError, Exception) as exc:
        if ended:  # the deadline's cancellation, or what ``send`` turned it into
            kind, detail = DEADLINE_EXCEEDED, f"no outcome within {limit:g}s"
        elif isinstance(exc, asyncio.CancelledError):
            raise  # cancelled by someone else: the caller's to hand off
        else:
            kind, detail = INTERNAL_ERROR, _where(exc)
    on_error(kind)
    log.error("delivery.guarded", extra={"fields": {**context(), "kind": kind, "detail": detail}})
    return Outcome(None, kind, time.perf_counter() - started, detail)


class Deliverer:
    """Runs deliveries: one attempt each, and what follows from its outcome."""

    def __init__(
        self,
        sender: HttpSender,
        lanes: Lanes,
        recovery: Recovery,
        policy: RetryPolicy,
        metrics: Metrics,
        subscriptions: Callable[[], Subscriptions],
    ) -> None:
        self.subscriptions = subscriptions  # the configuration in force, when asked
        self.sender = sender
        self.lanes = lanes
        self.recovery = recovery
        self.policy = policy
        self.metrics = metrics
        self.handing_off = False  # at shutdown: a cancelled delivery is handed to rung 1
        self.deadlines = Deadlines()

    async def deliver(self, delivery: PendingDelivery, webhook: Webhook, work: RecordWork) -> None:
        """Run one delivery; its record counts as finished only if the delivery settled.

        Settled means received, or durably written to a delay or dead-letter topic. The attempt
        itself cannot hang or raise (:func:`guarded_attempt`); should anything after it fail
        unexpectedly, the delivery is judged not received and goes up the ladder, and should
        that fail too, it is dead-lettered (``internal_error``), so the commit still moves. Only
        a dead letter that cannot be written leaves the record unfinished, as does a delivery
        that is cancelled (partitions revoked): its offset is not committed and whoever consumes
        it next delivers it again.
        """
        try:
            await self.attempt(delivery, webhook)
        except asyncio.CancelledError:
            if not self.handing_off:
                raise
            await self.recovery.hand_off(delivery)
        except Exception as exc:
            self.metrics.delivery_errors.labels(INTERNAL_ERROR).inc()
            events.exception("delivery.crashed", extra={"fields": _ids(delivery)})
            crashed = Outcome(None, INTERNAL_ERROR, 0.0, type(exc).__name__)
            try:
                await self.not_received(delivery, webhook, crashed)
            except Exception as again:
                events.exception("delivery.ladder_failed", extra={"fields": _ids(delivery)})
                try:
                    failed = delivery.next(delivery.attempt, 0, None, type(again).__name__)
                    await self.recovery.dead_letter(failed, INTERNAL_ERROR, delivery.attempt + 1)
                except Exception:
                    events.exception("delivery.unsettled", extra={"fields": _ids(delivery)})
                    return
        work.done()

    async def attempt(self, delivery: PendingDelivery, webhook: Webhook) -> None:
        """One attempt, then its consequence: received, next rung, parked or dead letter."""
        lane = self.lanes.of(webhook)
        if not await lane.enter(delivery.came_back):
            await self.recovery.park(delivery)  # no request made, no attempt spent
            return
        # A reload may have come while it waited for a slot: judged again, and the request is
        # made with the settings in force when it starts.
        judged = self.subscriptions().judge(webhook.id, delivery.account, delivery.event)
        if isinstance(judged, str):
            lane.vacate()
            await self.recovery.dead_letter(delivery, judged)
            return
        webhook = judged
        answered: bool | None = None  # None: cancelled before the attempt ended
        try:
            outcome = await guarded_attempt(
                self.sender.send,
                lambda: build_request(
                    webhook, delivery.message_id, delivery.body, int(time.time())
                ),
                webhook.timeout_seconds,
                self._guard_ended,
                lambda: _ids(delivery),
                self.deadlines,
            )
            answered = outcome.status is not None
        finally:
            if answered is None:
                lane.vacate()
            else:
                lane.release(answered)
        if outcome.received:
            self._received(delivery, webhook, outcome)
        else:
            await self.not_received(delivery, webhook, outcome)

    def _guard_ended(self, kind: str) -> None:
        self.metrics.delivery_errors.labels(kind).inc()

    def _received(self, delivery: PendingDelivery, webhook: Webhook, outcome: Outcome) -> None:
        assert outcome.status is not None
        self.metrics.delivery_received(
            webhook.id,
            outcome.status,
            outcome.duration,
            max(0.0, (now_ms() - delivery.source.timestamp_ms) / 1000),
        )
        if events.isEnabledFor(logging.DEBUG):
            events.debug("delivery.received", extra={"fields": _fields(delivery, outcome)})

    async def not_received(
        self, delivery: PendingDelivery, webhook: Webhook, outcome: Outcome
    ) -> None:
        """Count a failed attempt and hand the delivery to the next rung of the ladder, or to
        the dead letters after the last."""
        metrics = self.metrics
        metrics.deliveries.labels(
            webhook.id, "failed", status_class(outcome.status, outcome.error)
        ).inc()
        if outcome.duration:
            metrics.request_duration.labels(webhook.id).observe(outcome.duration)
        step = self.policy.after_failure(delivery.attempt, now_ms_rounded_up())
        error = outcome.describe()
        if isinstance(step, GiveUp):
            failed = delivery.next(delivery.attempt, 0, outcome.status, error)
            events.warning(
                "delivery.failed",
                extra={"fields": {**_fields(delivery, outcome), "next": "dead_letter"}},
            )
            await self.recovery.dead_letter(failed, "retries_exhausted", step.attempts_made)
            return
        retry = delivery.next(step.attempt, step.due_ms, outcome.status, error)
        events.info(
            "delivery.failed",
            extra={"fields": {**_fields(delivery, outcome), "next": f"retry {step.attempt}"}},
        )
        if await self.recovery.delay(retry, step.topic):
            metrics.retries.labels(webhook.id, str(step.attempt)).inc()


def _ids(delivery: PendingDelivery) -> dict[str, Any]:
    return {"webhook": delivery.webhook_id, "message_id": delivery.message_id}


def _fields(delivery: PendingDelivery, outcome: Outcome) -> dict[str, Any]:
    return {
        **_ids(delivery),
        "attempt": delivery.attempt,
        "status": outcome.status,
        "error": outcome.error or None,
        "duration_ms": round(outcome.duration * 1000, 1),
    }


def _where(exc: BaseException) -> str:
    """The exception's type and the place it was raised, without its message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
