"""Varints longer than Avro allows, which fastavro reads as another value.

Avro writes ``int`` and ``long`` values (and the lengths, counts, enum and union indexes) as
zig-zag varints of a 64-bit value: 10 bytes at most. fastavro's compiled reader reads any number
of bytes and shifts each one's seven bits into place with a C shift, which past the 64th bit
wraps around: an 11-byte varint of 5 ending in 0x01 reads as 37, and a ``performedAt`` so
written is delivered 32 ms off what the writer meant, where the Java reader (and the Avro
specification) refuses the record. :func:`first_overlong_varint` finds such a varint by reading
the record again the way fastavro read it, but only when the bytes could hold one: a varint of
11 bytes or more has ten bytes in a row with the high bit set (:data:`MAY_HOLD_ONE`), which an
ordinary record holds only in text or binary data (non-ASCII text, a double's bytes), so the
walk is skipped for almost every record (it costs about as much as fastavro's read).
"""

from __future__ import annotations

import re
from typing import Any, Final

MAX_VARINT_BYTES: Final = 10
"""The longest varint of a 64-bit value (ten groups of seven bits)."""

MAY_HOLD_ONE: Final = re.compile(rb"[\x80-\xff]{%d}" % MAX_VARINT_BYTES)
"""Ten bytes in a row with the high bit set: where an over-long varint's bytes would be."""

_MASK: Final = (1 << 64) - 1
_FIXED_WIDTH: Final = {"null": 0, "boolean": 1, "float": 4, "double": 8}
_VARINT_TYPES: Final = frozenset({"int", "long", "enum"})


class _Overlong(Exception):
    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


def first_overlong_varint(value: bytes, offset: int, schema: Any) -> int | None:
    """Where in ``value`` the first varint longer than :data:`MAX_VARINT_BYTES` starts, read
    from ``offset`` as ``schema`` (fastavro's parsed writer schema, which read the record without
    error), or None when it has none. Bytes that cannot hold one are not walked."""
    if MAY_HOLD_ONE.search(value, offset) is None:
        return None
    try:
        _walk(value, offset, schema, schema.get("__named_schemas", {}))
    except _Overlong as found:
        return found.at
    return None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The zig-zag value of the varint at ``at``, as fastavro has it for one of at most ten
    bytes (the bits past the 64th dropped), and where it ends; _Overlong past ten bytes."""
    n = shift = 0
    end = at
    while True:
        byte = data[end]
        end += 1
        if end - at > MAX_VARINT_BYTES:
            raise _Overlong(at)
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    n &= _MASK
    return (n >> 1) ^ -(n & 1), end


def _walk(data: bytes, at: int, schema: Any, named: dict[str, Any]) -> int:
    """Read one value of ``schema`` at ``at`` as fastavro does; where it ends."""
    while isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):  # a union: its branch's index, then the branch
        index, at = _varint(data, at)
        return _walk(data, at, schema[index], named)
    kind = schema if isinstance(schema, str) else schema["type"]
    if kind in _FIXED_WIDTH:
        return at + _FIXED_WIDTH[kind]
    if kind in _VARINT_TYPES:
        return _varint(data, at)[1]
    if kind in ("bytes", "string"):
        length, at = _varint(data, at)
        return at + length
    if kind == "fixed":
        return at + int(schema["size"])
    if kind in ("record", "error"):
        for field in schema["fields"]:
            at = _walk(data, at, field["type"], named)
        return at
    if kind in ("array", "map"):
        inner = schema["items"] if kind == "array" else schema["values"]
        while True:
            count, at = _varint(data, at)
            if count == 0:
                return at
            if count < 0:  # a block that gives its size in bytes too
                count = -count
                at = _varint(data, at)[1]
            for _ in range(count):
                if kind == "map":
                    length, at = _varint(data, at)
                    at += length
                at = _walk(data, at, inner, named)
    raise ValueError(f"a type fastavro does not read: {kind!r}")  # (it read the record)
