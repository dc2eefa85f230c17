"""The typed, frozen configuration: one dataclass per section, validated once by
:mod:`bridge.config.loader` and immutable afterwards."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

from bridge.core.webhook import (
    DEFAULT_CONCURRENCY_PER_WEBHOOK,
    DEFAULT_TIMEOUT_SECONDS,
    Secret,
    TlsSettings,
    Webhook,
)

IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


KAFKA_ENVIRONMENT: Final = {
    "KAFKA_BOOTSTRAP_SERVERS": "bootstrap_servers",
    "KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "KAFKA_SASL_USERNAME": "sasl_username",
    "KAFKA_SASL_PASSWORD": "sasl_password",
    "KAFKA_GROUP_ID": "group_id",
}
"""Environment variables that override the Kafka settings of the file (when set and not empty)."""


KAFKA_CREDENTIAL_WORDS: Final = ("password", "passphrase", "secret", "jaas")
"""A ``kafka.properties`` name containing one of these words holds a credential, e.g.
``ssl.key.password``, ``ssl.keystore.password``, ``sasl.oauthbearer.client.secret``,
``sasl.oauthbearer.assertion.private.key.passphrase``, ``sasl.jaas.config``."""


KAFKA_CREDENTIAL_PROPERTIES: Final = frozenset(
    {
        "ssl.key.pem",  # the client's private key itself (PEM)
        "ssl_key",  # the same, as set by rd_kafka_conf_set_ssl_cert()
        "sasl.oauthbearer.assertion.private.key.pem",  # private key signing JWT assertions
        "sasl.oauthbearer.config",  # may carry client credentials or a token
    }
)
"""``kafka.properties`` names that hold key material or tokens without a credential word. Paths
(``ssl.key.location``, ``ssl.keystore.location``, ``sasl.kerberos.keytab``...) and public
certificates (``ssl.certificate.pem``, ``ssl.ca.pem``) are not credentials."""


def is_kafka_credential(name: str) -> bool:
    """Whether the librdkafka property ``name`` holds a credential (kept as a :class:`Secret`)."""
    lowered = name.lower()
    return lowered in KAFKA_CREDENTIAL_PROPERTIES or any(
        word in lowered for word in KAFKA_CREDENTIAL_WORDS
    )


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """Connection to the Kafka cluster (environment variables may override it)."""

    bootstrap_servers: str = "localhost:9092"
    group_id: str = "transaction-webhook-bridge"
    client_id: str = "transaction-webhook-bridge"
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    properties: Mapping[str, str | Secret] = field(default_factory=lambda: MappingProxyType({}))
    """Extra librdkafka properties; credentials (:func:`is_kafka_credential`) as Secrets."""


@dataclass(frozen=True, slots=True)
class SchemasConfig:
    """Where writer schemas come from: the ``schemas/`` directory or a schema registry."""

    mode: Literal["embedded", "registry"] = "embedded"
    directory: Path = Path("schemas")
    registry_url: str | None = None
    max_record_bytes: int = 1_048_576
    registry_username: str | None = None
    registry_password: Secret | None = None
    """HTTP basic authentication to the registry (both or neither; never in ``registry_url``)."""


@dataclass(frozen=True, slots=True)
class TopicsConfig:
    """Source, retry-ladder, parking and dead-letter topics; the loader derives the others from
    source."""

    source: str = "transactions.outcomes"
    retry_prefix: str = "transactions.outcomes.retry"
    parked: str = "transactions.outcomes.parked"
    dead_letter: str = "transactions.outcomes.dlq"
    partitions: int = 6
    replication_factor: int = 1


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """The retry ladder: ``attempts`` retries after attempt 0, delays first, first + increment..."""

    attempts: int = 5
    first_delay_ms: int = 500
    increment_ms: int = 500
    park_delay_ms: int = 30_000
    max_parks: int = 20


@dataclass(frozen=True, slots=True)
class DeliveryConfig:
    """HTTP delivery limits and outbound address policy."""

    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    connect_timeout_seconds: float = 3.0
    concurrency_per_webhook: int = DEFAULT_CONCURRENCY_PER_WEBHOOK
    max_in_flight: int = 1000
    response_body_limit_bytes: int = 4096
    allow_private_networks: bool = False
    allowed_networks: tuple[IPNetwork, ...] = ()
    shutdown_grace_seconds: float = 20.0
    tls: TlsSettings = field(default_factory=TlsSettings)  # the default of each webhook's own


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Address of the HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``."""

    host: str = "0.0.0.0"
    port: int = 9464
    enabled: bool = True
    webhook_series: int = 10  # webhooks with series of their own (the rest count as "(other)")


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Log format (``json`` or ``text``) and level (lowercase)."""

    format: Literal["json", "text"] = "json"
    level: str = "info"


@dataclass(frozen=True, slots=True)
class Config:
    """The whole validated configuration.

    ``sources`` lists every file that was read (the YAML file first, then secret files) with the
    SHA-256 of the bytes read, so that a watcher can tell when any of them changes. For a
    configuration directory (``path`` is then the directory) the directory comes first, with the
    signature of its listing (:func:`bridge.config.directory.listing_digest`), then its files.
    """

    path: Path
    kafka: KafkaConfig = KafkaConfig()
    schemas: SchemasConfig = SchemasConfig()
    topics: TopicsConfig = TopicsConfig()
    retry: RetryConfig = RetryConfig()
    delivery: DeliveryConfig = DeliveryConfig()
    metrics: MetricsConfig = MetricsConfig()
    logging: LoggingConfig = LoggingConfig()
    webhooks: tuple[Webhook, ...] = ()
    sources: tuple[tuple[Path, str], ...] = ()

    @property
    def delay_topics(self) -> tuple[str, ...]:
        """The retry-ladder topics, rung 1 first: ``<retry_prefix>.<n>``, one per retry."""
        prefix = self.topics.retry_prefix
        return tuple(f"{prefix}.{rung}" for rung in range(1, self.retry.attempts + 1))

    @property
    def parked_topic(self) -> str:
        """Where deliveries to a stalled webhook wait, ``retry.park_delay_ms`` at a time."""
        return self.topics.parked

    @property
    def dead_letter_topic(self) -> str:
        """The dead-letter topic."""
        return self.topics.dead_letter

    def kafka_settings(self) -> dict[str, str]:
        """The librdkafka settings of the Kafka section, except ``group.id`` (credentials
        revealed: the one place they leave their :class:`Secret`)."""
        kafka = self.kafka
        settings = {"bootstrap.servers": kafka.bootstrap_servers, "client.id": kafka.client_id}
        optional = {
            "security.protocol": kafka.security_protocol,
            "sasl.mechanism": kafka.sasl_mechanism,
            "sasl.username": kafka.sasl_username,
        }
        settings.update({key: value for key, value in optional.items() if value is not None})
        protocol = (kafka.security_protocol or "").upper()
        if protocol.startswith("SASL") and kafka.sasl_mechanism is None:
            settings["sasl.mechanism"] = "PLAIN"  # librdkafka's own default is GSSAPI
        if kafka.sasl_password is not None:
            settings["sasl.password"] = kafka.sasl_password.reveal().decode("utf-8")
        for name, value in kafka.properties.items():
            settings[name] = value.reveal().decode("utf-8") if isinstance(value, Secret) else value
        return settings


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of bytes: the fingerprint of one file in :attr:`Config.sources`."""
    return hashlib.sha256(data).hexdigest()
