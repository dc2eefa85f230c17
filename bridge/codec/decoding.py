"""Decoding: Kafka record value bytes -> transaction record dict, read with the current schema.

Three framings are read, each resolved against the reader schema (``transaction_outcome.avsc``):

- Confluent wire format: byte 0, 4-byte big-endian schema id, Avro binary; the writer schema comes
  from the schema registry (the only I/O here, on the first sight of an id).
- Avro single-object encoding: 0xC3 0x01, 8-byte CRC-64-AVRO fingerprint, Avro binary; the writer
  schema is the ``.avsc`` file in ``schemas/`` with that fingerprint.
- Plain Avro binary (registry-less mode only): written with the configured writer schema file.

Every failure is a :class:`DecodeError` carrying the raw bytes, except
:class:`RegistryUnavailableError` when the registry cannot answer now.

Importing this module replaces fastavro's readers of the ``decimal`` logical type (entries
``bytes-decimal`` and ``fixed-decimal`` of ``fastavro.read.LOGICAL_READERS``, the dict its compiled
reader looks them up in, for every fastavro reader in the process) with :func:`read_decimal`,
which refuses what fastavro's would round or spend seconds on: fastavro converts any number of
bytes (its int to Decimal conversion is quadratic: 300 KB took 11 s) and rounds the digits beyond
the precision away; and ``long-timestamp-millis`` with :func:`read_timestamp_millis`, fastavro's
own reader saying which value is out of the range of dates (fastavro's says only "Python int too
large to convert to C int").
"""

from __future__ import annotations

import io
import math
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Context, Decimal, Inexact, Rounded
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, cast

import fastavro
from fastavro.read import LOGICAL_READERS, SchemaResolutionError

from bridge.codec.encoding import (
    CONFLUENT_HEADER_SIZE,
    CONFLUENT_MAGIC_BYTE,
    SINGLE_OBJECT_HEADER_SIZE,
    SINGLE_OBJECT_MAGIC,
    AvroSchema,
    SchemaFileError,
    load_schema_file,
    single_object_fingerprint,
)
from bridge.core.errors import DecodeError, printable

READER_SCHEMA_FILE = "transaction_outcome.avsc"
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024


class ValueRefused(ValueError):
    """A logical value its type cannot hold (``reason``: ``invalid_decimal``,
    ``invalid_timestamp``); the message says which bound."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


MAX_DECIMAL_PRECISION = 1000
"""The most digits of a decimal read (the transaction schema's amount has 24): a writer schema's
``fixed`` may be as wide as the record, and converting that many digits is quadratic."""


def max_decimal_bytes(precision: int) -> int:
    """The most bytes a two's-complement unscaled value of ``precision`` digits needs."""
    return math.ceil((precision * math.log2(10) + 1) / 8)


@lru_cache(maxsize=64)
def _decimal_context(precision: int) -> Context:
    """Enough precision for every value of ``precision`` digits; rounding would be an error."""
    return Context(prec=max(precision, 1), traps=[Inexact, Rounded])


@lru_cache(maxsize=64)
def _power_of_ten(exponent: int) -> int:
    return int(10**exponent)


def read_decimal(
    data: bytes, writer_schema: dict[str, Any], reader_schema: object = None
) -> Decimal:
    """The exact Decimal of an Avro ``decimal`` (bytes or fixed), as fastavro's reader gives it for
    a value within the precision; :class:`ValueRefused` for no bytes, more bytes than the
    precision can need (``bytes`` only: a ``fixed`` has the size its schema says) or more digits
    than the precision."""
    refused = "invalid_decimal"
    precision: int = writer_schema["precision"]
    scale: int = writer_schema.get("scale", 0)
    if precision > MAX_DECIMAL_PRECISION:  # (a fixed of a writer schema's size: bound the work)
        raise ValueRefused(
            refused, f"decimal(precision {precision}), over the {MAX_DECIMAL_PRECISION} digits read"
        )
    if not data:
        raise ValueRefused(
            refused, f"decimal(precision {precision}) of 0 bytes (at least 1 is needed)"
        )
    most = max_decimal_bytes(precision)
    if writer_schema["type"] == "bytes" and len(data) > most:
        raise ValueRefused(
            refused,
            f"decimal(precision {precision}) of {len(data):,} bytes, over the {most} that "
            f"{precision} digits can need",
        )
    unscaled = int.from_bytes(data, "big", signed=True)  # linear; only the Decimal is not
    if abs(unscaled) >= _power_of_ten(precision):
        raise ValueRefused(
            refused,
            f"decimal(precision {precision}) with an unscaled value of more than {precision} "
            "digits",
        )
    if isinstance(reader_schema, dict) and reader_schema.get("logicalType") == "decimal":
        _check_fits_reader(unscaled, precision, scale, reader_schema)
    return Decimal(unscaled).scaleb(-scale, _decimal_context(precision))


def _check_fits_reader(
    unscaled: int, precision: int, scale: int, reader_schema: dict[str, Any]
) -> None:
    """:class:`ValueRefused` unless the value (``unscaled`` at the writer's ``scale``) is exactly
    a value of the reader's decimal: a writer's decimal(30, 0) delivered 28 digits, and its
    decimal(24, 9) 0.000000001, amounts the schema the account holders were promised cannot
    hold (a receiver sized to it would round them)."""
    reader_precision, reader_scale = reader_schema["precision"], reader_schema.get("scale", 0)
    if (reader_precision, reader_scale) == (precision, scale):
        return
    shift = reader_scale - scale
    if shift >= 0:
        scaled, exact = unscaled * _power_of_ten(shift), True
    else:
        scaled, left = divmod(unscaled, _power_of_ten(-shift))
        exact = not left
    if not exact or abs(scaled) >= _power_of_ten(reader_precision):
        value = Decimal(unscaled).scaleb(-scale, _decimal_context(precision))
        raise ValueRefused(
            "invalid_decimal",
            f"decimal {value} (written as decimal({precision}, {scale})) is not a value of the "
            f"reader schema's decimal({reader_precision}, {reader_scale})",
        )


_fastavro_timestamp_millis = LOGICAL_READERS["long-timestamp-millis"]


def read_timestamp_millis(
    data: int, writer_schema: object = None, reader_schema: object = None
) -> datetime:
    """fastavro's reading of a ``timestamp-millis``; :class:`ValueRefused` naming the value for
    one outside the years 1 to 9999."""
    try:
        return cast(datetime, _fastavro_timestamp_millis(data, writer_schema, reader_schema))
    except OverflowError:
        raise ValueRefused(
            "invalid_timestamp",
            f"timestamp-millis {data} is out of the range of dates (years 1 to 9999)",
        ) from None


LOGICAL_READERS["bytes-decimal"] = read_decimal
LOGICAL_READERS["fixed-decimal"] = read_decimal
LOGICAL_READERS["long-timestamp-millis"] = read_timestamp_millis


class UnsupportedWriterSchema(ValueError):
    """A writer schema whose records fastavro cannot read safely; the message names the shape."""


_Visit = Generator[tuple[object, str], bool | None, bool]


def check_writer_schema(parsed: object) -> None:
    """Refuse (:class:`UnsupportedWriterSchema`) the two shapes of parsed writer schema whose
    records fastavro cannot read safely: a named type that refers to itself (fastavro's compiled
    reader recurses on the C stack for each nested level: a record nested 50,000 deep crashed the
    process) and an array whose items take no bytes (null, fixed of size 0, a record of only
    such fields: a declared count of 2^62 items is read for ever, holding the GIL). A map of
    such values is fine: each key takes a byte at least. One iterative walk: deep schemas too."""
    takes_no_bytes: dict[str, bool] = {}  # named types walked, by full name
    enclosing: set[str] = set()  # named types being walked

    def visit(schema: object, where: str) -> _Visit:
        if isinstance(schema, str):
            if schema in enclosing:
                raise UnsupportedWriterSchema(
                    f"{where} refers to {schema}, a type that contains it: recursive types are "
                    "not read (a record nested in itself 50,000 deep would crash the reader)"
                )
            return takes_no_bytes.get(schema, schema == "null")
        if isinstance(schema, list):  # a union: its branch index takes a byte at least
            for branch in schema:
                yield branch, where
            return False
        assert isinstance(schema, dict)
        kind = schema["type"]
        if kind in ("record", "error"):
            name = schema["name"]
            names = [field["name"] for field in schema["fields"]]
            if len(set(names)) != len(names):
                twice = next(field for field in names if names.count(field) > 1)
                raise UnsupportedWriterSchema(
                    f"record {name} has the field {twice!r} twice: fastavro would read both "
                    "and keep one of them"
                )
            enclosing.add(name)
            empty = True
            for field in schema["fields"]:
                empty = bool((yield field["type"], f"field {name}.{field['name']}")) and empty
            enclosing.discard(name)
            takes_no_bytes[name] = empty
            return empty
        if kind == "array":
            if (yield schema["items"], where):
                raise UnsupportedWriterSchema(
                    f"{where} is an array of items that take no bytes: arrays of those are not "
                    "read (a count of 2^62 of them would be read for ever)"
                )
            return False
        if kind == "map":
            yield schema["values"], where
            return False
        if kind in ("fixed", "enum"):
            empty = kind == "fixed" and bool(schema["size"] == 0)
            takes_no_bytes[schema["name"]] = empty
            return empty
        return bool((yield kind, where))  # a primitive type with attributes (logicalType...)

    stack = [visit(parsed, "the writer schema")]
    answer: bool | None = None
    while stack:
        try:
            inner = stack[-1].send(answer)
        except StopIteration as finished:
            stack.pop()
            answer = finished.value
        else:
            stack.append(visit(*inner))
            answer = None


class EnumSymbols(dict[int, str]):
    """An enum's symbols in a parsed writer schema, by index, the way the Avro specification
    allows: from 0 to the count less one. fastavro's compiled reader gives the index it read to
    ``symbols[index]``; a Python list takes -1 as its last item, so a status written as -2 (one
    bit away from FAILED's 1) read as SUCCEEDED. A dict is asked for the index as read (a list
    subclass is handed it with the list's length already added), and finds a symbol in C."""

    __slots__ = ("name",)

    def __init__(self, name: str, symbols: Iterable[str]) -> None:
        super().__init__(enumerate(symbols))
        self.name = name

    def __missing__(self, index: object) -> str:
        raise ValueRefused(
            "corrupt",
            f"enum {self.name} index {index}: not one of its {len(self)} symbols "
            f"(0 to {len(self) - 1})",
        )

    def __repr__(self) -> str:
        return repr(list(self.values()))


def check_enum_indexes(parsed: object) -> None:
    """Make every enum of a parsed writer schema (the tree and fastavro's ``__named_schemas``)
    refuse an index outside its symbols (:class:`EnumSymbols`) instead of reading a negative one
    from the end. One iterative walk over the schema's dicts and lists, each once."""
    pending = [parsed]
    seen: set[int] = set()
    while pending:
        schema = pending.pop()
        if id(schema) in seen:
            continue
        seen.add(id(schema))
        if isinstance(schema, list):
            pending.extend(schema)
        elif isinstance(schema, dict):
            if schema.get("type") == "enum" and isinstance(schema.get("symbols"), list):
                schema["symbols"] = EnumSymbols(str(schema.get("name")), schema["symbols"])
            pending.extend(
                value
                for key, value in schema.items()
                if key != "default" and isinstance(value, (dict, list))  # (a default is data)
            )


class SchemaFilesError(ValueError):
    """Schema files a decoder cannot be built from: ``problems`` names each file and says why."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class WriterSchemaSource(Protocol):
    """Where Confluent schema ids are looked up: :class:`SchemaRegistryClient` (codec.registry)."""

    def fetch(self, schema_id: int) -> AvroSchema:
        """The writer schema for ``schema_id``; raises DecodeError or RegistryUnavailableError."""
        ...


@dataclass(frozen=True, slots=True)
class _ResolvedReader:
    """A writer schema paired with the reader schema, both parsed once."""

    origin: str
    writer: Any
    reader: Any  # None when the writer schema is the reader schema: no resolution needed

    def read(self, value: bytes, offset: int) -> dict[str, Any]:
        buffer = io.BytesIO(value)
        buffer.seek(offset)
        try:
            record = cast(
                dict[str, Any], fastavro.schemaless_reader(buffer, self.writer, self.reader)
            )
        except SchemaResolutionError as exc:
            message = str(exc)
            reason = "unknown_enum_symbol" if "reader symbol list" in message else "schema_mismatch"
            if message.lower().startswith("schema mismatch"):  # fastavro quotes both schemas whole
                message = "the writer schema does not resolve to the reader schema"
            raise DecodeError(reason, f"{self.origin}: {_shorten(message)}", raw=value) from exc
        except ValueRefused as exc:
            raise DecodeError(exc.reason, f"{self.origin}: {exc}", raw=value) from exc
        except Exception as exc:
            # fastavro reports a short buffer as EOFError, IndexError or ValueError, and garbage as
            # almost anything; a read that stopped at the end of the bytes ran out of them.
            reason = "truncated" if buffer.tell() >= len(value) else "corrupt"
            detail = f"{self.origin}: {type(exc).__name__}: {_shorten(str(exc))}"
            raise DecodeError(reason, detail, raw=value) from exc
        if buffer.tell() != len(value):
            raise DecodeError(
                "trailing_bytes",
                f"{self.origin}: {len(value) - buffer.tell()} byte(s) left after the record",
                raw=value,
            )
        return record


class Decoder:
    """Turns record value bytes into transaction records shaped by the reader schema."""

    def __init__(
        self,
        reader_schema: AvroSchema,
        *,
        registry: WriterSchemaSource | None = None,
        plain_writer_schema: AvroSchema | None = None,
        known_writer_schemas: Iterable[AvroSchema] = (),
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        """Read Confluent framing when ``registry`` is given, plain Avro otherwise.

        ``known_writer_schemas`` are matched by fingerprint for single-object encoding (the reader
        schema always is); ``plain_writer_schema`` (default: the reader schema) reads plain Avro.
        """
        self._reader_schema = reader_schema
        self._parsed_reader = fastavro.parse_schema(reader_schema)
        self._registry = registry
        self._max_record_bytes = max_record_bytes
        self._readers_by_schema_id: dict[int, _ResolvedReader] = {}
        self._readers_by_fingerprint: dict[bytes, _ResolvedReader] = {}
        for schema in (reader_schema, *known_writer_schemas):
            fingerprint = single_object_fingerprint(schema)
            self._readers_by_fingerprint[fingerprint] = self._resolve(
                schema, f"single-object writer schema {fingerprint.hex()}"
            )
        self._plain_reader = self._resolve(
            reader_schema if plain_writer_schema is None else plain_writer_schema,
            "plain Avro record",
        )

    @classmethod
    def from_schema_dir(
        cls,
        schema_dir: Path,
        *,
        registry: WriterSchemaSource | None = None,
        plain_writer_schema_file: Path | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> Decoder:
        """A decoder reading with ``transaction_outcome.avsc`` that knows every ``.avsc`` there.

        Raises :class:`SchemaFilesError` naming every file that is not a readable Avro schema (not
        a regular file, too large, not UTF-8 JSON, not Avro, a shape :func:`check_writer_schema`
        refuses), before any record is read."""
        problems: list[str] = []

        def schema(path: Path) -> AvroSchema:
            try:
                loaded = load_schema_file(path)
                check_writer_schema(fastavro.parse_schema(loaded))
                single_object_fingerprint(loaded)
            except SchemaFileError as exc:
                problems.append(f"{printable(str(path))}: {exc}")
            except UnsupportedWriterSchema as exc:
                problems.append(f"{printable(str(path))}: unsupported writer schema: {exc}")
            except Exception as exc:  # fastavro's errors for a schema are of many types
                why = _shorten(printable(f"{type(exc).__name__}: {exc}"))
                problems.append(f"{printable(str(path))}: not a valid Avro schema: {why}")
            else:
                return loaded
            return "null"  # (a stand-in; the problem is raised below)

        reader = schema(schema_dir / READER_SCHEMA_FILE)
        paths = sorted(schema_dir.glob("*.avsc"))
        known = [schema(path) for path in paths]
        if not problems:
            problems += _same_fingerprint(zip(paths, known, strict=True))
        plain = None if plain_writer_schema_file is None else schema(plain_writer_schema_file)
        if problems:
            raise SchemaFilesError(list(dict.fromkeys(problems)))  # (the reader is in both)
        return cls(
            reader,
            registry=registry,
            plain_writer_schema=plain,
            known_writer_schemas=known,
            max_record_bytes=max_record_bytes,
        )

    def schema_id_to_fetch(self, value: bytes) -> int | None:
        """The Confluent schema id of ``value`` if its writer schema is not loaded yet, else None.

        When it returns an id, run :meth:`decode` off the event loop (it fetches the schema, then
        caches it); otherwise :meth:`decode` does no I/O and is safe to call inline.
        """
        if (
            self._registry is None
            or len(value) < CONFLUENT_HEADER_SIZE
            or len(value) > self._max_record_bytes
            or value[:1] != CONFLUENT_MAGIC_BYTE
        ):
            return None
        schema_id = int.from_bytes(value[1:CONFLUENT_HEADER_SIZE], "big")
        return None if schema_id in self._readers_by_schema_id else schema_id

    def decode(self, value: bytes) -> dict[str, Any]:
        """Decode one record value; raises DecodeError (with ``raw``) for bytes we cannot read."""
        if len(value) > self._max_record_bytes:
            raise DecodeError(
                "oversized",
                f"record value is {len(value)} bytes, over the limit of {self._max_record_bytes}",
                raw=value,
            )
        if not value:
            raise DecodeError("truncated", "record value is empty", raw=value)
        if value[:2] == SINGLE_OBJECT_MAGIC:
            return self._decode_single_object(value)
        if self._registry is None:
            return self._decode_plain(value)
        return self._decode_confluent(value, self._registry)

    def _decode_plain(self, value: bytes) -> dict[str, Any]:
        try:
            return self._plain_reader.read(value, 0)
        except DecodeError as exc:
            if value[:1] != CONFLUENT_MAGIC_BYTE or len(value) < CONFLUENT_HEADER_SIZE:
                raise
            schema_id = int.from_bytes(value[1:CONFLUENT_HEADER_SIZE], "big")
            hint = (
                f" (the value starts like the Confluent wire format, schema id {schema_id}, "
                "which only schemas.mode registry reads)"
            )
            raise DecodeError(exc.reason, exc.detail + hint, raw=value) from exc

    def _decode_single_object(self, value: bytes) -> dict[str, Any]:
        if len(value) < SINGLE_OBJECT_HEADER_SIZE:
            raise DecodeError(
                "truncated",
                f"{len(value)} bytes is too short for a single-object header",
                raw=value,
            )
        fingerprint = value[2:SINGLE_OBJECT_HEADER_SIZE]
        reader = self._readers_by_fingerprint.get(fingerprint)
        if reader is None:
            raise DecodeError(
                "unknown_fingerprint",
                f"no known writer schema has the single-object fingerprint {fingerprint.hex()}",
                raw=value,
            )
        return reader.read(value, SINGLE_OBJECT_HEADER_SIZE)

    def _decode_confluent(self, value: bytes, registry: WriterSchemaSource) -> dict[str, Any]:
        if value[:1] != CONFLUENT_MAGIC_BYTE:
            raise DecodeError(
                "bad_magic_byte",
                f"record value starts with 0x{value[0]:02x}, expected 0x00 (Confluent wire format) "
                "or 0xc3 0x01 (Avro single-object encoding)",
                raw=value,
            )
        if len(value) < CONFLUENT_HEADER_SIZE:
            raise DecodeError(
                "truncated", f"{len(value)} bytes is too short for a Confluent header", raw=value
            )
        schema_id = int.from_bytes(value[1:CONFLUENT_HEADER_SIZE], "big")
        reader = self._readers_by_schema_id.get(schema_id)
        if reader is None:
            try:
                writer_schema = registry.fetch(schema_id)
            except DecodeError as exc:
                raise DecodeError(exc.reason, exc.detail, raw=value) from exc
            reader = self._resolve(writer_schema, f"schema id {schema_id}", raw=value)
            self._readers_by_schema_id[schema_id] = reader
        return reader.read(value, CONFLUENT_HEADER_SIZE)

    def _resolve(
        self, writer_schema: AvroSchema, origin: str, raw: bytes | None = None
    ) -> _ResolvedReader:
        try:
            parsed_writer = fastavro.parse_schema(writer_schema)
        except Exception as exc:
            raise DecodeError(
                "invalid_writer_schema",
                f"{origin} is not a valid Avro schema: {_shorten(str(exc))}",
                raw=raw,
            ) from exc
        try:
            check_writer_schema(parsed_writer)
        except UnsupportedWriterSchema as exc:
            detail = f"{origin}: {printable(_shorten(str(exc)))}"
            raise DecodeError("unsupported_writer_schema", detail, raw=raw) from exc
        check_enum_indexes(parsed_writer)
        same_as_reader = _without_docs(writer_schema) == _without_docs(self._reader_schema)
        reader = None if same_as_reader else self._parsed_reader
        writer_name = parsed_writer.get("name") if isinstance(parsed_writer, dict) else None
        return _ResolvedReader(f"{origin} ({writer_name or parsed_writer})", parsed_writer, reader)


def _same_fingerprint(schemas: Iterable[tuple[Path, AvroSchema]]) -> list[str]:
    """A problem for each schema file whose single-object fingerprint another file has while
    the two differ (beyond docs). The fingerprint is of the Parsing Canonical Form, which leaves
    out ``logicalType``, ``precision`` and ``scale``: a copy of the schema with money at scale 2
    had the reader's fingerprint, and whichever file sorted last read every record with it
    (1500.25 written, 15002500 delivered)."""
    problems: list[str] = []
    first: dict[bytes, tuple[Path, object]] = {}
    for path, schema in schemas:
        fingerprint = single_object_fingerprint(schema)
        stripped = _without_docs(schema)
        seen = first.setdefault(fingerprint, (path, stripped))
        if seen[1] != stripped:
            problems.append(
                f"{printable(str(path))}: has the single-object fingerprint {fingerprint.hex()} "
                f"of {printable(seen[0].name)} but differs from it (the fingerprint leaves out "
                "logicalType, precision and scale), so their records cannot be told apart: "
                "keep one of them"
            )
    return problems


def _without_docs(schema: object) -> object:
    """The schema without ``doc`` attributes, which never change how bytes are read."""
    if isinstance(schema, dict):
        return {key: _without_docs(value) for key, value in schema.items() if key != "doc"}
    if isinstance(schema, list):
        return [_without_docs(item) for item in schema]
    return schema


def _shorten(message: str, limit: int = 300) -> str:
    """A library message cut to a length that stays readable in a dead-letter header."""
    return message if len(message) <= limit else message[: limit - 3] + "..."
