"""One state per assigned partition: made on assign, dropped whole on revoke (its registry
failures included), and the in-flight accounting of the work it starts.

The rebalance goes through :class:`bridge.engine.rebalance.Rebalance` and the fake consumer of
``test_engine_fakes`` (every call, callbacks included, on the consumer's own thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from bridge.core.envelope import PendingDelivery, SourceRef, parse_delivery
from bridge.core.errors import BridgeError, DecodeError, RegistryUnavailableError
from bridge.core.retry import RetryPolicy
from bridge.core.settings import Config, RetryConfig, TopicsConfig
from bridge.core.signing import message_id
from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Secret, Webhook
from bridge.engine.budget import Lanes
from bridge.engine.dispatch import Dispatcher, InFlight
from bridge.engine.intake import FETCH_CHECK_S, REGISTRY_BACKOFF_S, Intake
from bridge.engine.partition import WAITING_LIMIT, Partitions, PartitionState, RecordWork
from bridge.engine.rebalance import Rebalance
from bridge.engine.recovery import Recovery
from bridge.ops.metrics import Metrics
from tests.unit.test_engine_fakes import FakeConsumer, FakeKafka, FakeMessage, FakeProducer

SRC = ("src", 0)
RETRY = ("src.retry.1", 0)
CONFIG = Config(
    path=Path("partitions.yaml"),
    topics=TopicsConfig(source="src", retry_prefix="src.retry", parked="src.parked"),
    retry=RetryConfig(attempts=2, first_delay_ms=5, increment_ms=5),
)


def hook(name: str) -> Webhook:
    return Webhook(
        id=name,
        account="acct",
        url=f"https://{name}.example/hook",
        events=frozenset({"transaction.success"}),
        secret=Secret(b"s" * 32),
    )


def delivery(webhook_id: str, offset: int = 0) -> PendingDelivery:
    return PendingDelivery(
        webhook_id=webhook_id,
        message_id=f"msg_{webhook_id}_{offset}",
        event="transaction.success",
        transaction_id=f"tx-{offset}",
        body=b"{}",
        attempt=0,
        source=SourceRef("src", 0, offset, 0),
    )


class RegistryDown:
    """A decoder whose schema registry cannot answer."""

    def schema_id_to_fetch(self, _value: bytes) -> int | None:
        return None

    def decode(self, _value: bytes) -> dict[str, Any]:
        raise RegistryUnavailableError("registry down")


class Engine:
    """The parts between a record and its deliveries, over fakes; ``deliver`` waits for
    ``answer`` to be set."""

    def __init__(self, limit: int = 10) -> None:
        self.kafka = FakeKafka()
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.in_flight = InFlight(limit, self.metrics)
        self.lanes = Lanes(0.005, hurry=self.in_flight.at_limit)
        self.recovery = Recovery(
            FakeProducer(self.kafka),  # type: ignore[arg-type]
            RetryPolicy.from_config(CONFIG),
            self.metrics,
            CONFIG.dead_letter_topic,
        )
        self.answer = asyncio.Event()
        self.started: list[str] = []
        self.dispatcher = Dispatcher(self.in_flight, self.lanes, self.deliver, self.recovery)
        self.intake = Intake(
            Subscriptions(()),
            RegistryDown(),  # type: ignore[arg-type]
            self.dispatcher,
            self.recovery,
            self.metrics,
            RetryPolicy.from_config(CONFIG).longest_wait_ms,
        )

    async def deliver(self, one: PendingDelivery, _webhook: Webhook, work: RecordWork) -> None:
        self.started.append(one.webhook_id)
        await self.answer.wait()
        work.done()


def run(main: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(main, 5))


def test_assign_makes_a_state_and_revoke_drops_it_whole() -> None:
    """Everything a partition held (offsets, hold, pause, kept records, registry failures) is
    gone after a revoke; the revoke commits its finished prefix; the next assign starts fresh.
    The other partition is untouched."""

    async def main() -> None:
        partitions = Partitions()
        consumer = FakeConsumer(FakeKafka())
        metrics = Metrics(CollectorRegistry())
        rebalance = Rebalance(consumer, partitions, metrics)  # type: ignore[arg-type]
        try:
            await rebalance.subscribe(["src", "src.retry.1"])
            await consumer.call(consumer.fetch, 10, 0.0)  # the group assigns both
            state = partitions.get(SRC)
            other = partitions.get(RETRY)
            assert state is not None and other is not None and len(partitions) == 2
            for offset in (0, 1, 2):
                state.started(offset)
            state.finished(1)
            state.finished(0)
            state.registry_failures = 4
            state.hold(1e12)
            state.pause()
            state.next_offset = 3
            state.keep(FakeMessage("src", 3, b""))
            other.registry_failures = 2

            await consumer.call(consumer.callbacks["revoke"], consumer, [TopicPartition(*SRC)])
            assert partitions.get(SRC) is None
            assert partitions.earliest_hold() is None and partitions.paused_count() == 0
            assert partitions.get(RETRY) is other and other.registry_failures == 2
            assert consumer.stored[SRC] == 2, "the finished prefix is committed on revoke"

            consumer.assigned = False
            await consumer.call(consumer.fetch, 10, 0.0)  # assigned again
            fresh = partitions.get(SRC)
            assert fresh is not None and fresh is not state
            assert (fresh.registry_failures, fresh.hold_until, fresh.paused) == (0, None, False)
            assert (fresh.next_offset, fresh.waiting, fresh.committable) == (None, None, None)
            assert not fresh.tasks and not fresh.dirty and len(fresh.tracker) == 0
            assert consumer.calls_off_thread == 0
        finally:
            consumer.executor.shutdown(wait=True)

    run(main())


def test_registry_failures_back_off_and_a_revoke_forgets_them() -> None:
    """A source partition whose registry cannot answer is held, longer after each failure in a
    row; after a revoke and an assign the back-off starts again from its first step."""

    async def main() -> None:
        engine = Engine()
        partitions = Partitions()
        partitions.assign([SRC])
        state = partitions.get(SRC)
        assert state is not None
        for failures in range(3):
            before = time.monotonic()
            held = await engine.intake.source(FakeMessage("src", 0, b"\x00\x00"), state, 0)
            assert held is False and state.registry_failures == failures + 1
            assert state.hold_until is not None
            held_for = state.hold_until - before
            assert REGISTRY_BACKOFF_S[failures] <= held_for < REGISTRY_BACKOFF_S[failures] + 0.1
        partitions.drop([SRC])
        partitions.assign([SRC])
        fresh = partitions.get(SRC)
        assert fresh is not None and fresh.registry_failures == 0
        before = time.monotonic()
        await engine.intake.source(FakeMessage("src", 0, b"\x00\x00"), fresh, 0)
        assert fresh.registry_failures == 1
        assert fresh.hold_until is not None
        assert fresh.hold_until - before < REGISTRY_BACKOFF_S[0] + 0.1, "the first step again"

    run(main())


class SlowRegistry:
    """A decoder whose registry answers a new schema id (values starting with 0x00) only when
    ``answer`` is set, with ``error``; other values are not Avro (poison, decoded inline)."""

    def __init__(self, error: BridgeError) -> None:
        self.answer = threading.Event()
        self.error = error
        self.fetches = 0

    def schema_id_to_fetch(self, value: bytes) -> int | None:
        return 5 if value.startswith(b"\x00") else None

    def decode(self, value: bytes) -> dict[str, Any]:
        if value.startswith(b"\x00"):
            self.fetches += 1
            self.answer.wait(10)
        raise self.error if value.startswith(b"\x00") else DecodeError("corrupt", "x", raw=value)


@pytest.mark.parametrize(
    "error",
    [
        DecodeError("unknown_schema_id", "schema id 5 is not registered"),
        RegistryUnavailableError("registry down"),
    ],
)
def test_a_registry_that_does_not_answer_holds_only_the_partition_waiting_for_it(
    error: BridgeError,
) -> None:
    """A record whose writer schema must be fetched does not make the consume loop wait: its
    partition is held and looked at again every FETCH_CHECK_S while one fetch runs off the
    loop, and records of other partitions are taken meanwhile. Once the registry answers, the
    record is dead-lettered (an unknown id) or its partition backs off (the registry down)."""

    async def main() -> None:
        engine = Engine()
        registry = SlowRegistry(error)
        engine.intake.decoder = registry  # type: ignore[assignment]
        partitions = Partitions()
        partitions.assign([SRC, ("src", 1)])
        waiting, other = partitions.get(SRC), partitions.get(("src", 1))
        assert waiting is not None and other is not None
        record = FakeMessage("src", 3, b"\x00\x00\x00\x00\x05rest")
        for _ in range(3):
            before = time.monotonic()
            assert await engine.intake.source(record, waiting, 0) is False
            assert time.monotonic() - before < 0.05, "the loop did not wait for the registry"
            assert waiting.hold_until is not None
            assert waiting.hold_until - before <= FETCH_CHECK_S + 0.01
            assert waiting.registry_failures == 0
            assert await engine.intake.source(FakeMessage("src", 0, b"\x01"), other, 0) is True
        assert registry.fetches == 1, "one fetch for the record, however often it is looked at"
        registry.answer.set()
        deadline = time.monotonic() + 3
        while (taken := await engine.intake.source(record, waiting, 0)) is False:
            if waiting.registry_failures:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        if isinstance(error, RegistryUnavailableError):
            assert taken is False and waiting.registry_failures == 1
            assert waiting.hold_until is not None
            assert waiting.hold_until - time.monotonic() > REGISTRY_BACKOFF_S[0] - 0.1
        else:
            assert taken is True and waiting.registry_failures == 0
        assert registry.fetches == 1

    run(main())


def test_deliveries_are_counted_in_flight_until_their_task_is_done() -> None:
    """A record's deliveries count in flight from when they start (the dead letters of webhooks
    gone do not); the record is finished, and its offset committable, when the last settles."""

    async def main() -> None:
        engine = Engine()
        state = PartitionState(SRC)
        state.started(7)
        wanted = [hook(f"w{n}") for n in range(3)]
        gone = [("removed", "webhook_removed")]
        engine.dispatcher.dispatch(state, 7, delivery("w0", 7), wanted, gone)
        assert engine.in_flight.count == 3 and len(state.tasks) == 4
        assert engine.registry.get_sample_value("bridge_deliveries_in_flight") == 3
        await asyncio.sleep(0.01)
        assert sorted(engine.started) == ["w0", "w1", "w2"]
        assert len(state.tasks) == 3, "the dead letter was written"
        assert state.committable is None, "not finished while deliveries are out"
        engine.answer.set()
        await asyncio.sleep(0.01)
        assert engine.in_flight.count == 0 and not state.tasks
        assert engine.registry.get_sample_value("bridge_deliveries_in_flight") == 0, "read now"
        assert state.committable == 8 and state.dirty

    run(main())


def test_a_delivery_cancelled_before_it_ran_is_no_longer_counted() -> None:
    async def main() -> None:
        engine = Engine()
        state = PartitionState(SRC)
        state.started(0)
        engine.dispatcher.dispatch(state, 0, delivery("w0"), [hook("w0")], [])
        assert engine.in_flight.count == 1
        for task in list(state.tasks):
            task.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert engine.in_flight.count == 0 and not state.tasks and engine.started == []
        assert state.committable is None, "a cancelled delivery leaves its record unfinished"

    run(main())


def test_deliveries_of_a_refusing_webhook_are_parked_together_and_counted_once() -> None:
    async def main() -> None:
        engine = Engine()
        state = PartitionState(SRC)
        state.started(3)
        for name in ("stalled", "silent"):
            engine.lanes.of(hook(name)).credit = 0.0  # out of unanswered credit: refusing
        wanted = [hook("stalled"), hook("ok"), hook("silent")]
        engine.dispatcher.dispatch(state, 3, delivery("ok", 3), wanted, [])
        assert engine.in_flight.count == 2, "one delivery and one park"
        engine.answer.set()
        await asyncio.sleep(0.01)
        assert engine.started == ["ok"]
        [record] = engine.kafka.topics["src.parked"]
        parked = parse_delivery(record.headers(), record.value(), record.key())
        assert (parked.webhook_id, parked.also) == ("stalled", ("silent",))
        assert parked.message_id == message_id("tx-3", "transaction.success", "stalled")
        assert (parked.deferrals, parked.attempt) == (1, 0)
        assert engine.in_flight.count == 0 and state.committable == 4

    run(main())


def test_work_of_a_dropped_state_never_touches_the_fresh_one() -> None:
    partitions = Partitions()
    partitions.assign([SRC])
    old = partitions.get(SRC)
    assert old is not None
    old.started(5)
    work = RecordWork(old, 5, 1)
    partitions.drop([SRC])
    partitions.assign([SRC])
    fresh = partitions.get(SRC)
    assert fresh is not None
    fresh.started(4)
    fresh.started(5)
    work.done()  # a delivery of the revoked assignment settles late
    fresh.finished(4)
    assert fresh.committable == 5, "offset 5 of the fresh assignment is not finished"
    assert partitions.to_store() == [(SRC, 5)]
    assert partitions.to_store() == [], "stored once"


def test_a_held_partition_keeps_what_follows_its_head_up_to_the_limit() -> None:
    state = PartitionState(RETRY)
    assert state.admits(FakeMessage("src.retry.1", 0, b""))
    state.next_offset = 1
    state.hold(1e12)
    state.keep(FakeMessage("src.retry.1", 0, b""))
    for offset in range(1, WAITING_LIMIT + 5):
        assert not state.admits(FakeMessage("src.retry.1", offset, b""))
    assert state.waiting is not None and len(state.waiting) == WAITING_LIMIT
    assert state.next_offset == WAITING_LIMIT, "a resume seeks past what is kept"
    assert not state.admits(FakeMessage("src.retry.1", 0, b"")), "before a seek back: skipped"


def test_records_fetched_before_a_pause_took_effect_are_fetched_again() -> None:
    state = PartitionState(SRC)
    state.paused = True
    assert not state.admits(FakeMessage("src", 10, b""))
    assert not state.admits(FakeMessage("src", 11, b""))
    assert state.next_offset == 10, "the resume seeks back to the first one not taken"


def test_each_turn_looks_at_the_partitions_needing_it_and_never_at_a_dropped_one() -> None:
    partitions = Partitions()
    partitions.assign([SRC, RETRY])
    src, retry = partitions.get(SRC), partitions.get(RETRY)
    assert src is not None and retry is not None
    retry.hold(time.monotonic() - 1.0)  # its head fell due a second ago
    assert partitions.to_pause(everything=False) == [retry], "held partitions are paused"
    assert partitions.to_pause(everything=True) == [src, retry], "at shutdown, every one"
    retry.pause()
    assert partitions.to_resume() == [], "paused while held"
    partitions.expire_holds(time.monotonic())
    assert retry.hold_until is None and partitions.to_resume() == [retry]
    retry.paused = False
    assert partitions.paused_count() == 0 and partitions.to_store() == []

    src.started(0)
    src.finished(0)
    src.hold(time.monotonic() + 30)
    assert partitions.earliest_hold() == src.hold_until
    partitions.drop([SRC])
    assert partitions.to_store() == [] and partitions.earliest_hold() is None
    assert partitions.to_pause(everything=True) == [retry]
