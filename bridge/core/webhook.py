"""The webhook subscription: the domain type that the configuration, signing and delivery share, and
the Secret wrapper that keeps secrets out of reprs, logs and messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

EVENTS: Final = ("transaction.success", "transaction.failed")
"""The events a webhook can choose, as they appear in the notification's ``event`` field."""


SignatureScheme: TypeAlias = Literal["hmac-sha256", "secret"]
"""How ``x-service-secret`` is filled: an HMAC of the body (default), or the secret itself."""


DEFAULT_SIGNATURE: Final[SignatureScheme] = "hmac-sha256"


DEFAULT_TIMEOUT_SECONDS: Final = 10.0


DEFAULT_CONCURRENCY_PER_WEBHOOK: Final = 32


SECRET_HEADER_MIN_LENGTH: Final = 32
"""Least length of a secret sent as is (``signature: secret``): 32 printable ASCII characters."""


class Secret:
    """A secret value; ``repr`` and ``str`` never show it, :meth:`reveal` returns its bytes."""

    __slots__ = ("_value",)

    def __init__(self, value: bytes) -> None:
        self._value = value

    def reveal(self) -> bytes:
        """The secret's bytes, for signing only."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and self._value == other._value

    def __hash__(self) -> int:
        return hash(self._value)


TlsVersion: TypeAlias = Literal["TLSv1.2", "TLSv1.3"]


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """How deliveries to an https receiver set up TLS: a CA file *added* to the system store
    (for receivers behind a private CA), a client certificate and key (receivers that require
    mutual TLS; the key unencrypted), and the least TLS version accepted."""

    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    min_version: TlsVersion = "TLSv1.2"


@dataclass(frozen=True, slots=True)
class Webhook:
    """One subscription: where to send which events of one account holder, and how to sign them.

    ``timeout_seconds`` and ``concurrency`` are resolved: the webhook's own value, else the
    default of the ``delivery`` section.

    ``webhook-signature`` (Standard Webhooks) is keyed by ``standard_webhooks_secret`` (and
    ``previous_standard_webhooks_secret`` during its rotation) when set, else by ``secret`` (and
    ``previous_secret``). With ``signature: secret`` the secret itself is sent, so the loader
    requires a separate ``standard_webhooks_secret``.
    """

    id: str
    account: str
    url: str
    events: frozenset[str]
    secret: Secret
    previous_secret: Secret | None = None
    signature: SignatureScheme = DEFAULT_SIGNATURE
    enabled: bool = True
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    concurrency: int = DEFAULT_CONCURRENCY_PER_WEBHOOK
    standard_webhooks_secret: Secret | None = None
    previous_standard_webhooks_secret: Secret | None = None
    tls: TlsSettings = TlsSettings()
