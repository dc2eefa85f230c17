"""The group's rebalances: partitions coming to this instance and leaving it.

The consumer runs its rebalance callbacks on its own thread, inside ``fetch``
(:mod:`bridge.kafka.consumer`); each hands its work to the event loop and waits for it. An assigned
partition gets a fresh :class:`~bridge.engine.partition.PartitionState`. A revoked one has its
deliveries waited for (at most :data:`REVOKE_DRAIN_S`), what is left cancelled (delivered again by
the next owner: at least once), the offset of its finished records committed, and its state
dropped whole; a lost one (the group has already moved on) is abandoned at once, committing
nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from confluent_kafka import TopicPartition

from bridge.engine.partition import Partitions, committable
from bridge.kafka.consumer import TP, ThreadedConsumer
from bridge.ops.metrics import Metrics

log = logging.getLogger("bridge.engine.pipeline")  # the logger its events always had

REVOKE_DRAIN_S = 10.0


class Rebalance:
    """Subscribes the consumer and keeps :class:`Partitions` in step with its assignment."""

    def __init__(
        self, consumer: ThreadedConsumer, partitions: Partitions, metrics: Metrics
    ) -> None:
        self.consumer = consumer
        self.partitions = partitions
        self.metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None

    async def subscribe(self, topics: Sequence[str]) -> None:
        """Subscribe to ``topics`` (on the consumer's thread, like every call on it)."""
        self._loop = asyncio.get_running_loop()
        consumer = self.consumer
        await consumer.call(
            consumer.subscribe, topics, self._on_assign, self._on_revoke, self._on_lost
        )

    # ---- the callbacks (called on the consumer's thread, inside fetch) ------------------------

    def _run_on_loop(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._run_on_loop(self._assigned([(p.topic, p.partition) for p in partitions]))

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        offsets = self._run_on_loop(self._released(tps, drain=True))
        try:  # already on the consumer's thread: called directly
            self.consumer.commit_now(offsets)
        except Exception as exc:  # the group may already be gone; the next owner redoes the work
            log.warning("commit.failed", extra={"fields": {"error": str(exc)}})

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._run_on_loop(self._released([(p.topic, p.partition) for p in partitions], drain=False))

    # ---- their work (on the event loop) -------------------------------------------------------

    async def _assigned(self, tps: list[TP]) -> None:
        self.partitions.assign(tps)
        self.metrics.assigned_partitions.set(len(self.partitions))
        log.info("partitions.assigned", extra={"fields": {"partitions": _names(tps)}})

    async def _released(self, tps: list[TP], drain: bool) -> list[tuple[TP, int]]:
        """Finish (revoke) or abandon (lost) the work of partitions leaving this instance."""
        tasks = [task for state in self.partitions.select(tps) for task in state.tasks]
        if drain and tasks:
            await asyncio.wait(tasks, timeout=REVOKE_DRAIN_S)
        for task in tasks:
            task.cancel()
        dropped = self.partitions.drop(tps)
        for tp in tps:
            self.metrics.forget_partition(*tp)
        self.metrics.assigned_partitions.set(len(self.partitions))
        self.metrics.paused_partitions.set(self.partitions.paused_count())
        log.info(
            "partitions.revoked" if drain else "partitions.lost",
            extra={
                "fields": {"partitions": _names(tps), "abandoned": sum(not t.done() for t in tasks)}
            },
        )
        return committable(dropped) if drain else []


def _names(tps: Iterable[TP]) -> str:
    return ",".join(f"{topic}/{partition}" for topic, partition in sorted(tps))
