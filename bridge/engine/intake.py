"""What a consumed record becomes: deliveries started, a hold, or a dead letter.

A source record is decoded, mapped and matched to webhooks, one delivery for each match; a record
that can never become a notification (poison) is dead-lettered whole, and one whose schema the
registry cannot give now holds its partition, backing off. A writer schema is fetched off the
event loop, its partition held meanwhile: the consume loop, and every other partition, never
wait for the registry. A retry record (from a delay topic or
the parking topic) is taken once it is due, each of its deliveries going to its webhook again, or
to the dead letters if that webhook was removed, disabled or no longer subscribed to the event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from confluent_kafka import Message

from bridge.codec.decoding import Decoder
from bridge.core.envelope import EnvelopeError, PendingDelivery, SourceRef, parse_delivery
from bridge.core.errors import BridgeError, RecordError
from bridge.core.mapping import to_notification
from bridge.core.signing import message_id
from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Webhook
from bridge.engine.dispatch import Dispatcher
from bridge.engine.partition import PartitionState
from bridge.engine.recovery import Recovery
from bridge.kafka.consumer import TP
from bridge.ops.metrics import Metrics

log = logging.getLogger("bridge.engine.pipeline")  # the logger its events always had

REGISTRY_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
FETCH_CHECK_S = 0.05  # how often a partition waiting for a writer schema looks again
CLOCK_SKEW_MS = 60_000
"""How far ahead of this replica's clock another's may run: a retry record due further ahead
than the longest wait of the ladder plus this was not written so by any rung (forged, or a clock
far off), and is taken as due now rather than holding its partition for as long as it says."""


class Intake:
    """Takes consumed records: source records and retry records."""

    def __init__(
        self,
        subscriptions: Subscriptions,
        decoder: Decoder,
        dispatcher: Dispatcher,
        recovery: Recovery,
        metrics: Metrics,
        longest_wait_ms: int,
    ) -> None:
        self.subscriptions = subscriptions  # swapped whole on a reload
        self.decoder = decoder
        self.dispatcher = dispatcher
        self.recovery = recovery
        self.metrics = metrics
        self.latest_due_ms = longest_wait_ms + CLOCK_SKEW_MS  # ahead of now: see CLOCK_SKEW_MS
        # Per partition: the offset of the record whose writer schema is being fetched, and the
        # fetch (which decodes that record).
        self._fetches: dict[TP, tuple[int, asyncio.Future[Any]]] = {}

    async def source(self, msg: Message, partition: PartitionState, wall_ms: int) -> bool | None:
        """Take a source record: True when taken, False when its partition is held (the registry
        cannot answer), None when its deliveries do not fit in the in-flight limit now (a record
        whose fan-out alone exceeds the limit is taken when nothing else is in flight)."""
        tp = partition.tp
        value = msg.value() or b""
        ts_type, ts = msg.timestamp()
        source = SourceRef(tp[0], tp[1], msg.offset(), ts if ts_type and ts > 0 else wall_ms)
        try:
            record = self._decoded(value, partition, source.offset)
            if record is None:  # its writer schema is being fetched: look again shortly
                partition.hold(time.monotonic() + FETCH_CHECK_S)
                return False
            notification = to_notification(record, value)
        except BridgeError as exc:
            if not exc.retriable:  # the record can never become a notification
                self.metrics.consumed_source.inc()
                self.metrics.record_failures.labels(exc.reason).inc()
                self._poison(msg, partition, source, exc)
                return True
            self._hold(partition, source.offset, exc)
            return False
        webhooks = self.subscriptions.match(notification.account_holder_id, notification.event)
        if not self.dispatcher.in_flight.fits(len(webhooks)):
            return None
        partition.registry_failures = 0
        self.metrics.consumed_source.inc()
        partition.started(source.offset)
        if not webhooks:
            partition.finished(source.offset)
            return True
        first = webhooks[0].id
        delivery = PendingDelivery(  # to the first webhook; the others are made from it
            webhook_id=first,
            message_id=message_id(notification.transaction_id, notification.event, first),
            event=notification.event,
            transaction_id=notification.transaction_id,
            body=notification.body,
            attempt=0,
            source=source,
            key=msg.key(),
            account=notification.account_holder_id,
        )
        self.dispatcher.dispatch(partition, source.offset, delivery, webhooks, [])
        return True

    def _decoded(self, value: bytes, partition: PartitionState, offset: int) -> Any:
        """The record ``value`` holds, decoded inline when that needs no I/O; else None while
        its writer schema is fetched from the registry off the event loop, and the outcome
        (record or error) once the fetch ended. A slow registry holds only the partitions whose
        records wait for it: the consume loop never waits on a fetch."""
        fetch = self._fetches.get(partition.tp)
        if fetch is not None and fetch[0] == offset:
            if not fetch[1].done():
                return None
            del self._fetches[partition.tp]
            return fetch[1].result()  # (raises the decoding's error)
        if self.decoder.schema_id_to_fetch(value) is None:
            return self.decoder.decode(value)
        started = asyncio.get_running_loop().run_in_executor(None, self.decoder.decode, value)
        started.add_done_callback(_retrieved)
        self._fetches[partition.tp] = (offset, started)  # (a stale one is dropped, left to end)
        return None

    def _hold(self, partition: PartitionState, offset: int, exc: BridgeError) -> None:
        """Hold a partition whose record is fine but needs what cannot answer now (the schema
        registry): it is tried again after a back-off that grows with each failure in a row."""
        failures = partition.registry_failures
        partition.registry_failures = failures + 1
        delay = REGISTRY_BACKOFF_S[min(failures, len(REGISTRY_BACKOFF_S) - 1)]
        partition.hold(time.monotonic() + delay)
        log.warning(
            "registry.unavailable" if exc.reason == "registry_unavailable" else "record.held",
            extra={
                "fields": {
                    "topic": partition.tp[0],
                    "partition": partition.tp[1],
                    "offset": offset,
                    "retry_in_s": delay,
                    "error": str(exc),
                }
            },
        )

    def _poison(
        self, msg: Message, partition: PartitionState, source: SourceRef, error: BridgeError
    ) -> None:
        """Dead-letter a record that can never be delivered; it is finished once written."""
        partition.started(source.offset)
        self.dispatcher.settle(
            partition, source.offset, self.recovery.dead_letter_poison(msg, source, error)
        )

    def retry(self, msg: Message, partition: PartitionState, wall_ms: int) -> bool | None:
        """Take a retry record: True when taken (or dead-lettered as malformed), False when it
        is not due yet (its partition is then held until it is), None when its deliveries (a
        parking record may carry several) do not fit in the in-flight limit now."""
        tp = partition.tp
        try:
            delivery = parse_delivery(msg.headers(), msg.value(), msg.key())
        except Exception as exc:  # EnvelopeError; anything else too: a record never stops us
            reason = str(exc) if isinstance(exc, EnvelopeError) else type(exc).__name__
            source = SourceRef(tp[0], tp[1], msg.offset(), wall_ms)
            error = RecordError("malformed_retry_record", reason, msg.value())
            self._poison(msg, partition, source, error)
            return True
        if wall_ms < delivery.due_ms <= wall_ms + self.latest_due_ms:
            partition.hold(time.monotonic() + (delivery.due_ms - wall_ms) / 1000)
            return False
        if not self.dispatcher.in_flight.fits(1 + len(delivery.also)):
            return None
        self.metrics.consumed_retry.inc()
        self.metrics.retry_lateness.observe(max(0, wall_ms - delivery.due_ms) / 1000)
        partition.started(msg.offset())
        wanted: list[Webhook] = []
        gone: list[tuple[str, str]] = []
        for webhook_id in (delivery.webhook_id, *delivery.also):
            judged = self.subscriptions.judge(webhook_id, delivery.account, delivery.event)
            if isinstance(judged, str):
                gone.append((webhook_id, judged))
            else:
                wanted.append(judged)
        self.dispatcher.dispatch(partition, msg.offset(), delivery, wanted, gone)
        return True


def _retrieved(fetch: asyncio.Future[Any]) -> None:
    """Take a finished fetch's error, so that one whose record went elsewhere (its partition
    revoked) is not reported as never retrieved."""
    if not fetch.cancelled():
        fetch.exception()
