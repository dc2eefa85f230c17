"""Micro-benchmark of the pure stages on one core: decode, map+serialize, and both together.

``python -m devtools.benchmark_pure [RECORDS]`` prints records per second for each loop. Records are
realistic Confluent-framed values built before timing; only the loops are timed.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from bridge.codec.decoding import READER_SCHEMA_FILE, Decoder
from bridge.codec.encoding import AvroSchema, encode_confluent, load_schema_file
from bridge.core.mapping import to_notification

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
DISTINCT_RECORDS = 1_000
SCHEMA_ID = 1


class _PreloadedSchemas:
    """A writer-schema source that already holds every id, so the loops do no I/O."""

    def __init__(self, schemas: dict[int, AvroSchema]) -> None:
        self._schemas = schemas

    def fetch(self, schema_id: int) -> AvroSchema:
        return self._schemas[schema_id]


def sample_record(index: int) -> dict[str, Any]:
    """A realistic transaction record; every tenth fails, methods and providers rotate."""
    method = ("MOBILE_MONEY", "WALLET", "CARD")[index % 3]
    failed = index % 10 == 0
    return {
        "transactionId": f"txn_01HV{index:012d}",
        "accountHolderId": f"ah_{index % 50:04d}",
        "status": "FAILED" if failed else "SUCCEEDED",
        "failureCode": "processing_error" if failed else None,
        "failureMessage": "processing_error" if failed else None,
        "account": f"+22177{index:07d}" if method != "CARD" else None,
        "label": f"Paiement facture n°{index}",
        "method": method,
        "provider": ("wave", "orange_money", "free_money")[index % 3] if method != "CARD" else None,
        "amount": Decimal(f"{1000 + index * 37}.{index % 100:02d}"),
        "fees": Decimal(f"{(1000 + index * 37) // 100}.5"),
        "currency": "XOF",
        "partnerId": f"partner_{index % 7}",
        "performedAt": datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC) + timedelta(milliseconds=index),
        "stateData": json.dumps({"orderId": f"o-{index}"}) if index % 5 == 0 else None,
        "merchantReference": f"ref-{index}" if index % 2 else None,
    }


def _rate(operation: Callable[[Any], object], inputs: Iterable[Any]) -> float:
    """Records per second of ``operation`` over ``inputs``."""
    count = 0
    started = time.perf_counter()
    for item in inputs:
        operation(item)
        count += 1
    return count / (time.perf_counter() - started)


def run(records: int = 200_000) -> dict[str, float]:
    """Time decode, map+serialize, and decode+map+serialize over ``records`` records each."""
    schema = load_schema_file(SCHEMA_DIR / READER_SCHEMA_FILE)
    decoder = Decoder(schema, registry=_PreloadedSchemas({SCHEMA_ID: schema}))
    values = [
        encode_confluent(SCHEMA_ID, schema, sample_record(index))
        for index in range(DISTINCT_RECORDS)
    ]
    decoded = [decoder.decode(value) for value in values]

    def pipeline(value: bytes) -> object:
        return to_notification(decoder.decode(value), value)

    def repeat(items: list[Any]) -> Iterable[Any]:
        return itertools.islice(itertools.cycle(items), records)

    return {
        "records": records,
        "decode_per_s": _rate(decoder.decode, repeat(values)),
        "map_serialize_per_s": _rate(to_notification, repeat(decoded)),
        "decode_map_serialize_per_s": _rate(pipeline, repeat(values)),
    }


def main(argv: list[str]) -> int:
    """Run the benchmark and print one line per measured loop."""
    results = run(int(argv[0])) if argv else run()
    print(f"records per loop:          {results['records']:>10,.0f}")
    print(f"decode alone:              {results['decode_per_s']:>10,.0f} records/s")
    print(f"map + serialize alone:     {results['map_serialize_per_s']:>10,.0f} records/s")
    print(f"decode + map + serialize:  {results['decode_map_serialize_per_s']:>10,.0f} records/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
