"""Handing what cannot be delivered now to a bridge topic: a delay topic of the retry ladder, the
parking topic, or the dead letters.

Every write is tried again until the broker acknowledges it (:meth:`Recovery.produce`): a delivery
or a record is finished only once it was received or durably handed over, so a broker that
refuses writes holds up the commit instead of losing anything. The one refusal no retry changes
is a record too large for the client or the topic (:class:`RecordTooLargeError`): tried again,
it held its partition's commit for good. A delivery too large to wait in a delay topic is
dead-lettered at once (``too_large``); a dead letter too large to keep its value is written
without it, saying how large it was (``bridge-value-dropped-bytes``) beside the source record's
topic, partition and offset, where it still is.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from confluent_kafka import Message

from bridge.core.envelope import (
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    H_VALUE_DROPPED,
    Headers,
    PendingDelivery,
    SourceRef,
    dead_letter_headers,
    delay_headers,
    header_map,
    poison_headers,
)
from bridge.core.errors import BridgeError
from bridge.core.retry import GiveUp, RetryPolicy
from bridge.engine.clock import now_ms, now_ms_rounded_up
from bridge.kafka.producer import (
    DurableProducer,
    ProduceError,
    ProducerFailedError,
    RecordTooLargeError,
)
from bridge.ops.metrics import Metrics

# The engine's delivery and record events keep the logger name they have always had.
log = logging.getLogger("bridge.engine.pipeline")

PRODUCE_BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
TOO_LARGE = "too_large"
"""The dead-letter reason of a delivery too large for the bridge's delay topics."""


class Recovery:
    """Writes deliveries and records to the bridge's own topics, until the broker has them."""

    def __init__(
        self,
        producer: DurableProducer,
        policy: RetryPolicy,
        metrics: Metrics,
        dead_letter_topic: str,
    ) -> None:
        self.producer = producer
        self.policy = policy
        self.metrics = metrics
        self.dead_letter_topic = dead_letter_topic

    async def delay(self, delivery: PendingDelivery, topic: str) -> bool:
        """Write a delivery to a delay topic (a rung of the ladder, or the parking topic): True.
        One too large for it is dead-lettered instead (``too_large``), each of its webhooks:
        False."""
        try:
            await self.produce(topic, delivery.body, delivery.key, delay_headers(delivery), "retry")
        except RecordTooLargeError:
            for webhook_id in (delivery.webhook_id, *delivery.also):
                await self.dead_letter(delivery.to(webhook_id), TOO_LARGE)
            return False
        return True

    async def park(self, delivery: PendingDelivery, also: tuple[str, ...] = ()) -> None:
        """Park ``delivery``, and the deliveries of its record to the webhooks ``also`` (one
        event, one attempt, as often parked), in one record of the parking topic, without using
        an attempt; each parked too often is dead-lettered."""
        step = self.policy.defer(delivery.attempt, delivery.deferrals, now_ms_rounded_up())
        if isinstance(step, GiveUp):
            for webhook_id in (delivery.webhook_id, *also):
                stalled = delivery.to(webhook_id)
                await self.dead_letter(stalled, "webhook_stalled", step.attempts_made)
            return
        parked = replace(delivery, due_ms=step.due_ms, deferrals=delivery.deferrals + 1, also=also)
        if not await self.delay(parked, step.topic):
            return
        deferrals = self.metrics.deferrals
        for webhook_id in (delivery.webhook_id, *also):
            deferrals.labels(webhook_id).inc()

    async def hand_off(self, delivery: PendingDelivery) -> None:
        """At shutdown: park a delivery still in flight in rung 1, due at once, same attempt."""
        await self.delay(replace(delivery, due_ms=now_ms()), self.policy.delay_topics[0])

    async def dead_letter(
        self, delivery: PendingDelivery, reason: str, attempts: int | None = None
    ) -> None:
        """Write a delivery to the dead letters, saying why and after how many requests."""
        made = delivery.attempt if attempts is None else attempts  # requests made so far
        headers = dead_letter_headers(delivery, reason, made, now_ms())
        await self.produce_letter(delivery.body, delivery.key, headers)
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

    async def dead_letter_poison(self, msg: Message, source: SourceRef, error: BridgeError) -> None:
        """Write a record that can never be delivered to the dead letters, whole."""
        headers = poison_headers(source, error.reason, error.detail, now_ms())
        await self.produce_letter(msg.value(), msg.key(), headers)
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

    async def produce_letter(
        self, value: bytes | None, key: bytes | None, headers: Headers
    ) -> None:
        """Write a dead letter; if its value is too large to be kept, without it."""
        try:
            await self.produce(self.dead_letter_topic, value, key, headers, "dead_letter")
        except RecordTooLargeError as exc:
            size = len(value or b"")
            log.warning(
                "dead_letter.value_dropped",
                extra={"fields": {"bytes": size, "error": _short(exc), **_source_of(headers)}},
            )
            dropped = [*headers, (H_VALUE_DROPPED, str(size).encode())]
            await self.produce(self.dead_letter_topic, None, key, dropped, "dead_letter")

    async def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        kind: str,
    ) -> None:
        """Write to a bridge topic, trying again until the broker acknowledges it; a record
        too large for the client or the topic raises :class:`RecordTooLargeError` at once."""
        failures = 0
        while True:
            try:
                await self.producer.send(topic, value, key, headers)
                return
            except RecordTooLargeError:
                self.metrics.produce_failures.labels(kind).inc()
                raise
            except ProducerFailedError:
                # The producer can never write again and the bridge is ending (logged once as
                # kafka.producer_failed): wait to be cancelled, without a warning per try.
                await asyncio.sleep(PRODUCE_BACKOFF_S[-1])
            except Exception as exc:  # ProduceError, or anything the client raises: try again
                self.metrics.produce_failures.labels(kind).inc()
                delay = PRODUCE_BACKOFF_S[min(failures, len(PRODUCE_BACKOFF_S) - 1)]
                failures += 1
                log.warning(
                    "produce.failed",
                    extra={"fields": {"topic": topic, "error": _short(exc), "retry_in_s": delay}},
                )
                await asyncio.sleep(delay)


def _source_of(headers: Headers) -> dict[str, str]:
    """The source record's topic, partition and offset named in a dead letter's headers."""
    values = header_map(headers)
    return {
        "source_topic": values.get(H_SOURCE_TOPIC, ""),
        "source_partition": values.get(H_SOURCE_PARTITION, ""),
        "source_offset": values.get(H_SOURCE_OFFSET, ""),
    }


def _short(exc: Exception) -> str:
    """A ProduceError's text (the broker's words); for anything else only the type."""
    return str(exc)[:300] if isinstance(exc, ProduceError) else type(exc).__name__
