"""Tests of bridge.codec.decoding and .encoding: every framing, schema versions, bad bytes."""

from __future__ import annotations

import copy
import io
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro import _logical_readers as fastavro_logical_readers
from hypothesis import given
from hypothesis import strategies as st

from bridge.codec.decoding import (
    READER_SCHEMA_FILE,
    Decoder,
    SchemaFilesError,
    UnsupportedWriterSchema,
    check_writer_schema,
    max_decimal_bytes,
    read_decimal,
)
from bridge.codec.encoding import (
    SCHEMA_FILE_LIMIT,
    encode_confluent,
    encode_plain,
    encode_single_object,
    single_object_fingerprint,
)
from bridge.core.errors import DecodeError, RegistryUnavailableError
from tests.special_files import NOT_REGULAR, make_sparse, make_special

Factory = Callable[..., dict[str, Any]]
REFUND_SCHEMA = {
    "type": "record",
    "name": "RefundOutcome",
    "namespace": "payments.refunds",
    "fields": [{"name": "refundId", "type": "string"}, {"name": "amount", "type": "long"}],
}


class UnavailableSchemaSource:
    """A schema source whose registry is down."""

    def fetch(self, schema_id: int) -> Any:
        raise RegistryUnavailableError(f"registry down while fetching schema id {schema_id}")


def with_extra_payment_method(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with a PaymentMethod symbol the bridge does not know."""
    extended = copy.deepcopy(schema)
    method = next(field for field in extended["fields"] if field["name"] == "method")
    method["type"]["symbols"].append("BANK_TRANSFER")
    return extended


def assert_decode_error(decoder: Decoder, value: bytes, reason: str) -> DecodeError:
    """Decoding ``value`` raises a non-retriable DecodeError with ``reason`` and the raw bytes."""
    with pytest.raises(DecodeError) as caught:
        decoder.decode(value)
    error = caught.value
    assert (error.reason, error.retriable, error.raw) == (reason, False, value), error.detail
    assert error.detail
    return error


@pytest.fixture
def confluent_decoder(schema_dir: Path, schema_source: Any) -> Decoder:
    return Decoder.from_schema_dir(schema_dir, registry=schema_source)


@pytest.fixture
def plain_decoder(schema_dir: Path) -> Decoder:
    return Decoder.from_schema_dir(schema_dir)


# --- Records that decode ------------------------------------------------------------------------


def test_v2_record_decodes_to_the_record_written(
    confluent_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    record = make_record(merchantReference="INV-42", stateData='{"a":1}')
    assert confluent_decoder.decode(encode_confluent(1, reader_schema, record)) == record


def test_v1_record_decodes_with_the_v2_reader_schema(
    confluent_decoder: Decoder, v1_schema: Any, make_record: Factory
) -> None:
    record = make_record()
    del record["merchantReference"]
    decoded = confluent_decoder.decode(encode_confluent(2, v1_schema, record))
    assert decoded == {**record, "merchantReference": None}


@pytest.mark.parametrize("writer", ["v1", "v2"])
def test_single_object_records_of_every_schema_file_decode(
    confluent_decoder: Decoder,
    plain_decoder: Decoder,
    reader_schema: Any,
    v1_schema: Any,
    make_record: Factory,
    writer: str,
) -> None:
    value = encode_single_object(v1_schema if writer == "v1" else reader_schema, make_record())
    assert confluent_decoder.decode(value) == plain_decoder.decode(value) == make_record()


def test_plain_record_decodes_with_the_configured_writer_schema(
    schema_dir: Path, v1_schema: Any, make_record: Factory
) -> None:
    decoder = Decoder.from_schema_dir(
        schema_dir, plain_writer_schema_file=schema_dir / "transaction_outcome.v1.avsc"
    )
    assert decoder.decode(encode_plain(v1_schema, make_record())) == make_record()


def test_registry_copy_of_the_schema_without_docs_decodes(
    reader_schema: Any, make_record: Factory, make_schema_source: Any
) -> None:
    stripped = copy.deepcopy(reader_schema)
    del stripped["doc"]
    for field in stripped["fields"]:
        del field["doc"]
    decoder = Decoder(reader_schema, registry=make_schema_source({9: stripped}))
    assert decoder.decode(encode_confluent(9, stripped, make_record())) == make_record()


def test_single_object_fingerprint_matches_the_avro_reference_values() -> None:
    # Values from the Avro specification's test data (Java's parsingFingerprint64).
    assert single_object_fingerprint("null") == (7195948357588979594).to_bytes(8, "little")
    assert single_object_fingerprint("int") == (8247732601305521295).to_bytes(8, "little")


# --- Fetching writer schemas off the event loop -------------------------------------------------


def test_schema_id_to_fetch_names_only_ids_not_loaded_yet(
    confluent_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_confluent(1, reader_schema, make_record())
    assert confluent_decoder.schema_id_to_fetch(value) == 1
    confluent_decoder.decode(value)
    assert confluent_decoder.schema_id_to_fetch(value) is None
    assert (
        confluent_decoder.schema_id_to_fetch(encode_confluent(7, reader_schema, make_record())) == 7
    )


def test_schema_id_to_fetch_ignores_values_without_a_registry_lookup(
    confluent_decoder: Decoder, plain_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    confluent = encode_confluent(1, reader_schema, make_record())
    assert plain_decoder.schema_id_to_fetch(confluent) is None
    assert (
        confluent_decoder.schema_id_to_fetch(encode_single_object(reader_schema, make_record()))
        is None
    )
    assert confluent_decoder.schema_id_to_fetch(b"\x00\x00\x00") is None


def test_registry_down_is_retriable_and_not_cached(
    reader_schema: Any, make_record: Factory
) -> None:
    decoder = Decoder(reader_schema, registry=UnavailableSchemaSource())
    value = encode_confluent(1, reader_schema, make_record())
    for _ in range(2):
        with pytest.raises(RegistryUnavailableError) as caught:
            decoder.decode(value)
        assert caught.value.retriable
    assert decoder.schema_id_to_fetch(value) == 1


# --- Bytes that are not a transaction record ---------------------------------------------------


def test_every_truncation_is_reported_as_truncated(
    confluent_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_confluent(1, reader_schema, make_record(stateData='{"a":1}'))
    for length in range(len(value)):
        assert_decode_error(confluent_decoder, value[:length], "truncated")


def test_truncated_single_object_record(
    plain_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_single_object(reader_schema, make_record())
    for length in (2, 9, 10, len(value) - 1):
        assert_decode_error(plain_decoder, value[:length], "truncated")


def test_wrong_magic_byte(
    confluent_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = b"\x01" + encode_confluent(1, reader_schema, make_record())[1:]
    assert "0x01" in assert_decode_error(confluent_decoder, value, "bad_magic_byte").detail


def test_unknown_schema_id(
    confluent_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_confluent(404, reader_schema, make_record())
    assert "404" in assert_decode_error(confluent_decoder, value, "unknown_schema_id").detail


def test_unknown_fingerprint(
    plain_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    unknown_schema = with_extra_payment_method(reader_schema)
    value = encode_single_object(unknown_schema, make_record())
    error = assert_decode_error(plain_decoder, value, "unknown_fingerprint")
    assert single_object_fingerprint(unknown_schema).hex() in error.detail


@pytest.mark.parametrize(
    ("writer_schema", "record"),
    [
        (REFUND_SCHEMA, {"refundId": "r-1", "amount": 5}),
        ("string", "just a string"),
    ],
)
def test_record_of_another_schema(
    reader_schema: Any, make_schema_source: Any, writer_schema: Any, record: Any
) -> None:
    decoder = Decoder(reader_schema, registry=make_schema_source({3: writer_schema}))
    assert_decode_error(decoder, encode_confluent(3, writer_schema, record), "schema_mismatch")
    plain = Decoder(reader_schema, plain_writer_schema=writer_schema)
    assert_decode_error(plain, encode_plain(writer_schema, record), "schema_mismatch")


def test_writer_schema_without_a_required_field(
    reader_schema: Any, make_schema_source: Any, make_record: Factory
) -> None:
    without_label = copy.deepcopy(reader_schema)
    without_label["fields"] = [f for f in without_label["fields"] if f["name"] != "label"]
    decoder = Decoder(reader_schema, registry=make_schema_source({3: without_label}))
    value = encode_confluent(3, without_label, make_record())
    assert "label" in assert_decode_error(decoder, value, "schema_mismatch").detail


def test_unknown_enum_symbol(
    reader_schema: Any, make_schema_source: Any, make_record: Factory
) -> None:
    extended = with_extra_payment_method(reader_schema)
    decoder = Decoder(reader_schema, registry=make_schema_source({3: extended}))
    known = encode_confluent(3, extended, make_record(method="CARD"))
    assert decoder.decode(known)["method"] == "CARD"
    unknown = encode_confluent(3, extended, make_record(method="BANK_TRANSFER"))
    assert "BANK_TRANSFER" in assert_decode_error(decoder, unknown, "unknown_enum_symbol").detail


def test_invalid_writer_schema_from_the_registry(
    reader_schema: Any, make_schema_source: Any, make_record: Factory
) -> None:
    broken = {"type": "record", "name": "Broken", "fields": [{"name": "x", "type": "nothing"}]}
    decoder = Decoder(reader_schema, registry=make_schema_source({3: broken}))
    value = encode_confluent(3, reader_schema, make_record())
    assert "schema id 3" in assert_decode_error(decoder, value, "invalid_writer_schema").detail


def test_oversized_record_is_refused_before_decoding(
    schema_dir: Path, schema_source: Any, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_confluent(1, reader_schema, make_record())
    at_limit = Decoder.from_schema_dir(
        schema_dir, registry=schema_source, max_record_bytes=len(value)
    )
    assert at_limit.decode(value) == make_record()
    under_limit = Decoder.from_schema_dir(
        schema_dir, registry=schema_source, max_record_bytes=len(value) - 1
    )
    assert str(len(value)) in assert_decode_error(under_limit, value, "oversized").detail
    assert under_limit.schema_id_to_fetch(value) is None
    default = Decoder.from_schema_dir(schema_dir, registry=schema_source)
    assert_decode_error(default, b"\x00" * (1024 * 1024 + 1), "oversized")


def test_trailing_bytes(
    confluent_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_confluent(1, reader_schema, make_record()) + b"\x00\x00"
    assert "2 byte(s)" in assert_decode_error(confluent_decoder, value, "trailing_bytes").detail


def test_invalid_utf8_text_is_corrupt(
    confluent_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_confluent(1, reader_schema, make_record(transactionId="abcd"))
    corrupted = value[:6] + b"\xff\xfe\xfd\xfc" + value[10:]
    assert_decode_error(confluent_decoder, corrupted, "corrupt")


# --- Decimals: exact, within their precision, never slow ------------------------------------------


def _avro_long(number: int) -> bytes:
    """Avro's zig-zag varint of ``number``."""
    zigzag = (number << 1) ^ (number >> 63)
    out = bytearray()
    while zigzag > 0x7F:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    return bytes(out) + bytes([zigzag])


def with_amount_bytes(reader_schema: Any, record: dict[str, Any], data: bytes) -> bytes:
    """The plain Avro of ``record`` with the bytes of its ``amount`` (a decimal) replaced."""
    value = encode_plain(reader_schema, record)
    unscaled = int(record["amount"].scaleb(6))
    written = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
    encoded = _avro_long(len(written)) + written
    assert value.count(encoded) == 1
    return value.replace(encoded, _avro_long(len(data)) + data)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "of 0 bytes (at least 1 is needed)"),
        (b"\x00" * 12, "of 12 bytes, over the 11 that 24 digits can need"),
        (b"\x7f" + b"\xff" * 299_999, "of 300,000 bytes, over the 11 that 24 digits can need"),
        (
            (10**24).to_bytes(11, "big", signed=True),
            "with an unscaled value of more than 24 digits",
        ),
        (
            (-(10**24)).to_bytes(11, "big", signed=True),
            "with an unscaled value of more than 24 digits",
        ),
        (
            (123456789012345678901234567).to_bytes(11, "big", signed=True),
            "with an unscaled value of more than 24 digits",
        ),
    ],
    ids=["empty", "12 bytes", "300 KB", "10^24", "-10^24", "27 digits"],
)
def test_a_decimal_its_precision_cannot_hold_is_refused_at_once(
    plain_decoder: Decoder, reader_schema: Any, make_record: Factory, data: bytes, why: str
) -> None:
    """No bytes, more bytes than 24 digits need, more than 24 digits: each is an invalid_decimal
    naming the bound, never a zero, a rounded amount (fastavro's reader rounded 27 digits to 24)
    or seconds of conversion (300 KB took 11 s)."""
    value = with_amount_bytes(reader_schema, make_record(), data)
    started = time.perf_counter()
    error = assert_decode_error(plain_decoder, value, "invalid_decimal")
    assert time.perf_counter() - started < 1.0
    assert f"decimal(precision 24) {why}" in error.detail, error.detail


def test_decimals_at_the_edges_of_the_precision_decode_exactly(
    plain_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    for amount in ("999999999999999999.999999", "0.000001", "0.000000", "1500.000000"):
        record = make_record(amount=Decimal(amount))
        decoded = plain_decoder.decode(encode_plain(reader_schema, record))["amount"]
        assert (str(decoded), decoded.as_tuple()) == (amount, Decimal(amount).as_tuple())
    most = (10**24 - 1).to_bytes(11, "big", signed=True)
    value = with_amount_bytes(reader_schema, make_record(), most)
    assert str(plain_decoder.decode(value)["amount"]) == "999999999999999999.999999"


@given(data=st.data())
def test_decimals_within_the_precision_read_as_fastavro_reads_them(data: st.DataObject) -> None:
    """Every unscaled value of at most ``precision`` digits, written in as few bytes as it needs
    (as fastavro's and Java's writers do) or in a wider ``fixed``, reads as fastavro's own
    reader reads it: same digits, same exponent."""
    precision = data.draw(st.integers(1, 40), label="precision")
    scale = data.draw(st.integers(0, precision), label="scale")
    edge = 10**precision - 1
    unscaled = data.draw(st.integers(-edge, edge) | st.sampled_from([edge, -edge, 0, -1]))
    width = max(1, (unscaled.bit_length() + 8) // 8)
    assert width <= max_decimal_bytes(precision)
    as_bytes = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    as_fixed = {**as_bytes, "type": "fixed", "name": "F", "size": max_decimal_bytes(precision) + 3}
    for schema, size in ((as_bytes, width), (as_fixed, as_fixed["size"])):
        raw = unscaled.to_bytes(size, "big", signed=True)
        ours = read_decimal(raw, schema)
        theirs = fastavro_logical_readers.read_decimal(raw, schema)
        assert (str(ours), ours.as_tuple()) == (str(theirs), theirs.as_tuple())


def test_fastavro_reads_decimals_with_the_strict_reader() -> None:
    schema = {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}
    value = encode_plain(schema, Decimal("99.99"))
    assert fastavro.schemaless_reader(io.BytesIO(value), fastavro.parse_schema(schema), None) == (
        Decimal("99.99")
    )
    too_many_digits = _avro_long(2) + (10_000).to_bytes(2, "big", signed=True)
    with pytest.raises(ValueError, match="more than 4 digits"):
        fastavro.schemaless_reader(io.BytesIO(too_many_digits), fastavro.parse_schema(schema), None)


@pytest.mark.parametrize("millis", [1 << 62, -(1 << 62), 253402300800000])
def test_a_timestamp_out_of_the_range_of_dates_says_so(
    plain_decoder: Decoder, reader_schema: Any, make_record: Factory, millis: int
) -> None:
    """fastavro's message was "OverflowError: Python int too large to convert to C int"."""
    record = make_record()
    written = _avro_long(int(record["performedAt"].timestamp() * 1000))
    value = encode_plain(reader_schema, record)
    assert value.count(written) == 1
    error = assert_decode_error(
        plain_decoder, value.replace(written, _avro_long(millis)), "invalid_timestamp"
    )
    assert f"timestamp-millis {millis} is out of the range of dates" in error.detail


def test_the_last_millisecond_of_year_9999_still_decodes(
    plain_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    last = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    record = make_record(performedAt=last)
    assert plain_decoder.decode(encode_plain(reader_schema, record)) == record


# --- Enums: an index is read from 0, never from the end ---------------------------------------


def enums_as_ints(schema: Any) -> tuple[Any, dict[str, list[str]]]:
    """The schema with each enum field an ``int`` (the same bytes on the wire: an enum is written
    as the zig-zag int of its index), and each such field's symbols."""
    as_ints = copy.deepcopy(schema)
    symbols: dict[str, list[str]] = {}
    for field in as_ints["fields"]:
        if isinstance(field["type"], dict) and field["type"]["type"] == "enum":
            symbols[field["name"]] = field["type"]["symbols"]
            field["type"] = "int"
    return as_ints, symbols


@pytest.mark.parametrize("writer", ["the reader schema", "version 1 (resolved)"])
def test_an_enum_index_outside_its_symbols_is_corrupt_not_read_from_the_end(
    confluent_decoder: Decoder,
    reader_schema: Any,
    v1_schema: Any,
    make_record: Factory,
    writer: str,
) -> None:
    """fastavro reads ``symbols[index]``: a status written as -2 (one bit away from FAILED's 1)
    was read as SUCCEEDED, -1 as FAILED. Every index of every enum of the schema, a few past
    each end and the extremes of an int: within the symbols it reads as its symbol, outside
    it is ``corrupt`` naming the enum and the index."""
    schema, schema_id = (reader_schema, 1) if writer == "the reader schema" else (v1_schema, 2)
    as_ints, enums = enums_as_ints(schema)
    assert set(enums) == {"status", "method"}
    record = make_record()
    if schema is v1_schema:
        del record["merchantReference"]
    record.update({field: symbols.index(record[field]) for field, symbols in enums.items()})
    for field, symbols in enums.items():
        count = len(symbols)
        for index in [*range(-count - 2, count + 2), 2**31 - 1, -(2**31)]:
            value = encode_confluent(schema_id, as_ints, {**record, field: index})
            if 0 <= index < count:
                assert confluent_decoder.decode(value)[field] == symbols[index]
                continue
            error = assert_decode_error(confluent_decoder, value, "corrupt")
            name = "payments.transactions." + (
                "TransactionStatus" if field == "status" else "PaymentMethod"
            )
            assert f"enum {name} index {index}: not one of its {count} symbols" in error.detail


def test_enum_indexes_are_checked_in_every_enum_of_a_writer_schema() -> None:
    """Nested, referred to by name, inside a union, an array and a map: each is checked."""
    status = {"type": "enum", "name": "Status", "symbols": ["A", "B"]}
    schema = {
        "type": "record",
        "name": "Outer",
        "fields": [
            {"name": "first", "type": status},
            {"name": "again", "type": "Status"},
            {"name": "maybe", "type": ["null", "Status"]},
            {"name": "many", "type": {"type": "array", "items": "Status"}},
            {"name": "keyed", "type": {"type": "map", "values": "Status"}},
        ],
    }
    decoder = Decoder(schema)
    # (each field's bytes: an index 1 of a union, a block of one item or one key "k", then 0)
    good = [b"\x00", b"\x02", b"\x02\x00", b"\x02\x00\x00", b"\x02\x02k\x02\x00"]
    bad = [b"\x03", b"\x03", b"\x02\x03", b"\x02\x03\x00", b"\x02\x02k\x03\x00"]
    assert decoder.decode(b"".join(good)) == {
        "first": "A",
        "again": "B",
        "maybe": "A",
        "many": ["A"],
        "keyed": {"k": "B"},
    }
    for place in range(len(good)):
        value = b"".join([*good[:place], bad[place], *good[place + 1 :]])
        error = assert_decode_error(decoder, value, "corrupt")
        assert "enum Status index -2" in error.detail, place


def test_a_confluent_record_read_without_a_registry_says_which_framing_it_looks_like(
    plain_decoder: Decoder, reader_schema: Any, make_record: Factory
) -> None:
    value = encode_confluent(7, reader_schema, make_record())
    error = assert_decode_error(plain_decoder, value, "corrupt")
    assert error.detail.startswith("plain Avro record (payments.transactions.TransactionOutcome)")
    assert error.detail.endswith(
        "(the value starts like the Confluent wire format, schema id 7, which only "
        "schemas.mode registry reads)"
    )


# --- Writer schemas fastavro cannot read safely ------------------------------------------------

NODE_SCHEMA = {
    "type": "record",
    "name": "Node",
    "fields": [{"name": "next", "type": ["null", "Node"]}],
}
RECURSIVE_SCHEMAS: dict[str, tuple[Any, str]] = {
    "linked list": (NODE_SCHEMA, "field Node.next refers to Node, a type that contains it"),
    "through a map": (
        {
            "type": "record",
            "name": "Tree",
            "fields": [{"name": "children", "type": {"type": "map", "values": "Tree"}}],
        },
        "field Tree.children refers to Tree",
    ),
    "through an array": (
        {
            "type": "record",
            "name": "Tree",
            "fields": [{"name": "kids", "type": {"type": "array", "items": "Tree"}}],
        },
        "field Tree.kids refers to Tree",
    ),
    "through another record, by its full name": (
        {
            "type": "record",
            "name": "A",
            "namespace": "one",
            "fields": [
                {
                    "name": "b",
                    "type": {
                        "type": "record",
                        "name": "B",
                        "namespace": "two",
                        "fields": [{"name": "back", "type": ["null", "one.A"]}],
                    },
                }
            ],
        },
        "field two.B.back refers to one.A, a type that contains it",
    ),
}
EMPTY_RECORD = {"type": "record", "name": "Empty", "fields": []}
ZERO_SIZE_ARRAYS: dict[str, tuple[Any, str]] = {
    "of null": ("null", "null"),
    "of null with attributes": ({"type": "null"}, "null"),
    "of a record without fields": (EMPTY_RECORD, "Empty"),
    "of a fixed of size 0": ({"type": "fixed", "name": "Nothing", "size": 0}, "Nothing"),
    "of a record of records of null": (
        {
            "type": "record",
            "name": "Outer",
            "fields": [
                {"name": "a", "type": "null"},
                {"name": "inner", "type": EMPTY_RECORD},
                {"name": "again", "type": "Empty"},
            ],
        },
        "Outer",
    ),
}


def holding(field_type: Any) -> dict[str, Any]:
    """A record schema with one field of ``field_type``, named ``pad``."""
    return {"type": "record", "name": "Holder", "fields": [{"name": "pad", "type": field_type}]}


@pytest.mark.parametrize("kind", sorted(RECURSIVE_SCHEMAS))
def test_a_recursive_writer_schema_is_refused(kind: str) -> None:
    schema, why = RECURSIVE_SCHEMAS[kind]
    with pytest.raises(UnsupportedWriterSchema, match="recursive types are not read") as caught:
        check_writer_schema(fastavro.parse_schema(schema))
    assert why in str(caught.value)


@pytest.mark.parametrize("kind", sorted(ZERO_SIZE_ARRAYS))
def test_an_array_of_items_that_take_no_bytes_is_refused(kind: str) -> None:
    items, _ = ZERO_SIZE_ARRAYS[kind]
    schema = fastavro.parse_schema(holding({"type": "array", "items": items}))
    with pytest.raises(UnsupportedWriterSchema) as caught:
        check_writer_schema(schema)
    assert str(caught.value).startswith(
        "field Holder.pad is an array of items that take no bytes"
    ), caught.value


@pytest.mark.parametrize(
    "field_type",
    [
        {"type": "map", "values": "null"},  # each key takes a byte at least
        {"type": "array", "items": ["null"]},  # the branch index takes a byte
        {"type": "array", "items": {"type": "array", "items": "int"}},
        {"type": "array", "items": {"type": "enum", "name": "One", "symbols": ["ONLY"]}},
        {"type": "array", "items": {"type": "fixed", "name": "Byte", "size": 1}},
        {"type": "array", "items": {**holding(["null", "int"]), "name": "Inner"}},
        ["null", {"type": "record", "name": "Leaf", "fields": []}, "Leaf"],
    ],
)
def test_writer_schemas_that_read_safely_are_kept(field_type: Any) -> None:
    check_writer_schema(fastavro.parse_schema(holding(field_type)))


def test_records_of_a_recursive_registry_schema_are_refused_not_read(
    reader_schema: Any, make_schema_source: Any, make_record: Factory
) -> None:
    """The review's shapes: the transaction schema with an optional linked list, a record nested
    in it 50,000 deep (fastavro's reader crashed the process: SIGSEGV), and a list alone."""
    with_chain = copy.deepcopy(reader_schema)
    with_chain["fields"].append({"name": "chain", "type": ["null", NODE_SCHEMA], "default": None})
    source = make_schema_source({4: with_chain, 6: NODE_SCHEMA})
    decoder = Decoder(reader_schema, registry=source)
    chain = b"\x02" * 50_000 + b"\x00"
    value = encode_confluent(4, reader_schema, make_record()) + chain
    error = assert_decode_error(decoder, value, "unsupported_writer_schema")
    assert "schema id 4: field payments.transactions.Node.next refers to" in error.detail
    assert_decode_error(decoder, b"\x00\x00\x00\x00\x06" + chain, "unsupported_writer_schema")


def test_records_of_an_array_of_nulls_are_refused_not_read_for_ever(
    reader_schema: Any, make_schema_source: Any, make_record: Factory
) -> None:
    """The review's shape: a field array<null> declaring 2^62 items (the decoder never ended)."""
    with_pad = copy.deepcopy(reader_schema)
    pad = {"name": "pad", "type": {"type": "array", "items": "null"}, "default": []}
    with_pad["fields"].append(pad)
    decoder = Decoder(reader_schema, registry=make_schema_source({3: with_pad}))
    value = encode_confluent(3, reader_schema, make_record()) + _avro_long(1 << 62) + b"\x00"
    error = assert_decode_error(decoder, value, "unsupported_writer_schema")
    assert "field payments.transactions.TransactionOutcome.pad is an array" in error.detail


@pytest.mark.parametrize("place", ["plain writer", "known"])
def test_a_decoder_is_not_built_with_a_writer_schema_it_cannot_read_safely(
    reader_schema: Any, place: str
) -> None:
    schema = holding({"type": "array", "items": "null"})
    with pytest.raises(DecodeError) as caught:
        if place == "plain writer":
            Decoder(reader_schema, plain_writer_schema=schema)
        else:
            Decoder(reader_schema, known_writer_schemas=[NODE_SCHEMA])
    assert caught.value.reason == "unsupported_writer_schema"


# --- Fuzzing: only DecodeError ever escapes ----------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_targets(schema_dir: Path, schema_source: Any) -> list[Decoder]:
    return [
        Decoder.from_schema_dir(schema_dir, registry=schema_source),
        Decoder.from_schema_dir(schema_dir),
    ]


def decodes_or_refuses(decoders: list[Decoder], value: bytes) -> None:
    """Each decoder returns a record dict or raises DecodeError carrying the bytes, nothing else."""
    for decoder in decoders:
        try:
            record = decoder.decode(value)
        except DecodeError as error:
            assert error.raw == value
            assert error.reason and error.detail
        else:
            assert isinstance(record, dict)


@given(value=st.binary(max_size=300))
def test_random_bytes_raise_only_decode_error(fuzz_targets: list[Decoder], value: bytes) -> None:
    decodes_or_refuses(fuzz_targets, value)


@given(
    header=st.sampled_from([b"\x00\x00\x00\x00\x01", b"\x00\x00\x00\x00\x02", b""]),
    body=st.binary(max_size=300),
)
def test_random_avro_bodies_raise_only_decode_error(
    fuzz_targets: list[Decoder], header: bytes, body: bytes
) -> None:
    decodes_or_refuses(fuzz_targets, header + body)


@given(data=st.data())
def test_mutated_records_raise_only_decode_error(
    fuzz_targets: list[Decoder], reader_schema: Any, make_record: Factory, data: st.DataObject
) -> None:
    value = bytearray(encode_confluent(1, reader_schema, make_record(stateData='{"k":[1]}')))
    for _ in range(data.draw(st.integers(1, 4))):
        value[data.draw(st.integers(0, len(value) - 1))] = data.draw(st.integers(0, 255))
    decodes_or_refuses(fuzz_targets, bytes(value))


# --- Schema files that cannot be read -----------------------------------------------------------


def _nested_array(depth: int) -> str:
    text = '"int"'
    for _ in range(depth):
        text = '{"type": "array", "items": ' + text + "}"
    return text


BAD_SCHEMA_FILES: dict[str, tuple[Callable[[Path], object], str]] = {
    "fifo": (lambda path: make_special(path, "fifo"), NOT_REGULAR["fifo"]),
    "device": (lambda path: make_special(path, "device"), NOT_REGULAR["device"]),
    "directory": (lambda path: make_special(path, "directory"), NOT_REGULAR["directory"]),
    "sparse": (
        lambda path: make_sparse(path, 1 << 40),
        f"too large (more than {SCHEMA_FILE_LIMIT:,} bytes)",
    ),
    "latin-1": (lambda path: path.write_bytes('"caf\xe9"'.encode("latin-1")), "not UTF-8 text"),
    "cut short": (lambda path: path.write_text('{"type": '), "not JSON: Expecting value (line 1"),
    "deep JSON": (lambda path: path.write_text("[" * 100_000), "nested too deeply"),
    "unknown type": (
        lambda path: path.write_text(
            '{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}'
        ),
        "not a valid Avro schema: UnknownType: nope",
    ),
    "fixed without size": (
        lambda path: path.write_text('{"type": "fixed", "name": "F"}'),
        "not a valid Avro schema: KeyError",
    ),
    "number": (lambda path: path.write_text("12"), "not a valid Avro schema"),
    "recursive": (
        lambda path: path.write_text(json.dumps(NODE_SCHEMA)),
        "unsupported writer schema: field Node.next refers to Node",
    ),
    "array of nulls": (
        lambda path: path.write_text(json.dumps(holding({"type": "array", "items": "null"}))),
        "unsupported writer schema: field Holder.pad is an array of items that take no bytes",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_SCHEMA_FILES))
@pytest.mark.parametrize("place", ["known", "reader", "plain writer"])
def test_a_schema_file_that_cannot_be_read_is_named_with_why_and_nothing_waits(
    kind: str, place: str, schema_dir: Path, tmp_path: Path
) -> None:
    """Whatever an ``.avsc`` file is (a FIFO whose plain open() waits for ever, an endless
    device, a terabyte, not UTF-8, not JSON, too deep, not Avro), building the decoder raises
    SchemaFilesError naming the file and why, and reads no further than the bound."""
    directory = tmp_path / "schemas"
    directory.mkdir()
    reader = schema_dir / READER_SCHEMA_FILE
    (directory / READER_SCHEMA_FILE).write_bytes(reader.read_bytes())
    make, why = BAD_SCHEMA_FILES[kind]
    target = {
        "known": directory / "bad.avsc",
        "reader": directory / READER_SCHEMA_FILE,
        "plain writer": tmp_path / "writer.avsc",
    }[place]
    if target.exists():
        target.unlink()
    make(target)
    plain = target if place == "plain writer" else None
    with pytest.raises(SchemaFilesError) as caught:
        Decoder.from_schema_dir(directory, plain_writer_schema_file=plain)
    (problem,) = caught.value.problems
    assert problem.startswith(f"{target}: ") and why in problem, problem


def test_every_bad_schema_file_is_named_once(schema_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    directory.mkdir()
    (directory / READER_SCHEMA_FILE).write_text("{")
    (directory / "b.avsc").write_text("[")
    (directory / "deep.avsc").write_text(_nested_array(900))  # deep, and valid
    with pytest.raises(SchemaFilesError) as caught:
        Decoder.from_schema_dir(directory)
    assert [problem.split(":")[0] for problem in caught.value.problems] == [
        str(directory / READER_SCHEMA_FILE),
        str(directory / "b.avsc"),
    ]


def test_a_decimal_of_a_precision_past_the_bound_is_refused_at_once() -> None:
    """A writer schema's decimal may be a ``fixed`` as wide as the record, with any precision:
    past MAX_DECIMAL_PRECISION digits it is refused before any conversion."""
    import time

    from bridge.codec.decoding import MAX_DECIMAL_PRECISION, ValueRefused, read_decimal

    wide = {"type": "fixed", "size": 400_000, "precision": 1_000_000, "scale": 2}
    started = time.process_time()
    with pytest.raises(ValueRefused, match=f"over the {MAX_DECIMAL_PRECISION} digits"):
        read_decimal(b"\x7f" * 400_000, wide)
    assert time.process_time() - started < 0.5
    edge = {"type": "fixed", "size": 416, "precision": MAX_DECIMAL_PRECISION, "scale": 0}
    assert read_decimal((10**999).to_bytes(416, "big", signed=True), edge) == 10**999


# --- What fastavro reads that the reader schema does not say ------------------------------------


def with_money(schema: Any, precision: int, scale: int) -> Any:
    """The schema with ``amount`` and ``fees`` decimals of this precision and scale."""
    changed = copy.deepcopy(schema)
    for field in changed["fields"]:
        if field["name"] in ("amount", "fees"):
            field["type"] = {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": precision,
                "scale": scale,
            }
    return changed


@pytest.mark.parametrize("name", ["a_first.avsc", "transaction_outcome.v3.avsc"])
def test_schema_files_that_share_a_fingerprint_but_differ_are_refused(
    schema_dir: Path, tmp_path: Path, reader_schema: Any, make_record: Factory, name: str
) -> None:
    """The single-object fingerprint leaves out logicalType, precision and scale: a copy of the
    reader schema with money at scale 2 had its fingerprint, and whichever file sorted last read
    every record (1500.25 written, 15002500 delivered). Such files are refused, naming both;
    a copy that differs only in docs is kept."""
    directory = tmp_path / "schemas"
    directory.mkdir()
    for path in schema_dir.glob("*.avsc"):
        (directory / path.name).write_text(path.read_text())
    scale_two = with_money(reader_schema, 24, 2)
    assert single_object_fingerprint(scale_two) == single_object_fingerprint(reader_schema)
    (directory / name).write_text(json.dumps(scale_two))
    with pytest.raises(SchemaFilesError) as caught:
        Decoder.from_schema_dir(directory)
    (problem,) = caught.value.problems
    assert "same" not in problem and "single-object fingerprint" in problem
    assert {READER_SCHEMA_FILE, name} <= {
        part.strip(":").split("/")[-1] for part in problem.split()
    }
    undocumented = {key: value for key, value in reader_schema.items() if key != "doc"}
    (directory / name).write_text(json.dumps(undocumented))
    value = encode_single_object(reader_schema, make_record())
    assert Decoder.from_schema_dir(directory).decode(value) == make_record()


def test_a_writer_schema_with_a_field_twice_is_refused(
    reader_schema: Any, make_schema_source: Any, make_record: Factory
) -> None:
    """fastavro reads both fields and keeps one: a status written FAILED then SUCCEEDED was
    delivered FAILED, an amount written 1500 then 15000000 delivered as 1500."""
    twice = copy.deepcopy(reader_schema)
    amount = next(field for field in twice["fields"] if field["name"] == "amount")
    twice["fields"].append(copy.deepcopy(amount))
    decoder = Decoder(reader_schema, registry=make_schema_source({7: twice}))
    value = b"\x00\x00\x00\x00\x07" + encode_plain(reader_schema, make_record())
    error = assert_decode_error(decoder, value, "unsupported_writer_schema")
    assert "has the field 'amount' twice" in error.detail
    with pytest.raises(UnsupportedWriterSchema, match="field 'amount' twice"):
        check_writer_schema(fastavro.parse_schema(twice))


@pytest.mark.parametrize(
    ("precision", "scale", "amount", "fits"),
    [
        (24, 2, "1500.25", True),  # rescaled: the same value
        (30, 0, str(10**17), True),  # 18 digits before the point: the reader's most
        (30, 0, str(10**18), False),  # 19 digits: the reader's decimal(24, 6) cannot hold it
        (30, 0, str(10**27), False),
        (24, 9, "0.000001000", True),  # more places written, none of them used
        (24, 9, "0.000000001", False),  # a ninth place: the reader's six cannot hold it
        (24, 9, "-0.000000001", False),
    ],
)
def test_a_decimal_from_another_writer_schema_must_be_a_value_of_the_reader_schema(
    reader_schema: Any,
    make_schema_source: Any,
    make_record: Factory,
    precision: int,
    scale: int,
    amount: str,
    fits: bool,
) -> None:
    """A writer's decimal(30, 0) delivered 28 digits and its decimal(24, 9) 0.000000001:
    amounts the schema promised to account holders (decimal(24, 6)) cannot hold."""
    writer = with_money(reader_schema, precision, scale)
    decoder = Decoder(reader_schema, registry=make_schema_source({5: writer}))
    money = {"amount": Decimal(amount), "fees": Decimal(0).scaleb(-scale)}  # (at that scale)
    value = encode_confluent(5, writer, make_record(**money))
    if fits:
        assert decoder.decode(value)["amount"] == Decimal(amount)
        return
    error = assert_decode_error(decoder, value, "invalid_decimal")
    assert (
        f"(written as decimal({precision}, {scale})) is not a value of the reader" in error.detail
    )
