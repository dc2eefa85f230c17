"""Dead-letter tooling over letters that are not what the bridge writes: ``dlq list`` shows
them, ``dlq replay`` skips each one it cannot read and still sends every other (the real broker
runs the whole path in tests/integration/test_operations.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from bridge.core.envelope import (
    PendingDelivery,
    SourceRef,
    dead_letter_headers,
    header_map,
    poison_headers,
)
from bridge.core.settings import Config, TopicsConfig
from bridge.ops import dlq
from bridge.ops.dlq import DeadLetter, Selection

DELIVERY = PendingDelivery(
    webhook_id="shop",
    message_id="msg_1",
    event="transaction.failed",
    transaction_id="tx-1",
    body=b"{}",
    attempt=3,
    source=SourceRef("tx", 0, 1, 1_700_000_000_000),
)


def letter(
    offset: int, headers: list[tuple[str, bytes]], value: bytes | None = b"{}"
) -> DeadLetter:
    return DeadLetter(0, offset, None, value, header_map(headers), headers)


def good(offset: int) -> DeadLetter:
    return letter(offset, dead_letter_headers(DELIVERY, "retries_exhausted", 4, 1_700_000_001_000))


def with_header(offset: int, name: str, value: bytes) -> DeadLetter:
    headers = dead_letter_headers(DELIVERY, "retries_exhausted", 4, 1_700_000_001_000)
    return letter(offset, [(k, value if k == name else v) for k, v in headers])


@pytest.mark.parametrize("written", ["²", "abc", "-5", "9" * 5000, ""])
def test_a_letter_with_a_malformed_time_is_listed_without_an_age_and_matches_no_time_filter(
    written: str,
) -> None:
    bad = with_header(7, "bridge-dead-lettered-ms", written.encode())
    assert bad.dead_lettered_ms is None
    assert bad.row(1_700_000_100_000)[0] == "0/7" and bad.row(1_700_000_100_000)[-1] == "-"
    assert Selection().matches(bad) and Selection(reason="retries_exhausted").matches(bad)
    assert not Selection(since_ms=0).matches(bad) and not Selection(until_ms=2**62).matches(bad)
    assert good(1).row(1_700_000_061_000)[-1] == "1m"


class FakeProducer:
    """Records what is produced and whether it was flushed; refuses records for ``refused``."""

    instances: ClassVar[list[FakeProducer]] = []

    def __init__(self, _settings: dict[str, Any]) -> None:
        self.produced: list[tuple[str, bytes | None]] = []
        self.flushed = False
        self.callbacks: list[Any] = []
        FakeProducer.instances.append(self)

    def produce(self, topic: str, value: bytes | None = None, **kwargs: Any) -> None:
        if value == b"too large":
            raise BufferError("Local: Message size too large")
        self.produced.append((topic, value))
        self.callbacks.append(kwargs["on_delivery"])

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        for callback in self.callbacks:
            callback(None, None)
        self.callbacks.clear()
        self.flushed = True
        return 0


def test_replay_skips_each_letter_it_cannot_read_and_sends_every_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Good letters around bad ones (a malformed number, a missing header, no body, a record
    the producer refuses): every good one is sent and acknowledged (the queue is flushed
    whatever happened), and the error names how many were not replayed and the first's place."""
    monkeypatch.setattr(dlq, "Producer", FakeProducer)
    FakeProducer.instances.clear()
    no_webhook = [
        (k, v) for k, v in dead_letter_headers(DELIVERY, "r", 1, 1) if k != "bridge-webhook"
    ]
    poison = poison_headers(SourceRef("tx", 0, 9, 1), "corrupt", "x", 1)
    letters = [
        good(0),
        with_header(1, "bridge-attempt", "²".encode()),
        good(2),
        letter(3, no_webhook),
        letter(4, dead_letter_headers(DELIVERY, "r", 1, 1), value=None),
        letter(5, dead_letter_headers(DELIVERY, "r", 1, 1), value=b"too large"),
        letter(6, poison, value=b"\x00raw"),
        good(7),
    ]
    config = Config(path=Path("x.yaml"), topics=TopicsConfig(source="tx"))
    with pytest.raises(
        RuntimeError, match=r"^4 dead letter\(s\) not replayed: 0/1: header 'bridge-attempt'"
    ):
        dlq.replay(config, letters)
    (producer,) = FakeProducer.instances
    assert producer.flushed
    assert [topic for topic, _value in producer.produced] == [
        config.delay_topics[0],
        config.delay_topics[0],
        "tx",
        config.delay_topics[0],
    ]


@pytest.mark.parametrize("kind", ["delivery", "poison"])
def test_a_letter_whose_value_was_not_kept_is_listed_as_such_and_not_replayed(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A dead letter written without its value (too large for the topic) says so in the list,
    and replay skips it naming where the source record is: replayed, a delivery would have had
    no body and a poison record would have gone back to the source topic as a null value."""
    monkeypatch.setattr(dlq, "Producer", FakeProducer)
    FakeProducer.instances.clear()
    headers = (
        dead_letter_headers(DELIVERY, "too_large", 1, 1_700_000_001_000)
        if kind == "delivery"
        else poison_headers(SourceRef("tx", 0, 1, 1), "corrupt", "x", 1_700_000_001_000)
    )
    dropped = letter(1, [*headers, ("bridge-value-dropped-bytes", b"1048000")], value=None)
    assert "(value not kept)" in dropped.row(1_700_000_002_000)[3]
    assert "(value not kept)" not in letter(2, headers).row(1_700_000_002_000)[3]
    config = Config(path=Path("x.yaml"), topics=TopicsConfig(source="tx"))
    with pytest.raises(
        RuntimeError,
        match=r"^1 dead letter\(s\) not replayed: 0/1: its value \(1048000 bytes\) was too large "
        r"to be kept; the source record is at tx/0/1 \(topic/partition/offset\)",
    ):
        dlq.replay(config, [dropped, good(2)])
    (producer,) = FakeProducer.instances
    assert [topic for topic, _value in producer.produced] == [config.delay_topics[0]]
