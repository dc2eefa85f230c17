"""The records the bridge writes to its own topics: delay-topic retries and dead letters.

A delay-topic record carries one delivery: the exact body as value, and in headers the webhook, the
``webhook-id``, the attempt due, the due time, the last error and the original coordinates. A
parking-topic record may carry the same event for several webhooks at once (``bridge-also-webhooks``
lists the others; their ``webhook-id`` is derived again, :meth:`PendingDelivery.to`): a
neighbour whose many webhooks are all parked costs one record per event, not one per webhook.
A dead letter carries either that same delivery (``kind=delivery``) or a poison source record's raw
bytes (``kind=poison``), with the reason and when it happened. Header names start with ``bridge-``;
secrets never appear in them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from bridge.core.errors import clipped
from bridge.core.signing import message_id

Headers = list[tuple[str, bytes]]

H_WEBHOOK = "bridge-webhook"
H_MESSAGE_ID = "bridge-message-id"
H_EVENT = "bridge-event"
H_TRANSACTION = "bridge-transaction-id"
H_ATTEMPT = "bridge-attempt"
H_DUE = "bridge-due-ms"
H_LAST_STATUS = "bridge-last-status"
H_LAST_ERROR = "bridge-last-error"
H_SOURCE_TOPIC = "bridge-source-topic"
H_SOURCE_PARTITION = "bridge-source-partition"
H_SOURCE_OFFSET = "bridge-source-offset"
H_SOURCE_TIMESTAMP = "bridge-source-timestamp-ms"
H_DEFERRALS = "bridge-deferrals"
H_KIND = "bridge-kind"
H_REASON = "bridge-reason"
H_DETAIL = "bridge-detail"
H_ATTEMPTS = "bridge-attempts"
H_DEAD_LETTERED = "bridge-dead-lettered-ms"
H_ALSO = "bridge-also-webhooks"
H_ACCOUNT = "bridge-account"  # the account holder whose record the body was built from
H_VALUE_DROPPED = "bridge-value-dropped-bytes"  # a dead letter whose value was too large to keep

KIND_DELIVERY = "delivery"
KIND_POISON = "poison"


class EnvelopeError(ValueError):
    """A record in a bridge topic lacks a header the bridge needs or has a malformed one."""


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a record came from: the original topic, partition, offset and record timestamp."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PendingDelivery:
    """One delivery of one event to one webhook, as it travels through the retry ladder."""

    webhook_id: str
    message_id: str
    event: str
    transaction_id: str
    body: bytes
    attempt: int
    source: SourceRef
    key: bytes | None = None
    due_ms: int = 0
    last_status: int | None = None
    last_error: str = ""
    deferrals: int = 0
    also: tuple[str, ...] = ()  # other webhooks parked in the same record (same event, attempt)
    account: str = ""  # the record's account holder ("" only in records written before it was)

    @property
    def came_back(self) -> bool:
        """Whether the delivery was tried or parked before (it comes from a retry rung or the
        parking topic, not from its record): a stalled webhook still tries it while a slot is
        free (:meth:`bridge.engine.budget.Lane.room`)."""
        return self.attempt > 0 or self.deferrals > 0

    def to(self, webhook_id: str) -> PendingDelivery:
        """The same delivery of its record for ``webhook_id`` alone: that webhook's
        ``webhook-id``, no other webhooks carried (``also``), everything else shared."""
        if webhook_id == self.webhook_id:
            return replace(self, also=()) if self.also else self
        return PendingDelivery(
            webhook_id,
            message_id(self.transaction_id, self.event, webhook_id),
            self.event,
            self.transaction_id,
            self.body,
            self.attempt,
            self.source,
            self.key,
            self.due_ms,
            self.last_status,
            self.last_error,
            self.deferrals,
            account=self.account,
        )

    def next(
        self, attempt: int, due_ms: int, status: int | None, error: str, deferred: bool = False
    ) -> PendingDelivery:
        """The same delivery, rescheduled as ``attempt`` at ``due_ms`` after ``error``."""
        return replace(
            self,
            attempt=attempt,
            due_ms=due_ms,
            last_status=status if not deferred else self.last_status,
            last_error=error if not deferred else self.last_error,
            deferrals=self.deferrals + (1 if deferred else 0),
        )


def _common(delivery: PendingDelivery) -> Headers:
    source = delivery.source
    return [
        (H_KIND, KIND_DELIVERY.encode()),
        (H_WEBHOOK, delivery.webhook_id.encode()),
        (H_MESSAGE_ID, delivery.message_id.encode()),
        (H_EVENT, delivery.event.encode()),
        (H_TRANSACTION, delivery.transaction_id.encode()),
        (H_ATTEMPT, str(delivery.attempt).encode()),
        (
            H_LAST_STATUS,
            b"" if delivery.last_status is None else str(delivery.last_status).encode(),
        ),
        (H_LAST_ERROR, delivery.last_error.encode()),
        (H_SOURCE_TOPIC, source.topic.encode()),
        (H_SOURCE_PARTITION, str(source.partition).encode()),
        (H_SOURCE_OFFSET, str(source.offset).encode()),
        (H_SOURCE_TIMESTAMP, str(source.timestamp_ms).encode()),
        (H_DEFERRALS, str(delivery.deferrals).encode()),
        *([(H_ALSO, ",".join(delivery.also).encode())] if delivery.also else []),
        *([(H_ACCOUNT, delivery.account.encode())] if delivery.account else []),
    ]


def delay_headers(delivery: PendingDelivery) -> Headers:
    """Headers of a delay-topic record for ``delivery``."""
    return [*_common(delivery), (H_DUE, str(delivery.due_ms).encode())]


def dead_letter_headers(
    delivery: PendingDelivery, reason: str, attempts: int, now_ms: int
) -> Headers:
    """Headers of a dead letter for a delivery that never got through."""
    return [
        *_common(delivery),
        (H_REASON, reason.encode()),
        (H_ATTEMPTS, str(attempts).encode()),
        (H_DEAD_LETTERED, str(now_ms).encode()),
    ]


def poison_headers(source: SourceRef, reason: str, detail: str, now_ms: int) -> Headers:
    """Headers of a dead letter for a source record that cannot be decoded or mapped."""
    return [
        (H_KIND, KIND_POISON.encode()),
        (H_REASON, reason.encode()),
        (H_DETAIL, detail[:1000].encode()),
        (H_SOURCE_TOPIC, source.topic.encode()),
        (H_SOURCE_PARTITION, str(source.partition).encode()),
        (H_SOURCE_OFFSET, str(source.offset).encode()),
        (H_SOURCE_TIMESTAMP, str(source.timestamp_ms).encode()),
        (H_DEAD_LETTERED, str(now_ms).encode()),
    ]


def header_map(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """Headers as a dict of text (the last value of a repeated header wins)."""
    return {name: (value or b"").decode("utf-8", "replace") for name, value in headers or ()}


_MAX_WHOLE: Final = 2**63 - 1  # (Kafka's offsets and timestamps are signed 64-bit)
_MAX_COUNT: Final = 2**31 - 1  # attempts and deferrals


def whole_number(
    values: dict[str, str], name: str, highest: int = _MAX_WHOLE, lowest: int = 0
) -> int:
    """Header ``name`` as a whole number from ``lowest`` to ``highest``, written in ASCII digits
    (no sign, no spaces, no other script's digits: ``int()`` takes ``'²'``'s kin and 5,000-digit
    texts, and a header the bridge wrote holds none); else EnvelopeError naming the header. Every
    number the bridge reads back from its own records is read here."""
    try:
        text = values[name]
    except KeyError:
        raise EnvelopeError(f"header {name!r} is missing") from None
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(highest))):
        raise EnvelopeError(
            f"header {name!r} is not a whole number: {clipped(text, 40)!r}"
        ) from None
    value = int(text)
    if not lowest <= value <= highest:
        raise EnvelopeError(f"header {name!r} is {value}, not from {lowest} to {highest}")
    return value


def _optional(values: dict[str, str], name: str, highest: int = _MAX_WHOLE) -> int | None:
    """Like :func:`whole_number`, but an absent or empty header is None."""
    return whole_number(values, name, highest) if values.get(name) else None


def _text(values: dict[str, str], name: str) -> str:
    try:
        return values[name]
    except KeyError:
        raise EnvelopeError(f"header {name!r} is missing") from None


def parse_delivery(
    headers: Sequence[tuple[str, bytes | None]] | None, body: bytes | None, key: bytes | None
) -> PendingDelivery:
    """Read a delay-topic record (or a ``kind=delivery`` dead letter) back into a delivery, or
    EnvelopeError naming the header that is missing or malformed (its numbers: whole, in range)."""
    values = header_map(headers)
    if body is None:
        raise EnvelopeError("the record has no body")
    return PendingDelivery(
        webhook_id=_text(values, H_WEBHOOK),
        message_id=_text(values, H_MESSAGE_ID),
        event=_text(values, H_EVENT),
        transaction_id=_text(values, H_TRANSACTION),
        body=body,
        attempt=whole_number(values, H_ATTEMPT, _MAX_COUNT),
        source=SourceRef(
            topic=_text(values, H_SOURCE_TOPIC),
            partition=whole_number(values, H_SOURCE_PARTITION, _MAX_COUNT),
            offset=whole_number(values, H_SOURCE_OFFSET),
            timestamp_ms=whole_number(values, H_SOURCE_TIMESTAMP),
        ),
        key=key,
        due_ms=_optional(values, H_DUE) or 0,
        last_status=_optional(values, H_LAST_STATUS, 999),
        last_error=values.get(H_LAST_ERROR, ""),
        deferrals=_optional(values, H_DEFERRALS, _MAX_COUNT) or 0,
        also=_also(values),
        account=values.get(H_ACCOUNT, ""),
    )


def _also(values: dict[str, str]) -> tuple[str, ...]:
    text = values.get(H_ALSO, "")
    if not text:
        return ()
    ids = tuple(text.split(","))
    if not all(ids) or len(set(ids)) != len(ids) or values.get(H_WEBHOOK) in ids:
        raise EnvelopeError(f"header {H_ALSO} is malformed")
    return ids
