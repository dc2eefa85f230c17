"""Dead letters: list them and replay them (``bridge dlq list``, ``bridge dlq replay``).

Listing reads the dead-letter topic from the beginning to its current end without joining a group.
Replaying re-injects each selected dead letter at attempt 0: a failed delivery goes to the first
delay rung, due at once, for its one webhook (same ``webhook-id``, so receivers can de-duplicate);
a poison record goes back to the source topic as it was. Replay is at least once and leaves the
dead letters in place (Kafka topics are append-only): filter by time to avoid replaying twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition

from bridge.core.envelope import (
    H_ATTEMPTS,
    H_DEAD_LETTERED,
    H_KIND,
    H_LAST_ERROR,
    H_LAST_STATUS,
    H_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    H_VALUE_DROPPED,
    H_WEBHOOK,
    KIND_POISON,
    EnvelopeError,
    delay_headers,
    header_map,
    parse_delivery,
    whole_number,
)
from bridge.core.settings import Config


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic, with its headers as text."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]
    raw_headers: list[tuple[str, bytes]]

    @property
    def kind(self) -> str:
        return self.headers.get(H_KIND, "")

    @property
    def webhook(self) -> str:
        return self.headers.get(H_WEBHOOK, "")

    @property
    def reason(self) -> str:
        return self.headers.get(H_REASON, "")

    @property
    def dead_lettered_ms(self) -> int | None:
        """When it was dead-lettered; None when its header is missing or malformed (such a
        letter is listed, its age as ``-``, and matches no time filter)."""
        try:
            return whole_number(self.headers, H_DEAD_LETTERED)
        except EnvelopeError:
            return None

    def value_dropped(self) -> str | None:
        """Why this letter cannot be replayed, when its value was too large to be kept (the
        bridge wrote it without): where the source record is; else None."""
        size = self.headers.get(H_VALUE_DROPPED)
        if size is None:
            return None
        where = "/".join(
            self.headers.get(name, "?")
            for name in (H_SOURCE_TOPIC, H_SOURCE_PARTITION, H_SOURCE_OFFSET)
        )
        return (
            f"its value ({size} bytes) was too large to be kept; the source record is at {where} "
            "(topic/partition/offset)"
        )

    def row(self, now_ms: int) -> list[str]:
        """The columns of ``dlq list``: where, kind, webhook, reason, attempts, last, age."""
        when = self.dead_lettered_ms
        age = "-" if when is None else _age(max(0, now_ms - when) // 1000)
        last = self.headers.get(H_LAST_STATUS) or self.headers.get(H_LAST_ERROR, "")
        return [
            f"{self.partition}/{self.offset}",
            self.kind,
            self.webhook or "-",
            self.reason + (" (value not kept)" if H_VALUE_DROPPED in self.headers else ""),
            self.headers.get(H_ATTEMPTS, "-"),
            (last or "-")[:40],
            age,
        ]


def _age(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Selection:
    """Which dead letters to list or replay; every filter left as None matches all."""

    webhook: str | None = None
    reason: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def matches(self, letter: DeadLetter) -> bool:
        """True when the dead letter passes every filter."""
        when = letter.dead_lettered_ms
        return (
            (self.webhook is None or letter.webhook == self.webhook)
            and (self.reason is None or letter.reason == self.reason)
            and (self.since_ms is None or (when is not None and when >= self.since_ms))
            and (self.until_ms is None or (when is not None and when <= self.until_ms))
        )


def read_dead_letters(config: Config, timeout: float = 30.0) -> Iterator[DeadLetter]:
    """Every record of the dead-letter topic up to its end at the time of the call."""
    consumer = Consumer(
        {
            **config.kafka_settings(),
            "group.id": "bridge-dlq-reader",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    try:
        topic = config.dead_letter_topic
        metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise LookupError(f"dead-letter topic {topic!r} does not exist (run `bridge topics`)")
        ends = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
            if high > low:
                ends[partition] = high
        if not ends:
            return
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            yield _letter(msg)
            if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
        if ends:
            raise TimeoutError(f"could not read the dead-letter topic to its end in {timeout}s")
    finally:
        consumer.close()


def _letter(msg: Message) -> DeadLetter:
    raw = [(name, value or b"") for name, value in msg.headers() or []]
    return DeadLetter(msg.partition(), msg.offset(), msg.key(), msg.value(), header_map(raw), raw)


def replay(
    config: Config,
    letters: list[DeadLetter],
    progress: Callable[[int, int], None] | None = None,
    timeout: float = 60.0,
) -> int:
    """Re-inject dead letters at attempt 0; returns how many the broker acknowledged."""
    producer = Producer(
        {**config.kafka_settings(), "acks": "all", "enable.idempotence": True, "log_level": 3}
    )
    acknowledged = 0
    failures: list[str] = []

    def on_delivery(err: object, _msg: Message) -> None:
        nonlocal acknowledged
        if err is None:
            acknowledged += 1
        else:
            failures.append(str(err))

    now = time.time_ns() // 1_000_000
    first_rung = config.delay_topics[0] if config.delay_topics else config.topics.source

    def reinject(letter: DeadLetter) -> None:
        dropped = letter.value_dropped()
        if dropped is not None:
            raise EnvelopeError(dropped)
        if letter.kind == KIND_POISON:
            producer.produce(
                config.topics.source, value=letter.value, key=letter.key, on_delivery=on_delivery
            )
            return
        delivery = parse_delivery(letter.raw_headers, letter.value, letter.key)
        fresh = replace(
            delivery,
            attempt=0,
            due_ms=now,
            last_status=None,
            last_error="replayed from the dead-letter topic",
            deferrals=0,
        )
        producer.produce(
            first_rung,
            value=fresh.body,
            key=fresh.key,
            headers=delay_headers(fresh),
            on_delivery=on_delivery,
        )

    try:  # a letter that cannot be replayed is said and skipped; those queued are always sent
        for index, letter in enumerate(letters, start=1):
            try:
                reinject(letter)
            except Exception as exc:  # EnvelopeError, or the producer refusing the record
                why = str(exc) if isinstance(exc, EnvelopeError) else f"{type(exc).__name__}"
                failures.append(f"{letter.partition}/{letter.offset}: {why}")
            producer.poll(0)
            if progress is not None:
                progress(index, len(letters))
    finally:
        producer.flush(timeout)
    if failures:
        raise RuntimeError(f"{len(failures)} dead letter(s) not replayed: {failures[0]}")
    return acknowledged
