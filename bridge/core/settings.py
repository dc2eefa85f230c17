"""The typed, frozen configuration: one dataclass per section, validated once by
:mod:`bridge.config.loader` and immutable afterwards. Each field declares its key of the file:
kind, limits, default and help (:mod:`bridge.core.keys`)."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal, TypeAlias, get_args

from bridge.core.keys import (
    Boolean,
    Choice,
    DirectoryPath,
    Integer,
    Nested,
    Networks,
    Properties,
    Seconds,
    SecretText,
    Text,
    TopicName,
    Url,
    Username,
    alternatives,
    declare,
    key_of,
    section,
)
from bridge.core.webhook import (
    DEFAULT_CONCURRENCY_PER_WEBHOOK,
    DEFAULT_TIMEOUT_SECONDS,
    Secret,
    TlsSettings,
    Webhook,
)

IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

SchemaMode: TypeAlias = Literal["embedded", "registry"]

LogFormat: TypeAlias = Literal["json", "text"]

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")

LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")

DEFAULT_MAX_IN_FLIGHT: Final = 1000

IDLE_PER_IN_FLIGHT: Final = 2
"""``delivery.max_idle_connections`` when not given: this many times ``max_in_flight``. Measured
(docs/PERFORMANCE.md, "Idle connections"), 10,000 webhooks on 500 hosts with 2,000 in flight:
an idle bound of 2,000 made 45 % of the deliveries open a connection, 4,000 about 13 %. An idle
TLS connection holds about 44 KB, a plain one a few: the bound is memory too."""


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


_PROPERTIES_HELP: Final = (
    "Passed through to the consumer, the producer and the admin client, e.g. "
    '`ssl.ca.location: /etc/ssl/certs/ca-certificates.crt`. `"${ENV_VAR}"` reads the variable '
    "(unset or empty is an error naming the property); `{file: PATH}` reads the file (one "
    "trailing newline ignored, at most 1 MiB, watched like secret files). A value read from the "
    "environment or a file is kept masked like a credential, whatever the property. Credentials "
    f"(names containing {alternatives(KAFKA_CREDENTIAL_WORDS)}, and "
    f"{', '.join(f'`{name}`' for name in sorted(KAFKA_CREDENTIAL_PROPERTIES))}) must be strings "
    "and never appear in logs, reprs or error messages. Keys that have a field above "
    "(`bootstrap.servers`, `group.id`, `client.id`, `security.protocol`, `sasl.mechanism(s)`, "
    "`sasl.username`, `sasl.password`) are refused. The consumer's `statistics.interval.ms` is "
    "always 5000 (it feeds the lag metrics)."
)


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """Connection to the Kafka cluster (environment variables may override it)."""

    bootstrap_servers: str = field(
        default="localhost:9092",
        metadata=declare(
            Text(), "Comma-separated `host:port` list.", env="KAFKA_BOOTSTRAP_SERVERS"
        ),
    )
    group_id: str = field(
        default="transaction-webhook-bridge",
        metadata=declare(Text(), "Consumer group shared by every replica.", env="KAFKA_GROUP_ID"),
    )
    client_id: str = field(
        default="transaction-webhook-bridge",
        metadata=declare(Text(), "Client id shown in broker logs and quotas."),
    )
    security_protocol: str | None = field(
        default=None,
        metadata=declare(
            Choice(SECURITY_PROTOCOLS, fold=str.upper),
            "Plain text or TLS, with or without SASL.",
            default_text="`null` (PLAINTEXT)",
            env="KAFKA_SECURITY_PROTOCOL",
        ),
    )
    sasl_mechanism: str | None = field(
        default=None,
        metadata=declare(
            Choice(SASL_MECHANISMS, fold=str.upper),
            "With a `SASL_*` protocol, `null` means `PLAIN` (passed to librdkafka explicitly, "
            "since its own default is `GSSAPI`).",
            env="KAFKA_SASL_MECHANISM",
        ),
    )
    sasl_username: str | None = field(
        default=None,
        metadata=declare(Text(), "SASL user name.", env="KAFKA_SASL_USERNAME"),
    )
    sasl_password: Secret | None = field(
        default=None,
        metadata=declare(
            SecretText(
                file_help="File holding the password (one trailing newline ignored). "
                "Exclusive with `sasl_password`; `KAFKA_SASL_PASSWORD` wins over both."
            ),
            "SASL password.",
            env="KAFKA_SASL_PASSWORD",
        ),
    )
    properties: Mapping[str, str | Secret] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=declare(Properties(), _PROPERTIES_HELP),
    )
    """Extra librdkafka properties; credentials (:func:`is_kafka_credential`) as Secrets."""


KAFKA_ENVIRONMENT: Final = {
    env: each.name for each in fields(KafkaConfig) if (env := key_of(each).env) is not None
}
"""Environment variables that override the Kafka settings of the file (when set and not empty)."""


@dataclass(frozen=True, slots=True)
class SchemasConfig:
    """Where writer schemas come from: the ``schemas/`` directory or a schema registry."""

    mode: SchemaMode = field(
        default="embedded",
        metadata=declare(
            Choice(get_args(SchemaMode)),
            "`embedded`: no registry; records are plain Avro binary or Avro single-object "
            "encoding, read with the `.avsc` files. `registry`: records are Confluent wire "
            "format (single-object also accepted); writer schemas are fetched from "
            "`registry_url` by id and cached; an id the registry does not know is remembered "
            "for 60 s (the last 1,000). Each request ends within 5 s whatever the registry does "
            "(connecting, sending and the whole answer, not each read), and an answer over 1 MiB "
            "is not read: both are the registry being unavailable (the partition waits).",
        ),
    )
    directory: Path = field(
        default=Path("schemas"),
        metadata=declare(
            DirectoryPath(),
            "Directory of the `.avsc` files; the reader schema is `transaction_outcome.avsc`. "
            "Each must be an Avro schema in a regular file of at most 1 MiB, neither recursive "
            "(a named type inside itself) nor holding an array of items that take no bytes "
            "(null, fixed of size 0, a record of only such fields), nor a record with a field "
            "given twice (fastavro reads both and keeps one), which fastavro cannot read "
            "safely: `bridge check` and `bridge run` name every one that is not. Two files with "
            "the same single-object fingerprint that differ are refused too: the fingerprint (of "
            "the Parsing Canonical Form) leaves out `logicalType`, `precision` and `scale`, so a "
            "copy of the reader schema with money at scale 2 would have read every record of the "
            "other at its scale. For the same reason a single-object producer must write with "
            "one of these files exactly (a producer's own decimal(18, 2) schema has the reader's "
            "fingerprint and would be read at scale 6); the registry, which gives the writer "
            "schema itself, has no such limit. A writer schema of those shapes from the registry "
            "is `unsupported_writer_schema`.",
        ),
    )
    registry_url: str | None = field(
        default=None,
        metadata=declare(
            Url(basic_auth=True),
            "Confluent-compatible schema registry; required in `registry` mode. Credentials go "
            "in the keys below, never in the URL; errors name the registry without query "
            "string.",
        ),
    )
    max_record_bytes: int = field(
        default=1_048_576,
        metadata=declare(
            Integer(1, 1 << 30),
            "Larger record values are dead-lettered without decoding (reason `oversized`).",
        ),
    )
    registry_username: str | None = field(
        default=None,
        metadata=declare(
            Username(), "HTTP basic authentication user; set together with a password."
        ),
    )
    registry_password: Secret | None = field(
        default=None,
        metadata=declare(
            SecretText(file_help="File holding the password (one trailing newline ignored)."),
            "Its password. Exactly one of `registry_password`, `registry_password_file`.",
        ),
    )
    """HTTP basic authentication to the registry (both or neither; never in ``registry_url``)."""


@dataclass(frozen=True, slots=True)
class TopicsConfig:
    """Source, retry-ladder, parking and dead-letter topics; the loader derives the others from
    source."""

    source: str = field(
        default="transactions.outcomes",
        metadata=declare(TopicName(), "Topic of transaction outcomes."),
    )
    retry_prefix: str = field(
        default="transactions.outcomes.retry",
        metadata=declare(
            TopicName(),
            "Rung *n* of the ladder is `<retry_prefix>.<n>`.",
            default_text="`<source>.retry`",
        ),
    )
    parked: str = field(
        default="transactions.outcomes.parked",
        metadata=declare(
            TopicName(),
            "Where deliveries to a stalled webhook wait (`retry.park_delay_ms`).",
            default_text="`<source>.parked`",
        ),
    )
    dead_letter: str = field(
        default="transactions.outcomes.dlq",
        metadata=declare(TopicName(), "Dead-letter topic.", default_text="`<source>.dlq`"),
    )
    partitions: int = field(
        default=6,
        metadata=declare(Integer(1, 10_000), "Partitions of every topic `bridge topics` creates."),
    )
    replication_factor: int = field(
        default=1,
        metadata=declare(
            Integer(1, 100),
            "Replication of every topic `bridge topics` creates (`min.insync.replicas` = "
            "min(2, this)).",
        ),
    )


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """The retry ladder: ``attempts`` retries after attempt 0, delays first, first + increment..."""

    attempts: int = field(
        default=5,
        metadata=declare(
            Integer(1, 20),
            "Retries after the first delivery (attempt 0): at most `attempts + 1` requests. One "
            "delay topic per retry.",
        ),
    )
    first_delay_ms: int = field(
        default=500,
        metadata=declare(
            Integer(0, 86_400_000),
            "Wait before retry 1. Also the least time a webhook with every slot taken may go "
            "without answering before it counts as stalled (otherwise half its timeout).",
        ),
    )
    increment_ms: int = field(
        default=500,
        metadata=declare(
            Integer(0, 86_400_000),
            "Added for each further retry: retry *n* waits `first_delay_ms + (n - 1) * "
            "increment_ms` (0.5, 1.0, 1.5, 2.0, 2.5 s by default).",
        ),
    )
    park_delay_ms: int = field(
        default=30_000,
        metadata=declare(
            Integer(1, 86_400_000),
            "How long a delivery to a stalled webhook waits in the parking topic before it is "
            "tried again (no attempt used). One pass per park delay, not per rung: a stalled "
            "webhook costs little Kafka traffic and CPU.",
        ),
    )
    max_parks: int = field(
        default=20,
        metadata=declare(
            Integer(1, 10_000),
            "Parks after which a delivery is dead-lettered (reason `webhook_stalled`); 20 parks "
            "of 30 s are 10 minutes.",
        ),
    )


@dataclass(frozen=True, slots=True)
class DeliveryConfig:
    """HTTP delivery limits and outbound address policy."""

    timeout_seconds: float = field(
        default=DEFAULT_TIMEOUT_SECONDS,
        metadata=declare(
            Seconds(0, 300),
            "Total time for one request (connect, send, status, reading the capped body). "
            "Default of each webhook's `timeout_seconds`.",
        ),
    )
    connect_timeout_seconds: float = field(
        default=3.0,
        metadata=declare(
            Seconds(0, 300), "Time to connect (TCP and TLS), capped at the request's total."
        ),
    )
    concurrency_per_webhook: int = field(
        default=DEFAULT_CONCURRENCY_PER_WEBHOOK,
        metadata=declare(
            Integer(1, 10_000),
            "Requests in flight at once per webhook, per replica. Default of each webhook's "
            "`concurrency`.",
        ),
    )
    max_in_flight: int = field(
        default=DEFAULT_MAX_IN_FLIGHT,
        metadata=declare(
            Integer(1, 1_000_000),
            "Deliveries in flight per replica, counted per delivery (a record with ten matching "
            "webhooks takes ten); at the limit no record is taken until 75 % of it.",
        ),
    )
    max_idle_connections: int = field(
        default=IDLE_PER_IN_FLIGHT * DEFAULT_MAX_IN_FLIGHT,
        metadata=declare(
            Integer(0, 1_000_000),
            "Keep-alive connections kept open between deliveries, across every host, per "
            "replica; past it the one idle longest is closed (none idles longer than 4 s). "
            "Hosts' busy moments do not coincide, so webhooks on many hosts keep more "
            "connections between deliveries than are ever busy at once. An idle TLS connection "
            "holds about 44 KB of memory. 0 keeps none (a new connection per request).",
            default_text="twice `max_in_flight`",
        ),
    )
    response_body_limit_bytes: int = field(
        default=4096,
        metadata=declare(
            Integer(0, 10_485_760),
            "At most this many bytes of a response body are read, then discarded (the "
            "connection is closed if more would follow). A body in more than 8,192 pieces "
            "counts as past the limit too (its status stands, the rest is not read). Whatever "
            "the limit, a response with more than 8,192 parts in all (header fields, trailers, "
            "body pieces, interim answers) without its status, or more than 256 KiB of head, "
            "chunk framing and trailers, is refused.",
        ),
    )
    allow_private_networks: bool = field(
        default=False,
        metadata=declare(
            Boolean(),
            "Allow non-public destinations (development, tests). Cloud metadata addresses stay "
            "refused.",
        ),
    )
    allowed_networks: tuple[IPNetwork, ...] = field(
        default=(),
        metadata=declare(
            Networks(),
            "Networks allowed even though not public, e.g. an internal receiver "
            "`10.20.0.0/16`; listing a metadata address allows it.",
        ),
    )
    shutdown_grace_seconds: float = field(
        default=20.0,
        metadata=declare(
            Seconds(0, 3600),
            "On SIGTERM, the whole shutdown's time: in-flight deliveries get 70 % of it, then "
            "the rest are handed to the first delay topic, the offsets committed, the group left "
            "and the producer flushed; what is still unsettled at the end is left for "
            "redelivery.",
        ),
    )
    tls: TlsSettings = field(
        default_factory=TlsSettings,
        metadata=declare(
            Nested(TlsSettings, prefix="tls_", own_rows=True), "Default of each webhook's own."
        ),
    )


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Address of the HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``."""

    host: str = field(
        default="0.0.0.0",
        metadata=declare(
            Text(),
            "Address of the operator port (`/metrics`, `/healthz`, `/readyz`, `/status`).",
        ),
    )
    port: int = field(default=9464, metadata=declare(Integer(0, 65_535), "Its port."))
    enabled: bool = field(
        default=True,
        metadata=declare(
            Boolean(),
            "`false` records nothing but `bridge_build_info` (to measure what metrics cost); "
            "the three endpoints are served either way.",
        ),
    )
    webhook_series: int = field(
        default=10,
        metadata=declare(
            Integer(0, 1000),
            "Webhooks with series of their own (failing ones first); the others count under "
            '`webhook="(other)"`. Read at start.',
        ),
    )


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Log format (``json`` or ``text``) and level (lowercase)."""

    format: LogFormat = field(
        default="json",
        metadata=declare(
            Choice(get_args(LogFormat)),
            "One JSON object per line, or a readable line for a terminal.",
        ),
    )
    level: str = field(
        default="info",
        metadata=declare(
            Choice(LOG_LEVELS, fold=str.lower),
            "`debug` adds one `delivery.received` line per 2xx.",
        ),
    )


@dataclass(frozen=True, slots=True)
class Config:
    """The whole validated configuration; the fields with :func:`~bridge.core.keys.section`
    metadata are the sections of the file, in order.

    ``sources`` lists every file that was read (the YAML file first, then secret files) with the
    SHA-256 of the bytes read, so that a watcher can tell when any of them changes. For a
    configuration directory (``path`` is then the directory) the directory comes first, with the
    signature of its listing (:func:`bridge.config.directory.listing_digest`), then its files.
    """

    path: Path
    kafka: KafkaConfig = field(default=KafkaConfig(), metadata=section(KafkaConfig))
    schemas: SchemasConfig = field(default=SchemasConfig(), metadata=section(SchemasConfig))
    topics: TopicsConfig = field(default=TopicsConfig(), metadata=section(TopicsConfig))
    retry: RetryConfig = field(default=RetryConfig(), metadata=section(RetryConfig))
    delivery: DeliveryConfig = field(default=DeliveryConfig(), metadata=section(DeliveryConfig))
    metrics: MetricsConfig = field(default=MetricsConfig(), metadata=section(MetricsConfig))
    logging: LoggingConfig = field(default=LoggingConfig(), metadata=section(LoggingConfig))
    webhooks: tuple[Webhook, ...] = field(default=(), metadata=section(Webhook))
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
