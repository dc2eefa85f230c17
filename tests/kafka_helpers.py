"""Produce, consume and topic helpers for tests that talk to the real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

QUIET = {"log_level": 0}


def unique_name(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topics(bootstrap: str, names: Sequence[str], partitions: int = 1) -> None:
    """Create topics and wait until each is created."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names],
        operation_timeout=30,
    )
    for future in futures.values():
        future.result(timeout=30)


@dataclass
class Produced:
    """Where one produced record landed."""

    topic: str
    partition: int
    offset: int


def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | None],
    key: bytes | None = None,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
) -> list[Produced]:
    """Produce values synchronously (acks=all) and return where each landed, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **QUIET})
    landed: list[Produced] = []
    errors: list[str] = []

    def on_delivery(err: object, msg: Message) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            landed.append(Produced(msg.topic(), msg.partition(), msg.offset()))

    for value in values:
        extra = {} if partition is None else {"partition": partition}
        producer.produce(
            topic, value=value, key=key, headers=headers, on_delivery=on_delivery, **extra
        )
    remaining = producer.flush(30)
    if errors or remaining:
        raise AssertionError(f"produce failed: {errors or f'{remaining} not delivered'}")
    return landed


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    group: str | None = None,
    timeout: float = 30.0,
    commit: bool = False,
) -> list[Message]:
    """Consume ``count`` records from ``topic`` through a consumer group within ``timeout``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or unique_name("reader"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    consumer.subscribe([topic])
    received: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(received) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            received.append(msg)
        if commit and received:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    if len(received) < count:
        raise AssertionError(
            f"consumed {len(received)} of {count} records from {topic} in {timeout}s"
        )
    return received


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int = 1) -> list[int]:
    """The committed offset of each partition of ``topic`` for ``group`` (-1001 when none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **QUIET})
    try:
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=10
        )
    finally:
        consumer.close()
    return [tp.offset for tp in committed]


def wait_for(condition, timeout: float, interval: float = 0.05, message: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it returns a truthy value or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
