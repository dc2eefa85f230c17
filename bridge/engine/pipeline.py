"""The delivery engine: from consumed records to received notifications, retries and dead letters.

One consumer (one consumer group) reads the source topic and every delay topic of the retry
ladder. A source record is decoded, mapped and matched to webhooks; each match is one delivery,
run concurrently under a per-webhook limit and a process-wide in-flight limit. A delivery that is
not received goes to the next rung's delay topic, or after the last rung to the dead-letter topic.
A record is finished when each of its deliveries was received or durably handed to a bridge topic;
only then can its offset (as the end of a contiguous prefix of finished records) be committed.

Flow control never uses an unbounded queue: at the in-flight limit no more records are taken
from the consumer, whose prefetch is bounded, until a quarter of the limit is free again (nothing
is paused, so nothing is fetched twice: pausing and resuming a partition costs a fresh fetch of up
to a second, which starved the deliveries). A delay-topic partition whose head is not yet due is
paused alone until it is due; the records already in hand for it (up to 500) are kept and taken
when due, and only what lies beyond them is fetched again after a seek. At shutdown every
partition is paused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from bridge.codec.decoding import Decoder
from bridge.core.envelope import (
    EnvelopeError,
    PendingDelivery,
    SourceRef,
    dead_letter_headers,
    delay_headers,
    expand,
    parse_delivery,
    poison_headers,
)
from bridge.core.errors import BridgeError, RecordError
from bridge.core.mapping import to_notification
from bridge.core.offsets import OffsetTracker
from bridge.core.retry import GiveUp, RetryPolicy
from bridge.core.settings import Config
from bridge.core.signing import message_id
from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Webhook
from bridge.engine.attempt import INTERNAL_ERROR, guarded_attempt
from bridge.engine.budget import Lane
from bridge.http.sender import HttpSender, Outcome, build_request
from bridge.kafka.consumer import TP, ThreadedConsumer
from bridge.kafka.producer import DurableProducer, ProduceError
from bridge.ops.metrics import Metrics, status_class
from bridge.ops.status import STATUS_LIMIT, bounded

log = logging.getLogger("bridge.engine.pipeline")

FETCH_BATCH = 500
IDLE_POLL_S = 0.05
REGISTRY_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
PRODUCE_BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
RESUME_FRACTION = 0.75
BACKPRESSURE_WAIT_S = 0.25
WAITING_LIMIT = 500  # retry records kept in hand per held partition
REVOKE_DRAIN_S = 10.0
HAND_OFF_SHARE = 0.3  # of the shutdown grace kept for handing off, committing and closing


def now_ms() -> int:
    """Wall-clock time in milliseconds (the unit of Kafka timestamps and due times)."""
    return time.time_ns() // 1_000_000


def now_ms_rounded_up() -> int:
    """Wall-clock time in milliseconds, rounded up: a due time counted from it is never before
    the exact moment plus the delay (a retry is taken once ``now_ms() >= due``)."""
    return -(-time.time_ns() // 1_000_000)


@dataclass(slots=True)
class RecordWork:
    """A consumed record and how many of its deliveries are not yet finished."""

    tp: TP
    offset: int
    remaining: int


class Pipeline:
    """Consumes, delivers, retries and dead-letters; owns offsets and flow control."""

    def __init__(
        self,
        config: Config,
        *,
        consumer: ThreadedConsumer,
        producer: DurableProducer,
        sender: HttpSender,
        decoder: Decoder,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.subscriptions = Subscriptions(config.webhooks)
        self.consumer = consumer
        self.producer = producer
        self.sender = sender
        self.decoder = decoder
        self.metrics = metrics
        self.policy = RetryPolicy.from_config(config)
        self.source_topic = config.topics.source
        self.dead_letter_topic = config.dead_letter_topic
        self.max_in_flight = config.delivery.max_in_flight
        self.stall_patience = config.retry.first_delay_ms / 1000
        self.lanes: dict[str, Lane] = {}
        self.trackers: dict[TP, OffsetTracker] = {}
        self.next_offset: dict[TP, int] = {}
        self.holds: dict[TP, float] = {}  # partition -> monotonic time when it may resume
        self.waiting: dict[TP, deque[Message]] = {}  # held retry records already in hand
        self.paused: set[TP] = set()
        self.dirty: set[TP] = set()
        self.tasks: dict[TP, set[asyncio.Task[None]]] = {}
        self.in_flight = 0  # deliveries spawned and not finished, counted when spawned
        self.carry: deque[Message] = deque()  # fetched records whose fan-out did not fit yet
        self.backpressure = False
        self._room_freed: asyncio.Event | None = None
        self.stopping = False
        self.handing_off = False
        self.last_message = float("-inf")  # monotonic time of the last record fetched
        self.last_loop = time.monotonic()
        self._registry_failures: dict[TP, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- configuration ---------------------------------------------------------------------

    def apply_config(self, config: Config) -> None:
        """Swap in a new webhook set: new deliveries use it, deliveries in flight keep theirs.

        Cheap at 10,000 webhooks (it runs on the event loop): the index is updated for the
        webhooks that changed, not rebuilt, and only the lanes that exist are visited."""
        self.config = config
        self.subscriptions = self.subscriptions.updated(config.webhooks)
        for webhook_id, lane in self.lanes.items():
            webhook = self.subscriptions.get(webhook_id)
            if webhook is not None:
                lane.limit = webhook.concurrency
                lane.patience = self._patience(webhook)
        self._register_webhooks()

    def status(self, limit: int = STATUS_LIMIT) -> dict[str, Any]:
        """Per-webhook detail and totals for the operator's ``/status`` (ids only: never a URL or
        a secret). Lists each webhook failing now, stalled, out of unanswered credit, or with
        deliveries active or waiting for a slot, never the idle ones: the most pressing first,
        at most ``limit``, saying how many were left out (:func:`bridge.ops.status.bounded`)."""
        failing = self.metrics.webhooks.failing
        rows: list[dict[str, Any]] = []
        for webhook_id, lane in self.lanes.items():
            if webhook_id not in failing and not (
                lane.active or lane.waiters or lane.is_stalled or lane.credit < 1.0
            ):
                continue  # idle, at a glance (the snapshot below decides for the others)
            state = lane.snapshot()
            if webhook_id in failing or any(
                state[key] for key in ("active", "waiting", "stalled", "out_of_credit")
            ):
                rows.append({"id": webhook_id, "failing_since": failing.get(webhook_id), **state})
        for webhook_id in failing.keys() - self.lanes.keys():  # failing, no lane: no detail
            rows.append({"id": webhook_id, "failing_since": failing[webhook_id]})
        body = bounded(rows, limit)
        body["totals"] = {
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "backpressure": self.backpressure,
            "paused_partitions": len(self.paused),
            "assigned_partitions": len(self.trackers),
            "webhooks_configured": len(self.subscriptions),
            "webhooks_failing": len(failing),
        }
        body["time"] = round(time.time(), 3)
        return body

    def _register_webhooks(self) -> None:
        webhooks = self.config.webhooks
        self.metrics.webhooks_configured.set(sum(1 for w in webhooks if w.enabled))
        self.metrics.register_webhooks((w.id for w in webhooks), self.policy.attempts)

    # ---- the consume loop --------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Every topic the bridge consumes: the source, each rung of the ladder, the parking lot."""
        return [self.source_topic, *self.policy.delay_topics, self.policy.parked_topic]

    async def run(self) -> None:
        """Consume and dispatch until ``stopping`` is set (then :meth:`drain` finishes the work)."""
        self._loop = asyncio.get_running_loop()
        self._register_webhooks()
        await self.consumer.call(  # on the consumer's thread, like every call on it
            self.consumer.subscribe,
            self.topics(),
            self._on_assign,
            self._on_revoke,
            self._on_lost,
        )
        while not self.stopping:
            self.last_loop = time.monotonic()
            room = self._room()
            if room == 0:
                self._shed_waiters()
                await self._wait_for_room()
                room = self._room()
            if self.carry:  # records already in hand come first; nothing new is fetched meanwhile
                if room:  # (without room, the turn has just waited for it)
                    carried, self.carry = list(self.carry), deque()
                    await self._handle(carried)
                    if self.carry:  # the head's fan-out does not fit yet: wait for deliveries
                        await self._wait_for_room()
                await self._flow_control()
                continue
            # Even at the limit a turn polls (for one record), so rebalances and the group's
            # liveness are served; at most four such turns a second.
            messages = await self.consumer.call(
                self.consumer.fetch,
                min(FETCH_BATCH, max(1, room)),
                self._poll_timeout(),
                self._offsets_to_store(),
            )
            if messages:
                await self._handle(messages)
            await self._flow_control()

    def _room(self) -> int:
        """How many deliveries the next turn may start (records are fetched up to that many and
        taken while their fan-out fits): none from the in-flight limit until enough deliveries
        finished (a quarter of the limit), so turns do not crawl one record at a time."""
        if self.in_flight >= self.max_in_flight:
            self.backpressure = True
        elif self.in_flight <= self.max_in_flight * RESUME_FRACTION:
            self.backpressure = False
        return 0 if self.backpressure else self.max_in_flight - self.in_flight

    def _at_limit(self) -> bool:
        """Whether the in-flight limit holds records back (back-pressure is on)."""
        return self.backpressure or self.in_flight >= self.max_in_flight

    async def _wait_for_room(self) -> None:
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

    def _shed_waiters(self) -> None:
        """At the in-flight limit: park the deliveries that waited a lane's patience or more for
        one of its slots (a webhook too slow for its traffic), so they do not hold up the
        others' records."""
        for lane in self.lanes.values():
            if lane.waiters:
                lane.shed()

    def _poll_timeout(self) -> float:
        if not self.holds:
            return IDLE_POLL_S
        until = min(self.holds.values()) - time.monotonic()
        return max(0.0, min(IDLE_POLL_S, until))

    async def _handle(self, messages: list[Message]) -> None:
        wall_ms = now_ms()
        self.last_message = time.monotonic()
        for index, msg in enumerate(messages):
            error = msg.error()
            if error is not None:
                self._kafka_error(error)
                continue
            tp: TP = (msg.topic(), msg.partition())
            offset = msg.offset()
            tracker = self.trackers.get(tp)
            if tracker is None:
                continue  # no longer assigned
            expected = self.next_offset.get(tp)
            if expected is not None and offset < expected:
                continue  # fetched before a seek back: a newer fetch brings it again
            waiting = self.waiting.get(tp)
            if waiting is not None:
                if offset == expected and len(waiting) < WAITING_LIMIT:
                    waiting.append(msg)  # behind a head not yet due: kept, taken when due
                    self.next_offset[tp] = offset + 1
                continue  # beyond what is kept: fetched again after the resume
            if tp in self.holds or tp in self.paused:
                if expected is None:
                    self.next_offset[tp] = offset
                continue  # fetched before the pause took effect: fetched again after resume
            if tp[0] == self.source_topic:
                accepted = await self._accept_source(msg, tp, tracker, wall_ms)
                if accepted is None:  # its fan-out does not fit now: it and what follows wait
                    self.carry.extend(messages[index:])
                    return
            else:
                if self.in_flight >= self.max_in_flight:  # no room for its delivery now
                    self.carry.extend(messages[index:])
                    return
                accepted = self._accept_retry(msg, tp, tracker, wall_ms)
                if not accepted:  # not due: keep it (and what follows) rather than fetch again
                    self.waiting[tp] = deque([msg])
                    accepted = True
            self.next_offset[tp] = offset + 1 if accepted else offset

    def _kafka_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        log.warning("kafka.error", extra={"fields": {"error": error.str(), "code": error.code()}})

    # ---- source records ----------------------------------------------------------------------

    async def _accept_source(
        self, msg: Message, tp: TP, tracker: OffsetTracker, wall_ms: int
    ) -> bool | None:
        """Take a source record: True when taken, False when its partition is held (the registry
        cannot answer), None when its deliveries do not fit in the in-flight limit now (a record
        whose fan-out alone exceeds the limit is taken when nothing else is in flight)."""
        value = msg.value() or b""
        ts_type, ts = msg.timestamp()
        source = SourceRef(tp[0], tp[1], msg.offset(), ts if ts_type and ts > 0 else wall_ms)
        try:
            if self.decoder.schema_id_to_fetch(value) is not None:
                record = await asyncio.get_running_loop().run_in_executor(
                    None, self.decoder.decode, value
                )
            else:
                record = self.decoder.decode(value)
            notification = to_notification(record, value)
        except BridgeError as exc:
            if not exc.retriable:  # the record can never become a notification
                self.metrics.consumed_source.inc()
                self.metrics.record_failures.labels(exc.reason).inc()
                tracker.started(source.offset)
                work = RecordWork(tp, source.offset, 1)
                self._spawn(tp, self._settled(work, self._dead_letter_poison(msg, source, exc)))
                return True
            failures = self._registry_failures.get(tp, 0)
            self._registry_failures[tp] = failures + 1
            delay = REGISTRY_BACKOFF_S[min(failures, len(REGISTRY_BACKOFF_S) - 1)]
            self.holds[tp] = time.monotonic() + delay
            log.warning(  # the record is fine; what it needs cannot answer now: held, tried again
                "registry.unavailable" if exc.reason == "registry_unavailable" else "record.held",
                extra={
                    "fields": {
                        "topic": tp[0],
                        "partition": tp[1],
                        "offset": source.offset,
                        "retry_in_s": delay,
                        "error": str(exc),
                    }
                },
            )
            return False
        webhooks = self.subscriptions.match(notification.account_holder_id, notification.event)
        if self.in_flight and self.in_flight + len(webhooks) > self.max_in_flight:
            return None
        self._registry_failures.pop(tp, None)
        self.metrics.consumed_source.inc()
        tracker.started(source.offset)
        if not webhooks:
            self._finished(tp, source.offset)
            return True
        wanted = [
            (
                PendingDelivery(
                    webhook_id=webhook.id,
                    message_id=message_id(
                        notification.transaction_id, notification.event, webhook.id
                    ),
                    event=notification.event,
                    transaction_id=notification.transaction_id,
                    body=notification.body,
                    attempt=0,
                    source=source,
                    key=msg.key(),
                ),
                webhook,
            )
            for webhook in webhooks
        ]
        self._dispatch(tp, source.offset, wanted, [])
        return True

    # ---- retry records -----------------------------------------------------------------------

    def _accept_retry(self, msg: Message, tp: TP, tracker: OffsetTracker, wall_ms: int) -> bool:
        try:
            delivery = parse_delivery(msg.headers(), msg.value(), msg.key())
        except EnvelopeError as exc:
            source = SourceRef(tp[0], tp[1], msg.offset(), wall_ms)
            tracker.started(msg.offset())
            error = RecordError("malformed_retry_record", str(exc), msg.value())
            self._spawn(
                tp,
                self._settled(
                    RecordWork(tp, msg.offset(), 1), self._dead_letter_poison(msg, source, error)
                ),
            )
            return True
        if delivery.due_ms > wall_ms:
            self.holds[tp] = time.monotonic() + (delivery.due_ms - wall_ms) / 1000
            return False
        self.metrics.consumed_retry.inc()
        self.metrics.retry_lateness.observe((wall_ms - delivery.due_ms) / 1000)
        tracker.started(msg.offset())
        wanted: list[tuple[PendingDelivery, Webhook]] = []
        gone: list[tuple[PendingDelivery, str]] = []
        for one in expand(delivery):
            webhook = self.subscriptions.get(one.webhook_id)
            if webhook is not None and webhook.enabled and one.event in webhook.events:
                wanted.append((one, webhook))
            elif webhook is None:
                gone.append((one, "webhook_removed"))
            elif not webhook.enabled:
                gone.append((one, "webhook_disabled"))
            else:
                gone.append((one, "event_unsubscribed"))
        self._dispatch(tp, msg.offset(), wanted, gone)
        return True

    def _dispatch(
        self,
        tp: TP,
        offset: int,
        wanted: list[tuple[PendingDelivery, Webhook]],
        gone: list[tuple[PendingDelivery, str]],
    ) -> None:
        """Start the deliveries of one record (all of one event, at one attempt). Those whose
        webhook refuses work now (stalled, or its unanswered credit spent) are parked together,
        in one record; those whose webhook is gone are dead-lettered."""
        go: list[tuple[PendingDelivery, Webhook]] = []
        park: list[tuple[PendingDelivery, Webhook]] = []
        for delivery, webhook in wanted:
            lane = self.lanes.get(webhook.id)
            (park if lane is not None and lane.refusing() else go).append((delivery, webhook))
        work = RecordWork(tp, offset, len(go) + len(gone) + (1 if park else 0))
        for delivery, webhook in go:
            self._spawn_delivery(tp, delivery, webhook, work)
        for delivery, reason in gone:
            self._spawn(tp, self._settled(work, self._dead_letter(delivery, reason)))
        if park:  # counted in flight like a delivery: it holds a body until the broker has it
            self._spawn_counted(tp, self._settled(work, self._park([d for d, _w in park])))

    # ---- deliveries --------------------------------------------------------------------------

    def _spawn(self, tp: TP, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        tasks = self.tasks.setdefault(tp, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    def _spawn_delivery(
        self, tp: TP, delivery: PendingDelivery, webhook: Webhook, work: RecordWork
    ) -> None:
        """Start one delivery, counted in flight from now until its task is done (also when it
        is cancelled before it ever ran)."""
        self._spawn_counted(tp, self._deliver(delivery, webhook, work))

    def _spawn_counted(self, tp: TP, work: Coroutine[Any, Any, None]) -> None:
        self.in_flight += 1
        self.metrics.in_flight.inc()
        self._spawn(tp, work).add_done_callback(self._ended)

    def _ended(self, _task: asyncio.Task[None]) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.dec()
        freed = self._room_freed
        if freed is not None and self.in_flight <= self.max_in_flight * RESUME_FRACTION:
            freed.set()

    def _lane(self, webhook: Webhook) -> Lane:
        lane = self.lanes.get(webhook.id)
        if lane is None:
            lane = self.lanes[webhook.id] = Lane(
                webhook.concurrency, self._patience(webhook), hurry=self._at_limit
            )
        return lane

    def _patience(self, webhook: Webhook) -> float:
        """How long a full lane may go without an answer before it counts as stalled: half the
        webhook's timeout (a slow but healthy webhook answers well within it), at least the
        first rung's delay."""
        return max(self.stall_patience, webhook.timeout_seconds / 2)

    async def _deliver(self, delivery: PendingDelivery, webhook: Webhook, work: RecordWork) -> None:
        """Run one delivery; its record counts as finished only if the delivery settled.

        Settled means received, or durably written to a delay or dead-letter topic. The attempt
        itself cannot hang or raise (:func:`guarded_attempt`); should anything after it fail
        unexpectedly, the delivery is judged not received and goes up the ladder, so the commit
        still moves. A delivery that is cancelled (partitions revoked) leaves its record
        unfinished: its offset is not committed and whoever consumes it next delivers it again.
        """
        try:
            await self._attempt(delivery, webhook)
        except asyncio.CancelledError:
            if not self.handing_off:
                raise
            await self._hand_off(delivery)
        except Exception as exc:
            self.metrics.delivery_errors.labels(INTERNAL_ERROR).inc()
            log.exception("delivery.crashed", extra={"fields": _ids(delivery)})
            try:
                crashed = Outcome(None, INTERNAL_ERROR, 0.0, type(exc).__name__)
                await self._not_received(delivery, webhook, crashed)
            except Exception:
                log.exception("delivery.unsettled", extra={"fields": _ids(delivery)})
                return
        self._work_done(work)

    async def _attempt(self, delivery: PendingDelivery, webhook: Webhook) -> None:
        """One attempt, then its consequence: received, next rung, parked or dead letter."""
        lane = self._lane(webhook)
        if not await lane.enter():
            await self._defer(delivery, webhook)  # parked: no request made, no attempt spent
            return
        answered = False
        try:
            outcome = await guarded_attempt(
                self.sender.send,
                lambda: build_request(
                    webhook, delivery.message_id, delivery.body, int(time.time())
                ),
                webhook.timeout_seconds,
                self._guard_ended,
                lambda: _ids(delivery),
            )
            answered = outcome.status is not None
        finally:
            lane.release(answered)
        if outcome.received:
            self._received(delivery, webhook, outcome)
        else:
            await self._not_received(delivery, webhook, outcome)

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
        if log.isEnabledFor(logging.DEBUG):
            log.debug("delivery.received", extra={"fields": _fields(delivery, outcome)})

    async def _not_received(
        self, delivery: PendingDelivery, webhook: Webhook, outcome: Outcome
    ) -> None:
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
            log.warning(
                "delivery.failed",
                extra={"fields": {**_fields(delivery, outcome), "next": "dead_letter"}},
            )
            await self._dead_letter(failed, "retries_exhausted", step.attempts_made)
            return
        retry = delivery.next(step.attempt, step.due_ms, outcome.status, error)
        log.info(
            "delivery.failed",
            extra={"fields": {**_fields(delivery, outcome), "next": f"retry {step.attempt}"}},
        )
        await self._produce(step.topic, retry.body, retry.key, delay_headers(retry), "retry")
        metrics.retries.labels(webhook.id, str(step.attempt)).inc()

    async def _defer(self, delivery: PendingDelivery, webhook: Webhook) -> None:
        await self._park([delivery])

    async def _park(self, deliveries: list[PendingDelivery]) -> None:
        """Park deliveries of one record (one event, one attempt, as often parked) in one record
        of the parking topic, without using an attempt; each parked too often is dead-lettered."""
        first = deliveries[0]
        step = self.policy.defer(first.attempt, first.deferrals, now_ms_rounded_up())
        if isinstance(step, GiveUp):
            for delivery in deliveries:
                await self._dead_letter(delivery, "webhook_stalled", step.attempts_made)
            return
        parked = replace(
            first.next(first.attempt, step.due_ms, None, "", deferred=True),
            also=tuple(d.webhook_id for d in deliveries[1:]),
        )
        await self._produce(step.topic, parked.body, parked.key, delay_headers(parked), "retry")
        for delivery in deliveries:
            self.metrics.deferrals.labels(delivery.webhook_id).inc()

    async def _hand_off(self, delivery: PendingDelivery) -> None:
        """At shutdown: park a delivery still in flight in rung 1, due at once, same attempt."""
        parked = replace(delivery, due_ms=now_ms())
        topic = self.policy.delay_topics[0]
        await self._produce(topic, parked.body, parked.key, delay_headers(parked), "retry")

    async def _settled(self, work: RecordWork, step: Coroutine[Any, Any, None]) -> None:
        """Run ``step`` (a dead-letter write); the record is finished only if it completes."""
        try:
            await step
        except Exception:
            log.exception(
                "record.crashed", extra={"fields": {"partition": work.tp, "offset": work.offset}}
            )
            return
        self._work_done(work)

    async def _dead_letter(
        self, delivery: PendingDelivery, reason: str, attempts: int | None = None
    ) -> None:
        made = delivery.attempt if attempts is None else attempts  # requests made so far
        headers = dead_letter_headers(delivery, reason, made, now_ms())
        await self._produce(
            self.dead_letter_topic, delivery.body, delivery.key, headers, "dead_letter"
        )
        self.metrics.dead_letters.labels(delivery.webhook_id, reason).inc()
        log.warning(
            "delivery.dead_lettered",
            extra={
                "fields": {
                    "webhook": delivery.webhook_id,
                    "message_id": delivery.message_id,
                    "reason": reason,
                    "attempts": made,
                    "last_error": delivery.last_error,
                }
            },
        )

    async def _dead_letter_poison(
        self, msg: Message, source: SourceRef, error: BridgeError
    ) -> None:
        headers = poison_headers(source, error.reason, error.detail, now_ms())
        await self._produce(self.dead_letter_topic, msg.value(), msg.key(), headers, "dead_letter")
        self.metrics.dead_letters.labels("", error.reason).inc()
        log.warning(
            "record.dead_lettered",
            extra={
                "fields": {
                    "reason": error.reason,
                    "detail": error.detail[:300],
                    "topic": source.topic,
                    "partition": source.partition,
                    "offset": source.offset,
                }
            },
        )

    async def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        kind: str,
    ) -> None:
        """Write to a bridge topic, trying again until the broker acknowledges it."""
        failures = 0
        while True:
            try:
                await self.producer.send(topic, value, key, headers)
                return
            except Exception as exc:  # ProduceError, or anything the client raises: try again
                self.metrics.produce_failures.labels(kind).inc()
                delay = PRODUCE_BACKOFF_S[min(failures, len(PRODUCE_BACKOFF_S) - 1)]
                failures += 1
                log.warning(
                    "produce.failed",
                    extra={"fields": {"topic": topic, "error": _short(exc), "retry_in_s": delay}},
                )
                await asyncio.sleep(delay)

    # ---- offsets -----------------------------------------------------------------------------

    def _work_done(self, work: RecordWork) -> None:
        work.remaining -= 1
        if work.remaining == 0:
            self._finished(work.tp, work.offset)

    def _finished(self, tp: TP, offset: int) -> None:
        tracker = self.trackers.get(tp)
        if tracker is not None and tracker.finished(offset):
            self.dirty.add(tp)

    def _committable(self, partitions: Iterable[TP]) -> list[tuple[TP, int]]:
        offsets = []
        for tp in partitions:
            tracker = self.trackers.get(tp)
            if tracker is not None and tracker.committable is not None:
                offsets.append((tp, tracker.committable))
        return offsets

    def _offsets_to_store(self) -> list[tuple[TP, int]]:
        if not self.dirty:
            return []
        offsets = self._committable(self.dirty)
        self.dirty.clear()
        return offsets

    # ---- flow control ------------------------------------------------------------------------

    async def _flow_control(self) -> None:
        everything = self.stopping
        # Pause every held partition first, even one whose hold has just expired: records behind
        # its head were skipped, and only a pause and a resume with a seek fetches them again.
        wanted = set(self.trackers) if everything else set(self.holds)
        to_pause = [tp for tp in wanted if tp not in self.paused and tp in self.trackers]
        if to_pause:
            await self.consumer.call(self.consumer.pause, to_pause)
            self.paused.update(to_pause)
        monotonic = time.monotonic()
        for tp, until in list(self.holds.items()):
            if until <= monotonic:
                del self.holds[tp]
        if not everything:
            self._take_waiting()
        # A partition with kept records still in hand (no room for them yet) stays paused: what
        # lies beyond them is fetched again, after a seek, only once they were all taken.
        wanted = set(self.trackers) if everything else set(self.holds) | set(self.waiting)
        to_resume = [tp for tp in self.paused if tp not in wanted]
        if to_resume:
            positions = [(tp, self.next_offset.get(tp)) for tp in to_resume]
            await self.consumer.call(self.consumer.resume_at, positions)
            self.paused.difference_update(to_resume)
        if to_pause or to_resume:
            self.metrics.paused_partitions.set(len(self.paused))

    def _take_waiting(self) -> None:
        """Take the kept records of partitions whose hold expired, in order, until one is not
        due yet (which holds the partition again). A partition resumes, after what it kept, only
        once all of it was taken: a retry falling due costs no pause, seek and fetch of its own."""
        wall_ms = now_ms()
        for tp in [tp for tp in self.waiting if tp not in self.holds]:
            waiting = self.waiting[tp]
            tracker = self.trackers.get(tp)
            while tracker is not None and waiting and self.in_flight < self.max_in_flight:
                if not self._accept_retry(waiting[0], tp, tracker, wall_ms):
                    break
                waiting.popleft()
            if tracker is None or not waiting:
                del self.waiting[tp]

    # ---- rebalance callbacks (called on the consumer's thread, inside fetch) ------------------

    def _run_on_loop(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._run_on_loop(self._assigned([(p.topic, p.partition) for p in partitions]))

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        offsets = self._run_on_loop(self._released(tps, drain=True))
        try:
            self.consumer.commit_now(offsets)
        except Exception as exc:  # the group may already be gone; the next owner redoes the work
            log.warning("commit.failed", extra={"fields": {"error": str(exc)}})

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._run_on_loop(self._released([(p.topic, p.partition) for p in partitions], drain=False))

    async def _assigned(self, tps: list[TP]) -> None:
        for tp in tps:
            self.trackers[tp] = OffsetTracker()
            self.next_offset.pop(tp, None)
            self.holds.pop(tp, None)
            self.waiting.pop(tp, None)
            self.paused.discard(tp)
        self.metrics.assigned_partitions.set(len(self.trackers))
        log.info("partitions.assigned", extra={"fields": {"partitions": _names(tps)}})

    async def _released(self, tps: list[TP], drain: bool) -> list[tuple[TP, int]]:
        """Finish (revoke) or abandon (lost) the work of partitions leaving this instance."""
        tasks = [task for tp in tps for task in self.tasks.get(tp, ())]
        if drain and tasks:
            await asyncio.wait(tasks, timeout=REVOKE_DRAIN_S)
        for task in tasks:
            task.cancel()
        offsets = self._committable(tps) if drain else []
        for tp in tps:
            self.trackers.pop(tp, None)
            self.next_offset.pop(tp, None)
            self.holds.pop(tp, None)
            self.waiting.pop(tp, None)
            self.paused.discard(tp)
            self.dirty.discard(tp)
            self.tasks.pop(tp, None)
            self.metrics.forget_partition(*tp)
        self.metrics.assigned_partitions.set(len(self.trackers))
        self.metrics.paused_partitions.set(len(self.paused))
        log.info(
            "partitions.revoked" if drain else "partitions.lost",
            extra={
                "fields": {"partitions": _names(tps), "abandoned": sum(not t.done() for t in tasks)}
            },
        )
        return offsets

    # ---- shutdown ----------------------------------------------------------------------------

    async def drain(self, deadline: float) -> int:
        """Stop taking records, finish deliveries, hand off the rest, commit: all by
        ``deadline`` (event-loop time), whatever the broker or a receiver does. Deliveries get
        until ``HAND_OFF_SHARE`` of the time is left, the hand-off to rung 1 half of that, the
        commit the rest; a step still running at its limit is left (its records are delivered
        again by whoever consumes them next: at least once). Returns how many deliveries were
        left unsettled."""
        loop = asyncio.get_running_loop()
        reserve = max(0.0, deadline - loop.time()) * HAND_OFF_SHARE
        self.stopping = True
        await run_until(self._flow_control(), deadline - reserve)
        pending = [task for tasks in self.tasks.values() for task in tasks]
        if pending:
            _done, still = await asyncio.wait(
                pending, timeout=max(0.0, deadline - reserve - loop.time())
            )
            if still:
                self.handing_off = True
                for task in still:
                    task.cancel()
                await asyncio.wait(still, timeout=max(0.0, deadline - reserve / 2 - loop.time()))
        offsets = self._committable(self.trackers)
        if offsets:
            await run_until(self.consumer.call(self.consumer.commit_now, offsets), deadline)
        return sum(not task.done() for tasks in self.tasks.values() for task in tasks)


async def run_until(step: Coroutine[Any, Any, Any], deadline: float) -> bool:
    """Run ``step`` until ``deadline`` (event-loop time); False if it was cut short."""
    try:
        await asyncio.wait_for(step, max(0.0, deadline - asyncio.get_running_loop().time()))
    except TimeoutError:
        return False
    return True


def _names(tps: Iterable[TP]) -> str:
    return ",".join(f"{topic}/{partition}" for topic, partition in sorted(tps))


def _short(exc: Exception) -> str:
    """A ProduceError's text (the broker's words); for anything else only the type."""
    return str(exc)[:300] if isinstance(exc, ProduceError) else type(exc).__name__


def _ids(delivery: PendingDelivery) -> dict[str, Any]:
    return {"webhook": delivery.webhook_id, "message_id": delivery.message_id}


def _fields(delivery: PendingDelivery, outcome: Outcome) -> dict[str, Any]:
    return {
        "webhook": delivery.webhook_id,
        "message_id": delivery.message_id,
        "attempt": delivery.attempt,
        "status": outcome.status,
        "error": outcome.error or None,
        "duration_ms": round(outcome.duration * 1000, 1),
    }
