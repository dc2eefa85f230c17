"""Sample transaction records for the sample producer, the demo, the benchmark and the tests."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from bridge.codec.encoding import AvroSchema, encode_plain

METHODS = ("MOBILE_MONEY", "WALLET", "CARD")
PROVIDERS = {
    "MOBILE_MONEY": ("orange_money", "mtn", "wave"),
    "WALLET": ("wallet",),
    "CARD": (None,),
}


def make_record(
    transaction_id: str,
    account_holder_id: str,
    *,
    success: bool = True,
    method: str = "MOBILE_MONEY",
    provider: str | None = "orange_money",
    account: str | None = "+221770000000",
    amount: Decimal | str = "1500.00",
    fees: Decimal | str = "15.00",
    label: str = "Order 42",
    partner_id: str = "partner-1",
    performed_at: datetime | None = None,
    state_data: str | None = None,
    failure_code: str = "processing_error",
    failure_message: str = "processing_error",
) -> dict[str, Any]:
    """One transaction-outcome record (reader-schema shape) with sensible defaults."""
    return {
        "transactionId": transaction_id,
        "accountHolderId": account_holder_id,
        "status": "SUCCEEDED" if success else "FAILED",
        "failureCode": None if success else failure_code,
        "failureMessage": None if success else failure_message,
        "account": account,
        "label": label,
        "method": method,
        "provider": provider,
        "amount": Decimal(amount),
        "fees": Decimal(fees),
        "currency": "XOF",
        "partnerId": partner_id,
        "performedAt": performed_at or datetime.now(UTC),
        "stateData": state_data,
        "merchantReference": None,
    }


def random_record(
    rng: random.Random, transaction_id: str, account_holder_id: str
) -> dict[str, Any]:
    """A plausible random record: mostly successes, every method and provider."""
    method = rng.choice(METHODS)
    return make_record(
        transaction_id,
        account_holder_id,
        success=rng.random() < 0.8,
        method=method,
        provider=rng.choice(PROVIDERS[method]),
        account=f"+2217{rng.randrange(10**8):08d}",
        amount=f"{rng.randrange(100, 500_000)}.{rng.randrange(100):02d}",
        fees=f"{rng.randrange(0, 5_000)}.{rng.randrange(100):02d}",
        label=rng.choice(("Order", "Invoice", "Subscription", "Top-up"))
        + f" {rng.randrange(10_000)}",
    )


def encode_records(schema: AvroSchema, records: list[dict[str, Any]]) -> list[bytes]:
    """Plain Avro values (the registry-less framing) for a list of records."""
    return [encode_plain(schema, record) for record in records]
