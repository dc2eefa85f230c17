"""Delay-topic and dead-letter records round-trip through their headers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.core.envelope import (
    EnvelopeError,
    PendingDelivery,
    SourceRef,
    dead_letter_headers,
    delay_headers,
    header_map,
    parse_delivery,
    poison_headers,
)
from bridge.core.signing import message_id

DELIVERY = PendingDelivery(
    webhook_id="shop",
    message_id="msg_abc",
    event="transaction.failed",
    transaction_id="tx-1",
    body=b'{"transactionId":"tx-1"}',
    attempt=2,
    source=SourceRef("tx", 3, 42, 1_700_000_000_000),
    key=b"tx-1",
    due_ms=1_700_000_001_500,
    last_status=503,
    last_error="HTTP 503",
    deferrals=1,
    account="acct_7",
)


def test_delay_record_round_trips() -> None:
    parsed = parse_delivery(delay_headers(DELIVERY), DELIVERY.body, DELIVERY.key)
    assert parsed == DELIVERY


def test_dead_letter_headers_name_reason_attempts_and_origin() -> None:
    headers = header_map(dead_letter_headers(DELIVERY, "retries_exhausted", 6, 123))
    assert headers["bridge-kind"] == "delivery"
    assert headers["bridge-reason"] == "retries_exhausted"
    assert headers["bridge-attempts"] == "6"
    assert headers["bridge-last-status"] == "503"
    assert (
        headers["bridge-source-topic"],
        headers["bridge-source-partition"],
        headers["bridge-source-offset"],
    ) == ("tx", "3", "42")
    assert headers["bridge-dead-lettered-ms"] == "123"


def test_poison_headers_carry_reason_and_detail() -> None:
    headers = header_map(poison_headers(SourceRef("tx", 0, 7, 5), "truncated", "x" * 5000, 9))
    assert headers["bridge-kind"] == "poison"
    assert headers["bridge-reason"] == "truncated"
    assert len(headers["bridge-detail"]) == 1000


def test_next_attempt_records_the_error_and_deferral_does_not() -> None:
    retried = DELIVERY.next(3, 99, 500, "HTTP 500")
    assert (retried.attempt, retried.due_ms, retried.last_status, retried.deferrals) == (
        3,
        99,
        500,
        1,
    )
    parked = DELIVERY.next(2, 77, None, "", deferred=True)
    assert (parked.last_status, parked.last_error, parked.deferrals) == (503, "HTTP 503", 2)


@pytest.mark.parametrize(
    "missing",
    # (without a transaction id, the webhooks a parking record carries all had one webhook-id
    # per webhook whatever the transaction: message_id("", event, webhook))
    ["bridge-webhook", "bridge-attempt", "bridge-source-offset", "bridge-transaction-id"],
)
def test_missing_header_is_a_clear_error(missing: str) -> None:
    headers = [(k, v) for k, v in delay_headers(DELIVERY) if k != missing]
    with pytest.raises(EnvelopeError, match=missing):
        parse_delivery(headers, DELIVERY.body, None)


NUMBER_HEADERS = [
    "bridge-attempt",
    "bridge-due-ms",
    "bridge-last-status",
    "bridge-deferrals",
    "bridge-source-partition",
    "bridge-source-offset",
    "bridge-source-timestamp-ms",
]


@pytest.mark.parametrize("name", NUMBER_HEADERS)
@pytest.mark.parametrize(
    "written",
    [
        "two",
        "²",  # str.isdigit() and int() take it
        "٣",  # another script's digit: int() takes it
        "-10",  # a negative attempt indexed the ladder from its end
        "+3",
        " 3",
        "3_0",
        "1" + "0" * 400,  # int() takes it; a hold of it overflowed a float
        "9" * 5000,  # past int()'s limit on digits (ValueError)
        "0x10",
        "\uff13",  # fullwidth
    ],
)
def test_every_number_header_is_whole_ascii_digits_in_range_or_a_clear_error(
    name: str, written: str
) -> None:
    """Each number the bridge reads back from its own records is ASCII digits in range; anything
    else is an EnvelopeError naming the header, its text clipped (never an int() error)."""
    headers = [(k, written.encode() if k == name else v) for k, v in delay_headers(DELIVERY)]
    with pytest.raises(EnvelopeError, match=name) as refused:
        parse_delivery(headers, DELIVERY.body, None)
    assert len(str(refused.value)) < 120


@pytest.mark.parametrize(
    ("name", "written", "ok"),
    [
        ("bridge-attempt", str(2**31 - 1), True),
        ("bridge-attempt", str(2**31), False),
        ("bridge-deferrals", str(2**31), False),
        ("bridge-last-status", "999", True),
        ("bridge-last-status", "1000", False),
        ("bridge-source-offset", str(2**63 - 1), True),
        ("bridge-source-offset", str(2**63), False),
        ("bridge-due-ms", "0" * 19, True),
    ],
)
def test_number_headers_have_bounds(name: str, written: str, ok: bool) -> None:
    headers = [(k, written.encode() if k == name else v) for k, v in delay_headers(DELIVERY)]
    if ok:
        parse_delivery(headers, DELIVERY.body, None)
        return
    with pytest.raises(EnvelopeError, match=f"{name}' is"):
        parse_delivery(headers, DELIVERY.body, None)


@pytest.mark.parametrize("name", ["bridge-due-ms", "bridge-last-status", "bridge-deferrals"])
def test_optional_number_headers_may_be_absent_or_empty(name: str) -> None:
    for headers in (
        [(k, v) for k, v in delay_headers(DELIVERY) if k != name],
        [(k, b"" if k == name else v) for k, v in delay_headers(DELIVERY)],
    ):
        parsed = parse_delivery(headers, DELIVERY.body, None)
        assert (parsed.due_ms, parsed.last_status, parsed.deferrals)[
            NUMBER_HEADERS[1:4].index(name)
        ] in (0, None)


def test_a_record_for_several_webhooks_round_trips_and_gives_one_delivery_each() -> None:
    first = replace(DELIVERY, message_id=message_id("tx-1", "transaction.failed", "shop"))
    group = replace(first, also=("crm", "ledger.v2"))
    parsed = parse_delivery(delay_headers(group), group.body, group.key)
    assert parsed == group
    one_each = [parsed.to(w) for w in (parsed.webhook_id, *parsed.also)]
    assert [d.webhook_id for d in one_each] == ["shop", "crm", "ledger.v2"]
    assert [d.message_id for d in one_each] == [
        message_id("tx-1", "transaction.failed", w) for w in ("shop", "crm", "ledger.v2")
    ]
    assert all(d.also == () for d in one_each)
    assert {d.account for d in one_each} == {"acct_7"}, "each keeps its record's account holder"
    assert {(d.attempt, d.deferrals, d.due_ms, d.body, d.source) for d in one_each} == {
        (2, 1, DELIVERY.due_ms, DELIVERY.body, DELIVERY.source)
    }
    assert "bridge-also-webhooks" not in header_map(delay_headers(one_each[1]))
    assert DELIVERY.to(DELIVERY.webhook_id) is DELIVERY, "its own webhook: itself"
    assert replace(DELIVERY, message_id="msg_as_written").to(DELIVERY.webhook_id).message_id == (
        "msg_as_written"
    ), "the webhook-id a record carries is kept for its own webhook"


@pytest.mark.parametrize("also", ["", ",crm", "crm,,x", "crm,crm", "shop,crm"])
def test_a_malformed_list_of_other_webhooks_is_a_clear_error(also: str) -> None:
    headers = [*delay_headers(DELIVERY), ("bridge-also-webhooks", also.encode())]
    if also == "":
        assert parse_delivery(headers, DELIVERY.body, DELIVERY.key).also == ()
        return
    with pytest.raises(EnvelopeError, match="bridge-also-webhooks"):
        parse_delivery(headers, DELIVERY.body, DELIVERY.key)


def test_a_record_written_before_the_account_was_carried_reads_without_one() -> None:
    """Records on the ladder when the bridge is upgraded have no ``bridge-account``: they read
    with "" (and are delivered as before); every record written now names it."""
    headers = delay_headers(DELIVERY)
    assert header_map(headers)["bridge-account"] == "acct_7"
    older = [(name, value) for name, value in headers if name != "bridge-account"]
    assert parse_delivery(older, DELIVERY.body, DELIVERY.key) == replace(DELIVERY, account="")
    assert "bridge-account" not in header_map(delay_headers(replace(DELIVERY, account="")))
