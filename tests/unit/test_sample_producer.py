"""JSON-described transactions for the sample producer: accepted shapes and clear errors."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from bridge.core.mapping import to_notification
from devtools.sample_producer import SampleError, record_from_json, records_from_json


def test_a_failed_card_payment_from_json() -> None:
    record = record_from_json(
        {
            "transactionId": "tx-9",
            "accountHolderId": "acct_1",
            "status": "FAILED",
            "method": "CARD",
            "amount": "10.5",
            "fees": 0,
            "performedAt": "2026-03-14T09:26:53.589Z",
            "stateData": {"k": "v"},
        },
        "t:1",
    )
    assert record["status"] == "FAILED" and record["amount"] == Decimal("10.5")
    body = to_notification(record).body
    assert b'"failureCode":"processing_error"' in body and b'"account":null' in body
    assert b'"performedAt":"2026-03-14T09:26:53.589Z"' in body and b'"stateData":{"k":"v"}' in body


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ([], "expected a JSON object"),
        ({"accountHolderId": "a"}, "'transactionId' is required"),
        ({"transactionId": "t", "accountHolderId": "a", "colour": 1}, "unknown field(s) colour"),
        ({"transactionId": "t", "accountHolderId": "a", "status": "DONE"}, "SUCCEEDED or FAILED"),
        ({"transactionId": "t", "accountHolderId": "a", "performedAt": "soon"}, "performedAt"),
        ({"transactionId": "t", "accountHolderId": "a", "amount": "ten"}, "t:3"),
    ],
)
def test_bad_transactions_name_the_place_and_field(item: object, message: str) -> None:
    with pytest.raises(SampleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        record_from_json(item, "t:3")


def test_json_lines_and_arrays(tmp_path: Path) -> None:
    lines = tmp_path / "tx.jsonl"
    lines.write_text(
        '{"transactionId": "a", "accountHolderId": "x"}\n\n'
        '{"transactionId": "b", "accountHolderId": "x"}\n'
    )
    array = tmp_path / "tx.json"
    array.write_text('[{"transactionId": "c", "accountHolderId": "x"}]')
    assert [r["transactionId"] for r in records_from_json(lines)] == ["a", "b"]
    assert [r["transactionId"] for r in records_from_json(array)] == ["c"]
