"""Signing: fixed test vectors and interoperability with the Standard Webhooks library.

The expected strings were computed independently of this code, with OpenSSL and coreutils::

    B='{"transactionId":"txn_1","isPaymentSucces":true,"event":"transaction.success"}'
    printf '%s' "$B" | openssl dgst -sha256 -hmac 'test-secret'
    printf 'msg_test.1700000000.%s' "$B" | openssl dgst -sha256 -hmac 'test-secret' -binary | base64
    printf 'msg_test.1700000000.%s' "$B" | openssl dgst -sha256 -hmac 'old-secret' -binary | base64
    KEY=$(printf 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' | base64 -d | xxd -p | tr -d '\\n')
    printf 'msg_test.1700000000.%s' "$B" \\
        | openssl dgst -sha256 -mac HMAC -macopt hexkey:$KEY -binary | base64
    printf '%s' "$B" | openssl dgst -sha256 -hmac 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'
    printf 'msg_test.1700000000.%s' "$B" \\
        | openssl dgst -sha256 -hmac 'legacy-secret-sent-as-is-0123456789' -binary | base64
    printf 'txn_1\\ntransaction.success\\nshop-main' | openssl dgst -sha256 -binary \\
        | head -c 20 | base32 | tr A-Z a-z
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook as StandardWebhook
from standardwebhooks.webhooks import WebhookVerificationError

from bridge import __version__
from bridge.core import signing
from bridge.core.signing import (
    build_headers,
    hmac_sha256,
    message_id,
    standard_webhooks_key,
    standard_webhooks_secrets,
)
from bridge.core.webhook import Secret, SignatureScheme, Webhook

BODY = b'{"transactionId":"txn_1","isPaymentSucces":true,"event":"transaction.success"}'
WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
LEGACY = "legacy-secret-sent-as-is-0123456789"  # a signature: secret webhook's secret
WHSEC_SIGNATURE = "v1,M3Ocb9MCQx9gAgS79NSjquiUzynP1IEuDzHjvLnWoUk="  # keyed by WHSEC's key
OLD_SIGNATURE = "v1,+MtrHrtVRZFni1NUrdore6T/3Tavlwt/lKfBOoJHr2s="  # keyed by b"old-secret"
LEGACY_SIGNATURE = "v1,jsGqhPGMGZsdOuakljapvlgyt0skjEzFgy3OGvNdGT0="  # keyed by LEGACY: never sent


def webhook(
    secret: str,
    previous: str | None = None,
    signature: SignatureScheme = "hmac-sha256",
    standard: str | None = None,
    previous_standard: str | None = None,
) -> Webhook:
    return Webhook(
        id="shop-main",
        account="acct_123",
        url="https://shop.example.com/hooks",
        events=frozenset({"transaction.success"}),
        secret=Secret(secret.encode()),
        previous_secret=None if previous is None else Secret(previous.encode()),
        signature=signature,
        standard_webhooks_secret=None if standard is None else Secret(standard.encode()),
        previous_standard_webhooks_secret=(
            None if previous_standard is None else Secret(previous_standard.encode())
        ),
    )


def test_fixed_vector_raw_secret() -> None:
    headers = build_headers(webhook("test-secret"), "msg_test", 1_700_000_000, BODY)

    assert headers == {
        "Content-Type": "application/json",
        "User-Agent": f"transaction-webhook-bridge/{__version__}",
        "x-service-secret": "671b011470165bb1cfafc931b84010ef11e31bd51f5b2ae3af1f08b9a0340e08",
        "webhook-id": "msg_test",
        "webhook-timestamp": "1700000000",
        "webhook-signature": "v1,cB/i9BoXXm6X6iYTWfo/H6l5fa+l1gO9xuqkeD3+p8k=",
    }


def test_fixed_vector_whsec_secret_keys_standard_webhooks_with_the_decoded_key() -> None:
    headers = build_headers(webhook(WHSEC), "msg_test", 1_700_000_000, BODY)

    assert headers["webhook-signature"] == "v1,M3Ocb9MCQx9gAgS79NSjquiUzynP1IEuDzHjvLnWoUk="
    # x-service-secret is keyed with the secret exactly as configured, prefix included.
    assert (
        headers["x-service-secret"]
        == "53a65d8daa17c1456ac203fe97632ccc490d9538de9b9831b15e476ff5a62705"
    )


def test_fixed_vector_rotation_signs_with_both_secrets_current_first() -> None:
    headers = build_headers(webhook("test-secret", "old-secret"), "msg_test", 1_700_000_000, BODY)

    assert headers["webhook-signature"] == (
        "v1,cB/i9BoXXm6X6iYTWfo/H6l5fa+l1gO9xuqkeD3+p8k= "
        "v1,+MtrHrtVRZFni1NUrdore6T/3Tavlwt/lKfBOoJHr2s="
    )
    assert (
        headers["x-service-secret"]
        == "671b011470165bb1cfafc931b84010ef11e31bd51f5b2ae3af1f08b9a0340e08"
    )


def test_fixed_vector_secret_scheme_keys_standard_webhooks_with_its_own_secret() -> None:
    hook = webhook(LEGACY, signature="secret", standard=WHSEC)
    headers = build_headers(hook, "msg_test", 1_700_000_000, BODY)

    assert headers["x-service-secret"] == LEGACY
    assert headers["webhook-signature"] == WHSEC_SIGNATURE
    assert LEGACY_SIGNATURE not in headers["webhook-signature"]


def test_fixed_vector_secret_scheme_rotates_only_the_standard_webhooks_key() -> None:
    hook = webhook(LEGACY, signature="secret", standard=WHSEC, previous_standard="old-secret")
    headers = build_headers(hook, "msg_test", 1_700_000_000, BODY)

    assert headers["webhook-signature"] == f"{WHSEC_SIGNATURE} {OLD_SIGNATURE}"
    assert headers["x-service-secret"] == LEGACY
    hook = webhook(LEGACY, previous="old-secret", signature="secret", standard=WHSEC)
    headers = build_headers(hook, "msg_test", 1_700_000_000, BODY)
    assert headers["webhook-signature"] == WHSEC_SIGNATURE, "previous_secret signs nothing"


def test_fixed_vector_hmac_scheme_with_a_standard_webhooks_secret() -> None:
    headers = build_headers(
        webhook("test-secret", standard="old-secret"), "msg_test", 1_700_000_000, BODY
    )

    assert headers["webhook-signature"] == OLD_SIGNATURE
    assert (
        headers["x-service-secret"]
        == "671b011470165bb1cfafc931b84010ef11e31bd51f5b2ae3af1f08b9a0340e08"
    )


def test_secret_scheme_without_a_standard_webhooks_secret_is_refused() -> None:
    hook = webhook(LEGACY, signature="secret")
    with pytest.raises(ValueError, match="needs a separate standard_webhooks_secret"):
        build_headers(hook, "msg_test", 1_700_000_000, BODY)
    with pytest.raises(ValueError) as caught:
        standard_webhooks_secrets(hook)
    assert LEGACY not in str(caught.value)


def test_standard_webhooks_secrets_current_first() -> None:
    assert standard_webhooks_secrets(webhook("a", "b")) == (Secret(b"a"), Secret(b"b"))
    assert standard_webhooks_secrets(webhook("a", standard="c")) == (Secret(b"c"),)
    assert standard_webhooks_secrets(webhook("a", standard="c", previous_standard="d")) == (
        Secret(b"c"),
        Secret(b"d"),
    )


def test_standard_webhooks_library_verifies_the_secret_scheme_with_the_standard_secret() -> None:
    now = int(time.time())
    hook = webhook(LEGACY, signature="secret", standard=WHSEC)
    headers = build_headers(hook, "msg_legacy", now, BODY)

    assert StandardWebhook(WHSEC).verify(BODY, headers)["transactionId"] == "txn_1"
    leaked = "whsec_" + base64.b64encode(LEGACY.encode()).decode()
    with pytest.raises(WebhookVerificationError):
        StandardWebhook(leaked).verify(BODY, headers)  # the header's value forges nothing


def test_message_id_fixed_vector_and_stability() -> None:
    assert message_id("txn_1", "transaction.success", "shop-main") == (
        "msg_xbadv7sjltfk2fjeqri6b677od6hr7j2"
    )
    first = message_id("txn_1", "transaction.success", "shop-main")
    assert first == message_id("txn_1", "transaction.success", "shop-main")
    others = {
        message_id("txn_2", "transaction.success", "shop-main"),
        message_id("txn_1", "transaction.failed", "shop-main"),
        message_id("txn_1", "transaction.success", "shop-alerts"),
    }
    assert first not in others
    assert len(others) == 3


def test_standard_webhooks_library_verifies_our_headers() -> None:
    now = int(time.time())
    headers = build_headers(webhook(WHSEC), message_id("t", "transaction.success", "w"), now, BODY)

    assert StandardWebhook(WHSEC).verify(BODY, headers) == {
        "transactionId": "txn_1",
        "isPaymentSucces": True,
        "event": "transaction.success",
    }
    with pytest.raises(WebhookVerificationError):
        StandardWebhook("whsec_" + "A" * 32).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        StandardWebhook(WHSEC).verify(BODY.replace(b"true", b"false"), headers)


def test_standard_webhooks_library_accepts_either_secret_during_rotation() -> None:
    old = "whsec_b2xkLXNlY3JldC1vbGQtc2VjcmV0LW9sZA=="
    now = int(time.time())
    headers = build_headers(webhook(WHSEC, previous=old), "msg_rotation", now, BODY)

    for secret in (WHSEC, old):
        assert StandardWebhook(secret).verify(BODY, headers)["transactionId"] == "txn_1"


def test_x_service_secret_verifies_with_compare_digest() -> None:
    headers = build_headers(webhook("receiver-secret"), "msg_1", int(time.time()), BODY)
    expected = hmac.new(b"receiver-secret", BODY, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-service-secret"], expected)


def test_standard_webhooks_key() -> None:
    assert standard_webhooks_key(b"plain") == b"plain"
    assert standard_webhooks_key(b"whsec_aGVsbG8") == b"hello"  # unpadded base64 is accepted
    for bad in (b"whsec_", b"whsec_%%%"):
        with pytest.raises(ValueError, match="whsec_"):
            standard_webhooks_key(bad)


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)))  # any text that has a UTF-8


@settings(max_examples=300, deadline=None)
@given(_TEXT, st.sampled_from(["transaction.success", "transaction.failed"]), _TEXT)
def test_message_id_is_the_documented_base32_of_the_digest(
    transaction_id: str, event: str, webhook_id: str
) -> None:
    """The table-driven encoding gives exactly RFC 4648 base32 (lowercase, unpadded) of the first
    20 bytes of the SHA-256, as documented, for any input."""
    material = f"{transaction_id}\n{event}\n{webhook_id}"
    digest = hashlib.sha256(material.encode()).digest()[:20]
    expected = "msg_" + base64.b32encode(digest).decode("ascii").lower()
    assert message_id(transaction_id, event, webhook_id) == expected


# ---- HMAC holding the GIL ----------------------------------------------------------------------

GIL_FREE_UPDATE = 2047  # CPython 3.11's hashlib releases the GIL for an update of 2,048 bytes


@given(
    key=st.binary(max_size=200),
    parts=st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.integers(2040, 9000).map(
                lambda n: bytes(range(256)) * (n // 256) + b"x" * (n % 256)
            ),
        ),
        max_size=4,
    ),
)
@settings(max_examples=200, deadline=None)
def test_hmac_sha256_is_the_hmac_of_the_parts_joined(key: bytes, parts: list[bytes]) -> None:
    assert hmac_sha256(key, *parts) == hmac.digest(key, b"".join(parts), "sha256")


class _RecordingMac:
    """Wraps an HMAC object: notes how many bytes each update hands OpenSSL."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.updates: list[int] = []

    def update(self, data: bytes | memoryview) -> None:
        self.updates.append(len(data))
        self.real.update(data)

    def digest(self) -> bytes:
        return self.real.digest()


@pytest.mark.parametrize("size", [0, 400, GIL_FREE_UPDATE, GIL_FREE_UPDATE + 1, 2 * 2048, 70_001])
def test_signing_never_hands_hashlib_an_update_that_releases_the_gil(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """The invariant behind ``hmac_sha256``: no one-shot ``hmac.digest`` (which releases the GIL
    on every call) and no update of 2,048 bytes or more, for any body, so a delivery's two
    signatures never wait for the Kafka client's threads to give the GIL back."""
    body = bytes(size)
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    made: list[_RecordingMac] = []
    real_new = hmac.new

    def recording_new(key: bytes, digestmod: str) -> _RecordingMac:
        made.append(_RecordingMac(real_new(key, digestmod=digestmod)))
        return made[-1]

    monkeypatch.setattr(signing.hmac, "digest", None)  # any call fails the test
    monkeypatch.setattr(signing.hmac, "new", recording_new)
    headers = build_headers(webhook("s3cret"), "msg_1", 1_700_000_000, body)
    assert headers["x-service-secret"] == expected
    assert len(made) == 2  # x-service-secret and webhook-signature
    for mac in made:
        assert sum(mac.updates) >= size and max(mac.updates) <= GIL_FREE_UPDATE, mac.updates
