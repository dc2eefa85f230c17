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

Taking records is work on the event loop that every tenant's deliveries share: a batch of 500
(a backlog, or the retries of a rung falling due together) costs tens of milliseconds to decode,
match and dispatch. It is taken in slices of at most ``BATCH_SLICE_S`` (give or take one
record), each followed by a wait of 1 ms (:mod:`bridge.core.slices`), so the answers and
deliveries ready meanwhile are not held behind the rest of the batch. A wait, not only a turn of
the loop: between slices that only turned it, the threads that need the interpreter's lock (the
producer's, handing over the acknowledgements that finish retries and parks; the log writer;
registry lookups) got it only once the whole batch was taken. A stop stops the taking: what was
not taken is not marked, and is delivered by whoever consumes the partition next.

This module only orchestrates the parts: :mod:`~bridge.engine.partition` (the state of each
assigned partition), :mod:`~bridge.engine.rebalance` (partitions coming and going),
:mod:`~bridge.engine.intake` (what a consumed record becomes), :mod:`~bridge.engine.dispatch`
(starting deliveries within the in-flight limit), :mod:`~bridge.engine.budget` (per-webhook
lanes), :mod:`~bridge.engine.attempt` (one delivery attempt and its consequence) and
:mod:`~bridge.engine.recovery` (writes to the bridge's own topics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from operator import attrgetter
from typing import Any

from confluent_kafka import KafkaError, Message

from bridge.codec.decoding import Decoder
from bridge.core.retry import RetryPolicy
from bridge.core.settings import Config
from bridge.core.slices import SLICE_S, Slices
from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Webhook
from bridge.engine.attempt import Deliverer
from bridge.engine.budget import Lanes
from bridge.engine.clock import now_ms
from bridge.engine.dispatch import Dispatcher, InFlight
from bridge.engine.intake import Intake
from bridge.engine.partition import Partitions, committable
from bridge.engine.rebalance import Rebalance
from bridge.engine.recovery import Recovery
from bridge.http.sender import HttpSender
from bridge.kafka.consumer import ThreadedConsumer
from bridge.kafka.producer import DurableProducer
from bridge.ops.metrics import Metrics
from bridge.ops.status import STATUS_LIMIT, bounded

log = logging.getLogger("bridge.engine.pipeline")

FETCH_BATCH = 500
BATCH_SLICE_S = SLICE_S  # the longest the taking of a batch holds the loop before a wait
IDLE_POLL_S = 0.05
HAND_OFF_SHARE = 0.3  # of the shutdown grace kept for handing off, committing and closing


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
        self.consumer = consumer
        self.metrics = metrics
        self.policy = RetryPolicy.from_config(config)
        self.source_topic = config.topics.source
        self.partitions = Partitions()
        metrics.commit_ages.ages = self.partitions.commit_ages
        metrics.name_rungs(self.policy.delay_topics, self.policy.parked_topic)
        self.rebalance = Rebalance(consumer, self.partitions, metrics)
        self.in_flight = InFlight(config.delivery.max_in_flight, metrics)
        self.lanes = Lanes(config.retry.first_delay_ms / 1000, hurry=self.in_flight.at_limit)
        self.recovery = Recovery(producer, self.policy, metrics, config.dead_letter_topic)
        self.deliverer = Deliverer(
            sender,
            self.lanes,
            self.recovery,
            self.policy,
            metrics,
            subscriptions=lambda: self.intake.subscriptions,
        )
        self.dispatcher = Dispatcher(
            self.in_flight, self.lanes, self.deliverer.deliver, self.recovery
        )
        self.intake = Intake(
            Subscriptions(config.webhooks),
            decoder,
            self.dispatcher,
            self.recovery,
            metrics,
            self.policy.longest_wait_ms,
        )
        self.carry: deque[Message] = deque()  # fetched records whose fan-out did not fit yet
        self.stopping = False
        self.last_message = float("-inf")  # monotonic time of the last record fetched
        self.last_loop = time.monotonic()

    # ---- configuration and status ------------------------------------------------------------

    def apply_config(self, config: Config, changed: Sequence[Webhook] | None = None) -> None:
        """Swap in a new webhook set: new deliveries use it, deliveries in flight keep theirs.

        Cheap at 10,000 webhooks (it runs on the event loop): the index is updated for the
        webhooks that changed (``changed``, when the reload knows them: see
        :meth:`Subscriptions.updated`), not rebuilt, and only the lanes that exist are
        visited."""
        self.config = config
        subscriptions = self.intake.subscriptions.updated(config.webhooks, changed)
        self.intake.subscriptions = subscriptions
        moved = self.lanes.reconfigure(self.intake.subscriptions)
        self._register_webhooks()
        if moved:
            self.metrics.forget_webhooks(moved)

    def status(self, limit: int = STATUS_LIMIT) -> dict[str, Any]:
        """Per-webhook detail and totals for the operator's ``/status`` (ids only: never a URL or
        a secret). Lists each webhook failing now, stalled, out of unanswered credit, or with
        deliveries active or waiting for a slot, never the idle ones: the most pressing first,
        at most ``limit``, saying how many were left out (:func:`bridge.ops.status.bounded`)."""
        failing = self.metrics.webhooks.failing
        body = bounded(self.lanes.needing_attention(failing), limit)
        body["totals"] = {
            "in_flight": self.in_flight.count,
            "max_in_flight": self.in_flight.limit,
            "backpressure": self.in_flight.backpressure,
            "paused_partitions": self.partitions.paused_count(),
            "assigned_partitions": len(self.partitions),
            "webhooks_configured": len(self.intake.subscriptions),
            "webhooks_failing": len(failing),
        }
        body["time"] = round(time.time(), 3)
        return body

    def _register_webhooks(self) -> None:
        webhooks = self.config.webhooks  # (passes in C: 10,000 of them, on the event loop)
        self.metrics.webhooks_configured.set(sum(map(attrgetter("enabled"), webhooks)))
        self.metrics.register_webhooks(map(attrgetter("id"), webhooks), self.policy.attempts)

    # ---- the consume loop --------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Every topic the bridge consumes: the source, each rung of the ladder, the parking lot."""
        return [self.source_topic, *self.policy.delay_topics, self.policy.parked_topic]

    async def run(self) -> None:
        """Consume and dispatch until ``stopping`` is set (then :meth:`drain` finishes the work)."""
        self._register_webhooks()
        await self.rebalance.subscribe(self.topics())
        consumer = self.consumer  # every call on it runs on its own thread (consumer.call)
        while not self.stopping:
            self.last_loop = time.monotonic()
            room = self.in_flight.room()
            if room == 0:
                self.lanes.shed_waiters()
                await self.in_flight.wait_for_room()
                room = self.in_flight.room()
            if self.carry:  # records already in hand come first; nothing new is fetched meanwhile
                if room:  # (without room, the turn has just waited for it)
                    carried, self.carry = list(self.carry), deque()
                    await self._handle(carried)
                    if self.carry:  # the head's fan-out does not fit yet: wait for deliveries
                        await self.in_flight.wait_for_room()
                await self._flow_control()
                continue
            # Even at the limit a turn polls (for one record), so rebalances and the group's
            # liveness are served; at most four such turns a second.
            messages = await consumer.call(
                consumer.fetch,
                min(FETCH_BATCH, max(1, room)),
                self._poll_timeout(),
                self.partitions.to_store(),
            )
            if messages:
                await self._handle(messages)
            await self._flow_control()

    def _poll_timeout(self) -> float:
        earliest = self.partitions.earliest_hold()
        if earliest is None:
            return IDLE_POLL_S
        return max(0.0, min(IDLE_POLL_S, earliest - time.monotonic()))

    async def _handle(self, messages: list[Message]) -> None:
        wall_ms = now_ms()
        self.last_message = time.monotonic()
        slices = Slices(slice_s=BATCH_SLICE_S)
        for index, msg in enumerate(messages):
            if index and await slices.after_piece():
                wall_ms = now_ms()
            if self.stopping:  # (during a wait, or the fetch): the rest is not taken
                return
            error = msg.error()
            if error is not None:
                self._kafka_error(error)
                continue
            partition = self.partitions.get((msg.topic(), msg.partition()))
            if partition is None or not partition.admits(msg):
                continue  # no longer assigned, or kept or fetched again later (see admits)
            if partition.tp[0] == self.source_topic:
                accepted = await self.intake.source(msg, partition, wall_ms)
                if accepted is None:  # its fan-out does not fit now: it and what follows wait
                    self.carry.extend(messages[index:])
                    return
            else:
                accepted = self.intake.retry(msg, partition, wall_ms)
                if accepted is None:  # its deliveries do not fit now: it and what follows wait
                    self.carry.extend(messages[index:])
                    return
                if not accepted:  # not due: keep it (and what follows) rather than fetch again
                    partition.keep(msg)
                    accepted = True
            partition.next_offset = msg.offset() + 1 if accepted else msg.offset()

    def _kafka_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        log.warning("kafka.error", extra={"fields": {"error": error.str(), "code": error.code()}})

    # ---- flow control ------------------------------------------------------------------------

    async def _flow_control(self) -> None:
        """Pause the held partitions (at shutdown: all), let expired holds go, take kept records
        that fell due, and resume, each at its next record, the partitions no longer held."""
        everything = self.stopping
        to_pause = self.partitions.to_pause(everything)
        if to_pause:
            await self.consumer.call(self.consumer.pause, [p.tp for p in to_pause])
            for partition in to_pause:
                partition.pause()
        self.partitions.expire_holds(time.monotonic())
        to_resume = []
        if not everything:
            await self._take_waiting()
            if not self.stopping:  # (a stop may come while the kept records are taken)
                to_resume = self.partitions.to_resume()
        if to_resume:
            positions = [(p.tp, p.next_offset) for p in to_resume]
            await self.consumer.call(self.consumer.resume_at, positions)
            for partition in to_resume:
                partition.paused = False
        if to_pause or to_resume:
            self.metrics.paused_partitions.set(self.partitions.paused_count())

    async def _take_waiting(self) -> None:
        """Take the kept records of partitions whose hold expired, in order, until one is not
        due yet (which holds the partition again). A partition resumes, after what it kept, only
        once all of it was taken: a retry falling due costs no pause, seek and fetch of its own.
        Taken in slices like a batch (a rung's retries fall due together); a stop stops it."""
        wall_ms = now_ms()
        slices = Slices(slice_s=BATCH_SLICE_S)
        for partition in self.partitions.keeping():
            waiting = partition.waiting
            while waiting and not self.stopping:  # (stopped: the rest stays kept)
                if not self.intake.retry(waiting[0], partition, wall_ms):  # not due, or no room
                    break
                waiting.popleft()
                if await slices.after_piece():
                    wall_ms = now_ms()
            if not waiting:
                partition.waiting = None
            if self.stopping:
                return

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
        pending = self.partitions.tasks()
        if pending:
            _done, still = await asyncio.wait(
                pending, timeout=max(0.0, deadline - reserve - loop.time())
            )
            if still:
                self.deliverer.handing_off = True
                for task in still:
                    task.cancel()
                await asyncio.wait(still, timeout=max(0.0, deadline - reserve / 2 - loop.time()))
        offsets = committable(self.partitions)
        if offsets:
            await run_until(self.consumer.call(self.consumer.commit_now, offsets), deadline)
        return sum(not task.done() for task in self.partitions.tasks())


async def run_until(step: Coroutine[Any, Any, Any], deadline: float) -> bool:
    """Run ``step`` until ``deadline`` (event-loop time); False if it was cut short."""
    try:
        await asyncio.wait_for(step, max(0.0, deadline - asyncio.get_running_loop().time()))
    except TimeoutError:
        return False
    return True
