"""Signing: the headers of one delivery request, from secret, message id, timestamp and body.

Every request carries two signatures of the exact body bytes:

* ``x-service-secret``: lowercase hex HMAC-SHA256 of the body, keyed with the secret's bytes exactly
  as configured (a ``whsec_`` prefix included); or, with ``signature: secret``, the secret itself.
* ``webhook-signature`` (Standard Webhooks): ``v1,`` + base64 HMAC-SHA256 of
  ``"{webhook-id}.{webhook-timestamp}." + body``, keyed by the webhook's
  ``standard_webhooks_secret`` when it has one, else by its ``secret``. As the Standard Webhooks
  libraries do, a secret that starts with ``whsec_`` is keyed with the base64-decoded rest; any
  other secret is keyed with its raw bytes. During rotation (``previous_standard_webhooks_secret``,
  or ``previous_secret`` when the secret keys it) the header holds both signatures,
  space-separated, current first; ``x-service-secret`` always uses the current secret.

With ``signature: secret`` the secret itself is in ``x-service-secret``, so it never keys
``webhook-signature`` (anyone who saw the header could forge one): such a webhook must have a
``standard_webhooks_secret``, and :func:`build_headers` refuses one without.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import TYPE_CHECKING, Final

from bridge import __version__

if TYPE_CHECKING:
    from bridge.core.webhook import Secret, Webhook

USER_AGENT: Final = f"transaction-webhook-bridge/{__version__}"
"""The ``User-Agent`` of every delivery."""

_WHSEC_PREFIX: Final = b"whsec_"


def message_id(transaction_id: str, event: str, webhook_id: str) -> str:
    """The ``webhook-id`` of one event for one webhook, the same on every retry and redelivery.

    ``msg_`` + lowercase unpadded base32 of the first 20 bytes of SHA-256 over the UTF-8 of
    ``transaction_id + "\\n" + event + "\\n" + webhook_id`` (32 characters after the prefix).
    """
    material = f"{transaction_id}\n{event}\n{webhook_id}".encode()
    n = int.from_bytes(hashlib.sha256(material).digest()[:20], "big")  # 160 bits: 32 characters
    p = _BASE32_PAIRS  # base64.b32encode is pure Python: this is 3 µs of a delivery's CPU less
    return "".join(
        (
            "msg_",
            p[n >> 150],
            p[(n >> 140) & 1023],
            p[(n >> 130) & 1023],
            p[(n >> 120) & 1023],
            p[(n >> 110) & 1023],
            p[(n >> 100) & 1023],
            p[(n >> 90) & 1023],
            p[(n >> 80) & 1023],
            p[(n >> 70) & 1023],
            p[(n >> 60) & 1023],
            p[(n >> 50) & 1023],
            p[(n >> 40) & 1023],
            p[(n >> 30) & 1023],
            p[(n >> 20) & 1023],
            p[(n >> 10) & 1023],
            p[n & 1023],
        )
    )


_BASE32_PAIRS: Final = tuple(
    a + b for a in "abcdefghijklmnopqrstuvwxyz234567" for b in "abcdefghijklmnopqrstuvwxyz234567"
)
"""The lowercase RFC 4648 base32 of every 10-bit value (two characters), by value."""


def standard_webhooks_key(secret: bytes) -> bytes:
    """The Standard Webhooks HMAC key of a secret: base64-decoded after ``whsec_``, else as is.

    Raises ValueError when a ``whsec_`` secret is not valid base64 or decodes to nothing.
    """
    if not secret.startswith(_WHSEC_PREFIX):
        return secret
    encoded = secret[len(_WHSEC_PREFIX) :]
    try:
        key = base64.b64decode(encoded + b"=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ValueError("the part after 'whsec_' is not valid base64") from None
    if not key:
        raise ValueError("the part after 'whsec_' is empty")
    return key


_GIL_FREE_UPDATE: Final = 2047
"""The most bytes CPython's hashlib (3.11) hashes in one update without releasing the GIL."""


def hmac_sha256(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of the concatenation of ``parts``, computed holding the GIL.

    ``hmac.digest`` releases the GIL around every call, and an update of 2,048 bytes or more
    does too. The thread then has to take it back, and while the Kafka client's threads run
    Python code that can take the 5 ms switch interval: measured beside one busy thread, 5.2 ms
    a call against 3 µs held (docs/PERFORMANCE.md, "Two signatures, two waits for the GIL").
    Both cost the same when no other thread wants the GIL (2.1 and 2.2 µs).
    """
    mac = hmac.new(key, digestmod="sha256")
    for part in parts:
        if len(part) <= _GIL_FREE_UPDATE:
            mac.update(part)
        else:
            view = memoryview(part)
            for start in range(0, len(part), _GIL_FREE_UPDATE):
                mac.update(view[start : start + _GIL_FREE_UPDATE])
    return mac.digest()


def service_signature(secret: bytes, body: bytes) -> str:
    """Default ``x-service-secret``: lowercase hex HMAC-SHA256 of the body, keyed by the secret."""
    return hmac_sha256(secret, body).hex()


def standard_signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """One Standard Webhooks signature: ``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body``."""
    digest = hmac_sha256(key, b"%s.%d." % (message_id.encode(), timestamp), body)
    return "v1," + base64.b64encode(digest).decode("ascii")


def standard_webhooks_secrets(webhook: Webhook) -> tuple[Secret, ...]:
    """The secrets that key ``webhook-signature``, current first.

    ``standard_webhooks_secret`` (and its previous one) when set; else ``secret`` (and
    ``previous_secret``), except with ``signature: secret``, where the secret is sent as is and
    must not key it: ValueError then (the configuration loader never builds such a webhook).
    """
    if webhook.standard_webhooks_secret is not None:
        pair = (webhook.standard_webhooks_secret, webhook.previous_standard_webhooks_secret)
    elif webhook.signature == "secret":
        raise ValueError(
            f"webhook {webhook.id!r}: signature 'secret' sends the secret itself, so "
            "webhook-signature needs a separate standard_webhooks_secret"
        )
    else:
        pair = (webhook.secret, webhook.previous_secret)
    return tuple(each for each in pair if each is not None)


def build_headers(webhook: Webhook, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """All headers of one delivery of ``body`` to ``webhook`` (``timestamp`` in Unix seconds)."""
    secret = webhook.secret.reveal()
    signatures = " ".join(
        standard_signature(standard_webhooks_key(each.reveal()), message_id, timestamp, body)
        for each in standard_webhooks_secrets(webhook)
    )
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "x-service-secret": (
            service_signature(secret, body)
            if webhook.signature == "hmac-sha256"
            else secret.decode("ascii")
        ),
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }
