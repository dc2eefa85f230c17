"""Varints longer than Avro allows are found where they start, whatever value they hold, and a
record carrying one is refused as corrupt by the decoder, in every framing; ordinary records,
non-ASCII text and binary data among them, are never refused. The records are written here by
an encoder of this file's own, which can stretch any one of its varints past ten bytes."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.codec.decoding import Decoder
from bridge.codec.encoding import encode_confluent, encode_plain, encode_single_object
from bridge.codec.varints import MAY_HOLD_ONE, first_overlong_varint
from bridge.core.errors import DecodeError

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "T",
    "namespace": "test",
    "fields": [
        {"name": "text", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "items", "type": {"type": "array", "items": "long"}},
        {"name": "maybe", "type": ["null", "long"]},
        {"name": "tags", "type": {"type": "map", "values": "double"}},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["a", "b", "c"]}},
        {"name": "inner", "type": {"type": "record", "name": "I", "fields": [
            {"name": "blob", "type": "bytes"}, {"name": "again", "type": ["null", "K"]}]}},
    ],
}  # fmt: skip
PARSED = fastavro.parse_schema(SCHEMA)
LONGS = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(codec="utf-8"), max_size=30)  # much of it non-ASCII
RECORDS = st.fixed_dictionaries(
    {
        "text": TEXT,
        "n": LONGS,
        "items": st.lists(LONGS, max_size=5),
        "maybe": st.none() | LONGS,
        "tags": st.dictionaries(TEXT, st.floats(allow_nan=False), max_size=3),
        "kind": st.sampled_from(["a", "b", "c"]),
        "inner": st.fixed_dictionaries(
            {"blob": st.binary(max_size=30), "again": st.none() | st.sampled_from(["a", "c"])}
        ),
    }
)


class Writer:
    """Avro binary of SCHEMA's records, the ``stretch``-th varint (from 0) written in
    ``11 + extra`` bytes: the same value's groups, then groups of zero, the last one ``last``
    (0: the value unchanged for a reader that wraps, 1: a bit 64 or more up)."""

    def __init__(self, stretch: int | None = None, extra: int = 0, last: int = 0) -> None:
        self.out = bytearray()
        self.count = 0  # varints written
        self.stretch, self.extra, self.last = stretch, extra, last
        self.stretched_at: int | None = None

    def varint(self, value: int) -> None:
        zigzag = (value << 1) ^ (value >> 63)
        groups = []
        while True:
            groups.append(zigzag & 0x7F)
            zigzag >>= 7
            if not zigzag:
                break
        if self.count == self.stretch:
            self.stretched_at = len(self.out)
            groups += [0] * (11 + self.extra - len(groups) - 1) + [self.last]
        self.count += 1
        self.out += bytes(g | 0x80 for g in groups[:-1]) + bytes([groups[-1]])

    def data(self, raw: bytes) -> None:
        self.varint(len(raw))
        self.out += raw

    def record(self, r: dict[str, Any]) -> bytes:
        self.data(r["text"].encode())
        self.varint(r["n"])
        if r["items"]:
            self.varint(len(r["items"]))
            for item in r["items"]:
                self.varint(item)
        self.varint(0)
        if r["maybe"] is None:
            self.varint(0)
        else:
            self.varint(1)
            self.varint(r["maybe"])
        if r["tags"]:
            self.varint(-len(r["tags"]))  # a block that gives its size in bytes too
            first = None if self.stretch is None else self.stretch - self.count - 1
            items = Writer(first, self.extra, self.last)  # (its varints come after the size's)
            for key, value in r["tags"].items():
                items.data(key.encode())
                items.out += struct.pack("<d", value)
            self.varint(len(items.out))
            if items.stretched_at is not None:
                self.stretched_at = len(self.out) + items.stretched_at
            self.out += items.out
            self.count += items.count
        self.varint(0)
        self.varint(["a", "b", "c"].index(r["kind"]))
        self.data(r["inner"]["blob"])
        again = r["inner"]["again"]
        self.varint(0 if again is None else 1)
        if again is not None:
            self.varint(["a", "b", "c"].index(again))
        return bytes(self.out)


def read(value: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(value), PARSED, None)


@given(RECORDS)
def test_a_record_of_minimal_varints_has_none_too_long(record: dict[str, Any]) -> None:
    value = Writer().record(record)
    assert read(value) == record  # (the encoder here writes what fastavro reads)
    assert first_overlong_varint(value, 0, PARSED) is None


@given(RECORDS, st.data(), st.integers(0, 5))
def test_any_varint_past_ten_bytes_is_found_where_it_starts(
    record: dict[str, Any], data: st.DataObject, extra: int
) -> None:
    """Stretched with groups of zero, a varint keeps its value for fastavro, which reads the
    record as if nothing were wrong: the Java reader refuses it, and so does the check."""
    count = Writer()
    count.record(record)
    stretch = data.draw(st.integers(0, count.count - 1), label="varint")
    writer = Writer(stretch, extra)
    value = writer.record(record)
    assert read(value) == record
    assert MAY_HOLD_ONE.search(value) is not None
    assert first_overlong_varint(value, 0, PARSED) == writer.stretched_at


def test_a_stretched_varint_whose_last_group_is_past_the_64th_bit_reads_as_another_value() -> None:
    """What fastavro's compiled reader does with one (why the check exists): 5 read as 37."""
    record = {"text": "", "n": 5, "items": [], "maybe": None, "tags": {}, "kind": "a",
              "inner": {"blob": b"", "again": None}}  # fmt: skip
    writer = Writer(stretch=1, last=1)  # the second varint: n
    value = writer.record(record)
    assert read(value)["n"] == 37
    assert first_overlong_varint(value, 0, PARSED) == writer.stretched_at == 1


@pytest.mark.parametrize("text", ["\u4e2d\u6587\u4e2d\u6587", "\u00e9" * 20, "\U0001f600" * 3])
def test_text_and_data_with_the_high_bit_set_are_walked_and_pass(text: str) -> None:
    record = {"text": text, "n": -(2**63), "items": [2**63 - 1], "maybe": -1,
              "tags": {text: -1e308}, "kind": "c",
              "inner": {"blob": b"\xff" * 40, "again": "c"}}  # fmt: skip
    value = Writer().record(record)
    assert MAY_HOLD_ONE.search(value) is not None  # the walk is not skipped
    assert read(value) == record
    assert first_overlong_varint(value, 0, PARSED) is None


def overlong(value: int, last: int) -> bytes:
    """``value`` as a varint of eleven bytes: its groups, then zeros, the last group ``last``."""
    writer = Writer(stretch=0, last=last)
    writer.varint(value)
    return bytes(writer.out)


def minimal(value: int) -> bytes:
    writer = Writer()
    writer.varint(value)
    return bytes(writer.out)


@pytest.mark.parametrize("framing", ["plain", "single-object", "confluent"])
@pytest.mark.parametrize("last", [0, 1])
def test_a_transaction_whose_time_is_written_too_long_is_corrupt(
    reader_schema: Any,
    make_record: Callable[..., dict[str, Any]],
    make_schema_source: Any,
    framing: str,
    last: int,
) -> None:
    """performedAt (the record's last varint but the two null unions after it), written in
    eleven bytes: fastavro read it as the same time, or 32 ms later; the decoder refuses it."""
    record = make_record()
    millis = int(record["performedAt"].timestamp() * 1000)
    encoders: dict[str, Callable[[dict[str, Any]], bytes]] = {
        "plain": lambda r: encode_plain(reader_schema, r),
        "single-object": lambda r: encode_single_object(reader_schema, r),
        "confluent": lambda r: encode_confluent(7, reader_schema, r),
    }
    encode = encoders[framing]
    if framing == "confluent":
        decoder = Decoder(reader_schema, registry=make_schema_source({7: reader_schema}))
    else:
        decoder = Decoder(reader_schema, plain_writer_schema=reader_schema)
    good = encode(record)
    assert good.endswith(minimal(millis) + b"\x00\x00")
    bad = good[: -len(minimal(millis)) - 2] + overlong(millis, last) + b"\x00\x00"
    header = len(good) - len(encode_plain(reader_schema, record))
    fastavro_reads = fastavro.schemaless_reader(
        io.BytesIO(bad[header:]), fastavro.parse_schema(reader_schema), None
    )["performedAt"]
    shift = 2 ** ((11 - 1) * 7 - 64) // 2 if last else 0  # bit 70 wrapped to 6, then zig-zag
    assert fastavro_reads == datetime.fromtimestamp((millis + shift) / 1000, UTC)
    assert decoder.decode(good)["performedAt"] == record["performedAt"]
    with pytest.raises(DecodeError) as caught:
        decoder.decode(bad)
    assert caught.value.reason == "corrupt"
    at = len(good) - len(minimal(millis)) - 2  # (in the whole value, its header included)
    assert f"the varint at byte {at} is longer than the 10 bytes Avro allows" in caught.value.detail
    assert caught.value.raw == bad
