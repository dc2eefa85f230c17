"""Receiver helper: requests signed by the bridge verify; anything else is refused with a reason."""

from __future__ import annotations

import pytest

from bridge.core.signing import build_headers
from bridge.core.verify import VerificationError, verify
from bridge.core.webhook import Secret, SignatureScheme, Webhook

BODY = b'{"transactionId":"txn_1","isPaymentSucces":false,"event":"transaction.failed"}'
NOW = 1_700_000_000
LEGACY = "legacy-secret-sent-as-is-0123456789"
STANDARD = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def signed(
    secret: str = "receiver-secret",
    previous: str | None = None,
    signature: SignatureScheme = "hmac-sha256",
    timestamp: int = NOW,
    standard: str | None = None,
) -> dict[str, str]:
    webhook = Webhook(
        id="w",
        account="a",
        url="https://x.example",
        events=frozenset({"transaction.failed"}),
        secret=Secret(secret.encode()),
        previous_secret=None if previous is None else Secret(previous.encode()),
        signature=signature,
        standard_webhooks_secret=None if standard is None else Secret(standard.encode()),
    )
    return build_headers(webhook, "msg_1", timestamp, BODY)


def test_valid_request_returns_the_notification() -> None:
    assert verify(signed(), BODY, "receiver-secret", now=NOW) == {
        "transactionId": "txn_1",
        "isPaymentSucces": False,
        "event": "transaction.failed",
    }


def test_header_names_are_case_insensitive_and_secret_may_be_bytes() -> None:
    headers = {name.upper(): value for name, value in signed().items()}
    assert verify(headers, BODY, b"receiver-secret", now=NOW)["transactionId"] == "txn_1"


def test_secret_scheme_checks_webhook_signature_with_the_standard_webhooks_secret() -> None:
    headers = signed(LEGACY, signature="secret", standard=STANDARD)
    assert verify(
        headers, BODY, LEGACY, scheme="secret", standard_webhooks_secret=STANDARD, now=NOW
    )
    assert verify(headers, BODY, LEGACY, scheme="secret", standard_webhooks=False)
    with pytest.raises(VerificationError, match=r"x-service-secret does not match \(hmac-sha256\)"):
        verify(headers, BODY, LEGACY, standard_webhooks_secret=STANDARD, now=NOW)
    # Whoever saw x-service-secret cannot make a webhook-signature the receiver accepts.
    forged = {**headers, "webhook-signature": signed(LEGACY)["webhook-signature"]}
    with pytest.raises(VerificationError, match="no webhook-signature matches"):
        verify(forged, BODY, LEGACY, scheme="secret", standard_webhooks_secret=STANDARD, now=NOW)
    with pytest.raises(VerificationError, match="no webhook-signature matches"):
        verify(headers, BODY, LEGACY, scheme=None, now=NOW)


def test_secret_scheme_needs_the_standard_webhooks_secret() -> None:
    headers = signed(LEGACY, signature="secret", standard=STANDARD)
    with pytest.raises(ValueError, match="standard_webhooks_secret="):
        verify(headers, BODY, LEGACY, scheme="secret", now=NOW)


def test_hmac_scheme_with_a_standard_webhooks_secret() -> None:
    headers = signed(standard=STANDARD)
    assert verify(headers, BODY, "receiver-secret", standard_webhooks_secret=STANDARD, now=NOW)
    standard = STANDARD.encode()
    assert verify(headers, BODY, b"receiver-secret", standard_webhooks_secret=standard, now=NOW)
    with pytest.raises(VerificationError, match="no webhook-signature matches"):
        verify(headers, BODY, "receiver-secret", now=NOW)


def test_rotation_previous_secret_still_verifies_the_standard_signature() -> None:
    headers = signed(secret="new-secret", previous="old-secret")
    assert verify(headers, BODY, "old-secret", scheme=None, now=NOW)
    assert verify(headers, BODY, "new-secret", now=NOW)
    with pytest.raises(VerificationError, match="x-service-secret does not match"):
        verify(headers, BODY, "old-secret", now=NOW)


def test_each_check_can_be_used_alone() -> None:
    only_service = {"x-service-secret": signed()["x-service-secret"]}
    assert verify(only_service, BODY, "receiver-secret", standard_webhooks=False)
    only_standard = {k: v for k, v in signed().items() if k.startswith("webhook-")}
    assert verify(only_standard, BODY, "receiver-secret", scheme=None, now=NOW)
    with pytest.raises(ValueError, match="nothing to verify"):
        verify(only_standard, BODY, "receiver-secret", scheme=None, standard_webhooks=False)


@pytest.mark.parametrize(
    ("headers", "body", "secret", "reason"),
    [
        (signed(), BODY.replace(b"false", b"true "), "receiver-secret", "x-service-secret does"),
        (signed(), BODY, "wrong-secret", "x-service-secret does not match"),
        ({**signed(), "webhook-signature": "v1,AAAA"}, BODY, "receiver-secret", "no webhook-sig"),
        ({**signed(), "webhook-id": "msg_2"}, BODY, "receiver-secret", "no webhook-signature"),
        (signed(timestamp=NOW - 301), BODY, "receiver-secret", "too old"),
        (signed(timestamp=NOW + 301), BODY, "receiver-secret", "in the future"),
        ({**signed(), "webhook-timestamp": "soon"}, BODY, "receiver-secret", "not a whole number"),
        ({"x-service-secret": signed()["x-service-secret"]}, BODY, "receiver-secret", "missing"),
        ({}, BODY, "receiver-secret", "missing header x-service-secret"),
    ],
)
def test_refusals(headers: dict[str, str], body: bytes, secret: str, reason: str) -> None:
    with pytest.raises(VerificationError, match=reason):
        verify(headers, body, secret, now=NOW)


def test_timestamp_within_tolerance_is_accepted() -> None:
    assert verify(signed(timestamp=NOW - 300), BODY, "receiver-secret", now=NOW)
    assert verify(
        signed(timestamp=NOW - 30), BODY, "receiver-secret", tolerance_seconds=60, now=NOW
    )


def test_body_must_be_a_json_object() -> None:
    for body, reason in ((b"[1, 2]", "not a JSON object"), (b"{not json", "not JSON")):
        headers = {"x-service-secret": service_header(body)}
        with pytest.raises(VerificationError, match=reason):
            verify(headers, body, "receiver-secret", standard_webhooks=False)


def service_header(body: bytes) -> str:
    webhook = Webhook("w", "a", "https://x.example", frozenset(), Secret(b"receiver-secret"))
    return build_headers(webhook, "msg_1", NOW, body)["x-service-secret"]
