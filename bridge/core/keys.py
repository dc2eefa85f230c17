"""The configuration's keys, declared once: each field of the settings dataclasses
(:mod:`bridge.core.settings`, :mod:`bridge.core.webhook`) carries a :class:`Key` in its metadata,
with the kind of value it takes (limits included), its help text and how its default reads.

Pure data, read in two places: the loader turns each kind into the converter that validates it
(:mod:`bridge.config.loader`), and the reference turns the declarations into the README's tables
(:mod:`bridge.config.reference`). A test checks that the README carries what is declared here.

The kinds and :class:`Key` are named tuples rather than frozen dataclasses: every command imports
them, and as 17 dataclasses this module took about 13 ms to import, as named tuples about 2.5 ms.
Code tells kinds apart by class (``match``), never by ``==`` (``Text() == FilePath()``: both are
empty tuples).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, fields
from typing import Any, Final, NamedTuple, TypeAlias

KEY: Final = "key"
"""The name of a field's :class:`Key` in its metadata."""

SECTION: Final = "section"
"""The name, in the metadata of a :class:`~bridge.core.settings.Config` field, of the dataclass
whose fields are the keys of that section of the file."""


class Text(NamedTuple):
    """Text that is not blank."""


class AccountId(NamedTuple):
    """An account holder's id: text that is not blank, without control characters, bidi
    controls or line and paragraph separators (other format characters are part of ids)."""


class FilePath(NamedTuple):
    """A path, kept as text (a file read at load or by the HTTP client)."""


class DirectoryPath(NamedTuple):
    """A path, kept as a :class:`pathlib.Path`."""


class Integer(NamedTuple):
    """An integer from ``low`` to ``high``, both included."""

    low: int
    high: int


class Seconds(NamedTuple):
    """A number of seconds above ``low`` and at most ``high``."""

    low: float
    high: float


class Boolean(NamedTuple):
    """``true`` or ``false``."""


class Choice(NamedTuple):
    """One of ``values``; with ``fold``, in any case, folded by it (``str.upper``) first."""

    values: tuple[str, ...]
    fold: Callable[[str], str] | None = None


class TopicName(NamedTuple):
    """A Kafka topic name."""


class Url(NamedTuple):
    """An absolute http(s) URL without userinfo; ``basic_auth`` when keys of its own hold the
    credentials that userinfo would (the schema registry's), else the request is signed."""

    basic_auth: bool = False


class Username(NamedTuple):
    """An HTTP basic authentication user name (no ``:``)."""


class WebhookId(NamedTuple):
    """A webhook's id: 1 to 64 of ``A-Z a-z 0-9 . _ -``."""


class Events(NamedTuple):
    """A non-empty list of :data:`bridge.core.webhook.EVENTS`."""


class Networks(NamedTuple):
    """A list of CIDR networks."""


class SecretText(NamedTuple):
    """A secret: inline or ``"${ENV_VAR}"`` under the field's name, or the file named by the key
    ``<name>_file``. ``file_help`` documents that key in a row of its own; without it one row
    documents both."""

    file_help: str | None = None


class Properties(NamedTuple):
    """``kafka.properties``: a mapping the loader reads entry by entry."""


class Nested(NamedTuple):
    """A field holding a settings dataclass (``keys``) whose keys sit flat beside the others,
    each named with ``prefix``. ``own_rows``: the reference gives each key a row (the field's
    help ends each row's meaning); else one row documents them all."""

    keys: type
    prefix: str
    own_rows: bool = False


LeafKind: TypeAlias = (
    Text
    | AccountId
    | FilePath
    | DirectoryPath
    | Integer
    | Seconds
    | Boolean
    | Choice
    | TopicName
    | Url
    | Username
    | WebhookId
    | Events
    | Networks
    | SecretText
    | Properties
)
"""The kinds of value one YAML key holds."""

Kind: TypeAlias = LeafKind | Nested


class Key(NamedTuple):
    """The declaration of one configuration key: what it takes and what it is for.

    ``help`` is the reference's Meaning (Markdown); ``type_text`` and ``default_text`` replace the
    Type and Default the reference would derive from the kind and the field's default (a default
    derived from another key, say); ``env`` names the environment variable that overrides it.
    """

    kind: Kind
    help: str
    type_text: str | None = None
    default_text: str | None = None
    env: str | None = None


def declare(
    kind: Kind,
    help: str,
    *,
    type_text: str | None = None,
    default_text: str | None = None,
    env: str | None = None,
) -> Mapping[str, Key]:
    """The metadata of a field declaring a configuration key: ``field(default=...,
    metadata=declare(Integer(1, 20), "..."))``."""
    return {KEY: Key(kind, help, type_text, default_text, env)}


def alternatives(values: Iterable[str]) -> str:
    """``values`` as Markdown code, the last after "or": ``a``, ``b`` or ``c``."""
    quoted = [f"`{value}`" for value in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def key_of(each: Field[Any]) -> Key:
    """The :class:`Key` declared on a settings field."""
    key: Key = each.metadata[KEY]
    return key


def section(keys: type) -> Mapping[str, type]:
    """The metadata of a :class:`~bridge.core.settings.Config` field that is a section of the
    file, its keys declared on the fields of ``keys``."""
    return {SECTION: keys}


def sections(config: type) -> dict[str, type]:
    """The sections of the file in order: each name and the dataclass declaring its keys."""
    return {
        each.name: each.metadata[SECTION] for each in fields(config) if SECTION in each.metadata
    }


def inputs(each: Field[Any]) -> tuple[tuple[str, LeafKind], ...]:
    """The YAML keys that set the field ``each``, each with its kind: the field's own name; for
    a secret, ``<name>_file`` too; for nested settings, their keys with the prefix."""
    kind = key_of(each).kind
    if isinstance(kind, Nested):
        return tuple(
            (kind.prefix + name, leaf) for sub in fields(kind.keys) for name, leaf in inputs(sub)
        )
    if isinstance(kind, SecretText):
        return ((each.name, kind), (f"{each.name}_file", FilePath()))
    return ((each.name, kind),)
