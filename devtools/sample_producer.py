"""The sample producer (``python -m devtools produce``): random or JSON-described transactions to
Kafka.

Records are encoded as the configuration expects them: plain Avro (``schemas.mode: embedded``) or
Confluent framing after registering the schema (``schemas.mode: registry``).
"""

from __future__ import annotations

import io
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Producer

from bridge.codec.decoding import READER_SCHEMA_FILE
from bridge.codec.encoding import CONFLUENT_MAGIC_BYTE, load_schema_file
from bridge.core.settings import Config
from devtools.samples import make_record, random_record

# JSON field -> keyword of make_record
_JSON_FIELDS = {
    "transactionId": "transaction_id",
    "accountHolderId": "account_holder_id",
    "success": "success",
    "method": "method",
    "provider": "provider",
    "account": "account",
    "amount": "amount",
    "fees": "fees",
    "label": "label",
    "partnerId": "partner_id",
    "performedAt": "performed_at",
    "stateData": "state_data",
    "failureCode": "failure_code",
    "failureMessage": "failure_message",
}


class SampleError(ValueError):
    """A JSON-described transaction is malformed; the message names the line and field."""


def records_from_json(path: Path) -> Iterator[dict[str, Any]]:
    """Records from a JSON array or JSON lines file of transactions (camelCase fields)."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        items = list(enumerate(json.loads(text), start=1))
    else:
        items = [
            (n, json.loads(line)) for n, line in enumerate(text.splitlines(), 1) if line.strip()
        ]
    for number, item in items:
        yield record_from_json(item, f"{path}:{number}")


def record_from_json(item: object, where: str) -> dict[str, Any]:
    """One record from a JSON object; ``status`` may be given as SUCCEEDED/FAILED or ``success``."""
    if not isinstance(item, dict):
        raise SampleError(f"{where}: expected a JSON object, got {type(item).__name__}")
    unknown = set(item) - set(_JSON_FIELDS) - {"status"}
    if unknown:
        raise SampleError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for required in ("transactionId", "accountHolderId"):
        if not isinstance(item.get(required), str):
            raise SampleError(f"{where}: field {required!r} is required (a string)")
    options = {_JSON_FIELDS[k]: v for k, v in item.items() if k in _JSON_FIELDS}
    if "status" in item:
        if item["status"] not in ("SUCCEEDED", "FAILED"):
            raise SampleError(f"{where}: field 'status' must be SUCCEEDED or FAILED")
        options["success"] = item["status"] == "SUCCEEDED"
    if "performed_at" in options:
        try:
            options["performed_at"] = datetime.fromisoformat(
                str(options["performed_at"]).replace("Z", "+00:00")
            )
        except ValueError:
            raise SampleError(f"{where}: field 'performedAt' is not an ISO 8601 time") from None
    if isinstance(options.get("state_data"), dict):
        options["state_data"] = json.dumps(options["state_data"])
    for money in ("amount", "fees"):
        if money in options:
            options[money] = str(options[money])
    try:
        return make_record(
            options.pop("transaction_id"), options.pop("account_holder_id"), **options
        )
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise SampleError(f"{where}: {exc}") from exc


def random_records(count: int, accounts: list[str], seed: int | None) -> Iterator[dict[str, Any]]:
    """``count`` random transactions spread over ``accounts``."""
    rng = random.Random(seed)
    prefix = datetime.now(UTC).strftime("%H%M%S")
    for index in range(count):
        yield random_record(rng, f"tx-{prefix}-{index:05d}", accounts[index % len(accounts)])


def produce(
    config: Config,
    records: Iterable[dict[str, Any]],
    rate: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Produce records to the source topic (at ``rate`` per second if given); returns the count."""
    schema = load_schema_file(config.schemas.directory / READER_SCHEMA_FILE)
    parsed = fastavro.parse_schema(schema)
    prefix = b""
    if config.schemas.mode == "registry":
        from bridge.codec.build import registry_client

        with registry_client(config) as registry:
            schema_id = registry.register(f"{config.topics.source}-value", schema)
        prefix = CONFLUENT_MAGIC_BYTE + schema_id.to_bytes(4, "big")
    producer = Producer({**config.kafka_settings(), "acks": "all", "log_level": 3})
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    started = time.monotonic()
    count = 0
    for count, record in enumerate(records, start=1):
        if rate:
            pause = started + (count - 1) / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        producer.produce(
            config.topics.source,
            value=prefix + buffer.getvalue(),
            key=record["transactionId"].encode(),
            on_delivery=delivered,
        )
        producer.poll(0)
        if progress is not None:
            progress(count)
    left = producer.flush(30)
    if failures or left:
        raise RuntimeError(
            f"{len(failures) + left} record(s) not acknowledged: "
            f"{failures[0] if failures else 'flush timed out'}"
        )
    return count
