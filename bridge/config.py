"""Configuration: one YAML file read into typed, frozen dataclasses, validated once at load.

``load_config`` collects every problem in the file (unknown keys, wrong types, missing fields, bad
ranges, unset environment variables, unreadable secret files) and raises them together as one
:class:`~bridge.errors.ConfigError`, each naming ``file:line``, the webhook and the field. Secrets
are wrapped in :class:`Secret` so that they never show in reprs, logs or error messages.

Defaults live in the dataclasses below; a key that is absent or ``null`` takes its default.
Relative paths in the file (``schemas.directory``, ``*_file`` secrets) resolve against the current
working directory.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias
from urllib.parse import urlsplit

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from bridge.errors import ConfigError
from bridge.netsafety import DestinationPolicy
from bridge.signing import standard_webhooks_key

EVENTS: Final = ("transaction.success", "transaction.failed")
"""The events a webhook can choose, as they appear in the notification's ``event`` field."""

SignatureScheme: TypeAlias = Literal["hmac-sha256", "secret"]
"""How ``x-service-secret`` is filled: an HMAC of the body (default), or the secret itself."""

IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_SIGNATURE: Final[SignatureScheme] = "hmac-sha256"
DEFAULT_TIMEOUT_SECONDS: Final = 10.0
DEFAULT_CONCURRENCY_PER_WEBHOOK: Final = 32

KAFKA_ENVIRONMENT: Final = {
    "KAFKA_BOOTSTRAP_SERVERS": "bootstrap_servers",
    "KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "KAFKA_SASL_USERNAME": "sasl_username",
    "KAFKA_SASL_PASSWORD": "sasl_password",
    "KAFKA_GROUP_ID": "group_id",
}
"""Environment variables that override the Kafka settings of the file (when set and not empty)."""


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
    properties: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class SchemasConfig:
    """Where writer schemas come from: the ``schemas/`` directory or a schema registry."""

    mode: Literal["embedded", "registry"] = "embedded"
    directory: Path = Path("schemas")
    registry_url: str | None = None
    max_record_bytes: int = 1_048_576


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


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Address of the HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``."""

    host: str = "0.0.0.0"
    port: int = 9464
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Log format (``json`` or ``text``) and level (lowercase)."""

    format: Literal["json", "text"] = "json"
    level: str = "info"


@dataclass(frozen=True, slots=True)
class Webhook:
    """One subscription: where to send which events of one account holder, and how to sign them.

    ``timeout_seconds`` and ``concurrency`` are resolved: the webhook's own value, else the
    default of the ``delivery`` section.
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


@dataclass(frozen=True, slots=True)
class Config:
    """The whole validated configuration.

    ``sources`` lists every file that was read (the YAML file first, then secret files) with the
    SHA-256 of the bytes read, so that a watcher can tell when any of them changes.
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
        """The librdkafka settings of the Kafka section, except ``group.id`` (password included)."""
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
        settings.update(kafka.properties)
        return settings


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of bytes: the fingerprint of one file in :attr:`Config.sources`."""
    return hashlib.sha256(data).hexdigest()


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] = os.environ) -> Config:
    """Read, validate and return the configuration file; raise ConfigError listing every problem."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(str(file), [f"{file}: cannot read the file: {exc.strerror}"]) from None
    loader = _Loader(str(file), environ)
    loader.sources.append((file, sha256_hex(data)))
    config = loader.load(file, data)
    if loader.problems or config is None:
        raise ConfigError(str(file), loader.problems)
    return config


# Validation machinery: converters turn a YAML value into a field value or raise _Invalid.


class _Invalid(Exception):
    """A value a converter refuses; the message says why and never echoes a secret."""


Converter: TypeAlias = Callable[[Any], Any]

_SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
_PASSWORD_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# librdkafka keys that have their own field; setting them in ``kafka.properties`` is refused.
_KAFKA_FIELD_KEYS: Final = {
    "bootstrap.servers": "bootstrap_servers",
    "group.id": "group_id",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
}
_WEBHOOK_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER_SAFE = re.compile(rb"[\x21-\x7e]+")
_STR_TAG: Final = "tag:yaml.org,2002:str"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


_KINDS: Final[dict[type, str]] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}


def _kind(value: Any) -> str:
    """A short name for the type of a YAML value, for messages (never the value itself)."""
    return _KINDS.get(type(value), type(value).__name__)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {_kind(value)} (quote the value)")
    if not value.strip():
        raise _Invalid("must not be empty")
    return value


def _path(value: Any) -> Path:
    return Path(_text(value))


def _integer(low: int, high: int) -> Converter:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"expected an integer, got {_kind(value)}")
        if not low <= value <= high:
            raise _Invalid(f"must be between {low} and {high}, got {value}")
        return value

    return convert


def _seconds(low: float, high: float) -> Converter:
    """A number of seconds above ``low`` and at most ``high``."""

    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(f"expected a number, got {_kind(value)}")
        if not (math.isfinite(value) and low < value <= high):
            raise _Invalid(f"must be above {low:g} and at most {high:g}, got {value}")
        return float(value)

    return convert


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {_kind(value)}")
    return value


def _choice(*options: str, fold: Callable[[str], str] = str) -> Converter:
    def convert(value: Any) -> str:
        text = fold(_text(value))
        if text not in options:
            raise _Invalid(f"unknown value {value!r} (expected {', '.join(options)})")
        return text

    return convert


def _webhook_id(value: Any) -> str:
    if not _WEBHOOK_ID.fullmatch(_text(value)):
        raise _Invalid("must be 1 to 64 characters among A-Z a-z 0-9 . _ -")
    return str(value)


def _topic(value: Any) -> str:
    name = _text(value)
    if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise _Invalid(f"invalid Kafka topic name {name!r} (letters, digits, '.', '_', '-')")
    return name


def _http_url(value: Any) -> str:
    url = _text(value)
    if any(char.isspace() for char in url):
        raise _Invalid("must not contain whitespace")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Invalid("must be an absolute http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - urlsplit validates the port only when it is read
    except ValueError as exc:
        raise _Invalid(f"invalid port: {exc}") from None
    return url


def _events(value: Any) -> frozenset[str]:
    expected = f"(expected {', '.join(EVENTS)})"
    if not isinstance(value, list):
        raise _Invalid(f"expected a list of events {expected}, got {_kind(value)}")
    if not value:
        raise _Invalid(f"must name at least one event {expected}")
    for event in value:
        if not isinstance(event, str):
            raise _Invalid(f"expected event names, got {_kind(event)} {expected}")
        if event not in EVENTS:
            raise _Invalid(f"unknown event {event!r} {expected}")
    return frozenset(value)


def _networks(value: Any) -> tuple[IPNetwork, ...]:
    if not isinstance(value, list):
        raise _Invalid(f"expected a list of CIDR networks, got {_kind(value)}")
    networks = []
    for item in value:
        try:
            networks.append(ipaddress.ip_network(_text(item)))
        except ValueError as exc:
            raise _Invalid(f"invalid network {item!r}: {exc}") from None
    return tuple(networks)


def _properties(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise _Invalid(f"expected a mapping of librdkafka properties, got {_kind(value)}")
    properties = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _Invalid(f"property names must be strings, got {_kind(key)}")
        if key in _KAFKA_FIELD_KEYS:
            raise _Invalid(f"set {key!r} with kafka.{_KAFKA_FIELD_KEYS[key]} instead")
        if isinstance(item, bool):
            properties[key] = "true" if item else "false"
        elif isinstance(item, str | int | float):
            properties[key] = str(item)
        else:
            raise _Invalid(f"property {key!r}: expected a string, number or boolean")
    return MappingProxyType(properties)


@dataclass(frozen=True, slots=True)
class _Field:
    convert: Converter
    required: bool = False


_SECTIONS: Final[dict[str, dict[str, _Field]]] = {
    "kafka": {
        "bootstrap_servers": _Field(_text),
        "group_id": _Field(_text),
        "client_id": _Field(_text),
        "security_protocol": _Field(_choice(*_SECURITY_PROTOCOLS, fold=str.upper)),
        "sasl_mechanism": _Field(_choice(*_SASL_MECHANISMS, fold=str.upper)),
        "sasl_username": _Field(_text),
        "sasl_password": _Field(_text),
        "sasl_password_file": _Field(_text),
        "properties": _Field(_properties),
    },
    "schemas": {
        "mode": _Field(_choice("embedded", "registry")),
        "directory": _Field(_path),
        "registry_url": _Field(_http_url),
        "max_record_bytes": _Field(_integer(1, 1 << 30)),
    },
    "topics": {
        "source": _Field(_topic),
        "retry_prefix": _Field(_topic),
        "parked": _Field(_topic),
        "dead_letter": _Field(_topic),
        "partitions": _Field(_integer(1, 10_000)),
        "replication_factor": _Field(_integer(1, 100)),
    },
    "retry": {
        "attempts": _Field(_integer(1, 20)),
        "first_delay_ms": _Field(_integer(0, 86_400_000)),
        "increment_ms": _Field(_integer(0, 86_400_000)),
        "park_delay_ms": _Field(_integer(1, 86_400_000)),
        "max_parks": _Field(_integer(1, 10_000)),
    },
    "delivery": {
        "timeout_seconds": _Field(_seconds(0, 300)),
        "connect_timeout_seconds": _Field(_seconds(0, 300)),
        "concurrency_per_webhook": _Field(_integer(1, 10_000)),
        "max_in_flight": _Field(_integer(1, 1_000_000)),
        "response_body_limit_bytes": _Field(_integer(0, 10_485_760)),
        "allow_private_networks": _Field(_boolean),
        "allowed_networks": _Field(_networks),
        "shutdown_grace_seconds": _Field(_seconds(0, 3600)),
    },
    "metrics": {
        "host": _Field(_text),
        "port": _Field(_integer(0, 65_535)),
        "enabled": _Field(_boolean),
    },
    "logging": {
        "format": _Field(_choice("json", "text")),
        "level": _Field(_choice("debug", "info", "warning", "error", "critical", fold=str.lower)),
    },
}
_TOP_LEVEL: Final = (*_SECTIONS, "webhooks")
_WEBHOOK_FIELDS: Final = {
    "id": _Field(_webhook_id, required=True),
    "account": _Field(_text, required=True),
    "url": _Field(_http_url, required=True),
    "events": _Field(_events, required=True),
    "secret": _Field(_text),
    "secret_file": _Field(_text),
    "previous_secret": _Field(_text),
    "previous_secret_file": _Field(_text),
    "signature": _Field(_choice("hmac-sha256", "secret")),
    "enabled": _Field(_boolean),
    "timeout_seconds": _Field(_seconds(0, 300)),
    "concurrency": _Field(_integer(1, 10_000)),
}

Where: TypeAlias = Callable[[str], str]
"""Names a field for a message: ``field 'retry.attempts'`` or ``webhook 'x': field 'url'``."""


@dataclass(slots=True)
class _Values:
    """The valid fields present in one YAML mapping, the nodes they came from, and the mapping."""

    values: dict[str, Any]
    nodes: dict[str, Node]
    node: Node | None
    where: Where
    given: set[str] = field(default_factory=set)  # keys with a value, valid or not


class _Loader:
    """Walks the composed YAML tree, converting sections and collecting every problem."""

    def __init__(self, path: str, environ: Mapping[str, str]) -> None:
        self.path = path
        self.environ = environ
        self.sources: list[tuple[Path, str]] = []
        self._problems: list[tuple[int, str]] = []
        self._constructor = SafeConstructor()

    @property
    def problems(self) -> list[str]:
        """Every problem found so far, in line order."""
        return [text for _, text in sorted(self._problems, key=lambda problem: problem[0])]

    def report(self, line: int | None, text: str) -> None:
        """Record one problem at a 1-based line (None: not tied to a line)."""
        place = "" if line is None else f":{line}"
        self._problems.append((line or 0, f"{self.path}{place}: {text}"))

    def problem(self, node: Node | None, where: str, message: str) -> None:
        """Record a problem with a field or section, at the line of ``node``."""
        self.report(None if node is None else node.start_mark.line + 1, f"{where}: {message}")

    def load(self, file: Path, data: bytes) -> Config | None:
        try:
            root = yaml.compose(data, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            # Only the problem and the line: the usual snippet could show an inline secret.
            line = None if exc.problem_mark is None else exc.problem_mark.line + 1
            context = f"{exc.context}: " if exc.context else ""
            self.report(line, f"invalid YAML: {context}{exc.problem}")
            return None
        except yaml.YAMLError as exc:
            self.report(None, f"invalid YAML ({type(exc).__name__})")
            return None
        top = {} if root is None else self.mapping(root, "the top level")
        if top is None:
            return None
        for key, (key_node, _) in top.items():
            if key not in _TOP_LEVEL:
                self.problem(key_node, f"section '{key}'", self.unknown(key, _TOP_LEVEL))
        sections = {
            name: self.section(top.get(name, (None, None))[1], spec, _section_where(name))
            for name, spec in _SECTIONS.items()
        }
        delivery = DeliveryConfig(**sections["delivery"].values)
        webhooks: tuple[Webhook, ...] = ()
        if "webhooks" not in top:
            self.problem(root, "section 'webhooks'", "missing (required; may be an empty list [])")
        else:
            webhooks = self.webhooks(top["webhooks"][1], delivery)
        return Config(
            path=file,
            kafka=self.kafka(sections["kafka"]),
            schemas=self.schemas(sections["schemas"]),
            topics=self.topics(sections["topics"]),
            retry=RetryConfig(**sections["retry"].values),
            delivery=delivery,
            metrics=MetricsConfig(**sections["metrics"].values),
            logging=LoggingConfig(**sections["logging"].values),
            webhooks=webhooks,
            sources=tuple(self.sources),
        )

    @staticmethod
    def unknown(key: str, known: tuple[str, ...]) -> str:
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        return f"unknown key ({hint})"

    def mapping(self, node: Node, where: str) -> dict[str, tuple[Node, Node]] | None:
        """Keys of a mapping node with their key and value nodes; None (and a problem) if not one.

        Merge keys (``<<: *anchor``) are applied; keys given twice are reported.
        """
        if not isinstance(node, MappingNode):
            self.problem(node, where, "must be a mapping of keys to values")
            return None
        explicit: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, ScalarNode) or key_node.tag != _STR_TAG:
                self.problem(key_node, where, "keys must be strings")
            elif key_node.value in explicit:
                self.problem(key_node, where, f"key '{key_node.value}' is given twice")
            else:
                explicit.add(key_node.value)
        try:
            self._constructor.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            self.problem(node, where, f"cannot merge: {exc.problem}")
            return None
        return {
            key_node.value: (key_node, value_node)
            for key_node, value_node in node.value
            if isinstance(key_node, ScalarNode) and key_node.tag == _STR_TAG
        }

    def section(self, node: Node | None, spec: Mapping[str, _Field], where: Where) -> _Values:
        """Convert the fields of one mapping; absent and null fields are left out (defaults)."""
        result = _Values({}, {}, node, where)
        entries = {} if node is None else self.mapping(node, where(""))
        if entries is None:
            return result
        for key, (key_node, _) in entries.items():
            if key not in spec:
                self.problem(key_node, where(key), self.unknown(key, tuple(spec)))
        for name, spec_field in spec.items():
            value_node = entries[name][1] if name in entries else None
            try:
                raw = None if value_node is None else self.value(value_node)
                if value_node is None or raw is None:
                    if spec_field.required:
                        self.problem(value_node or node, where(name), "missing (required)")
                    continue
                result.given.add(name)
                result.values[name] = spec_field.convert(raw)
                result.nodes[name] = value_node
            except _Invalid as exc:
                result.given.add(name)
                self.problem(value_node, where(name), str(exc))
        return result

    def value(self, node: Node) -> Any:
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise _Invalid(f"cannot read the value: {exc.problem}") from None

    def kafka(self, section: _Values) -> KafkaConfig:
        values = section.values
        password_variable = self.environ.get("KAFKA_SASL_PASSWORD")
        if password_variable:
            values.pop("sasl_password", None)
            values.pop("sasl_password_file", None)
            values["sasl_password"] = Secret(password_variable.encode("utf-8"))
        else:
            values["sasl_password"] = self.secret(section, "sasl_password")
        for variable, name in KAFKA_ENVIRONMENT.items():
            raw = self.environ.get(variable)
            if raw and name != "sasl_password":
                try:
                    values[name] = _SECTIONS["kafka"][name].convert(raw)
                except _Invalid as exc:
                    self.problem(None, f"environment variable {variable}", str(exc))
        kafka = KafkaConfig(**values)
        protocol = kafka.security_protocol or "PLAINTEXT"
        sasl = protocol.startswith("SASL_")
        if not sasl and (kafka.sasl_username is not None or kafka.sasl_password is not None):
            self.problem(
                section.node,
                section.where("security_protocol"),
                "SASL credentials are set, so it must be SASL_PLAINTEXT or SASL_SSL",
            )
        mechanism = kafka.sasl_mechanism or "PLAIN"
        if sasl and mechanism in _PASSWORD_MECHANISMS:
            for name in ("sasl_username", "sasl_password"):
                if getattr(kafka, name) is None:
                    message = f"required with {protocol} and sasl_mechanism {mechanism}"
                    self.problem(section.node, section.where(name), message)
        return kafka

    def schemas(self, section: _Values) -> SchemasConfig:
        schemas = SchemasConfig(**section.values)
        if schemas.mode == "registry" and schemas.registry_url is None:
            self.problem(section.node, section.where("registry_url"), "required in registry mode")
        reader = schemas.directory / "transaction_outcome.avsc"
        if not reader.is_file():
            self.problem(
                section.node,
                section.where("directory"),
                f"{str(schemas.directory)!r} holds no transaction_outcome.avsc "
                "(paths are relative to the working directory)",
            )
        return schemas

    def topics(self, section: _Values) -> TopicsConfig:
        values = section.values
        source = values.get("source", TopicsConfig().source)
        values.setdefault("retry_prefix", f"{source}.retry")
        values.setdefault("parked", f"{source}.parked")
        values.setdefault("dead_letter", f"{source}.dlq")
        return TopicsConfig(**values)

    def secret(self, section: _Values, name: str, required: bool = False) -> Secret | None:
        """Resolve ``name`` (inline or ``${ENV}``) or ``name_file`` into a Secret (at most one).

        Both keys are removed from the section's values.
        """
        inline = section.values.pop(name, None)
        path = section.values.pop(f"{name}_file", None)
        if inline is not None and path is not None:
            self.problem(
                section.nodes[name], section.where(name), f"set '{name}' or '{name}_file', not both"
            )
            return None
        if path is not None:
            node = section.nodes[f"{name}_file"]
            return self.secret_file(node, section.where(f"{name}_file"), path)
        if inline is None:
            if required and not {name, f"{name}_file"} & section.given:
                message = f"missing (set '{name}' or '{name}_file')"
                self.problem(section.node, section.where(name), message)
            return None
        node, where = section.nodes[name], section.where(name)
        reference = _ENV_REFERENCE.fullmatch(inline)
        if reference is None:
            if "${" in inline:
                self.problem(node, where, "write ${NAME} alone to read an environment variable")
                return None
            return Secret(inline.encode("utf-8"))
        variable = reference.group(1)
        value = self.environ.get(variable)
        if not value:
            self.problem(node, where, f"environment variable {variable} is not set or empty")
            return None
        return Secret(value.encode("utf-8"))

    def secret_file(self, node: Node, where: str, path: str) -> Secret | None:
        """Read a secret file (one trailing newline stripped) and remember it as a source."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            self.problem(node, where, f"cannot read secret file {path}: {exc.strerror}")
            return None
        self.sources.append((Path(path), sha256_hex(data)))
        value = data[:-2] if data.endswith(b"\r\n") else data.removesuffix(b"\n")
        if not value:
            self.problem(node, where, f"secret file {path} is empty")
            return None
        return Secret(value)

    def webhooks(self, node: Node, delivery: DeliveryConfig) -> tuple[Webhook, ...]:
        if not isinstance(node, SequenceNode):
            self.problem(node, "section 'webhooks'", "must be a list of webhooks")
            return ()
        webhooks: list[Webhook] = []
        first_line: dict[str, int] = {}
        for index, item in enumerate(node.value, start=1):
            given_id = _given_id(item)
            if given_id in first_line:
                message = f"duplicate webhook id (first defined on line {first_line[given_id]})"
                self.problem(item, f"webhook '{given_id}': field 'id'", message)
            elif given_id is not None:
                first_line[given_id] = item.start_mark.line + 1
            webhook = self.webhook(
                item, f"webhook '{given_id}'" if given_id else f"webhook #{index}", delivery
            )
            if webhook is not None:
                webhooks.append(webhook)
        return tuple(webhooks)

    def webhook(self, node: Node, name: str, delivery: DeliveryConfig) -> Webhook | None:
        """Read one webhook named ``name`` in messages; None when it has problems."""
        before = len(self._problems)
        section = self.section(node, _WEBHOOK_FIELDS, _webhook_where(name))
        if not isinstance(node, MappingNode):
            return None
        values = section.values
        secret = self.secret(section, "secret", required=True)
        previous = self.secret(section, "previous_secret")
        sent_as_header = values.get("signature", DEFAULT_SIGNATURE) == "secret"
        self.check_secret(section, "secret", secret, sent_as_header)
        self.check_secret(section, "previous_secret", previous, False)
        if "url" in values:
            self.check_destination(section, values["url"], delivery)
        if len(self._problems) > before or secret is None:
            return None
        timeout_seconds = values.pop("timeout_seconds", delivery.timeout_seconds)
        concurrency = values.pop("concurrency", delivery.concurrency_per_webhook)
        return Webhook(
            secret=secret,
            previous_secret=previous,
            timeout_seconds=timeout_seconds,
            concurrency=concurrency,
            **values,
        )

    def check_secret(
        self, section: _Values, key: str, secret: Secret | None, sent_as_header: bool
    ) -> None:
        """A secret must give a Standard Webhooks key and, when sent as is, be a header value."""
        if secret is None:
            return
        node = section.nodes.get(key) or section.nodes.get(f"{key}_file")
        where = section.where(key)
        try:
            standard_webhooks_key(secret.reveal())
        except ValueError as exc:
            self.problem(node, where, str(exc))
        if sent_as_header and not _HEADER_SAFE.fullmatch(secret.reveal()):
            message = "with signature 'secret' it is sent as a header, so printable ASCII only"
            self.problem(node, where, message)

    def check_destination(self, section: _Values, url: str, delivery: DeliveryConfig) -> None:
        """Refuse at load a URL whose host is a literal IP address the outbound policy refuses."""
        policy = DestinationPolicy(delivery.allow_private_networks, delivery.allowed_networks)
        refusal = policy.url_refusal(url)
        if refusal is not None:
            message = f"{refusal} (see delivery.allow_private_networks and allowed_networks)"
            self.problem(section.nodes["url"], section.where("url"), message)


def _section_where(section: str) -> Where:
    return lambda key: f"field '{section}.{key}'" if key else f"section '{section}'"


def _webhook_where(name: str) -> Where:
    return lambda key: f"{name}: field '{key}'" if key else name


def _given_id(node: Node) -> str | None:
    """The valid ``id`` written in a webhook's mapping, if any (read before validation)."""
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if (
                key_node.value == "id"
                and isinstance(value_node, ScalarNode)
                and value_node.tag == _STR_TAG
                and _WEBHOOK_ID.fullmatch(value_node.value)
            ):
                return str(value_node.value)
    return None
