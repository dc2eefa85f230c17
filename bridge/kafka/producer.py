"""Writes to the bridge's own topics (delay rungs and dead letters), awaited until acknowledged.

confluent-kafka's threaded ``Producer`` (the asyncio producer does not take headers): ``produce``
is called from the event loop, delivery reports are served by a polling thread and resolve an
asyncio future. Idempotent, ``acks=all``: an awaited ``send`` means the record is durable.

A *fatal* error (librdkafka's word: the cluster refused the idempotent producer its id, say,
because the bridge's principal may not write) leaves the producer unable to write ever again.
The polling thread survives it (and anything else a poll raises), every ``send`` from then on
fails at once with :class:`ProducerFailedError`, and ``on_fatal`` is told, once: the bridge
ends, leaving what it could not write uncommitted for the next consumer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.core.envelope import Headers

log = logging.getLogger(__name__)


class ProduceError(Exception):
    """The broker did not acknowledge a record; the caller tries again."""


class ProducerFailedError(ProduceError):
    """The producer had a fatal error and can never write again (``error`` says which)."""

    def __init__(self, error: KafkaError) -> None:
        self.error = error
        super().__init__(f"the producer failed for good: {error.str()}")


class RecordTooLargeError(ProduceError):
    """The record is larger than the client (``message.max.bytes``) or the topic
    (``max.message.bytes``) takes: writing it again cannot succeed, so it is not tried again."""


def _refusal(error: KafkaError) -> ProduceError:
    """The error a refused write raises: :class:`RecordTooLargeError` for the size, which no
    retry changes; :class:`ProduceError` (try again) for anything else."""
    if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return RecordTooLargeError(str(error))
    return ProduceError(str(error))


SETTLE_BATCH = 50


class DurableProducer:
    """An idempotent producer whose ``send`` completes when the broker has the record."""

    def __init__(
        self,
        settings: dict[str, Any],
        on_fatal: Callable[[KafkaError], None] | None = None,
    ) -> None:
        self._on_fatal = on_fatal
        self.fatal: KafkaError | None = None  # set once, on the polling thread
        self._forward_error: Callable[[KafkaError], None] | None = settings.get("error_cb")
        self._producer = Producer(
            {
                **settings,
                "error_cb": self._producer_error,
                "acks": "all",
                "enable.idempotence": True,
                # Nothing written here is urgent (a retry's due time is set before it is
                # written), and a stalled webhook's deliveries are parked hundreds a second:
                # batching them 20 ms at a time spares the broker a request per record.
                "linger.ms": 20,
                "delivery.timeout.ms": 30000,
                "compression.type": "lz4",
            }
        )
        self._reports: deque[tuple[asyncio.Future[None], KafkaError | None]] = deque()
        self._running = True
        self._thread = threading.Thread(target=self._serve, name="kafka-producer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while self._running:
            try:
                self._turn()
            except Exception as exc:  # the reports must still be served: nothing ends the thread
                log.error(
                    "producer.poll_failed",
                    extra={"fields": {"error": type(exc).__name__, "detail": str(exc)[:300]}},
                )

    def _turn(self) -> None:
        """One poll (serving delivery reports and ``error_cb``), then hand the reports over."""
        try:
            self._producer.poll(0.05)
        except KafkaException as exc:  # librdkafka may raise its fatal error from poll
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError):
                raise
            self._failed(error)
        finally:
            self._hand_over()

    def _producer_error(self, error: KafkaError) -> None:
        """``error_cb``: a fatal error may be reported here rather than raised from poll."""
        try:
            if error.fatal():
                self._failed(error)
        finally:
            if self._forward_error is not None:
                self._forward_error(error)

    def _failed(self, error: KafkaError) -> None:
        """A poll raised ``error`` (or reported it): fatal ones end the producer's writing for
        good."""
        if not error.fatal():
            log.warning("producer.poll_error", extra={"fields": {"error": error.str()}})
            return
        if self.fatal is None:
            self.fatal = error
            if self._on_fatal is not None:
                self._on_fatal(error)

    def _hand_over(self) -> None:
        """Settle the delivery reports gathered by the last poll: one wake-up of the event loop
        for all of them, not one each."""
        reports = []
        while self._reports:
            reports.append(self._reports.popleft())
        if reports:
            reports[0][0].get_loop().call_soon_threadsafe(_settle_all, reports)

    async def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: Headers
    ) -> None:
        """Produce one record and wait until the broker acknowledges it (else ProduceError;
        ProducerFailedError at once when the producer had a fatal error)."""
        if self.fatal is not None:
            raise ProducerFailedError(self.fatal)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            self._reports.append((future, err))  # on the polling (or flushing) thread

        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=on_delivery
                )
                break
            except BufferError:  # local queue full: let the polling thread drain it
                await asyncio.sleep(0.01)
            except KafkaException as exc:
                error = exc.args[0]
                if self.fatal is not None or error.code() == KafkaError._FATAL:
                    raise ProducerFailedError(self.fatal or error) from exc
                raise _refusal(error) from exc
        try:
            await future
        except ProduceError:
            # (reported, so on_delivery is done with it: the error's traceback holds this frame,
            # the frame the future, the future the error: a cycle, cut here as in HttpClient.post)
            future = None  # type: ignore[assignment]
            raise

    def flush(self, timeout: float) -> int:
        """Wait for outstanding records; returns how many are still undelivered."""
        return int(self._producer.flush(timeout))

    def close(self, timeout: float = 10.0) -> int:
        """Flush and stop the polling thread; returns how many records were left undelivered."""
        left = self.flush(timeout)
        self._running = False
        self._thread.join()
        self._hand_over()
        return left


def _settle_all(reports: list[tuple[asyncio.Future[None], KafkaError | None]]) -> None:
    """Settle reports, a batch per turn of the event loop: a burst of thousands of
    acknowledgements then does not hold up the deliveries being answered meanwhile."""
    for future, err in reports[:SETTLE_BATCH]:
        if future.done():
            continue
        if err is None:
            future.set_result(None)
        else:
            future.set_exception(_refusal(err))
    if len(reports) > SETTLE_BATCH:
        asyncio.get_running_loop().call_soon(_settle_all, reports[SETTLE_BATCH:])
