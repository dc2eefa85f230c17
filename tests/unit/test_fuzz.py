"""Fuzzing the bridge's input boundaries: record bytes and configuration files.

Whatever the bytes, decoding plus mapping ends in a notification, a ``DecodeError`` or a
``MappingError`` (each carrying the raw bytes and a reason for the dead letter), never another
exception: a record that could crash the consume loop would stop every partition behind it.
Whatever the file, the configuration loader returns a configuration or a ``ConfigError`` naming
the file, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge.codec.decoding import Decoder
from bridge.codec.encoding import AvroSchema, encode_confluent, encode_plain, encode_single_object
from bridge.config.loader import load_config
from bridge.core.errors import ConfigError, DecodeError, MappingError
from bridge.core.mapping import Notification, to_notification
from bridge.core.settings import Config

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Factory = Callable[..., dict[str, Any]]


# ---- record bytes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def decoders(schema_dir: Path, schema_source: Any) -> list[Decoder]:
    """A registry-less decoder and a Confluent one (ids 1 and 2), both with a 2 KB size limit."""
    return [
        Decoder.from_schema_dir(schema_dir, max_record_bytes=2048),
        Decoder.from_schema_dir(schema_dir, registry=schema_source, max_record_bytes=2048),
    ]


@pytest.fixture(scope="module")
def valid_values(
    reader_schema: AvroSchema, v1_schema: AvroSchema, make_record: Factory
) -> list[bytes]:
    """Valid records in every framing: plain, Confluent (current and v1), single-object."""
    records = [
        make_record(),
        make_record(
            transactionId="txn_ko",
            status="FAILED",
            failureCode="insufficient_funds",
            failureMessage="Not enough money",
            method="CARD",
            provider=None,
            stateData='{"cart": [1, 2], "note": "\\u00e9"}',
            merchantReference="ref-1",
        ),
    ]
    v1_record = {k: v for k, v in records[0].items() if k != "merchantReference"}
    return [
        *(encode_plain(reader_schema, r) for r in records),
        *(encode_confluent(1, reader_schema, r) for r in records),
        encode_confluent(2, v1_schema, v1_record),
        encode_single_object(reader_schema, records[1]),
        encode_single_object(v1_schema, v1_record),
    ]


def notification_or_record_error(decoders: list[Decoder], value: bytes) -> None:
    """Bytes -> notification, or a DecodeError/MappingError carrying the bytes; nothing else."""
    for decoder in decoders:
        try:
            notification = to_notification(decoder.decode(value), value)
        except (DecodeError, MappingError) as error:
            assert error.raw == value, "the error keeps the raw record for the dead letter"
            assert error.reason and error.detail and not error.retriable
        else:
            assert isinstance(notification, Notification)
            assert notification.body.startswith(b'{"transactionId":')


@FUZZ
@given(
    prefix=st.sampled_from(
        [
            b"",
            b"\x00\x00\x00\x00\x01",
            b"\x00\x00\x00\x00\x02",
            b"\x00\xff\xff\xff\xff",
            b"\xc3\x01",
            b"\xc3\x01" + b"\x00" * 8,
        ]
    ),
    body=st.binary(max_size=400),
)
@example(prefix=b"", body=b"\x01" * 40)  # negative lengths
@example(prefix=b"", body=b"\xff" * 11)  # a varint longer than 64 bits
@example(prefix=b"", body=b"x" * 2049)  # over the size limit
def test_random_bytes_become_a_notification_or_a_record_error(
    decoders: list[Decoder], prefix: bytes, body: bytes
) -> None:
    notification_or_record_error(decoders, prefix + body)


@st.composite
def mutated(draw: st.DrawFn, values: list[bytes]) -> bytes:
    """A valid record value with a few bytes flipped, inserted, deleted, cut or repeated."""
    value = bytearray(draw(st.sampled_from(values)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(value)))
        operation = draw(st.sampled_from(["set", "insert", "delete", "cut", "repeat"]))
        if operation == "set" and at < len(value):
            value[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
        elif operation == "insert":
            value[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif operation == "delete":
            del value[at : at + draw(st.integers(1, 8))]
        elif operation == "cut":
            del value[at:]
        else:
            value[at:at] = value[at : at + draw(st.integers(1, 16))]
    return bytes(value)


@FUZZ
@given(data=st.data())
def test_mutated_records_become_a_notification_or_a_record_error(
    decoders: list[Decoder], valid_values: list[bytes], data: st.DataObject
) -> None:
    notification_or_record_error(decoders, data.draw(mutated(valid_values)))


def test_valid_records_of_every_framing_become_notifications(
    decoders: list[Decoder], valid_values: list[bytes]
) -> None:
    """The mutation seeds themselves are good, so the fuzzing above starts from real records."""
    registry_less, confluent = decoders
    for value in valid_values:
        decoder = confluent if value[:1] == b"\x00" else registry_less
        assert isinstance(to_notification(decoder.decode(value), value), Notification)


# ---- configuration files --------------------------------------------------------------------

ENVIRON = {"SHOP_MAIN_SECRET": "s3cret-from-env"}
VOCABULARY = [
    "kafka",
    "schemas",
    "topics",
    "retry",
    "delivery",
    "metrics",
    "logging",
    "webhooks",
    "bootstrap_servers",
    "group_id",
    "properties",
    "mode",
    "directory",
    "max_record_bytes",
    "source",
    "partitions",
    "attempts",
    "first_delay_ms",
    "increment_ms",
    "timeout_seconds",
    "concurrency",
    "allow_private_networks",
    "allowed_networks",
    "id",
    "account",
    "url",
    "events",
    "secret",
    "signature",
    "enabled",
    "port",
    "level",
    "format",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            "",
            "transaction.success",
            "transaction.failed",
            "http://127.0.0.1:1/",
            "https://example.com/hook",
            "ftp://x",
            "${SHOP_MAIN_SECRET}",
            "${MISSING}",
            "10.0.0.0/8",
            "embedded",
            "registry",
            "json",
            "debug",
        ]
    ),
    st.text(max_size=20),
)
FIELD_VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))
FIELDS = st.dictionaries(st.sampled_from(VOCABULARY), FIELD_VALUES, max_size=8)
SHAPED = st.fixed_dictionaries(
    {},
    optional={
        **{section: st.one_of(SCALARS, FIELDS) for section in VOCABULARY[:7]},
        "webhooks": st.one_of(SCALARS, st.lists(FIELDS, max_size=3)),
    },
)
"""Documents shaped like a configuration: known sections holding known fields, odd values."""
DOCUMENTS = st.one_of(
    SHAPED,
    st.recursive(
        SCALARS,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(
                st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=8)), children, max_size=5
            ),
        ),
        max_leaves=30,
    ),
)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one file every fuzzed configuration is written to."""
    return tmp_path_factory.mktemp("fuzz-config") / "bridge.yaml"


def config_or_config_error(path: Path, data: bytes) -> Config | None:
    """Load ``data`` as a configuration file: a Config, or a ConfigError naming the file."""
    path.write_bytes(data)
    try:
        return load_config(path, ENVIRON)
    except ConfigError as error:
        assert error.problems, "a rejected file says what is wrong"
        assert str(path) in str(error), "the message names the file"
        assert ENVIRON["SHOP_MAIN_SECRET"] not in str(error), "secrets never appear in errors"
        return None


@FUZZ
@given(document=DOCUMENTS)
def test_random_yaml_documents_load_or_raise_config_error(config_file: Path, document: Any) -> None:
    text = yaml.safe_dump(document, allow_unicode=True)
    config_or_config_error(config_file, text.encode())


@FUZZ
@given(data=st.binary(max_size=300))
@example(data=b"\xff\xfe not utf-8")
@example(data=b"webhooks: [")
@example(data=b"&a [*a]")
@example(data=b"a: &a\n  b: *a\nwebhooks: *a\n")
def test_random_bytes_load_or_raise_config_error(config_file: Path, data: bytes) -> None:
    config_or_config_error(config_file, data)


@pytest.fixture(scope="module")
def shipped_configs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The texts of the shipped configurations, their secret files present in a temporary folder."""
    secrets = tmp_path_factory.mktemp("secrets")
    for name in ("shop-alerts", "shop-alerts-previous"):
        (secrets / name).write_text(f"secret-{name}\n")
    example = (REPO / "config" / "bridge.example.yaml").read_text()
    return [
        (REPO / "config" / "test.yaml").read_text(),
        example.replace("/var/run/secrets/bridge/", f"{secrets}/"),
    ]


@st.composite
def mutated_config(draw: st.DrawFn, seeds: list[str]) -> str:
    """A shipped configuration with lines deleted, repeated, re-indented or given odd values."""
    lines = draw(st.sampled_from(seeds)).splitlines()
    for _ in range(draw(st.integers(1, 5))):
        at = draw(st.integers(0, len(lines) - 1))
        line = lines[at]
        operation = draw(
            st.sampled_from(["delete", "repeat", "indent", "dedent", "value", "insert", "chars"])
        )
        if operation == "delete":
            del lines[at]
        elif operation == "repeat":
            lines.insert(at, line)
        elif operation == "indent":
            lines[at] = "  " + line
        elif operation == "dedent":
            lines[at] = line[2:]
        elif operation == "value" and ":" in line:
            key = line.split(":", 1)[0]
            value = yaml.safe_dump(draw(SCALARS), default_flow_style=True).splitlines()[0]
            lines[at] = f"{key}: {value}"
        elif operation == "insert":
            lines.insert(at, draw(st.text(max_size=30)))
        else:
            cut = draw(st.integers(0, len(line)))
            lines[at] = line[:cut] + draw(st.text(max_size=4)) + line[cut:]
        if not lines:
            lines = [""]
    return "\n".join(lines) + "\n"


@FUZZ
@given(data=st.data())
def test_mutated_shipped_configs_load_or_raise_config_error(
    config_file: Path, shipped_configs: list[str], data: st.DataObject
) -> None:
    text = data.draw(mutated_config(shipped_configs))
    config_or_config_error(config_file, text.encode("utf-8", "surrogatepass"))


def test_the_mutation_seeds_are_valid(config_file: Path, shipped_configs: list[str]) -> None:
    """The fuzzing above starts from files the loader accepts."""
    for text in shipped_configs:
        assert config_or_config_error(config_file, text.encode()) is not None
