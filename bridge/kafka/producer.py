"""Writes to the bridge's own topics (delay rungs and dead letters), awaited until acknowledged.

confluent-kafka's threaded ``Producer`` (the asyncio producer does not take headers): ``produce``
is called from the event loop, delivery reports are served by a polling thread and resolve an
asyncio future. Idempotent, ``acks=all``: an awaited ``send`` means the record is durable.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.core.envelope import Headers


class ProduceError(Exception):
    """The broker did not acknowledge a record; the caller tries again."""


SETTLE_BATCH = 50


class DurableProducer:
    """An idempotent producer whose ``send`` completes when the broker has the record."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._producer = Producer(
            {
                **settings,
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
            self._producer.poll(0.05)
            self._hand_over()

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
        """Produce one record and wait until the broker acknowledges it (else ProduceError)."""
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
                raise ProduceError(str(exc)) from exc
        await future

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
            future.set_exception(ProduceError(str(err)))
    if len(reports) > SETTLE_BATCH:
        asyncio.get_running_loop().call_soon(_settle_all, reports[SETTLE_BATCH:])
