"""Tests of bridge.core.mapping: golden bodies byte for byte, contract properties, refusals."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.codec.decoding import Decoder
from bridge.codec.encoding import encode_confluent, encode_plain, encode_single_object
from bridge.core.errors import MappingError
from bridge.core.mapping import EVENT_FAILED, EVENT_SUCCESS, format_decimal, to_notification

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
GOLDEN = json.loads((Path(__file__).parent / "golden" / "mapping_cases.json").read_text("utf-8"))
BODY_VALIDATOR = jsonschema.Draft202012Validator(
    json.loads((SCHEMA_DIR / "notification.schema.json").read_text("utf-8"))
)
SUCCESS_FIELDS = [
    "transactionId", "isPaymentSucces", "account", "label", "method", "amount", "fees",
    "partnerId", "performedAt", "stateData", "event",
]  # fmt: skip
FAILURE_FIELDS = [*SUCCESS_FIELDS[:3], "failureCode", "failureMessage", *SUCCESS_FIELDS[3:]]
Factory = Callable[..., dict[str, Any]]


def golden_record(overrides: dict[str, Any]) -> dict[str, Any]:
    """A golden case's record with decimals and timestamps turned into Python values."""
    record = {**GOLDEN["defaults"], **overrides}
    record["amount"] = Decimal(record["amount"])
    record["fees"] = Decimal(record["fees"])
    record["performedAt"] = datetime.fromisoformat(record["performedAt"])
    return record


def fields_in_order(body: bytes) -> list[str]:
    """The body's top-level field names in the order they appear."""
    return [name for name, _ in json.loads(body, object_pairs_hook=lambda pairs: pairs)]


def number_texts(body: bytes) -> dict[str, str]:
    """The literal JSON text of the body's amount and fees."""
    parsed = json.loads(body, parse_float=str, parse_int=str)
    return {"amount": parsed["amount"], "fees": parsed["fees"]}


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[case["name"] for case in GOLDEN["cases"]])
def test_golden_record_maps_to_exact_body(
    case: dict[str, Any], schema_dir: Path, schema_source: Any
) -> None:
    writer_file = schema_dir / (
        "transaction_outcome.v1.avsc" if case.get("writer") == "v1" else "transaction_outcome.avsc"
    )
    writer_schema = json.loads(writer_file.read_text("utf-8"))
    record = golden_record(case["record"])
    framing = case.get("framing", "confluent")
    if framing == "plain":
        decoder = Decoder.from_schema_dir(schema_dir, plain_writer_schema_file=writer_file)
        value = encode_plain(writer_schema, record)
    else:
        decoder = Decoder.from_schema_dir(schema_dir, registry=schema_source)
        schema_id = 2 if case.get("writer") == "v1" else 1
        value = (
            encode_single_object(writer_schema, record)
            if framing == "single_object"
            else encode_confluent(schema_id, writer_schema, record)
        )

    notification = to_notification(decoder.decode(value), value)

    assert notification.body == case["body"].encode("utf-8")
    body = json.loads(notification.body)
    BODY_VALIDATOR.validate(body)
    assert notification.event == body["event"]
    assert notification.transaction_id == record["transactionId"]
    assert notification.account_holder_id == record["accountHolderId"]


def test_decimal_sum_is_sent_without_float_artefacts(make_record: Factory) -> None:
    record = make_record(amount=Decimal("0.10") + Decimal("0.20"), fees=Decimal("0.1") * 3)
    assert number_texts(to_notification(record).body) == {"amount": "0.3", "fees": "0.3"}


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("0.300000", "0.3"),
        ("100.000000", "100"),
        ("0", "0"),
        ("0E-6", "0"),
        ("-0.000000", "0"),
        ("1E+2", "100"),
        ("1E-7", "0.0000001"),
        ("123456789012345678.123456", "123456789012345678.123456"),
        ("1234567890123456789012345678901234567890", "1234567890123456789012345678901234567890"),
    ],
)
def test_format_decimal_is_plain_and_exact(value: str, text: str) -> None:
    assert format_decimal(Decimal(value)) == text


# --- Properties of every body -------------------------------------------------------------------

identifiers = st.text(min_size=1, max_size=20)
texts = st.text(max_size=30)
money = st.decimals(
    min_value=0,
    max_value=Decimal("999999999999999999.999999"),
    places=6,
    allow_nan=False,
    allow_infinity=False,
)
zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)), timezone.max]
)
moments = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=zones
)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), texts)
state_objects = st.dictionaries(
    texts, st.one_of(json_scalars, st.lists(json_scalars, max_size=3)), max_size=4
)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """Valid transaction records, as the decoder returns them (timestamps in any zone)."""
    failed = draw(st.booleans())
    failure_texts = identifiers if failed else st.one_of(st.none(), texts)
    state = draw(st.one_of(st.none(), state_objects))
    indent = draw(st.sampled_from([None, 2]))
    return {
        "transactionId": draw(identifiers),
        "accountHolderId": draw(identifiers),
        "status": "FAILED" if failed else "SUCCEEDED",
        "failureCode": draw(failure_texts),
        "failureMessage": draw(failure_texts),
        "account": draw(st.one_of(st.none(), texts)),
        "label": draw(texts),
        "method": draw(st.sampled_from(["MOBILE_MONEY", "WALLET", "CARD"])),
        "provider": draw(
            st.one_of(st.none(), st.sampled_from(["wave", "WAVE", "Wave", "orange_money"]), texts)
        ),
        "amount": draw(money),
        "fees": draw(money),
        "currency": "XOF",
        "partnerId": draw(identifiers),
        "performedAt": draw(moments),
        "stateData": None if state is None else json.dumps(state, indent=indent),
        "merchantReference": draw(st.one_of(st.none(), texts)),
    }


@given(records())
def test_body_follows_the_contract(record: dict[str, Any]) -> None:
    notification = to_notification(record)
    body = json.loads(notification.body)
    BODY_VALIDATOR.validate(body)
    failed = record["status"] == "FAILED"

    assert fields_in_order(notification.body) == (FAILURE_FIELDS if failed else SUCCESS_FIELDS)
    assert body["isPaymentSucces"] is not failed
    assert body["event"] == notification.event == (EVENT_FAILED if failed else EVENT_SUCCESS)
    if failed:
        assert (body["failureCode"], body["failureMessage"]) == (
            record["failureCode"],
            record["failureMessage"],
        )
    wave = record["provider"] is not None and record["provider"].strip().lower() == "wave"
    hidden = record["method"] == "CARD" or wave
    assert body["account"] == (None if hidden else record["account"])
    assert body["label"] == record["label"]
    assert body["stateData"] == (json.loads(record["stateData"]) if record["stateData"] else {})


@given(records())
def test_money_text_is_the_exact_normalized_decimal(record: dict[str, Any]) -> None:
    for name, text in number_texts(to_notification(record).body).items():
        assert "e" not in text.lower()
        assert not ("." in text and text.endswith(("0", ".")))
        assert not text.startswith("-")
        assert Decimal(text) == record[name]


@given(records())
def test_performed_at_is_utc_with_milliseconds(record: dict[str, Any]) -> None:
    moment = record["performedAt"]
    expected = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{moment.microsecond // 1000:03d}Z"
    )
    assert json.loads(to_notification(record).body)["performedAt"] == expected


@given(records())
def test_avro_round_trip_keeps_the_body(record: dict[str, Any]) -> None:
    moment = record["performedAt"]
    record["performedAt"] = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    reader_schema = json.loads((SCHEMA_DIR / "transaction_outcome.avsc").read_text("utf-8"))
    value = encode_plain(reader_schema, record)
    decoded = Decoder(reader_schema).decode(value)
    assert to_notification(decoded, value).body == to_notification(record).body


# --- Records that can never become a notification ----------------------------------------------


def assert_refused(record: dict[str, Any], reason: str, *words: str) -> MappingError:
    """Mapping ``record`` raises a non-retriable MappingError with ``reason`` naming ``words``."""
    raw = b"raw record bytes"
    with pytest.raises(MappingError) as caught:
        to_notification(record, raw)
    error = caught.value
    assert (error.reason, error.retriable, error.raw) == (reason, False, raw)
    for word in words:
        assert word in error.detail
    return error


@pytest.mark.parametrize(
    "name", ["transactionId", "accountHolderId", "partnerId", "label", "status", "method",
             "amount", "fees", "performedAt"],
)  # fmt: skip
def test_missing_required_field_is_refused(make_record: Factory, name: str) -> None:
    record = make_record()
    del record[name]
    assert_refused(record, "missing_field", name)
    assert_refused(make_record(**{name: None}), "missing_field", name)


@pytest.mark.parametrize("name", ["transactionId", "accountHolderId", "partnerId"])
def test_empty_identifier_is_refused(make_record: Factory, name: str) -> None:
    assert_refused(make_record(**{name: ""}), "missing_field", name)


@pytest.mark.parametrize(
    ("code", "message", "reason"),
    [
        (None, "processing_error", "missing_failure_code"),
        ("", "processing_error", "missing_failure_code"),
        ("processing_error", None, "missing_failure_message"),
    ],
)
def test_failure_without_code_or_message_is_refused(
    make_record: Factory, code: str | None, message: str | None, reason: str
) -> None:
    record = make_record(status="FAILED", failureCode=code, failureMessage=message)
    assert_refused(record, reason, "txn_001")


@pytest.mark.parametrize("name", ["amount", "fees"])
def test_negative_money_is_refused(make_record: Factory, name: str) -> None:
    assert_refused(make_record(**{name: Decimal("-0.01")}), "negative_amount", name)


@pytest.mark.parametrize("value", [Decimal("NaN"), Decimal("Infinity"), 0.3, 1, "1.0"])
def test_money_that_is_not_a_finite_decimal_is_refused(make_record: Factory, value: Any) -> None:
    assert_refused(make_record(amount=value), "invalid_field", "amount")


def state_data_text(body: bytes) -> str:
    """The text of the body's stateData object, as sent (the body ends with it and the event)."""
    text = body.decode("utf-8")
    start = text.index(',"stateData":') + len(',"stateData":')
    return text[start : text.rindex(',"event":')]


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ('{"amount": 12345678901234567.89}', '{"amount":12345678901234567.89}'),
        ('{ "x" : 1.10 , "y":[1E2, -0.0, 1e-7] }', '{"x":1.10,"y":[1E2,-0.0,1e-7]}'),
        ('{"n": 123456789012345678901234567890}', '{"n":123456789012345678901234567890}'),
        (
            '{\n\t"s": "a b\\" \\u00e9\\n \\\\",\r\n "t": "\u00e9"}',
            '{"s":"a b\\" \\u00e9\\n \\\\","t":"\u00e9"}',
        ),
        ('{"z": 1, "a": 2}', '{"z":1,"a":2}'),
        ('{"a": 1, "a": 2}', '{"a":1,"a":2}'),
        (" { } ", "{}"),
    ],
    ids=["big decimal", "number forms", "big int", "escapes", "key order", "key twice", "empty"],
)
def test_state_data_is_sent_as_written_without_whitespace_between_tokens(
    make_record: Factory, written: str, sent: str
) -> None:
    """Parsed and encoded again, 12345678901234567.89 was sent as 1.2345678901234568e+16, 1.10
    as 1.1 and 1E2 as 100.0: the account holder read numbers nobody wrote."""
    assert state_data_text(to_notification(make_record(stateData=written)).body) == sent


json_numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.decimals(allow_nan=False, allow_infinity=False).map(str),  # 1E+2, 0E-8, -0...
    st.from_regex(r"-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,2})?", fullmatch=True),
)
json_space = st.text(alphabet=" \t\n\r", max_size=3)


@st.composite
def json_object_texts(draw: st.DrawFn) -> str:
    """A JSON object as someone may write it: numbers in every form, whitespace anywhere."""
    items = []
    for _ in range(draw(st.integers(0, 4))):
        key = json.dumps(draw(texts), ensure_ascii=draw(st.booleans()))
        value = draw(st.one_of(json_numbers, texts.map(json.dumps)))
        pad = [draw(json_space) for _ in range(4)]
        items.append(f"{pad[0]}{key}{pad[1]}:{pad[2]}{value}{pad[3]}")
    return "{" + ",".join(items) + draw(json_space) + "}"


def _tokens(text: str) -> Any:
    """The object with every number kept as the text written."""
    return json.loads(text, parse_float=str, parse_int=str, object_pairs_hook=list)


@given(json_object_texts())
def test_state_data_keeps_every_token_and_drops_only_whitespace(written: str) -> None:
    try:
        sent = state_data_text(to_notification(golden_record({"stateData": written})).body)
    except MappingError as exc:
        assert exc.reason == "invalid_state_data"
        assert any(float(number) in (float("inf"), float("-inf")) for number in _numbers(written))
        return
    assert _tokens(sent) == _tokens(written)
    assert len(sent) == len(written) - sum(
        len(space) for space in re.findall(r'"(?:[^"\\]|\\.)*"|([ \t\n\r]+)', written)
    )


def _numbers(text: str) -> list[str]:
    found: list[str] = []
    json.loads(text, parse_float=lambda number: found.append(number) or 0.0)
    return found


@pytest.mark.parametrize(
    "state_data",
    ["not json", "[1, 2]", "null", '"text"', '{"a": NaN}', '{"a": 1e999}', '{"a": "\\ud800"}', 7],
)
def test_state_data_that_is_not_a_json_object_is_refused(
    make_record: Factory, state_data: Any
) -> None:
    assert_refused(make_record(stateData=state_data), "invalid_state_data", "stateData")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("status", "PENDING"),
        ("method", "BANK_TRANSFER"),
        ("method", ["CARD"]),
        ("label", 42),
        ("account", 42),
        ("provider", b"wave"),
        ("performedAt", datetime(2026, 3, 14, 9, 26, 53)),
        ("performedAt", 1773480413589),
        ("performedAt", datetime.min.replace(tzinfo=timezone.max)),
    ],
)
def test_field_of_the_wrong_kind_is_refused(make_record: Factory, name: str, value: Any) -> None:
    assert_refused(make_record(**{name: value}), "invalid_field", name)


def test_text_that_is_not_unicode_is_refused(make_record: Factory) -> None:
    assert_refused(make_record(label="\ud800"), "invalid_field", "surrogate")


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"status": "FAILED", "failureMessage": "declined"}, "missing_failure_code"),
        ({"transactionId": ""}, "missing_field"),
        ({"fees": Decimal("-1")}, "negative_amount"),
        ({"stateData": "[]"}, "invalid_state_data"),
    ],
)
def test_avro_record_breaking_the_contract_is_refused_whole(
    reader_schema: Any, make_record: Factory, overrides: dict[str, Any], reason: str
) -> None:
    value = encode_plain(reader_schema, make_record(**overrides))
    record = Decoder(reader_schema).decode(value)
    with pytest.raises(MappingError) as caught:
        to_notification(record, value)
    assert (caught.value.reason, caught.value.raw, caught.value.retriable) == (reason, value, False)
