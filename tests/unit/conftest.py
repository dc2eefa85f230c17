"""Shared fixtures for unit tests: the schemas in ``schemas/``, a valid record, a schema source."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from bridge.codec.encoding import AvroSchema, load_schema_file
from bridge.core.errors import DecodeError

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"


class InMemorySchemaSource:
    """A writer-schema source holding fixed ids; unknown ids fail like the registry's 404."""

    def __init__(self, schemas: dict[int, AvroSchema]) -> None:
        self.schemas = dict(schemas)

    def fetch(self, schema_id: int) -> AvroSchema:
        if schema_id not in self.schemas:
            raise DecodeError("unknown_schema_id", f"schema id {schema_id} is not registered")
        return self.schemas[schema_id]


@pytest.fixture(scope="session")
def schema_dir() -> Path:
    return SCHEMA_DIR


@pytest.fixture(scope="session")
def reader_schema() -> AvroSchema:
    return load_schema_file(SCHEMA_DIR / "transaction_outcome.avsc")


@pytest.fixture(scope="session")
def v1_schema() -> AvroSchema:
    return load_schema_file(SCHEMA_DIR / "transaction_outcome.v1.avsc")


@pytest.fixture(scope="session")
def make_record() -> Callable[..., dict[str, Any]]:
    """A factory of valid v2 transaction records; keyword arguments override fields."""

    def make(**overrides: Any) -> dict[str, Any]:
        record: dict[str, Any] = {
            "transactionId": "txn_001",
            "accountHolderId": "ah_1",
            "status": "SUCCEEDED",
            "failureCode": None,
            "failureMessage": None,
            "account": "+221770000001",
            "label": "Invoice 42",
            "method": "MOBILE_MONEY",
            "provider": "orange_money",
            "amount": Decimal("1500.000000"),
            "fees": Decimal("15.000000"),
            "currency": "XOF",
            "partnerId": "partner_7",
            "performedAt": datetime(2026, 3, 14, 9, 26, 53, 589000, tzinfo=UTC),
            "stateData": None,
            "merchantReference": None,
        }
        record.update(overrides)
        return record

    return make


@pytest.fixture(scope="session")
def make_schema_source() -> type[InMemorySchemaSource]:
    """Builds an in-memory schema source from ``{schema_id: schema}``."""
    return InMemorySchemaSource


@pytest.fixture(scope="session")
def schema_source(reader_schema: AvroSchema, v1_schema: AvroSchema) -> InMemorySchemaSource:
    """Schema id 1 is the current schema, id 2 is version 1."""
    return InMemorySchemaSource({1: reader_schema, 2: v1_schema})
