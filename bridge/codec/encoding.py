"""Avro encoders for producers and tests: Confluent wire format, single-object and plain binary.

The bridge itself only decodes; these helpers write exactly the framings that
:class:`bridge.codec.decoding.Decoder` reads, and compute the single-object schema fingerprint.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Final, TypeAlias

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from bridge.files import FileRefused, read_regular_file

AvroSchema: TypeAlias = dict[str, Any] | list[Any] | str
"""An Avro schema as JSON data (a record schema is a dict)."""

CONFLUENT_MAGIC_BYTE = b"\x00"
CONFLUENT_HEADER_SIZE = 5
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
SINGLE_OBJECT_HEADER_SIZE = 10
SCHEMA_FILE_LIMIT: Final = 1024 * 1024
"""The largest ``.avsc`` file read (the transaction schema is about 4 KB)."""


class SchemaFileError(ValueError):
    """An ``.avsc`` file that cannot be read as a schema; the message says why (not which file:
    the caller names it)."""


def load_schema_file(path: Path) -> AvroSchema:
    """Read one ``.avsc`` file as JSON data: a regular file (never a FIFO waited on) of at most
    :data:`SCHEMA_FILE_LIMIT` bytes, UTF-8 JSON; else :class:`SchemaFileError`."""
    try:
        data = read_regular_file(path, SCHEMA_FILE_LIMIT)
    except FileRefused as exc:
        limit = f" (more than {SCHEMA_FILE_LIMIT:,} bytes)" if exc.too_large else ""
        raise SchemaFileError(exc.reason + limit) from None
    try:
        schema: AvroSchema = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SchemaFileError(f"not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise SchemaFileError(f"not JSON: {exc.msg} ({where})") from None
    except RecursionError:
        raise SchemaFileError("not JSON this reader can read: nested too deeply") from None
    return schema


def single_object_fingerprint(schema: AvroSchema) -> bytes:
    """The 8-byte little-endian CRC-64-AVRO fingerprint of the schema's parsing canonical form."""
    # fastavro renders the 64-bit fingerprint as the hex of its little-endian bytes.
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def encode_plain(schema: AvroSchema, record: dict[str, Any]) -> bytes:
    """Plain Avro binary of one record, without any framing."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def encode_confluent(schema_id: int, schema: AvroSchema, record: dict[str, Any]) -> bytes:
    """Confluent wire format: magic byte 0, 4-byte big-endian schema id, Avro binary."""
    return CONFLUENT_MAGIC_BYTE + schema_id.to_bytes(4, "big") + encode_plain(schema, record)


def encode_single_object(schema: AvroSchema, record: dict[str, Any]) -> bytes:
    """Avro single-object encoding: 0xC3 0x01, the schema fingerprint, Avro binary."""
    return SINGLE_OBJECT_MAGIC + single_object_fingerprint(schema) + encode_plain(schema, record)
