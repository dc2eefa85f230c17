"""The Kafka consumer, driven from one dedicated thread so the event loop never blocks on it.

Every call on the confluent-kafka ``Consumer`` (fetch, pause, resume, seek, store, commit, close)
runs on that one thread, in order. Rebalance callbacks therefore run there too, inside ``fetch``;
they hand their work to the event loop and wait for it.

Settings for at-least-once: offsets are stored by the bridge only for a contiguous prefix of
finished records (``enable.auto.offset.store=false``) and committed every second and on revoke;
cooperative-sticky assignment, so a rebalance moves only the partitions that change owner.

Until the group first assigns partitions, an authentication or certificate failure
(:mod:`bridge.kafka.security`) ends ``fetch`` with :class:`KafkaSecurityError`: librdkafka would
retry it for ever, and a bridge that never started consuming should say why and exit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, TypeVar

from confluent_kafka import Consumer, Message, TopicPartition

from bridge.kafka.security import KafkaSecurityError, watch_security

log = logging.getLogger("bridge.kafka")
T = TypeVar("T")
TP = tuple[str, int]


def consumer_settings(
    kafka_settings: dict[str, Any], group_id: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The librdkafka settings of the bridge's consumer."""
    return {
        "auto.offset.reset": "earliest",
        **kafka_settings,
        "group.id": group_id,
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
        "auto.commit.interval.ms": 1000,
        "partition.assignment.strategy": "cooperative-sticky",
        # A partition resumed when its retry falls due is fetched in the next request; an
        # outstanding long poll delays that by up to this much (the default is 500 ms).
        "fetch.wait.max.ms": 25,
        # A partition resumed after a hold is fetched again at once (the default waits up to 1 s
        # when its prefetch queue had been full), so a retry falling due is not held back.
        "fetch.queue.backoff.ms": 20,
        # Bound the prefetch. librdkafka's defaults (64 MiB queued, 50 MiB per fetch, 1 MiB per
        # partition) cost far more than they bring here: delay-topic partitions are paused and
        # resumed all the time, and each resume fetched up to 1 MiB again. Measured on a failing
        # 100,000-record backlog (docs/PERFORMANCE.md): peak RSS 212 MB with 8 MiB / 8 MiB / 1 MiB,
        # 121 MB with these values; throughput unchanged (500 records a turn are 150 KB).
        "queued.max.messages.kbytes": 2048,
        "fetch.max.bytes": 2_097_152,
        "max.partition.fetch.bytes": 262_144,
        "enable.partition.eof": False,
        **(extra or {}),
    }


class ThreadedConsumer:
    """A confluent-kafka Consumer whose every call runs on one dedicated thread."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-consumer")
        on_error, self._security_failures = watch_security(settings.get("error_cb"))
        self._bootstrap = str(settings.get("bootstrap.servers", ""))
        self._started = False  # True once the group has assigned partitions to this consumer
        self.consumer = Consumer({**settings, "error_cb": on_error})

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the consumer's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: Callable[..., None],
        on_revoke: Callable[..., None],
        on_lost: Callable[..., None],
    ) -> None:
        """Subscribe the group to ``topics`` with rebalance callbacks (run inside :meth:`fetch`)."""

        def assigned(consumer: Any, partitions: list[TopicPartition]) -> None:
            self._started = True  # past the start: later failures are retried and logged
            on_assign(consumer, partitions)

        self.consumer.subscribe(
            list(topics), on_assign=assigned, on_revoke=on_revoke, on_lost=on_lost
        )

    def fetch(
        self, max_messages: int, timeout: float, store: Sequence[tuple[TP, int]] = ()
    ) -> list[Message]:
        """Store ``store`` offsets, wait up to ``timeout`` for a first record, then take what else
        is ready without waiting. One trip to the consumer's thread per turn of the loop.

        (``consume(n, timeout)`` alone waits for a full batch or the whole timeout, which adds up
        to ``timeout`` of latency to every record at low traffic.)
        """
        if store:
            self.store(store)
        first = self.consumer.poll(timeout)
        if not self._started and self._security_failures:
            self._fail_start(self._security_failures[0])
        if first is None:
            return []
        return [first, *self.consumer.consume(max_messages - 1, 0)]

    def _fail_start(self, reason: str) -> NoReturn:
        """End the start: the cluster refused the credentials or a certificate."""
        log.error(
            "kafka.start_failed",
            extra={"fields": {"bootstrap_servers": self._bootstrap, "reason": reason}},
        )
        raise KafkaSecurityError(self._bootstrap, reason)

    def pause(self, partitions: Sequence[TP]) -> None:
        """Stop fetching these partitions."""
        self.consumer.pause([TopicPartition(t, p) for t, p in partitions])

    def resume_at(self, positions: Sequence[tuple[TP, int | None]]) -> None:
        """Resume partitions, each from the given offset (records fetched while paused are lost)."""
        for (topic, partition), offset in positions:
            if offset is not None:
                self.consumer.seek(TopicPartition(topic, partition, offset))
        self.consumer.resume([TopicPartition(t, p) for (t, p), _ in positions])

    def store(self, offsets: Sequence[tuple[TP, int]]) -> None:
        """Store offsets to be committed by the next automatic commit."""
        self.consumer.store_offsets(
            offsets=[TopicPartition(t, p, offset) for (t, p), offset in offsets]
        )

    def commit_now(self, offsets: Sequence[tuple[TP, int]]) -> None:
        """Store and synchronously commit offsets (on revoke and at shutdown)."""
        if not offsets:
            return
        partitions = [TopicPartition(t, p, offset) for (t, p), offset in offsets]
        self.consumer.store_offsets(offsets=partitions)
        self.consumer.commit(offsets=partitions, asynchronous=False)

    async def close(self) -> None:
        """Leave the group (committing stored offsets) and stop the thread."""
        await self.call(self.consumer.close)
        self._executor.shutdown(wait=True)
