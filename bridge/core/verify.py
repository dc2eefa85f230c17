"""Receiver helper: verify a delivery from the bridge in a Python web application.

``verify(request.headers, raw_body, "my secret")`` returns the notification as a dict, or raises
:class:`VerificationError` saying why the request must be refused (answer it with a 4xx). Pass the
exact raw body bytes, before any JSON parsing.

A webhook with ``signature: secret`` (or any webhook with a ``standard_webhooks_secret``) has
``webhook-signature`` keyed by its ``standard_webhooks_secret``: pass that one too, e.g.
``verify(headers, raw_body, secret, scheme="secret", standard_webhooks_secret="whsec_...")``.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, Literal

from bridge.core.signing import service_signature, standard_signature, standard_webhooks_key


class VerificationError(Exception):
    """The request does not come from the bridge with this secret, or is stale or malformed."""


def verify(
    headers: Mapping[str, str],
    body: bytes,
    secret: str | bytes,
    *,
    scheme: Literal["hmac-sha256", "secret"] | None = "hmac-sha256",
    standard_webhooks: bool = True,
    standard_webhooks_secret: str | bytes | None = None,
    tolerance_seconds: int = 300,
    now: float | None = None,
) -> dict[str, Any]:
    """Check the request's signatures and timestamp, then return the parsed JSON body.

    ``scheme`` is how the webhook fills ``x-service-secret`` (None: do not check it).
    ``standard_webhooks`` checks ``webhook-signature`` (any of its ``v1`` signatures may match) and
    that ``webhook-timestamp`` is within ``tolerance_seconds`` of ``now`` (default: the clock).
    ``webhook-signature`` is checked with ``standard_webhooks_secret`` when given, else with
    ``secret``; with ``scheme="secret"`` it must be given (the bridge never keys
    ``webhook-signature`` with a secret it sends in a header), else ValueError.
    """
    if scheme is None and not standard_webhooks:
        raise ValueError("nothing to verify: enable scheme or standard_webhooks")
    if scheme == "secret" and standard_webhooks and standard_webhooks_secret is None:
        raise ValueError(
            "with scheme='secret', webhook-signature is keyed by the webhook's "
            "standard_webhooks_secret: pass it as standard_webhooks_secret= "
            "(or standard_webhooks=False)"
        )
    key = _bytes(secret)
    lowered = {name.lower(): value for name, value in headers.items()}
    if scheme is not None:
        _check_service_secret(lowered, body, key, scheme)
    if standard_webhooks:
        standard_key = key if standard_webhooks_secret is None else _bytes(standard_webhooks_secret)
        _check_standard_webhooks(lowered, body, standard_key, tolerance_seconds, now)
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise VerificationError(f"the body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise VerificationError("the body is not a JSON object")
    return payload


def _bytes(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise VerificationError(f"missing header {name}")
    return value


def _check_service_secret(
    headers: Mapping[str, str], body: bytes, secret: bytes, scheme: str
) -> None:
    received = _header(headers, "x-service-secret").encode()
    expected = service_signature(secret, body).encode() if scheme == "hmac-sha256" else secret
    if not hmac.compare_digest(received, expected):
        raise VerificationError(f"x-service-secret does not match ({scheme})")


def _check_standard_webhooks(
    headers: Mapping[str, str], body: bytes, secret: bytes, tolerance: int, now: float | None
) -> None:
    message_id = _header(headers, "webhook-id")
    signatures = _header(headers, "webhook-signature").split()
    try:
        timestamp = int(_header(headers, "webhook-timestamp"))
    except ValueError:
        raise VerificationError("webhook-timestamp is not a whole number of seconds") from None
    age = (time.time() if now is None else now) - timestamp
    if age > tolerance:
        raise VerificationError(f"webhook-timestamp is too old ({age:.0f}s > {tolerance}s)")
    if age < -tolerance:
        raise VerificationError(f"webhook-timestamp is in the future ({-age:.0f}s > {tolerance}s)")
    try:
        key = standard_webhooks_key(secret)
    except ValueError as exc:
        raise VerificationError(f"unusable secret: {exc}") from None
    expected = standard_signature(key, message_id, timestamp, body).encode()
    if not any(hmac.compare_digest(expected, signature.encode()) for signature in signatures):
        raise VerificationError("no webhook-signature matches")
