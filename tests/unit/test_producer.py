"""The durable producer's polling thread survives what a poll raises; a fatal error ends its
writing for good, said once, and every ``send`` after it fails at once (no broker: the inner
librdkafka producer is swapped for a stand-in whose ``poll`` raises)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from bridge.kafka.producer import (
    DurableProducer,
    ProduceError,
    ProducerFailedError,
    RecordTooLargeError,
    _settle_all,
)
from bridge.kafka.security import ACL_HINT, RESTART_HINT, producer_failure
from tests.cycles import bridge_cycles
from tests.kafka_helpers import wait_for

NOWHERE = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}  # never connects in time


class Raising:
    """Stands in for librdkafka's producer: each poll raises the next of ``raises`` (then
    returns), produce raises like a producer after a fatal error."""

    def __init__(self, *raises: BaseException) -> None:
        self.raises = list(raises)
        self.polls = 0
        self.produced = 0
        self.lock = threading.Lock()

    def poll(self, _timeout: float) -> int:
        with self.lock:
            self.polls += 1
            if self.raises:
                raise self.raises.pop(0)
        return 0

    def produce(self, *_args: Any, **_kwargs: Any) -> None:
        self.produced += 1
        raise KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce message"))

    def flush(self, _timeout: float) -> int:
        return 0


def fatal(code: int = KafkaError.CLUSTER_AUTHORIZATION_FAILED) -> KafkaException:
    return KafkaException(KafkaError(code, "Failed to acquire idempotence PID", fatal=True))


def swapped(stand_in: Raising, told: list[KafkaError]) -> DurableProducer:
    producer = DurableProducer(NOWHERE, on_fatal=told.append)
    producer._producer = stand_in  # type: ignore[assignment]  # the thread reads it each turn
    return producer


def test_a_fatal_error_is_told_once_and_every_send_then_fails_at_once() -> None:
    told: list[KafkaError] = []
    stand_in = Raising(fatal(), fatal())
    producer = swapped(stand_in, told)
    try:
        wait_for(lambda: stand_in.polls > 5, 10, message="the thread to poll on after the errors")
        assert [error.code() for error in told] == [KafkaError.CLUSTER_AUTHORIZATION_FAILED]
        assert producer.fatal is told[0]
        with pytest.raises(ProducerFailedError, match="Failed to acquire idempotence PID"):
            asyncio.run(producer.send("topic", b"v", b"k", []))
        assert stand_in.produced == 0, "nothing is handed to a producer that cannot write"
    finally:
        assert producer.close(1) == 0


def test_a_fatal_error_met_first_by_produce_fails_that_send_as_fatal() -> None:
    """librdkafka can refuse a produce before the polling thread has heard of the error."""
    told: list[KafkaError] = []
    stand_in = Raising()
    producer = swapped(stand_in, told)
    try:
        with pytest.raises(ProducerFailedError):
            asyncio.run(producer.send("topic", b"v", None, []))
        assert stand_in.produced == 1
    finally:
        producer.close(1)


@pytest.mark.parametrize(
    "raised",
    [
        RuntimeError("a delivery callback raised"),
        KafkaException(KafkaError(KafkaError._TRANSPORT, "not fatal")),
        KafkaException("a text, not a KafkaError"),
        KafkaException(),
        ValueError("anything else"),
    ],
)
def test_the_polling_thread_survives_anything_a_poll_raises(raised: BaseException) -> None:
    told: list[KafkaError] = []
    stand_in = Raising(raised, raised)
    producer = swapped(stand_in, told)
    try:
        wait_for(lambda: stand_in.polls > 5, 10, message="the thread to poll on after the errors")
        assert told == [] and producer.fatal is None
    finally:
        producer.close(1)


def test_a_failing_on_fatal_ends_neither_the_thread_nor_the_forwarding() -> None:
    """``on_fatal`` raising (the event loop already closed, say) is logged: the polling thread
    serves on, and ``error_cb``'s caller still hears of the error."""

    def closed(_error: KafkaError) -> None:
        raise RuntimeError("Event loop is closed")

    polled = DurableProducer(NOWHERE, on_fatal=closed)
    stand_in = Raising(fatal())
    polled._producer = stand_in  # type: ignore[assignment]
    forwarded: list[KafkaError] = []
    reported = DurableProducer({**NOWHERE, "error_cb": forwarded.append}, on_fatal=closed)
    try:
        wait_for(lambda: stand_in.polls > 5, 10, message="the thread to poll on after it")
        assert polled.fatal is not None
        error = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence", fatal=True)
        with pytest.raises(RuntimeError):
            reported._producer_error(error)  # (on the thread, the turn's handler logs it)
        assert error in forwarded
    finally:
        polled.close(1)
        reported.close(1)


def test_a_fatal_error_reported_to_error_cb_counts_too() -> None:
    """confluent-kafka may hand a fatal error to ``error_cb`` rather than raise it from poll:
    the producer's own ``error_cb`` notes it, then calls the one it was given."""
    told: list[KafkaError] = []
    forwarded: list[KafkaError] = []
    producer = DurableProducer({**NOWHERE, "error_cb": forwarded.append}, on_fatal=told.append)
    try:
        error = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence", fatal=True)
        producer._producer_error(error)
        producer._producer_error(error)
        assert told == [error]
        assert [e for e in forwarded if e.fatal()] == [error, error]  # (and the real ones)
    finally:
        producer.close(1)


def test_the_failure_names_what_to_grant_or_says_to_restart() -> None:
    refused = producer_failure(
        "kafka:9094",
        KafkaError(
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            "Failed to acquire idempotence PID from broker sasl_ssl://kafka:9094/1: "
            "Broker: Cluster authorization failed",
            fatal=True,
        ),
    )
    assert str(refused).startswith("Kafka at kafka:9094: not authorized to write the bridge's ")
    assert "Cluster authorization failed" in str(refused)
    assert refused.hint == ACL_HINT
    other = producer_failure(
        "kafka:9094", KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "seq", fatal=True)
    )
    assert str(other) == "Kafka at kafka:9094: the producer failed for good; librdkafka said: seq"
    assert other.hint == RESTART_HINT


def test_a_write_after_the_producer_failed_waits_to_be_cancelled_without_a_warning_per_try(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Recovery does not spin or flood the log on a producer that can never write: the bridge
    is ending (said once, as kafka.producer_failed) and cancels the wait."""
    from prometheus_client import CollectorRegistry

    from bridge.core.retry import RetryPolicy
    from bridge.engine.recovery import Recovery
    from bridge.ops.metrics import Metrics
    from tests.unit.test_partition_state import CONFIG

    class Failed:
        sends = 0

        async def send(self, *_args: Any) -> None:
            Failed.sends += 1
            raise ProducerFailedError(KafkaError(KafkaError._FATAL, "fatal", fatal=True))

    registry = CollectorRegistry()
    recovery = Recovery(
        Failed(),  # type: ignore[arg-type]
        RetryPolicy.from_config(CONFIG),
        Metrics(registry),
        CONFIG.dead_letter_topic,
    )

    async def scenario() -> None:
        task = asyncio.create_task(recovery.produce("t.retry.1", b"v", b"k", [], "retry"))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert Failed.sends == 1
    assert not [r for r in caplog.records if r.getMessage() == "produce.failed"]
    assert registry.get_sample_value("bridge_produce_failures_total", {"kind": "retry"}) in (
        None,
        0.0,
    )


class Refusing:
    """Stands in for librdkafka's producer: every record is reported failed at the next poll,
    as a broker that never acknowledges makes librdkafka do (``message.timeout.ms``)."""

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.lock = threading.Lock()

    def produce(self, *_args: Any, on_delivery: Any = None, **_kwargs: Any) -> None:
        with self.lock:
            self.pending.append(on_delivery)

    def poll(self, timeout: float) -> int:
        with self.lock:
            pending, self.pending = self.pending, []
        for report in pending:
            report(KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out"), None)
        if not pending:
            time.sleep(min(timeout, 0.005))
        return len(pending)

    def flush(self, _timeout: float) -> int:
        return 0


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_failed_write_leaves_nothing_for_the_cyclic_collector(event_loop: str) -> None:
    """A write the broker never acknowledged fails its ``send`` without leaving a reference
    cycle (the error's traceback holds the frame that holds the future that holds the error):
    during a broker outage every delivery handed to a delay topic fails so, and the bridge
    collects its oldest generation rarely (bridge.ops.collector)."""
    import uvloop

    producer = swapped(Refusing(), [])  # type: ignore[arg-type]

    async def scenario() -> None:
        async def write() -> str:
            try:
                await producer.send("topic", b"x" * 1024, b"key", [("h", b"v")])
            except ProduceError as exc:
                return type(exc).__name__
            return "acknowledged"

        assert await write() == "ProduceError"
        with bridge_cycles() as left:
            outcomes = set(await asyncio.gather(*(write() for _ in range(20))))
        assert outcomes == {"ProduceError"}
        assert left == [], "\n".join(left)

    try:
        (uvloop.run if event_loop == "uvloop" else asyncio.run)(scenario())
    finally:
        producer.close(1.0)


def test_a_record_too_large_for_the_client_is_refused_for_good_at_once() -> None:
    """librdkafka refuses a record over ``message.max.bytes`` (1,000,000 by default) when it is
    produced: :class:`RecordTooLargeError`, which the engine does not try again (tried again, it
    held its partition's commit for good). A record within the limit is only queued."""
    producer = DurableProducer(NOWHERE)
    try:

        async def send(size: int) -> None:
            await asyncio.wait_for(producer.send("topic", b"x" * size, None, [("h", b"v")]), 0.5)

        with pytest.raises(RecordTooLargeError, match="MSG_SIZE_TOO_LARGE"):
            asyncio.run(send(1_000_001))
        with pytest.raises(TimeoutError):  # queued (no broker answers): not refused
            asyncio.run(send(10_000))
    finally:
        producer.close(0.1)


@pytest.mark.parametrize(
    ("code", "refusal"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, RecordTooLargeError),
        (KafkaError.NOT_ENOUGH_REPLICAS, ProduceError),
        (KafkaError._MSG_TIMED_OUT, ProduceError),
    ],
)
def test_a_broker_refusing_a_record_for_its_size_is_told_apart(
    code: int, refusal: type[ProduceError]
) -> None:
    """A topic whose ``max.message.bytes`` is smaller than the client's refuses the record in
    its delivery report: the same :class:`RecordTooLargeError`; any other refusal is a
    :class:`ProduceError` (tried again)."""

    async def report() -> BaseException | None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        _settle_all([(future, KafkaError(code, "refused"))])
        return future.exception()

    error = asyncio.run(report())
    assert type(error) is refusal
