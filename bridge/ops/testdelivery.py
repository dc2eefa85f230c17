"""The test delivery of ``bridge test-webhook ID``: one signed request, clearly marked as a test.

The reference promises "a test after creation" but does not show its body. Ours has the shape of
a notification, so a receiver that parses strictly still parses it, with ``event`` set to
``webhook.test`` (never one of the two transaction events, so nothing mistakes it for a payment),
a ``transactionId`` starting with ``test_`` and ``stateData`` ``{"test": true}``. It is signed
exactly like a real delivery.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from bridge.core.mapping import format_timestamp
from bridge.core.settings import Config
from bridge.core.webhook import Webhook
from bridge.http.sender import HttpSender, Outcome, build_request

TEST_EVENT = "webhook.test"


def build_test_body(transaction_id: str, performed_at_ms: int) -> bytes:
    """The body of a test delivery (compact JSON, the notification's field order)."""
    body = {
        "transactionId": transaction_id,
        "isPaymentSucces": True,
        "account": None,
        "label": "Webhook test",
        "method": "WALLET",
        "amount": 0,
        "fees": 0,
        "partnerId": "test",
        "performedAt": format_timestamp(datetime.fromtimestamp(performed_at_ms / 1000, UTC)),
        "stateData": {"test": True},
        "event": TEST_EVENT,
    }
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ProbeResult:
    """What the test delivery got back."""

    message_id: str
    outcome: Outcome


async def send_test_delivery(config: Config, webhook: Webhook) -> ProbeResult:
    """Sign and send one test delivery to ``webhook`` with the configured limits and policy."""
    now_ms = time.time_ns() // 1_000_000
    transaction_id = f"test_{secrets.token_hex(8)}"
    message_id = f"msg_test_{secrets.token_hex(12)}"
    request = build_request(
        webhook, message_id, build_test_body(transaction_id, now_ms), now_ms // 1000
    )
    sender = HttpSender.from_settings(config.delivery)
    try:
        outcome = await sender.send(request, webhook.timeout_seconds)
    finally:
        await sender.close()
    return ProbeResult(message_id, outcome)
