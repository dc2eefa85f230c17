"""Mapping: decoded transaction record -> the documented notification body, byte for byte.

The body is assembled from pre-escaped JSON parts in the contract's field order (SPEC §2): this
is faster than ``json.dumps`` of a dict and keeps money exact (Decimal text, never float).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any

from bridge.core.errors import MappingError

EVENT_SUCCESS = "transaction.success"
EVENT_FAILED = "transaction.failed"
EVENTS = frozenset({EVENT_SUCCESS, EVENT_FAILED})
PAYMENT_METHODS = frozenset({"MOBILE_MONEY", "WALLET", "CARD"})
WAVE_PROVIDER = "wave"

_STATE_DATA_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_JSON_SPACE_OUTSIDE_STRINGS = re.compile(r'("(?:[^"\\]|\\.)*")|[ \t\n\r]+')
"""A JSON string (kept: group 1) or a run of JSON's whitespace between tokens (removed)."""


@dataclass(frozen=True, slots=True)
class Notification:
    """One notification: who it is for, which event, and the exact body bytes to sign and send."""

    transaction_id: str
    account_holder_id: str
    event: str
    body: bytes


def to_notification(record: Mapping[str, Any], raw: bytes | None = None) -> Notification:
    """Build the notification for a decoded record; raises MappingError (carrying ``raw``)."""
    transaction_id = _identifier(record, "transactionId", "", raw)
    account_holder_id = _identifier(record, "accountHolderId", transaction_id, raw)
    partner_id = _identifier(record, "partnerId", transaction_id, raw)
    label = _text(record, "label", transaction_id, raw)
    status = record.get("status")
    if status == "SUCCEEDED":
        failure = ""
    elif status == "FAILED":
        failure = (
            f',"failureCode":{_failure_text(record, "failureCode", transaction_id, raw)}'
            f',"failureMessage":{_failure_text(record, "failureMessage", transaction_id, raw)}'
        )
    else:
        raise _invalid(record, "status", "SUCCEEDED or FAILED", transaction_id, raw)
    method = record.get("method")
    if not isinstance(method, str) or method not in PAYMENT_METHODS:
        raise _invalid(record, "method", "one of MOBILE_MONEY, WALLET, CARD", transaction_id, raw)
    account = _optional_text(record, "account", transaction_id, raw)
    provider = _optional_text(record, "provider", transaction_id, raw)
    if (
        account is None
        or method == "CARD"
        or (provider is not None and provider.strip().lower() == WAVE_PROVIDER)
    ):
        account_json = "null"
    else:
        account_json = encode_basestring(account)
    event = EVENT_SUCCESS if status == "SUCCEEDED" else EVENT_FAILED
    text = (
        f'{{"transactionId":{encode_basestring(transaction_id)}'
        f',"isPaymentSucces":{"true" if status == "SUCCEEDED" else "false"}'
        f',"account":{account_json}{failure}'
        f',"label":{encode_basestring(label)}'
        f',"method":"{method}"'
        f',"amount":{_money(record, "amount", transaction_id, raw)}'
        f',"fees":{_money(record, "fees", transaction_id, raw)}'
        f',"partnerId":{encode_basestring(partner_id)}'
        f',"performedAt":"{_timestamp(record, "performedAt", transaction_id, raw)}"'
        f',"stateData":{_state_data(record, transaction_id, raw)}'
        f',"event":"{event}"}}'
    )
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MappingError(
            "invalid_field",
            f"transaction {transaction_id!r}: a text field holds a lone surrogate",
            raw=raw,
        ) from exc
    return Notification(transaction_id, account_holder_id, event, body)


def format_decimal(value: Decimal) -> str:
    """JSON number text of a finite Decimal: no exponent, no trailing zeros (0.300000 -> 0.3)."""
    if not value:
        return "0"
    text = str(value)
    if "E" in text:
        text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_timestamp(value: datetime) -> str:
    """An aware datetime as ISO 8601 UTC, three fractional digits and ``Z``: ``…T09:26:53.589Z``."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (  # noqa: UP031 -- twice as fast as isoformat
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond // 1000,
    )


def _prefix(transaction_id: str) -> str:
    return f"transaction {transaction_id!r}: " if transaction_id else ""


def _missing(name: str, transaction_id: str, raw: bytes | None) -> MappingError:
    return MappingError(
        "missing_field", f"{_prefix(transaction_id)}required field {name} is missing", raw=raw
    )


def _invalid(
    record: Mapping[str, Any], name: str, expected: str, transaction_id: str, raw: bytes | None
) -> MappingError:
    if record.get(name) is None:
        return _missing(name, transaction_id, raw)
    return MappingError(
        "invalid_field",
        f"{_prefix(transaction_id)}field {name} is {record[name]!r}, expected {expected}",
        raw=raw,
    )


def _text(record: Mapping[str, Any], name: str, transaction_id: str, raw: bytes | None) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise _invalid(record, name, "a string", transaction_id, raw)
    return value


def _identifier(
    record: Mapping[str, Any], name: str, transaction_id: str, raw: bytes | None
) -> str:
    value = _text(record, name, transaction_id, raw)
    if not value:
        raise _missing(name, transaction_id, raw)
    return value


def _optional_text(
    record: Mapping[str, Any], name: str, transaction_id: str, raw: bytes | None
) -> str | None:
    value = record.get(name)
    if value is not None and not isinstance(value, str):
        raise _invalid(record, name, "a string or null", transaction_id, raw)
    return value


def _failure_text(
    record: Mapping[str, Any], name: str, transaction_id: str, raw: bytes | None
) -> str:
    value = _optional_text(record, name, transaction_id, raw)
    if not value:
        reason = "missing_failure_code" if name == "failureCode" else "missing_failure_message"
        raise MappingError(
            reason, f"transaction {transaction_id!r} FAILED without a {name}", raw=raw
        )
    return encode_basestring(value)


def _money(record: Mapping[str, Any], name: str, transaction_id: str, raw: bytes | None) -> str:
    value = record.get(name)
    if not isinstance(value, Decimal) or not value.is_finite():
        raise _invalid(record, name, "a finite Decimal", transaction_id, raw)
    if value.is_signed() and value:
        raise MappingError(
            "negative_amount",
            f"transaction {transaction_id!r}: {name} is negative ({value})",
            raw=raw,
        )
    return format_decimal(value)


def _timestamp(record: Mapping[str, Any], name: str, transaction_id: str, raw: bytes | None) -> str:
    value = record.get(name)
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise _invalid(record, name, "a timezone-aware datetime", transaction_id, raw)
    try:
        return format_timestamp(value)
    except OverflowError as exc:
        raise MappingError(
            "invalid_field",
            f"transaction {transaction_id!r}: {name} {value.isoformat()} is out of range in UTC",
            raw=raw,
        ) from exc


def _state_data(record: Mapping[str, Any], transaction_id: str, raw: bytes | None) -> str:
    text = record.get("stateData")
    if text is None:
        return "{}"
    problem = "is not a string"
    if isinstance(text, str):
        try:
            state = json.loads(text)
            if isinstance(state, dict):
                # Encoded again only to be checked: an infinity (1e999), or a "\ud800" escape
                # that parses to text UTF-8 cannot carry. The text sent is the record's own,
                # whitespace between tokens removed: a number re-encoded from a float would not
                # be the one written (12345678901234567.89 became 1.2345678901234568e+16).
                _STATE_DATA_ENCODER.encode(state).encode("utf-8")
                return _JSON_SPACE_OUTSIDE_STRINGS.sub(r"\1", text)
            problem = f"is JSON but not an object: {text[:80]!r}"
        except (ValueError, RecursionError) as exc:
            problem = f"is not a usable JSON object ({exc})"
    raise MappingError(
        "invalid_state_data", f"transaction {transaction_id!r}: stateData {problem}", raw=raw
    )
