"""The README's configuration reference, rendered from the declarations of the keys (the
:class:`~bridge.core.keys.Key` on each field of :mod:`bridge.core.settings` and
:mod:`bridge.core.webhook`): one table per section of the file, in the file's order, with the
prose that belongs to a section before or after its table.

``python -m devtools config-reference --write`` puts it into README.md between two marker
comments; a unit test fails when the README's copy differs, so the tables cannot drift from the
keys the loader accepts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, fields, replace
from typing import Any, Final

from bridge.core.keys import (
    AccountId,
    Boolean,
    Choice,
    DirectoryPath,
    Events,
    FilePath,
    Integer,
    Key,
    Kind,
    Nested,
    Networks,
    Properties,
    Seconds,
    SecretText,
    Text,
    TopicName,
    Url,
    Username,
    WebhookId,
    alternatives,
    inputs,
    key_of,
    sections,
)
from bridge.core.settings import Config
from bridge.core.webhook import EVENTS

_HEADER: Final = "| Key | Type | Default | Meaning |\n|---|---|---|---|"

_KAFKA_NOTES: Final = """\
SASL credentials require a `SASL_*` protocol; `SASL_*` with `PLAIN` or `SCRAM-*` requires both
user name and password. Kafka credentials in `properties`, for example:

```yaml
  properties:
    ssl.key.password: {file: "/var/run/secrets/kafka/key-password"}
    sasl.oauthbearer.client.secret: "${KAFKA_OAUTH_CLIENT_SECRET}"
```

[Connecting to a secured cluster](#connecting-to-a-secured-cluster), after these tables, shows
whole examples."""

_SCHEMAS_NOTES: Final = """\
[`schemas/README.md`](schemas/README.md) describes the framings, the field rules and schema \
evolution."""

_DELIVERY_NOTES: Final = """\
TLS connections are pooled per origin and TLS setting. A new connection resumes the TLS session of
an earlier full handshake with the same host name through the same setting, for at most 5 minutes
(less if the receiver's ticket says so): a receiver that closes after each answer costs an
abbreviated handshake, and its certificate is still verified by a full handshake at least every 5
minutes. Sessions are kept for up to 2,048 host names per TLS setting (past that the one used
longest ago goes; a kept session holds the server's certificates, about 14 KB, and one whose
certificate is over 8 KiB is not kept), name lookups for as long as they last and parsed URLs for as
long as they are used, however many hosts there are (until 2026-11-27 all three started again from
nothing past 1,024 TLS hosts, 10,000 names and 10,000 URLs, so a larger configuration paid a full
handshake, a lookup or a parse again for every host). A closed connection releases its TLS state at
once, and every 1,000 TLS connections closed the process gives freed memory back to the system
(`malloc_trim`): 100,000 deliveries to a receiver that closes after each answer peak at about 113 MB
(354 MB before; `make bench --only https`, `https_churn`)."""

_WEBHOOKS_INTRO: Final = """\
A list; each entry is one subscription with its own deliveries and its own retry state. An account
holder may have several."""

_WEBHOOKS_NOTES: Final = """\
**Secret forms.** Inline (`secret: "s3cr3t"`, for development); an environment variable
(`secret: "${SHOP_MAIN_SECRET}"`, the whole value, unset or empty is an error); or a file
(`secret_file: /var/run/secrets/bridge/shop-main`, for Kubernetes Secrets). Secrets never appear in
logs, metrics, error messages or dead-letter headers. The same forms (inline, `"${ENV_VAR}"`,
`*_file`) apply to `standard_webhooks_secret`, `previous_standard_webhooks_secret`,
`schemas.registry_password` and `kafka.sasl_password`; Kafka `properties` use `"${ENV_VAR}"` or
`{file: PATH}`."""

_BEFORE_TABLE: Final = {"webhooks": _WEBHOOKS_INTRO}
"""Prose between a section's heading and its table."""

_AFTER_TABLE: Final = {
    "kafka": _KAFKA_NOTES,
    "schemas": _SCHEMAS_NOTES,
    "delivery": _DELIVERY_NOTES,
    "webhooks": _WEBHOOKS_NOTES,
}
"""Prose after a section's table: what concerns several of its keys at once."""


@dataclass(frozen=True, slots=True)
class _Row:
    """One row of a section's table: the keys it documents and its other three columns."""

    keys: tuple[str, ...]
    type: str
    default: str
    meaning: str


def render_reference() -> str:
    """The Markdown of every section of the file: its heading, table and prose, in order."""
    return "\n".join(_section(name, declared) for name, declared in sections(Config).items())


def _section(name: str, declared: type[Any]) -> str:
    table = "\n".join([_HEADER, *(_line(row) for row in _rows(declared))])
    parts = [f"### `{name}`", _BEFORE_TABLE.get(name), table, _AFTER_TABLE.get(name)]
    return "\n\n".join(part for part in parts if part) + "\n"


def _line(row: _Row) -> str:
    keys = ", ".join(f"`{key}`" for key in row.keys)
    return f"| {keys} | {row.type} | {row.default} | {row.meaning} |"


def _rows(declared: type[Any]) -> Iterator[_Row]:
    """The rows documenting the keys declared on the fields of the dataclass ``declared``."""
    for each in fields(declared):
        yield from _field_rows(each)


def _field_rows(each: Field[Any]) -> Iterator[_Row]:
    """One row per field, but two for a secret whose file key has help of its own, and one per
    nested key for nested settings with ``own_rows`` (its help ending each row's meaning)."""
    key = key_of(each)
    names = tuple(name for name, _ in inputs(each))
    default = _default_text(each, key)
    match key.kind:
        case SecretText(file_help=str(file_help)):
            yield _Row(names[:1], _type_text(key), default, _meaning(key))
            yield _Row(names[1:], _kind_text(FilePath()), default, file_help)
        case Nested(nested, prefix, own_rows=True):
            for sub in fields(nested):
                for row in _field_rows(sub):
                    renamed = tuple(prefix + name for name in row.keys)
                    yield replace(row, keys=renamed, meaning=f"{row.meaning} {key.help}")
        case _:
            yield _Row(names, _type_text(key), default, _meaning(key))


def _meaning(key: Key) -> str:
    return key.help if key.env is None else f"{key.help} Env `{key.env}`."


def _type_text(key: Key) -> str:
    return key.type_text if key.type_text is not None else _kind_text(key.kind)


def _kind_text(kind: Kind) -> str:
    """What a value of ``kind`` is, in the words of the Type column."""
    match kind:
        case Text():
            return "string"
        case AccountId():
            return "string without control characters or bidi controls"
        case SecretText():
            return 'string: inline or `"${ENV_VAR}"`'
        case FilePath() | DirectoryPath():
            return "path"
        case Integer(low, high):
            return f"integer, {low} to {high}"
        case Seconds(low, high):
            return f"number, > {low:g} and ≤ {high:g}"
        case Boolean():
            return "boolean"
        case Choice(values, fold):
            return alternatives(values) + ("" if fold is None else " (any case)")
        case TopicName():
            return "topic name"
        case Url():
            return "absolute `http://` or `https://` URL"
        case Username():
            return "string without `:`"
        case WebhookId():
            return "1 to 64 of `A-Z a-z 0-9 . _ -`, unique"
        case Events():
            return "non-empty list of " + ", ".join(f"`{event}`" for event in EVENTS)
        case Networks():
            return "list of CIDR"
        case Properties():
            return (
                "mapping of librdkafka property → string, number, boolean, "
                '`"${ENV_VAR}"` or `{file: PATH}`'
            )
        case Nested():
            raise ValueError("nested settings in one row need the type_text of their key")


def _default_text(each: Field[Any], key: Key) -> str:
    """The Default column: the key's own words, else ``required`` or the field's default as YAML."""
    if key.default_text is not None:
        return key.default_text
    if each.default is not MISSING:
        return f"`{_yaml_text(each.default)}`"
    if each.default_factory is not MISSING:
        return f"`{_yaml_text(each.default_factory())}`"
    return "required"


def _yaml_text(value: object) -> str:
    """A default value as it is written in the file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | tuple):
        if value:
            raise ValueError(f"no YAML text for the default {value!r}: give the key default_text")
        return "{}" if isinstance(value, Mapping) else "[]"
    return str(value)
