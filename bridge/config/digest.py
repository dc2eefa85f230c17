"""Keyed digests of configuration values: equal digests, equal values (secrets included), and
nothing told of a secret, the key being a random one of the watching process
(:mod:`bridge.config.reload`), never written anywhere."""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
from typing import Any

from bridge.core.webhook import Secret, Webhook


def keyed_digest(value: Any, key: bytes) -> bytes:
    """A keyed digest of ``value`` (plain data, dataclasses, sets, Secrets, nested)."""
    canonical = _canonical(value)
    try:  # marshal version 2 has no back-references: equal data, equal bytes (2x repr's speed)
        data = marshal.dumps(canonical, 2)
    except ValueError:  # a type marshal cannot write
        data = repr(canonical).encode()
    return hashlib.blake2b(data, key=key, digest_size=16).digest()


def webhook_digest(webhook: Webhook, key: bytes) -> bytes:
    """A keyed digest of every field of ``webhook`` (secrets included): equal digests, equal
    webhooks."""
    return keyed_digest(webhook, key)


_PLAIN = (str, int, float, bool, type(None))
_FIELDS: dict[type, tuple[str, ...]] = {}


def _canonical(value: Any) -> Any:
    """``value`` as plain, deterministic data (sets sorted, secrets as their bytes)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is Secret:
        return ("secret", value.reveal())
    if kind is frozenset or kind is set:
        return ("set", tuple(sorted(value)))
    if kind is tuple or kind is list:
        return (kind.__name__, tuple([_canonical(item) for item in value]))
    names = _FIELDS.get(kind)
    if names is None:
        if not dataclasses.is_dataclass(value):
            return value
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(value))
    return (kind.__name__, tuple([_canonical(getattr(value, name)) for name in names]))
