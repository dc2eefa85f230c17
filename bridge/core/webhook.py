"""The webhook subscription: the domain type that the configuration, signing and delivery share, and
the Secret wrapper that keeps secrets out of reprs, logs and messages. The fields of
:class:`Webhook` and :class:`TlsSettings` declare the keys of a webhook in the configuration file
(:mod:`bridge.core.keys`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Final, Literal, TypeAlias, final, get_args

from bridge.core.keys import (
    AccountId,
    Boolean,
    Choice,
    Events,
    FilePath,
    Integer,
    Nested,
    Seconds,
    SecretText,
    Url,
    WebhookId,
    declare,
)

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


@final  # (pickled as its constructor's arguments: a subclass would come back as this class)
@dataclass(frozen=True, slots=True)
class TlsSettings:
    """How deliveries to an https receiver set up TLS: a CA file *added* to the system store
    (for receivers behind a private CA), a client certificate and key (receivers that require
    mutual TLS; the key unencrypted), and the least TLS version accepted."""

    ca_file: str | None = field(
        default=None,
        metadata=declare(
            FilePath(),
            "A PEM file of CA certificates **added** to the system store, for receivers behind "
            "a private CA.",
        ),
    )
    client_cert_file: str | None = field(
        default=None,
        metadata=declare(
            FilePath(),
            "Client certificate, for receivers that require mutual TLS; set together with "
            "`tls_client_key_file`.",
        ),
    )
    client_key_file: str | None = field(
        default=None,
        metadata=declare(
            FilePath(), "Its (unencrypted) key; set together with `tls_client_cert_file`."
        ),
    )
    min_version: TlsVersion = field(
        default="TLSv1.2",
        metadata=declare(Choice(get_args(TlsVersion)), "The least TLS version accepted."),
    )

    def __reduce__(self) -> tuple[type[TlsSettings], tuple[Any, ...]]:
        return (TlsSettings, _tls_fields(self))


@final  # (as TlsSettings)
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

    id: str = field(
        metadata=declare(
            WebhookId(),
            "Used in metrics, logs, dead letters and `webhook-id`. Keep it stable: changing it "
            "changes `webhook-id`.",
        )
    )
    account: str = field(
        metadata=declare(
            AccountId(),
            "The account holder (the record's `accountHolderId`). No control characters "
            "(`\\n`, `\\x1b`...), line separators or bidi controls (U+202E, U+2066...): "
            "`bridge check` prints it. Other format characters (ZWNJ, ZWJ, a soft hyphen...) "
            "are taken as written and escaped when printed, but not an id made of them (or "
            "spaces) alone, which nothing would show.",
        )
    )
    url: str = field(
        metadata=declare(
            Url(),
            "The receiving page. No `user:password@`, no `#fragment`; the host is a valid DNS "
            "name (IDNA 2008 / UTS-46, labels of 1 to 63 characters, not ending in a number) or "
            "an IP address (IPv6 in brackets, no zone id), judged after UTS-46 mapping of the "
            "whole host: the full stops U+3002, U+FF0E and U+FF61 are dots (`169.254.169.254` "
            "written with them is that IP address), and `bridge check` shows the host so mapped. "
            "`https://` with `signature: secret`.",
        )
    )
    events: frozenset[str] = field(metadata=declare(Events(), "Only these events are sent."))
    secret: Secret = field(
        metadata=declare(
            SecretText(
                file_help="File holding the secret (one trailing `\\n` or `\\r\\n` ignored; must "
                "not be empty)."
            ),
            "The secret hash. Exactly one of `secret`, `secret_file`. A `whsec_` secret must be "
            "valid base64 after the prefix.",
            default_text="—",
        )
    )
    previous_secret: Secret | None = field(
        default=None,
        metadata=declare(
            SecretText(),
            "Previous secret during a rotation: `webhook-signature` carries both. Not with "
            "`signature: secret` or `standard_webhooks_secret`.",
            type_text="as above",
        ),
    )
    signature: SignatureScheme = field(
        default=DEFAULT_SIGNATURE,
        metadata=declare(
            Choice(get_args(SignatureScheme)),
            "How `x-service-secret` is filled: HMAC of the body, or the secret itself. Secret "
            "mode requires `https://`, at least 32 printable ASCII characters without spaces, "
            "and a `standard_webhooks_secret` ([why](#signature-secret)).",
        ),
    )
    enabled: bool = field(
        default=True,
        metadata=declare(
            Boolean(),
            "`false` keeps it configured but sends nothing; its pending retries are "
            "dead-lettered (`webhook_disabled`).",
        ),
    )
    timeout_seconds: float = field(
        default=DEFAULT_TIMEOUT_SECONDS,
        metadata=declare(
            Seconds(0, 300),
            "Per-webhook request timeout.",
            default_text="`delivery.timeout_seconds`",
        ),
    )
    concurrency: int = field(
        default=DEFAULT_CONCURRENCY_PER_WEBHOOK,
        metadata=declare(
            Integer(1, 10_000),
            "Per-webhook requests in flight, per replica.",
            default_text="`delivery.concurrency_per_webhook`",
        ),
    )
    standard_webhooks_secret: Secret | None = field(
        default=None,
        metadata=declare(
            SecretText(),
            "Key of `webhook-signature` instead of the secret; must differ from it. Required "
            "with `signature: secret`.",
            type_text="as `secret` (`whsec_…` or raw)",
        ),
    )
    previous_standard_webhooks_secret: Secret | None = field(
        default=None,
        metadata=declare(
            SecretText(),
            "Previous Standard Webhooks key during its rotation; only with "
            "`standard_webhooks_secret`.",
            type_text="as above",
        ),
    )
    tls: TlsSettings = field(
        default=TlsSettings(),
        metadata=declare(
            Nested(TlsSettings, prefix="tls_"),
            "This webhook's receiver TLS, key by key over the `delivery` defaults. Connections "
            "are pooled per TLS setting, so a client certificate is only ever used for the "
            "webhooks that name it. A wrong CA, a refused or missing client certificate, or a "
            "refused version is a not-received attempt (`tls_error`) that goes up the ladder. "
            "The files are looked at again every 10 s: new connections use files renewed in "
            "place, and files that could not be used are tried again. "
            "Key exchange is elliptic-curve only ([Security](#security)).",
            type_text="as in `delivery`",
            default_text="the `delivery` values",
        ),
    )

    def __reduce__(self) -> tuple[type[Webhook], tuple[Any, ...]]:
        """Pickled as the constructor's arguments: half the time of the dataclass's own state
        methods both ways (``bridge run`` receives its 10,000 webhooks from a child process)."""
        return (Webhook, _webhook_fields(self))


_tls_fields: Final = attrgetter(*(each.name for each in fields(TlsSettings)))
_webhook_fields: Final = attrgetter(*(each.name for each in fields(Webhook)))
