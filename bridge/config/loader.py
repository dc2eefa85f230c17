"""Configuration: one YAML file, or a directory of them, read into typed, frozen dataclasses,
validated once at load.

``load_config`` collects every problem in the file (unknown keys, wrong types, missing fields, bad
ranges, unset environment variables, unreadable secret files) and raises them together as one
:class:`~bridge.core.errors.ConfigError`, each naming ``file:line``, the webhook and the field.

**A directory** (several ConfigMaps projected into one volume: a ConfigMap holds at most 1 MiB,
about 3,000 webhooks) is the files :func:`bridge.config.directory.config_files` names: ``*.yaml``
and ``*.yml`` directly in it, in name order, hidden names (Kubernetes' ``..data``) left out. Each
is a part of the configuration with the schema of a whole file: a section other than
``webhooks`` may be in one file only (a second one is a problem naming both files), the
``webhooks`` lists are joined in file order, and a webhook id given twice, in one file or two, is
a problem naming both places. Every problem names the file it is in; one not tied to a file (no
file has ``webhooks``) names the directory. :attr:`Config.path` is the directory, and
:attr:`Config.sources` starts with the directory and the signature of its listing
(:func:`bridge.config.directory.listing_digest`), then each file.
Secrets are wrapped in :class:`Secret` so that they never show in reprs, logs or error messages; as
a last line of defence every secret value the loader saw is masked in the messages too.

Whatever the bytes, ``load_config`` returns a :class:`Config` or raises ConfigError, never anything
else: files larger than :data:`CONFIG_FILE_LIMIT_BYTES`, text that is not UTF-8, nesting deeper
than :data:`MAX_NESTING`, recursive aliases and alias "bombs" (aliases adding more than
:data:`MAX_ALIAS_EXPANSION` nodes, or 10 times the document's own) and more than :data:`MAX_NODES`
nodes in all (the composers stop there) are refused before any value is built, and an exception
nobody foresaw becomes a ConfigError naming only its type (its message could hold a secret).

The YAML is composed by libyaml (PyYAML's C loader, :data:`FAST_YAML_LOADER`) when PyYAML has it,
about ten times faster than PyYAML's pure-Python composer; a document libyaml might read otherwise
(tabs, tags, block scalars...), refuses, or nests near the limit is composed again by the pure
loader, whose messages are the ones reported, so the result never depends on which one ran.

Every key is declared once, on a field of the settings dataclasses (:mod:`bridge.core.keys`): its
kind and limits, its default, its help. The loader builds its tables from those declarations at
import, one converter per key; a key that is absent or ``null`` takes its default.
Relative paths in the file (``schemas.directory``, ``*_file`` secrets) resolve against the current
working directory, in a directory's files too (not against the file's own directory: the same
text means the same file wherever it is kept).
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import difflib
import functools
import gc
import hashlib
import ipaddress
import marshal
import math
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeAlias, assert_never

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from bridge.config.digest import keyed_digest
from bridge.config.directory import config_files, listing_digest
from bridge.config.segments import Layout, agrees, layout
from bridge.core.destinations import DestinationPolicy, IPNetwork
from bridge.core.errors import ConfigError, clipped, printable
from bridge.core.keys import (
    AccountId,
    Boolean,
    Choice,
    DirectoryPath,
    Events,
    FilePath,
    Integer,
    LeafKind,
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
    inputs,
    key_of,
    sections,
)
from bridge.core.settings import (
    DEFAULT_MAX_IN_FLIGHT,
    IDLE_PER_IN_FLIGHT,
    KAFKA_ENVIRONMENT,
    Config,
    DeliveryConfig,
    KafkaConfig,
    LoggingConfig,
    MetricsConfig,
    RetryConfig,
    SchemasConfig,
    TopicsConfig,
    is_kafka_credential,
    sha256_hex,
)
from bridge.core.signing import standard_webhooks_key
from bridge.core.urls import (
    UrlError,
    WebhookUrl,
    parse_webhook_url,
    shown_authority,
    url_authority,
)
from bridge.core.webhook import (
    DEFAULT_SIGNATURE,
    EVENTS,
    SECRET_HEADER_MIN_LENGTH,
    Secret,
    TlsSettings,
    Webhook,
)
from bridge.files import FileRefused, read_regular_file

CONFIG_FILE_LIMIT_BYTES: Final = 64 * 1024 * 1024
"""A configuration file larger than this (64 MiB) is refused unread; so are the files of a
configuration directory past this size in all."""

SECRET_FILE_LIMIT_BYTES: Final = 1024 * 1024
"""A secret file (``*_file``, ``{file: PATH}`` Kafka properties) larger than this (1 MiB) is
refused."""

MAX_NESTING: Final = 64
"""Deepest nesting of YAML collections accepted (a configuration needs about 5)."""

MAX_ALIAS_EXPANSION: Final = 100_000
"""Most nodes that YAML aliases may add to the document once expanded (refuses alias bombs), or
:data:`ALIAS_EXPANSION_FACTOR` times the document's own nodes when that is more."""

ALIAS_EXPANSION_FACTOR: Final = 10

MAX_NODES: Final = 3_000_000
"""Most YAML nodes (each key, value and list item; an alias adds none) a configuration may have,
in all its files: about 230,000 webhooks as usually written (13 nodes each; 100,000 make 1.3
million). The file limit bounds bytes, not nodes: one-character list items make 30 million nodes
from 64 MiB, about 10 GB once composed. The composers stop at the limit."""

MAX_PROBLEMS: Final = 1000
"""At most this many problems are listed in one ConfigError (then a count of the rest)."""

PROBLEM_LIMIT: Final = 2000
"""A problem listed is cut to this many characters (whatever the values it echoes), so that a
ConfigError is never larger than about :data:`MAX_PROBLEMS` times this."""


@dataclass
class Reuse:
    """What a reload knows of the webhooks in force, to build again only those whose YAML changed
    (:mod:`bridge.config.reload`: at 10,000 webhooks, building them all again was most of a
    reload's time).

    ``known`` maps the id of each webhook in force to the keyed digest of its YAML as read then
    (:attr:`read` of that load). A webhook whose YAML has the same digest now is *kept*: listed
    in :attr:`order`, left out of :attr:`Config.webhooks`, the one in force standing for it. The
    digest covers everything building a webhook reads:

    - its mapping, node by node: every key, tag and value, aliased content included (the same
      text with an anchor's content changed elsewhere is a change);
    - the ``delivery`` section as loaded (defaults, the outbound policy) and the environment.

    A webhook naming a file (``*_file``: the file may have changed), with a merge key, a value
    other than a scalar or a list of scalars, or a key that is not a webhook field is never kept.

    What depends on the rest of the document is done for a kept webhook as for any: its id is
    checked for duplicates, the secret its ``${VAR}`` reads is remembered, and its shown fields
    (id, account, url, TLS version) are checked once every secret of the load is known, as
    every shown value is (:meth:`_Loader.check_shown`), and reported where a built one's would
    be. So a load with ``Reuse`` reports exactly what a full load reports, and keeps only
    webhooks a full load would build equal to the ones in force.

    ``texts`` goes further: it maps the keyed digest of a webhook's *text* (its segment of the
    file, :mod:`bridge.config.segments`) to a small record of that webhook (:data:`_Noted`), as
    read from the same text in a load that was accepted. A segment met again is not composed at
    all: its lines are left blank in the text composed, and its record stands for its nodes in
    every check above (and in the document's alias and secret checks). Only a segment with no
    anchor, alias, tag, directive, block scalar or tab is noted (the text composes to the same
    nodes wherever it starts clean, and libyaml and PyYAML agree on it). Whatever such a load finds
    wrong, however little, the file is loaded again in full (see :func:`load_config`): a load
    that uses ``texts`` only ever accepts, and accepts exactly what a full load accepts.

    Two checks are settled once for all those webhooks rather than one by one. Their digest is
    the one noted with the text (in another ``context``, the delivery section or the
    environment changed, the load starts again in full). Their shown fields are checked only
    against the secrets of this load that ``secrets`` (those of the load that noted them)
    lacks: a text is noted only if its shown fields hold none of the secrets of the load noting
    it, all of them, met before it or after.
    """

    key: bytes
    known: Mapping[str, bytes]
    texts: Mapping[bytes, _Noted] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()
    """The secrets of the load that noted :attr:`texts`."""
    context: bytes = b""
    """The context of the load that noted :attr:`texts`."""
    order: list[str] = field(default_factory=list)
    """Every webhook's id in the order read, kept or built (filled by the load)."""
    read: dict[str, bytes] = field(default_factory=dict)
    """The digest of the YAML of each webhook that may be kept next time (filled by the load)."""
    texts_read: dict[bytes, _Noted] = field(default_factory=dict)
    """:attr:`texts` for the next load: the segments of this one that may be met again."""
    secrets_read: frozenset[str] = frozenset()
    """:attr:`secrets` for the next load (filled by the load)."""
    context_read: bytes = b""
    """:attr:`context` for the next load (filled by the load)."""
    uncomposed: int = 0
    """How many webhooks were kept from their text alone, never composed (filled by the load)."""

    def restart(self) -> None:
        """Forget what a load filled in and the texts met before: the file is loaded in full."""
        self.texts = {}
        self.uncomposed = 0
        self.secrets_read, self.context_read = frozenset(), b""
        self.order.clear()
        self.read.clear()
        self.texts_read.clear()


class _Recompose(Exception):
    """A load that left segments uncomposed (:attr:`Reuse.texts`) met something it cannot
    settle from their records: the file is loaded again in full."""


def load_config(
    path: str | os.PathLike[str],
    environ: Mapping[str, str] = os.environ,
    reuse: Reuse | None = None,
) -> Config:
    """Read, validate and return the configuration file, or the configuration directory's files
    merged; raise ConfigError listing every problem. With ``reuse``, the webhooks it keeps are
    left out of :attr:`Config.webhooks` (see :class:`Reuse`).

    Never raises anything else: an unexpected exception becomes a ConfigError naming only its type.
    """
    file = Path(path)
    try:
        with collector_paused():
            load = _load_directory if file.is_dir() else _load
            if reuse is not None and reuse.texts:
                try:
                    return load(file, environ, reuse)
                except (_Recompose, ConfigError):
                    reuse.restart()
            return load(file, environ, reuse)
    except ConfigError:
        raise
    except Exception as exc:  # a bug: say so, but never repeat the message (it may hold a secret)
        problem = (
            f"{file}: internal error while reading the configuration ({type(exc).__name__}); "
            "please report it"
        )
        raise ConfigError(str(file), [problem]) from None


def _load(file: Path, environ: Mapping[str, str], reuse: Reuse | None = None) -> Config:
    try:
        data = _read_config_file(file, CONFIG_FILE_LIMIT_BYTES)
    except _Unreadable as exc:
        raise ConfigError(str(file), [f"{file}: {exc}"]) from None
    loader = _Loader(str(file), environ, reuse)
    loader.sources.append((file, sha256_hex(data)))
    return _result(loader, file, loader.load(file, [((0, str(file)), data)]))


def _load_directory(
    directory: Path, environ: Mapping[str, str], reuse: Reuse | None = None
) -> Config:
    """The configuration files of ``directory`` merged (see the module's docstring)."""
    try:
        files = config_files(directory)
        signature = listing_digest(directory)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        problem = f"{directory}: cannot list the configuration directory: {reason}"
        raise ConfigError(str(directory), [problem]) from None
    if not files:
        problem = (
            f"{directory}: no configuration file in the directory (files named *.yaml or "
            "*.yml directly in it; names starting with '.' are ignored)"
        )
        raise ConfigError(str(directory), [problem])
    loader = _Loader(str(directory), environ, reuse)
    loader.sources.append((directory, signature))
    documents: list[tuple[_Source, bytes]] = []
    left = CONFIG_FILE_LIMIT_BYTES  # for the files in all
    for order, file in enumerate(files, start=1):
        source = (order, str(file))
        try:
            data = _read_config_file(file, min(left, CONFIG_FILE_LIMIT_BYTES))
        except _Unreadable as exc:
            reason = str(exc)
            if exc.too_large and left < CONFIG_FILE_LIMIT_BYTES:
                limit = CONFIG_FILE_LIMIT_BYTES // (1024 * 1024)
                reason = f"the configuration files of the directory add up to more than {limit} MiB"
            loader.report_in(source, None, reason)
            if exc.too_large:
                break
            continue
        left -= len(data)
        loader.sources.append((file, sha256_hex(data)))
        documents.append((source, data))
    complete = len(documents) == len(files)
    return _result(loader, directory, loader.load(directory, documents, complete=complete))


def _result(loader: _Loader, path: Path, config: Config | None) -> Config:
    """``config``, or the ConfigError of the loader's problems (at most MAX_PROBLEMS of them)."""
    problems = loader.problems
    if problems or config is None:
        raise ConfigError(str(path), problems)
    return config


class _Unreadable(Exception):
    """A configuration file that cannot be read; the message says why (never with the path)."""

    def __init__(self, reason: str, too_large: bool = False) -> None:
        super().__init__(reason)
        self.too_large = too_large


def _read_config_file(file: Path, limit: int) -> bytes:
    """The bytes of one configuration file, or _Unreadable."""
    try:
        return read_regular_file(file, limit)
    except FileRefused as exc:
        if exc.too_large:
            size = CONFIG_FILE_LIMIT_BYTES // (1024 * 1024)
            reason = f"the file is larger than {size} MiB; is it the configuration file?"
            raise _Unreadable(reason, too_large=True) from None
        raise _Unreadable(f"cannot read the file: {exc.reason}") from None


_collector_lock = threading.Lock()
_collector_pausers = 0
_collector_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a file loads (threads loading at once share the
    pause; the last one out restores the collector as it found it).

    A load allocates hundreds of thousands of objects that all stay alive until it ends (the YAML
    node graph), and each allocation burst made the collector walk them all again: at 10,000
    webhooks that was more than half of the load. A load leaves almost no cycles behind (a
    recursive alias's nodes), collected after it. (Also for what a command builds at once from
    the configuration it loaded: each collection would walk the whole configuration again.)
    """
    global _collector_pausers, _collector_was_enabled
    with _collector_lock:
        if _collector_pausers == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_pausers += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_pausers -= 1
            if _collector_pausers == 0 and _collector_was_enabled:
                gc.enable()


# Validation machinery: converters turn a YAML value into a field value or raise _Invalid.


class _Invalid(Exception):
    """A value a converter refuses; the message says why and never echoes a secret."""


Converter: TypeAlias = Callable[[Any], Any]
_Text: TypeAlias = str | Callable[[], str]
"""A problem's text, or what writes it (see :attr:`_Loader.problems`)."""

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
_PROPERTY_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER_SAFE = re.compile(rb"[\x21-\x7e]+")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_YAML_TAG: Final = "tag:yaml.org,2002:"
_STR_TAG: Final = "tag:yaml.org,2002:str"
_MAP_TAG: Final = "tag:yaml.org,2002:map"
_NULL_TAG: Final = "tag:yaml.org,2002:null"
_SEQ_TAG: Final = "tag:yaml.org,2002:seq"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_VALUE_TAG: Final = "tag:yaml.org,2002:value"
_KNOWN_TAGS: Final = frozenset(
    tag for tag in SafeConstructor.yaml_constructors if isinstance(tag, str)
) | {_MERGE_TAG, _VALUE_TAG}
_TAG_KINDS: Final = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true or false)",
    "timestamp": "a timestamp",
    "binary": "base64 binary data",
    "null": "null",
}
_SCRUB_MIN_LENGTH: Final = 8  # shorter secrets are not masked in messages (too many false hits)
_FOUND_STRIDE: Final = 2
"""At most one position in this many of a text is looked up by :meth:`_Secrets.found_in` (every
one while a secret of :data:`_SCRUB_MIN_LENGTH` characters is held)."""
_SHOWN_PART: Final = 16
"""This many characters of a secret in a row, shown, count as the secret (see :class:`_Secrets`):
with :data:`_FOUND_STRIDE`, the stretch of 8 characters plus the stride, plus 6."""
_PART_STRETCHES: Final = 32
"""A secret longer than this many stretches of 8 characters has as many longer stretches."""
_WEBHOOK_USERINFO: Final = (
    "must not contain userinfo (user:password before the host): credentials in a URL leak "
    "into logs and are not sent; authenticate the request by its signature"
)
_REGISTRY_USERINFO: Final = (
    "must not contain userinfo (user:password before the host): credentials in a URL leak "
    "into logs; set "
    'schemas.registry_username and schemas.registry_password (inline, "${ENV_VAR}") or '
    "schemas.registry_password_file instead"
)


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


def _clip(text: str, limit: int = 60) -> str:
    """``text`` shortened for a message (non-secret values only; a URL's userinfo masked first,
    so that the cut cannot leave part of it)."""
    return clipped(_mask_userinfo(text), limit)


def _quoted(value: str) -> str:
    """``repr`` of a non-secret string value, shortened for a message."""
    return repr(_clip(value))


def _line(node: Node | None) -> int | None:
    """The 1-based line where ``node`` starts, for a problem's place; None when it has none in
    the text (the empty mapping an empty file reads as, or no node at all)."""
    mark = getattr(node, "start_mark", None)
    return None if mark is None else int(mark.line) + 1


def _place(file: str, line: int | None) -> str:
    """``file:line``, or the file alone when the line is not known."""
    return file if line is None else f"{file}:{line}"


_WRITTEN_BITS: Final = 14_000
"""An integer larger than this many bits (about 4,200 digits) is never written out in decimal:
Python refuses past 4,300 digits (``sys.get_int_max_str_digits``), and the time grows with the
square of the length."""


def _written(value: float) -> str | None:
    """The decimal text of a number, or None for an integer too long to write out."""
    if isinstance(value, int) and value.bit_length() > _WRITTEN_BITS:
        return None
    try:
        return str(value)
    except ValueError:  # (a lower limit set by PYTHONINTMAXSTRDIGITS)
        return None


def _number(value: float) -> str:
    """A non-secret number for a message, without thousands of digits (an integer too long to
    write out is described by its length, from its logarithm)."""
    text = _written(value)
    if text is None:
        return f"a number of about {int(math.log10(abs(value))) + 1} digits"
    return text if len(text) <= 24 else f"a number of {len(text)} digits"


_KEY_THEN_VALUE: Final = re.compile(r"\s*([^\s:=]+)\s*[\s:=]\s*(\S.*)", re.DOTALL)
"""A key followed by its value in one scalar (the colon mistyped)."""

_SHOWN_SECRET: Final = (
    "holds a secret or 16 characters of one in a row: a secret belongs in a secret field only, "
    "and is not made from a value that is shown (such as the webhook's id)"
)


@functools.lru_cache(maxsize=1024)  # asked for every key of every webhook: a few names
def _is_secret_key(key: str) -> bool:
    """Whether a YAML key names a secret value (``secret``, ``sasl_password``, a Kafka credential
    property...); ``*_file`` keys name paths."""
    return is_kafka_credential(key) and not key.endswith("_file")


_secret_key: Final = functools.lru_cache(maxsize=1024)(_is_secret_key)


_AT_SIGNS: Final = "@\ufe6b\uff20"  # every character NFKC makes "@" (a test checks)
_URL_CHAR: Final = "[^/?#\\s'\"]"  # in an authority (and a userinfo): up to / ? # or a break
# A scheme's colon, its slashes (one or more: a path field shows the URL as a Path, which
# writes "https://" as "https:/"), then the authority.
_AUTHORITY: Final = re.compile(f"(:/+)({_URL_CHAR}*)")
_BEFORE_AT: Final = re.compile(f"{_URL_CHAR}+(?=[{_AT_SIGNS}])")


def _mask_userinfo(text: str) -> str:
    """``text`` with the userinfo of anything that looks like a URL replaced by ``***`` (a URL
    written into the wrong field is echoed by its message; its password must not be), also
    when the URL is mistyped: whatever stands before an @ (URL or not: "https //user:pw@host"
    still ends its userinfo with one), and an authority without an @ whose colon is followed
    by anything but a port (an @ lost). (Over-masking costs a message some detail;
    under-masking a password.)"""

    def mask(match: re.Match[str]) -> str:
        authority = match.group(2)
        _, colon, after = authority.partition(":")
        if (
            colon
            and after
            and not after.isdigit()
            and not authority.startswith("[")
            and not any(at in authority for at in _AT_SIGNS)
        ):
            return f"{match.group(1)}***"
        return match.group(0)

    if any(at in text for at in _AT_SIGNS):
        text = _BEFORE_AT.sub("***", text)
    return _AUTHORITY.sub(mask, text) if ":/" in text else text


def _tag_name(tag: str) -> str:
    """A YAML tag for a message: a standard one by its name (``!!int``), any other by its kind
    only. Its name is the document's, and may be a secret: ``secret: !s3cr3t`` (or ``!!s3cr3t``,
    ``!<s3cr3t>``) written without quotes is an empty value tagged so."""
    if tag in _KNOWN_TAGS:
        return f"!!{tag[len(_YAML_TAG) :]}"
    if tag.startswith(f"{_YAML_TAG}python/"):
        return "a !!python/ tag"
    if tag.startswith(_YAML_TAG):
        return "an unknown !! tag"
    return "an unknown local tag" if tag.startswith("!") else "an unknown global tag"


_UNNAMED_TAG: Final = (
    "only the standard YAML tags are read; the tag is not shown, as a value written without "
    "quotes that starts with '!' is read as a tag"
)
_YAML_NAMED: Final = {
    "found undefined alias": "found an undefined alias",
    "found duplicate anchor": "found a duplicate anchor",
    "found undefined tag handle": "found an undefined tag handle",
    "duplicate tag handle": "found a duplicate tag handle",
}
"""PyYAML's words that name an alias, an anchor or a tag handle, and what is said instead: the
name is the document's, and may be a secret (``secret: *s3cr3t`` written without quotes is an
alias, ``&s3cr3t`` an anchor)."""
_YAML_QUOTED: Final = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_YAML_SAYABLE: Final = re.compile(
    r".|\\(?:x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|.)|<[a-z ]+>|ascii|utf-8", re.DOTALL
)
"""What PyYAML's words may quote: one character (as ``repr`` writes it), a token's name
(``<block end>``), a codec's name."""


def _yaml_words(text: str | None) -> str:
    """PyYAML's ``problem`` or ``context`` text for a message, without any name the document
    chose (see :data:`_YAML_NAMED`), nor any other quoted text but what :data:`_YAML_SAYABLE`
    allows or a standard tag's name."""
    if not text:
        return ""
    for words, said in _YAML_NAMED.items():
        if text.startswith(words):
            return said
    return _YAML_QUOTED.sub(_sayable_or_hidden, text)


def _sayable_or_hidden(match: re.Match[str]) -> str:
    quoted = match.group()
    body = quoted[1:-1]
    return quoted if _YAML_SAYABLE.fullmatch(body) or body in _KNOWN_TAGS else "'...'"


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """What PyYAML found wrong (its context, then its problem), without the names and the text
    of the document (:func:`_yaml_words`); a name left out is replaced by its column."""
    problem, context = _yaml_words(exc.problem), _yaml_words(exc.context)
    mark, first = exc.problem_mark, exc.context_mark
    column = "" if mark is None else f" at column {mark.column + 1}"
    if context == _YAML_NAMED["found duplicate anchor"]:  # (its problem: "second occurrence")
        before = "" if first is None else f" (first at line {first.line + 1})"
        return f"{context}{column}{before}"
    if problem in _YAML_NAMED.values():
        problem += column
    return f"{context}: {problem}" if context else problem


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {_kind(value)} (quote the value)")
    if not value.strip():
        raise _Invalid("must not be empty")
    if not value.isascii() and _SURROGATE.search(value):
        raise _Invalid("contains a lone surrogate (\\ud800 to \\udfff), which is not text")
    return value


_NOT_SHOWN: Final = frozenset({"Cc", "Zl", "Zp"})
"""Unicode categories an account holder id may not hold: controls, line and paragraph
separators. Other format characters (Cf) are part of ordinary ids (ZWNJ in Persian, ZWJ in
emoji, tag characters in flags, a soft hyphen): they are escaped when shown (``printable``)."""
_BIDI_CONTROLS: Final = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
"""The format characters an account holder id may not hold: the bidi controls, which reorder
the text shown around them."""


_INVISIBLE: Final = frozenset({"Cf", "Zs"})
"""The categories of characters an account id may hold but not be made of alone (a zero-width
space, a soft hyphen, a byte-order mark: printed nowhere but escaped)."""


def _account(value: Any) -> str:
    account = _text(value)
    if not account.isprintable():  # (else nothing to look for)
        for at, char in enumerate(account):
            if char in _BIDI_CONTROLS or unicodedata.category(char) in _NOT_SHOWN:
                raise _Invalid(
                    f"contains a control character, line separator or bidi control "
                    f"(U+{ord(char):04X}) at position {at}: an account holder id is text that "
                    "can be shown"
                )
        if all(unicodedata.category(char) in _INVISIBLE for char in account):
            raise _Invalid(
                "has no visible character (only format characters or spaces): an account "
                "holder id is text that can be shown"
            )
    return account


def _path(value: Any) -> Path:
    return Path(_file_path(value))


def _file_path(value: Any) -> str:
    path = _text(value)
    if "\0" in path:
        raise _Invalid("a path must not contain a NUL character")
    return path


def _integer(low: int, high: int) -> Converter:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"expected an integer, got {_kind(value)}")
        if not low <= value <= high:
            raise _Invalid(f"must be between {low} and {high}, got {_number(value)}")
        return value

    return convert


def _seconds(low: float, high: float) -> Converter:
    """A number of seconds above ``low`` and at most ``high``."""

    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(f"expected a number, got {_kind(value)}")
        # Compare before converting: an integer such as 10**400 has no float.
        finite = isinstance(value, int) or math.isfinite(value)
        if not (finite and low < value <= high):
            raise _Invalid(f"must be above {low:g} and at most {high:g}, got {_number(value)}")
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
            raise _Invalid(f"unknown value {_quoted(value)} (expected {', '.join(options)})")
        return text

    return convert


def _webhook_id(value: Any) -> str:
    if not _WEBHOOK_ID.fullmatch(_text(value)):
        raise _Invalid("must be 1 to 64 characters among A-Z a-z 0-9 . _ -")
    return str(value)


def _topic(value: Any) -> str:
    name = _text(value)
    if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise _Invalid(f"invalid Kafka topic name {_quoted(name)} (letters, digits, '.', '_', '-')")
    return name


def _username(value: Any) -> str:
    name = _text(value)
    if ":" in name or _CONTROL.search(name):
        raise _Invalid("must not contain ':' or control characters (HTTP basic authentication)")
    return name


def _url(userinfo_message: str) -> Converter:
    """An absolute http(s) URL judged by :func:`bridge.core.urls.parse_webhook_url`; a URL with
    userinfo gets this field's own message."""

    def convert(value: Any) -> str:
        url = _text(value)
        try:
            _parsed_url(url)
        except UrlError as exc:
            raise _Invalid(userinfo_message if exc.reason == "userinfo" else str(exc)) from None
        return url

    return convert


@functools.lru_cache(maxsize=256)
def _parsed_url(url: str) -> WebhookUrl:
    """:func:`parse_webhook_url`, remembered: a webhook's URL is converted, then its destination
    checked (errors are not remembered: each raises anew)."""
    return parse_webhook_url(url)


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
            raise _Invalid(f"unknown event {_quoted(event)} {expected}")
    return frozenset(value)


def _networks(value: Any) -> tuple[IPNetwork, ...]:
    if not isinstance(value, list):
        raise _Invalid(f"expected a list of CIDR networks, got {_kind(value)}")
    networks = []
    for item in value:
        try:
            networks.append(ipaddress.ip_network(_text(item)))
        except ValueError as exc:
            raise _Invalid(f"invalid network {_quoted(item)}: {_clip(str(exc), 120)}") from None
    return tuple(networks)


def _node(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class _Field:
    convert: Converter
    required: bool = False
    node: bool = False  # keep the YAML node itself: the loader reads it entry by entry


def _converter(kind: LeafKind) -> Converter:
    """The converter that validates a value of ``kind`` (built once per key, at import)."""
    match kind:
        case Text() | SecretText():
            return _text
        case AccountId():
            return _account
        case FilePath():
            return _file_path
        case DirectoryPath():
            return _path
        case Integer(low, high):
            return _integer(low, high)
        case Seconds(low, high):
            return _seconds(low, high)
        case Boolean():
            return _boolean
        case Choice(values, fold):
            return _choice(*values, fold=fold or str)
        case TopicName():
            return _topic
        case Url(basic_auth):
            return _url(_REGISTRY_USERINFO if basic_auth else _WEBHOOK_USERINFO)
        case Username():
            return _username
        case WebhookId():
            return _webhook_id
        case Events():
            return _events
        case Networks():
            return _networks
        case Properties():
            return _node
    assert_never(kind)


def _spec(declared: type[Any]) -> dict[str, _Field]:
    """The keys of a mapping, from the fields of the dataclass ``declared`` in their order (see
    :func:`bridge.core.keys.inputs`). A field without a default is required, but for a secret:
    either of its keys will do, which :meth:`_Loader.secret` checks."""
    spec = {}
    for each in fields(declared):
        required = (
            each.default is MISSING
            and each.default_factory is MISSING
            and not isinstance(key_of(each).kind, SecretText)
        )
        for name, kind in inputs(each):
            spec[name] = _Field(
                _converter(kind), required=required, node=isinstance(kind, Properties)
            )
    return spec


_SECTIONS: Final = {
    name: _spec(declared) for name, declared in sections(Config).items() if declared is not Webhook
}
_TOP_LEVEL: Final = tuple(sections(Config))
_WEBHOOK_FIELDS: Final = _spec(Webhook)
_SECRET_NAMES: Final = tuple(
    each.name for each in fields(Webhook) if isinstance(key_of(each).kind, SecretText)
)
_TLS_FIELDS: Final = frozenset(
    name
    for each in fields(Webhook)
    if isinstance(key_of(each).kind, Nested)
    for name, _ in inputs(each)
)
"""Receiver TLS, in ``delivery`` (the default) and in each webhook (its own, key by key)."""
_SECRET_FIELD_NAMES: Final = frozenset(
    name
    for spec in (*_SECTIONS.values(), _WEBHOOK_FIELDS)
    for name in spec
    if name.endswith(("secret", "password"))
)
"""The fields whose value :meth:`_Loader.section` remembers as a secret."""
_SHOWN_WEBHOOK_KEYS: Final = ("id", "account", "url", *sorted(_TLS_FIELDS))
"""A webhook's fields shown in logs, metrics, /status and reprs: never a secret's value."""


_Content: TypeAlias = tuple[tuple[str, str, Any], ...]
"""A webhook's mapping as plain data (:func:`_reusable_content`)."""
_Noted: TypeAlias = tuple[str, bytes, str, tuple[str, ...], tuple[str, ...], int]
"""What :attr:`Reuse.texts` holds of a webhook's text, all that a load needs of it when it is
not composed (:func:`_noted`): its id, its digest (in the context of the load that noted it),
its shown fields one per line, the values under its secrets' keys, the environment variables
its secrets name, and how many nodes it was composed from. (Few objects: the children unpickle
and pickle 10,000 of them per reload, and its plain data, a tuple per key, took 130 ms.)"""


def _reusable_content(item: Node) -> _Content | None:
    """A webhook's mapping as plain data, ``(key, tag, value)`` per entry in key order (a list's
    value: its items' ``(tag, value)``), or None when it may not be kept (see :class:`Reuse`)."""
    if type(item) is not MappingNode or item.tag != _MAP_TAG:
        return None
    content = []
    keys: set[str] = set()
    for key_node, value_node in item.value:
        key = key_node.value
        if (
            type(key_node) is not ScalarNode
            or key_node.tag != _STR_TAG
            or key not in _WEBHOOK_FIELDS
            or key.endswith("_file")
            or key in keys  # given twice: a problem, reported by building it
        ):
            return None
        keys.add(key)
        kind = type(value_node)
        if kind is ScalarNode:
            content.append((key, value_node.tag, value_node.value))
        elif kind is SequenceNode and all(type(sub) is ScalarNode for sub in value_node.value):
            items = tuple((sub.tag, sub.value) for sub in value_node.value)
            content.append((key, value_node.tag, items))
        else:
            return None
    content.sort()  # the order of a mapping's keys (each once) changes nothing built from it
    return tuple(content)


def _noted(content: _Content, given_id: str, digest: bytes) -> _Noted:
    """What :attr:`Reuse.texts` holds of the webhook of plain data ``content``: what
    :meth:`_Loader.kept` and :meth:`_Loader.remember_document_secrets` read of it."""
    secrets: list[str] = []  # the values under a secret's key (as the document's secrets)
    variables: list[str] = []  # the ${VAR} a secret field names
    nodes = 1  # its mapping, each key, each value (a list: itself and its items)
    for key, tag, value in content:
        nodes += 2 + len(value) if isinstance(value, tuple) else 2
        if _secret_key(key):
            if isinstance(value, tuple):
                secrets += (str(sub) for _sub_tag, sub in value)
            else:
                secrets.append(str(value))
        if key in _SECRET_NAMES and tag == _STR_TAG:
            reference = _ENV_REFERENCE.fullmatch(value)
            if reference:
                variables.append(reference.group(1))
    return (given_id, digest, _shown(content), tuple(secrets), tuple(variables), nodes)


@dataclass(frozen=True, slots=True)
class _Piece:
    """A webhook whose text was met before (:attr:`Reuse.texts`), standing for its nodes."""

    digest: bytes  # of its text
    noted: _Noted
    line: int  # 1-based, of its entry

    @property
    def given_id(self) -> str:
        return self.noted[0]


def _text_digest(segment: str, key: bytes) -> bytes:
    data = segment.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, key=key, digest_size=16).digest()


_ShownField: TypeAlias = tuple[str, str, Node | None]
"""A shown value to check: its key, its text and its node (for the problem's line)."""


def _shown(content: _Content) -> str:
    """A webhook's shown fields (as :meth:`_Loader.kept` checks them), one per line."""
    shown: list[_ShownField] = [
        (key, value, None)
        for key, tag, value in content
        if key in _SHOWN_WEBHOOK_KEYS and tag == _STR_TAG
    ]
    return "\n".join(text for _key, text, _node in _with_shown_host(shown))


def _with_shown_host(shown: list[_ShownField]) -> list[_ShownField]:
    """A webhook's shown fields, and the authority ``bridge check`` shows of its ``url`` when
    it is not the one written (:func:`_shown_host`), as a value of ``url`` too."""
    hosts = [
        ("url", host, node)
        for key, text, node in shown
        if key == "url" and (host := _shown_host(text)) is not None
    ]
    return [*shown, *hosts] if hosts else shown


def _shown_host(url: str) -> str | None:
    """The authority ``bridge check`` shows for a webhook's ``url`` (:func:`shown_authority`:
    lowercased, its host mapped by UTS-46) when it is not the one written, else None: it is
    shown, so checked as the URL is. (Most URLs are ASCII in lowercase: nothing to work out.)"""
    if url.isascii() and url.islower():
        return None
    try:
        shown = shown_authority(url)
    except UrlError:  # (a URL as written that is not valid: never shown)
        return None
    return None if shown == url_authority(url) else shown


def _may_note(segment: str) -> bool:
    """Whether a webhook's text may be noted in :attr:`Reuse.texts`: nothing in it refers to the
    rest of the document (an anchor, an alias, a tag, whose handle a directive may define) or
    is read otherwise by libyaml and PyYAML (see :func:`_libyaml_may_differ`)."""
    return not (_libyaml_may_differ(segment) or _may_start_token(segment, "&*"))


Where: TypeAlias = Callable[[str], str]
"""Names a field for a message: ``field 'retry.attempts'`` or ``webhook 'x': field 'url'``."""

_Source: TypeAlias = tuple[int, str]
"""Where a problem is: the position of its file (0 for the directory itself, or a lone file) and
the path its message starts with."""

_ShownFields: TypeAlias = Sequence[_ShownField] | MappingNode
"""Shown values to check, each ``(key, text, node)``; or a kept webhook's mapping, whose shown
keys are read from it when one holds a secret (:meth:`_Loader.check_shown`)."""
_Shown: TypeAlias = tuple[str, _Source, Where | None, _ShownFields, tuple[str | None, int] | None]
"""Shown values noted while loading (:meth:`_Loader.refuse_shown_secrets`): their text joined
(looked up first), their file, how their fields are named, the fields, and for a webhook its
id as written and its place in its list (it is named once every secret is known)."""


@dataclass(slots=True)
class _Values:
    """The valid fields present in one YAML mapping, the nodes they came from, and the mapping."""

    values: dict[str, Any]
    nodes: dict[str, Node]
    node: Node | None
    where: Where
    given: set[str] = field(default_factory=set)  # keys with a value, valid or not
    source: _Source = (0, "")  # the file the mapping is in


_SPEC_ORDERS: dict[int, tuple[Mapping[str, _Field], dict[str, int], tuple[str, ...]]] = {}


def _spec_order(spec: Mapping[str, _Field]) -> tuple[dict[str, int], tuple[str, ...]]:
    """The position of each field of ``spec`` and its required fields (those read in a
    section when absent: to say they are missing), remembered per spec."""
    known = _SPEC_ORDERS.get(id(spec))
    if known is None or known[0] is not spec:
        order = {name: index for index, name in enumerate(spec)}
        required = tuple(name for name, each in spec.items() if each.required and not each.node)
        known = _SPEC_ORDERS[id(spec)] = (spec, order, required)
    return known[1], known[2]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [child for pair in node.value for child in pair]
    return []


def _distinct_nodes(root: Node) -> Iterator[Node]:
    """Every node under ``root`` (itself included) once, however many aliases reach it."""
    seen = {id(root)}
    pending = [root]
    while pending:
        node = pending.pop()
        yield node
        for child in _children(node):
            if id(child) not in seen:
                seen.add(id(child))
                pending.append(child)


_RECURSIVE: Final = "recursive alias: a node anchored here contains an alias to itself"


def _shape_problem(
    root: Node, extra: int = 0, distinct: int | None = None
) -> tuple[Node, str] | None:
    """Why the composed document is refused before any value is built, or None.

    Walks the node graph once (iteratively; aliases share nodes) to find recursive aliases, the
    nesting depth and the size the document would have once every alias is expanded. ``extra``
    nodes of the document were not composed (a tree, with no alias: they count once in its size
    and in its distinct nodes). ``distinct``: how many nodes the composer made (the graph's
    distinct nodes), when it counted them; then scalars (most of the nodes) are not remembered
    one by one (:func:`_collections_walk`).
    """
    if distinct is not None and type(root) is not ScalarNode:
        walked = _collections_walk(root)
        if walked is not None:
            problem, total, deepest = walked
            return problem or _expansion_problem(root, total + extra, deepest, distinct + extra)
    scalars: set[int] = set()
    figures: dict[int, tuple[int, int]] = {}  # each collection's expanded size and depth
    active = {id(root)}
    # Each entry: a collection, its children, and those not yet visited (in document order).
    stack: list[tuple[Node, list[Node], list[Node]]] = []
    if isinstance(root, ScalarNode):
        scalars.add(id(root))
    else:
        children = _children(root)
        stack.append((root, children, children[::-1]))
    while stack:
        node, children, pending = stack[-1]
        while pending:
            child = pending.pop()
            key = id(child)
            if key in active:
                return child, _RECURSIVE
            if key in scalars or key in figures:
                continue
            if len(stack) >= MAX_NESTING:
                return child, f"nested more than {MAX_NESTING} levels deep"
            if type(child) is ScalarNode:
                scalars.add(key)
                continue
            active.add(key)
            grandchildren = _children(child)
            stack.append((child, grandchildren, grandchildren[::-1]))
            break
        else:
            stack.pop()
            key = id(node)
            active.discard(key)
            size, depth = 1, 0
            for child in children:
                known = figures.get(id(child))
                if known is None:  # a scalar
                    size += 1
                    depth = depth or 1
                else:
                    size += known[0]
                    depth = max(depth, known[1])
            figures[key] = (size, depth + 1)
    total, deepest = figures.get(id(root), (1, 1))
    return _expansion_problem(root, total + extra, deepest, len(scalars) + len(figures) + extra)


def _collections_walk(root: Node) -> tuple[tuple[Node, str] | None, int, int] | None:
    """``(None, size, depth)``: the expanded size and depth of the collection ``root``, or
    ``((node, reason), 0, 0)``: a recursive alias or nesting too deep found at ``node``; visiting
    each distinct collection once and taking each scalar as met (size 1, depth 1) without
    remembering it. None when the walk cannot tell without knowing which scalars it met
    before: a scalar as deep as :data:`MAX_NESTING` (the first meeting of one there is a
    problem, a later one through an alias is not; :func:`_shape_problem` walks again, scalars
    remembered). The same verdicts, in the same order, as that walk."""
    figures: dict[int, tuple[int, int]] = {}  # each collection's expanded size and depth
    active = {id(root)}
    # Each frame: the collection, its children not yet visited, and its size and its deepest
    # child's depth so far.
    frame: list[Any] = [root, iter(_children(root)), 1, 0]
    stack = [frame]
    limit = MAX_NESTING
    while True:
        size, deepest = frame[2], frame[3]
        for child in frame[1]:
            if type(child) is ScalarNode:
                if len(stack) >= limit:
                    return None
                size += 1
                deepest = deepest or 1
                continue
            key = id(child)
            known = figures.get(key)
            if known is not None:
                size += known[0]
                deepest = max(deepest, known[1])
                continue
            if key in active:
                return (child, _RECURSIVE), 0, 0
            if len(stack) >= limit:
                return (child, f"nested more than {limit} levels deep"), 0, 0
            frame[2], frame[3] = size, deepest
            active.add(key)
            frame = [child, iter(_children(child)), 1, 0]
            stack.append(frame)
            break
        else:
            stack.pop()
            key = id(frame[0])
            active.discard(key)
            figures[key] = (size, deepest + 1)
            if not stack:
                return None, size, deepest + 1
            frame = stack[-1]
            frame[2] += size
            frame[3] = max(frame[3], deepest + 1)


def _expansion_problem(
    root: Node, total: int, deepest: int, distinct: int
) -> tuple[Node, str] | None:
    """The verdict on a document of ``distinct`` nodes whose size is ``total`` and depth
    ``deepest`` once every alias is expanded."""
    if deepest > MAX_NESTING:
        return root, f"nested more than {MAX_NESTING} levels deep (through aliases)"
    added = total - distinct
    limit = max(MAX_ALIAS_EXPANSION, ALIAS_EXPANSION_FACTOR * distinct)
    if added > limit:
        return root, (
            f"aliases would expand the document by more than {limit} nodes ({added}); "
            "write the values out or share fewer"
        )
    return None


_NEWLINE: Final = b"\n"


class _TooDeep(yaml.YAMLError):
    """Collections nested deeper than MAX_NESTING while composing."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _YamlLoader(yaml.SafeLoader):
    """The safe loader, refusing nesting deeper than MAX_NESTING as it composes (the composer
    recurses once per level, so a deep document would otherwise end in a RecursionError)."""

    def __init__(self, stream: str, budget: int = MAX_NODES) -> None:
        super().__init__(stream)
        self._depth = 0
        self._budget = budget
        self.nodes = 0  # made so far (an alias makes none)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self._depth >= MAX_NESTING:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _TooDeep(event.start_mark.line + 1)
        if not self.check_event(yaml.AliasEvent):
            self.nodes += 1
            if self.nodes > self._budget:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _TooMany(event.start_mark.line + 1)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _TooMany(yaml.YAMLError):
    """More than the nodes left of MAX_NODES while composing; ``line``: the node's (the pure
    composer), or where the collection composing it starts (libyaml gives no mark of its own)."""

    def __init__(self, line: int | None) -> None:
        super().__init__(line)
        self.line = line


class _Declined(Exception):
    """The libyaml composer leaves the document to the pure one, which has the last word."""


_NON_PRINTABLE: Final = yaml.reader.Reader.NON_PRINTABLE
_FAST_MAX_LEVEL: Final = MAX_NESTING - 1
"""The libyaml composer declines a node at this level (the root is level 1) or deeper, so any
document that could reach the pure composer's limit is judged by the pure composer alone."""
_PLAIN_TAG_CACHE_LENGTH: Final = 64  # plain scalars up to this long have their tag remembered

if yaml.__with_libyaml__:

    class _FastYamlLoader(yaml.CSafeLoader):
        """PyYAML's libyaml-backed safe loader, about ten times faster than the pure one, with
        the same guard on nesting (its composer recurses in C, where a deep document would crash
        the process rather than raise): it declines at :data:`_FAST_MAX_LEVEL`.

        libyaml calls :meth:`descend_resolver` and :meth:`ascend_resolver` around every node but
        aliases; the loader has no path resolvers, so they only count the levels here, and the
        nodes made (:attr:`nodes`: the graph's distinct nodes).
        """

        def __init__(self, stream: str, budget: int = MAX_NODES) -> None:
            super().__init__(stream)
            self._level = 0
            self.nodes = 0
            self._budget = budget
            self._plain_tags: dict[str, str] = {}
            if self.yaml_path_resolvers:  # never set for this class; keep the general code exact
                raise _Declined

        def descend_resolver(self, current_node: Any, current_index: Any) -> None:
            if self._level >= _FAST_MAX_LEVEL - 1:
                raise _Declined
            self._level += 1
            self.nodes += 1
            if self.nodes > self._budget:  # (current_node: the collection composing it)
                raise _TooMany(None if current_node is None else current_node.start_mark.line + 1)

        def ascend_resolver(self) -> None:
            self._level -= 1

        def resolve(self, kind: type[Node], value: Any, implicit: Any) -> str:
            """:meth:`yaml.resolver.Resolver.resolve` without path resolvers, a plain scalar's
            tag remembered by its text (a configuration repeats its keys thousands of times)."""
            if kind is MappingNode:  # (no path resolvers: the default tags)
                return str(self.DEFAULT_MAPPING_TAG)
            if kind is SequenceNode:
                return str(self.DEFAULT_SEQUENCE_TAG)
            if kind is not ScalarNode:
                return str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]
            if not implicit[0]:
                if not implicit[1]:  # an empty scalar tagged '!': the pure parser makes it null
                    raise _Declined
                return str(self.DEFAULT_SCALAR_TAG)
            tag = self._plain_tags.get(value)
            if tag is None:
                starts = _IMPLICIT_STARTS
                if starts is not None and value and value[0] not in starts:
                    return str(self.DEFAULT_SCALAR_TAG)  # no other type starts so (an id, a URL)
                tag = str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]
                if len(value) <= _PLAIN_TAG_CACHE_LENGTH:
                    self._plain_tags[value] = tag
            return tag

    # The characters a plain scalar that resolves to anything but a string can start with (None
    # when a resolver is tried whatever the first character: then every scalar is resolved).
    _IMPLICIT_STARTS: Final = (
        None
        if None in _FastYamlLoader.yaml_implicit_resolvers
        else frozenset(char for char in _FastYamlLoader.yaml_implicit_resolvers if char)
    )
    FAST_YAML_LOADER: type[_FastYamlLoader] | None = _FastYamlLoader
else:  # PyYAML built without libyaml
    FAST_YAML_LOADER = None
"""The loader tried first (libyaml), or None: compose with the pure-Python loader alone. Whatever
libyaml refuses, errs on or declines (control characters, nesting near :data:`MAX_NESTING`, a
bad escape...) is composed again by the pure loader, whose result and messages are the ones
reported: libyaml only ever speeds up a document both accept."""


_LINE_BREAKS: Final = "\r\n\x85\u2028\u2029"
_CANDIDATES_CHECKED: Final = 10_000  # past this many, a character is taken to start a token


def _may_start_token(text: str, chars: str, after: str | None = None) -> bool:
    """Whether one of ``chars`` may start a YAML token in ``text``: a superset, cheap to find.

    With ``after`` (a set of characters), only at the start or right after one of them;
    otherwise at the start or after anything but a word character or ``=``: an indicator such
    as ``!`` or ``&`` starts a token after whitespace, a flow indicator or a quote, and a
    character right after a letter (``pa!ss``, ``a=1&b=2``) is inside a plain scalar.
    """
    for char in chars:
        at = text.find(char)
        for _ in range(_CANDIDATES_CHECKED):
            if at < 0:
                break
            if at == 0:
                return True
            before = text[at - 1]
            if after is None:
                if not (before.isalnum() or before in "_="):
                    return True
            elif before in after:
                return True
            at = text.find(char, at + 1)
        else:
            return True
    return False


_FLOW_BEFORE: Final = "\n ,[{"
"""What may come right before a ``[`` or ``{`` that starts a flow collection (or the start)."""


def _flow_then_question(text: str) -> bool:
    """Whether a ``?`` comes after what may start a flow collection on its line (a ``[`` or
    ``{`` at the start of a line or after a space or another flow indicator: ``https://[::1]/?a``
    and ``${X}`` start none), or a flow collection is left open at the end of a line (then any
    ``?`` may be inside it). Each line with such a start is looked at once (linear in the text)."""
    for opener in "[{":
        at = text.find(opener)
        line_end = newline = last_question = last_close = -1
        while at >= 0:
            if at == 0 or text[at - 1] in _FLOW_BEFORE:
                if at > line_end:  # the first on its line
                    newline = text.find("\n", at)
                    line_end = len(text) if newline < 0 else newline
                    last_question = text.rfind("?", at, line_end)
                    last_close = max(text.rfind("]", at, line_end), text.rfind("}", at, line_end))
                if last_question > at or (newline >= 0 and last_close < at):
                    return True
            at = text.find(opener, at + 1)
    return False


def _libyaml_may_differ(text: str) -> bool:
    """Whether libyaml may read ``text`` otherwise than PyYAML: tabs (libyaml takes them where
    PyYAML refuses them, as in ``a: b<TAB>``), a byte order mark (libyaml skips one at the start
    of any line, PyYAML only at the start of the text), directives, tags (libyaml takes handles
    PyYAML refuses, as ``!...!``, and types an empty scalar tagged ``!`` otherwise), block
    scalars (libyaml takes ``|#`` without a space) and a ``?`` in a flow collection (PyYAML ends
    a plain scalar there, as in ``{s?urce: x}``, libyaml does not)."""
    return (
        "\t" in text
        or "\ufeff" in text
        or _may_start_token(text, "%", after=_LINE_BREAKS)
        or _may_start_token(text, "!|>")
        or ("?" in text and _flow_then_question(text))
    )


def _compose_fast(text: str, budget: int = MAX_NODES) -> tuple[bool, Node | None, int]:
    """``(True, root, nodes)`` when libyaml composed the document (``nodes``: how many distinct
    nodes it made), ``(False, None, 0)`` when the pure loader must: no libyaml, no line break at
    the end (there libyaml moves to a new line, so a value left empty at the end, as in ``? a``,
    would have its line one further), something libyaml may read otherwise
    (:func:`_libyaml_may_differ`), a character the pure reader refuses, or any libyaml
    failure. _TooMany past ``budget`` nodes (the pure loader would only stop there too, ten
    times slower)."""
    loader_class = FAST_YAML_LOADER
    if (
        loader_class is None
        or not text.endswith("\n")
        or _libyaml_may_differ(text)
        or _NON_PRINTABLE.search(text)
    ):
        return False, None, 0
    try:
        loader = loader_class(text, budget)
        try:
            return True, loader.get_single_node(), loader.nodes
        finally:
            loader.dispose()
    except _TooMany:
        raise
    except Exception:  # its own words and marks differ: the pure loader says what is wrong
        return False, None, 0


def _compose(text: str, budget: int) -> tuple[bool, Node | None, int]:
    """``(fast, root, nodes)``: the document composed by libyaml (``fast``) or else by PyYAML's
    pure loader, and how many distinct nodes it made; _TooMany past ``budget`` nodes."""
    fast, root, nodes = _compose_fast(text, budget)
    if fast:
        return fast, root, nodes
    loader = _YamlLoader(text, budget)
    try:
        return False, loader.get_single_node(), loader.nodes
    finally:
        loader.dispose()


def _decode(data: bytes) -> str:
    """The text of the file: UTF-8 (BOM allowed), or UTF-16 with its BOM, as YAML allows."""
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    try:
        return data.decode("utf-16" if utf16 else "utf-8-sig")
    except UnicodeDecodeError as exc:
        encoding = "UTF-16" if utf16 else "UTF-8"
        line = "" if utf16 else f" (line {data.count(_NEWLINE, 0, exc.start) + 1})"
        raise _Invalid(f"the file is not {encoding} text{line}") from None


def _agreement(a: str, i: int, b: str, j: int, *, before: bool = False) -> int:
    """How many characters ``a[i:]`` and ``b[j:]`` share from their start (``before``: ``a[:i]``
    and ``b[:j]`` from their end). Slices are compared in C, their lengths doubled, then halved
    once they differ: the work is that of the agreement, not of the strings."""
    most = min(i, j) if before else min(len(a) - i, len(b) - j)
    good, step = 0, 1
    while good < most:
        step = min(step, most - good)
        if before:
            same = a[i - good - step : i - good] == b[j - good - step : j - good]
        else:
            same = a[i + good : i + good + step] == b[j + good : j + good + step]
        if same:
            good += step
            step *= 2
        elif step == 1:
            break
        else:
            step //= 2
    return good


def _stretch(length: int) -> int:
    """Every how many characters of a secret of ``length`` :class:`_Secrets` indexes windows."""
    return max(_SCRUB_MIN_LENGTH, length // _PART_STRETCHES)


@functools.lru_cache(maxsize=1024)  # (a few lengths: the secrets of a file are alike)
def _windows(length: int, stride: int) -> tuple[slice, ...]:
    """The windows :class:`_Secrets` indexes of a secret of ``length`` characters: the first
    ``stride`` of each stretch (:func:`_stretch`)."""
    width = _SCRUB_MIN_LENGTH
    last = length - width  # (where the last window starts)
    return tuple(
        slice(offset, offset + width)
        for stretch in range(0, last + 1, _stretch(length))
        for offset in range(stretch, min(stretch + stride, last + 1))
    )


@functools.lru_cache(maxsize=4096)  # (shown values of a few hundred lengths)
def _cuts(length: int, stride: int) -> tuple[slice, ...]:
    """The windows :meth:`_Secrets.found_in` looks up in a text of ``length`` characters."""
    width = _SCRUB_MIN_LENGTH
    return tuple(slice(at, at + width) for at in range(0, length - width + 1, stride))


_CUTS_CACHED: Final = 1024
"""Texts up to this long are cut by cached slices (:func:`_cuts`); longer ones as they come (a
cached tuple holds about 30 bytes per character of the text, kept after the load)."""


def _windows_of(text: str, stride: int) -> Iterator[str]:
    """The windows of ``text`` that :meth:`_Secrets.found_in` looks up."""
    if len(text) <= _CUTS_CACHED:
        return map(text.__getitem__, _cuts(len(text), stride))
    width = _SCRUB_MIN_LENGTH
    return (text[at : at + width] for at in range(0, len(text) - width + 1, stride))


_WORK_BASE: Final = 256
_WORK_PER_CHARACTER: Final = 16
"""How many possible placements of a secret one text may have measured: this many per
character, and :data:`_WORK_BASE` more. A real text uses a few; one made to look like many
secrets at once (a config author's periodic or shared-prefix secrets) reaches it, and is then
taken to hold a secret (see :class:`_TooAlike`)."""

_WORK_PER_LOAD: Final = 200_000
"""How many placements the messages of one load may have measured in all to be masked (its
secrets and their lowercase twin together), a few microseconds each: a file can bring 1,000
problems of 2,000 characters, each within its own bound, and made to look like its secrets in
capitals they took 33 s to mask. Past it every message is taken to hold a secret where it meets
one's window (see :class:`_TooAlike`)."""


_MOST_PLACEMENTS: Final = 8
"""A window indexed at more places than this in one secret (a periodic secret: ``abab...``) is
not split (:meth:`_Secrets._split`): a text holding it is taken to hold a secret."""
_KEY_MOST: Final = 24
"""The longest string a shared window's placements are keyed by (:meth:`_Secrets._key`)."""


class _TooAlike(Exception):
    """A text holds so many windows of the secrets that measuring them all would cost more than
    the bound: it is taken to hold one (refused if shown, masked whole in a message)."""


def _needed(secret: str) -> int:
    """How many characters of ``secret`` in a row a text must hold to hold it."""
    return min(len(secret), _stretch(len(secret)) + _SHOWN_PART - _SCRUB_MIN_LENGTH)


def _echoed(secret: str) -> set[str]:
    """Every form ``secret`` takes in a message: as written, inside a ``repr`` (a message quotes
    a value so: backslashes, tabs, line breaks and characters that are not printable escaped,
    ``'`` escaped or not, by the quotes the whole value needed) and as :func:`printable` writes
    it (a line of output). Each is looked for as a secret of its own."""
    if secret.isprintable() and "\\" not in secret and "'" not in secret:
        return {secret}  # (nearly every secret: repr and printable leave it as it is)
    quoted = repr(secret)
    body = quoted[1:-1]
    if quoted[0] == "'" and "'" in secret:  # (both quotes in it: each ' escaped)
        other = body.replace("\\'", "'")
    else:
        other = body.replace("'", "\\'")
    return {secret, body, other, printable(secret)}


_Split: TypeAlias = dict[int, dict[str, dict[tuple[str, int], None]]]
"""What :meth:`_Secrets._split` makes of a shared window: by length, each string of the secrets
around it, and where the window is in each secret that holds the string there."""


class _Secrets:
    """The secret values met while loading, to keep them out of every message and every field
    that is not a secret.

    A text *holds* a secret (one of at least :data:`_SCRUB_MIN_LENGTH` characters) when it holds
    all of it or :data:`_SHOWN_PART` characters of it in a row (for a secret of more than
    ``32 * 8`` characters, a 32nd of it and 8 more): a part that long shown in a log gives much
    of the secret away (pasted after a prefix, into a URL's password, or cut short).
    :meth:`scrub` replaces each such run of a text with ``***`` (overlapping or adjacent runs
    become one); :meth:`found_in` says whether there is one.

    Both work from one index, whatever the number of secrets (a file of 10,000 webhooks has
    10,000 of them, and may have as many problems): a secret is indexed by its windows of
    :data:`_SCRUB_MIN_LENGTH` characters at the first :attr:`_stride` offsets of each stretch
    (:func:`_stretch`: 8 characters, or a 32nd of a long secret, so at most 64 windows a
    secret). A run long enough to count (:func:`_needed`) holds one such window at every offset
    modulo the stride, so looking up one position of the text in a stride finds it; the run
    is then measured from there, once per alignment of a secret. The stride is
    :data:`_FOUND_STRIDE`, 1 while a secret of :data:`_SCRUB_MIN_LENGTH` characters is held
    (the index is rebuilt when one comes). :meth:`found_in` is asked of every shown value (three
    per webhook) and looks at one position in a stride; :meth:`scrub`, of each problem only,
    looks at every one.

    The work is bounded by the text whatever the secrets: a shared window's split is kept and
    each new secret keyed into it; a text may have at most :data:`_WORK_PER_CHARACTER`
    placements measured per character (and :data:`_WORK_BASE`); a window met at more than
    :data:`_MOST_PLACEMENTS` places of one secret is not measured; and the messages masked
    through one index (one load) at most :data:`_WORK_PER_LOAD` placements in all. A text past
    any of them is *too alike* (:class:`_TooAlike`): it is taken to hold a secret, so it is
    refused if shown and masked whole in a message. Only a periodic secret, or many secrets with
    a long common part, can make a text so."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._stride = _FOUND_STRIDE
        # Each indexed window: the secret it is a window of, or the set of them when several
        # share it (not a record of the offsets: they are found again in the secret when a
        # text holds the window, which is seldom).
        self._index: dict[str, str | set[str]] = {}
        # A shared window met in a text: the secrets holding it, keyed by the strings around it
        # (see :meth:`_split`); a secret that comes later is keyed into it (:meth:`_sample`).
        self._splits: dict[str, _Split] = {}
        # Windows met at more than _MOST_PLACEMENTS places of one secret (see _TooAlike).
        self._alike: set[str] = set()
        self._folded: _Secrets | None = None  # the secrets in lowercase (scrub), made once
        self._work: list[float] = [_WORK_PER_LOAD]  # placements left (shared with _folded)
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str) -> None:
        """Look for ``secret`` in every form a message can show it in (:func:`_echoed`)."""
        for form in _echoed(secret):
            self._add(form)

    def _add(self, secret: str) -> None:
        width = _SCRUB_MIN_LENGTH
        if len(secret) < width or secret in self._secrets:
            return
        self._secrets.add(secret)
        self._folded = None
        if len(secret) - width + 1 < self._stride:
            self._stride = len(secret) - width + 1
            self._index, self._splits, self._alike = {}, {}, set()
            for known in self._secrets:
                self._sample(known)
        else:
            self._sample(secret)

    def _sample(self, secret: str) -> None:
        index, splits, alike = self._index, self._splits, self._alike
        setdefault = index.setdefault
        windows = list(map(secret.__getitem__, _windows(len(secret), self._stride)))
        if len(set(windows)) + _MOST_PLACEMENTS < len(windows):  # (a cheap test first)
            counts = collections.Counter(windows)
            alike.update(each for each, count in counts.items() if count > _MOST_PLACEMENTS)
        for window in windows:
            held = setdefault(window, secret)
            if held is secret:
                continue
            if isinstance(held, str):
                index[window] = {held, secret}
            else:
                held.add(secret)
            # (a split is kept and the secret keyed into it: rebuilt at each add, it cost n²)
            split = splits.get(window) if splits else None
            if split is not None and window not in alike:
                self._key(split, window, secret)

    def __contains__(self, secret: str) -> bool:
        """Whether ``secret`` is looked for (one of at least :data:`_SCRUB_MIN_LENGTH`
        characters added)."""
        return secret in self._secrets

    def held(self) -> frozenset[str]:
        """Every secret looked for."""
        return frozenset(self._secrets)

    def _placed(self, secret: str, window: str) -> list[tuple[str, int]]:
        """Where ``secret`` holds ``window`` among its indexed windows: (secret, offset), ..."""
        return [
            (secret, piece.start)
            for piece in _windows(len(secret), self._stride)
            if secret.startswith(window, piece.start)
        ]

    def _split(self, window: str, secrets: set[str]) -> _Split:
        """The secrets sharing ``window``, sorted for a text that holds it. A run long enough to
        count holds ``min(len(secret), _needed(secret), 24)`` characters of the secret in a row
        around the window, at one of at most 17 places: each placement of the window in a secret
        is keyed by those strings, by their length, and a text is looked up by the same few
        strings. (Secrets made from one template share windows, and a long common prefix: each of
        thousands would be measured at each hit.)"""
        split: _Split = {}
        for secret in secrets:
            self._key(split, window, secret)
        self._splits[window] = split
        return split

    def _key(self, split: _Split, window: str, secret: str) -> None:
        """Key each placement of ``window`` in ``secret`` in ``split`` (see :meth:`_split`);
        a placement is keyed once by each string (a periodic secret gives one string often)."""
        width, size = _SCRUB_MIN_LENGTH, min(len(secret), _needed(secret), _KEY_MOST)
        keyed = split.setdefault(size, {})
        for placed in self._placed(secret, window):
            offset = placed[1]
            for start in range(max(0, offset + width - size), offset + 1):
                if start + size <= len(secret):
                    keyed.setdefault(secret[start : start + size], {})[placed] = None

    def _spans(self, text: str, starts: range, messages: bool = False) -> Iterator[tuple[int, int]]:
        """The runs of ``text`` long enough to hold a secret (see the class) that hold a window
        indexed at one of ``starts``, each once (windows of a run met again are skipped).
        Raises :class:`_TooAlike` past the bound of :data:`_WORK_PER_CHARACTER`, or, for
        ``messages``, once the messages have measured :data:`_WORK_PER_LOAD` placements in all.
        (Not the shown values: their work grows with the file, and a valid file of 100,000
        webhooks whose ids each share a window with their secret spent 200,000.)"""
        width, index = _SCRUB_MIN_LENGTH, self._index
        measured: dict[tuple[str, int], int] = {}  # (secret, alignment): end of its run
        work = _WORK_BASE + _WORK_PER_CHARACTER * len(text)
        left = self._work if messages else [math.inf]  # (the shown values': no load bound)
        for at in starts:
            window = text[at : at + width]
            held = index.get(window)
            if held is None:
                continue
            if window in self._alike:
                raise _TooAlike
            candidates: Iterable[tuple[str, int]]
            if isinstance(held, str):
                candidates = self._placed(held, window)
            else:
                split = self._splits.get(window) or self._split(window, held)
                candidates = (  # (lazily: the bound may end it)
                    placed
                    for size, keyed in split.items()
                    for start in range(max(0, at + width - size), at + 1)
                    for placed in keyed.get(text[start : start + size], ())
                )
            for secret, offset in candidates:
                work -= 1
                left[0] -= 1
                if work < 0 or left[0] < 0:
                    raise _TooAlike
                alignment = (secret, at - offset)
                if measured.get(alignment, -1) >= at + width or _needed(secret) > len(text):
                    continue
                start = at - _agreement(text, at, secret, offset, before=True)
                end = at + width + _agreement(text, at + width, secret, offset + width)
                measured[alignment] = end
                if end - start >= _needed(secret):
                    yield start, end

    def found_in(self, text: str) -> bool:
        """Whether ``text`` holds any of the secrets. (Asked of every value that may be shown,
        tens of thousands at 10,000 webhooks: one window in :attr:`_stride` is cut, the windows
        are matched against the index by the set code, in C, and only a window that may be
        part of a secret is looked at further.)"""
        index, width, stride = self._index, _SCRUB_MIN_LENGTH, self._stride
        if not index or len(text) < width:
            return False
        if index.keys().isdisjoint(_windows_of(text, stride)):
            return False
        starts = range(0, len(text) - width + 1, stride)
        try:
            return next(self._spans(text, starts), None) is not None
        except _TooAlike:
            return True

    def _runs(self, text: str) -> list[tuple[int, int]]:
        """The spans of ``text`` that hold a secret, overlapping and adjacent ones merged."""
        try:
            starts = range(len(text) - _SCRUB_MIN_LENGTH + 1)
            return _merged(list(self._spans(text, starts, messages=True)))
        except _TooAlike:
            return [(0, len(text))]

    def scrub(self, text: str) -> str:
        """``text`` with each run that holds a secret replaced by ``***``, whatever the case of
        its letters (a message may echo a value lowercased, as a URL's host is): a text with
        capitals, or secrets with some, is looked at twice, the second time in lowercase."""
        runs = self._runs(text)
        if self._secrets and runs != [(0, len(text))]:
            if self._folded is None:
                folded = _Secrets(map(_lowercase, self._secrets))
                folded._work = self._work
                self._folded = self if folded.held() == self.held() else folded
            lowered = _lowercase(text)
            if self._folded is not self or lowered != text:  # (else: the same runs again)
                runs = _merged(runs + self._folded._runs(lowered))
        if not runs:
            return text
        parts, at = [], 0
        for start, end in runs:
            parts += [text[at:start], "***"]
            at = end
        parts.append(text[at:])
        return "".join(parts)


def _lowercase(text: str) -> str:
    """``text`` in lowercase, character for character (a character whose lowercase is longer,
    such as U+0130, is left as it is), so that a span of it is the same span of ``text``."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(low if len(low := char.lower()) == 1 else char for char in text)


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` in order, overlapping and adjacent ones merged."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(runs):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class _Loader:
    """Walks the composed YAML tree, converting sections and collecting every problem."""

    def __init__(self, path: str, environ: Mapping[str, str], reuse: Reuse | None = None) -> None:
        self.path = path
        self.environ = environ
        self.reuse = reuse
        self.sources: list[tuple[Path, str]] = []
        # Each problem: its file, its line (0: none), ":line" or "", and the text (or what
        # writes it: written only if the problem is listed, see problems).
        self._problems: list[tuple[_Source, int, str, _Text]] = []
        self._source: _Source = (0, path)  # the file being read (its problems name it)
        self._secrets = _Secrets()
        self._constructor = SafeConstructor()
        # With Reuse: the entries of a webhooks list composed with some left out (by the list's
        # id), and the digest of the text of each webhook composed that may be noted (by id).
        self._entries: dict[int, list[Node | _Piece]] = {}
        self._text_of: dict[int, bytes] = {}
        # The webhooks' texts to note once every secret is known (settle_texts): those composed,
        # and the shown fields of those that were not.
        self._fresh: list[tuple[bytes, _Noted]] = []
        self._uncomposed_shown: list[str] = []
        # Every shown value, checked once every secret of the load is known (check_shown).
        self._shown: list[_Shown] = []
        self._context = b""
        # The outbound policy of the delivery section, and its verdict on each literal address.
        self._policy: tuple[DeliveryConfig, DestinationPolicy, dict[str, str | None]] | None = None
        self._nodes_left = MAX_NODES  # of the configuration's files together

    @property
    def problems(self) -> list[str]:
        """The problems found so far, in line order, secret values masked: the first
        :data:`MAX_PROBLEMS` (each cut to :data:`PROBLEM_LIMIT` characters), then a count of the
        rest. Only those listed are written and masked (a file with tens of thousands of unknown
        keys spent seconds finding a suggestion for each)."""
        scrub = self._secrets.scrub
        problems = []
        ordered = sorted(self._problems, key=lambda problem: (problem[0][0], problem[1]))
        for source, _, place, text in ordered[:MAX_PROBLEMS]:
            written = _clip(text if isinstance(text, str) else text(), PROBLEM_LIMIT)
            shown = _clip(_mask_userinfo(scrub(written)), PROBLEM_LIMIT)
            problems.append(printable(f"{source[1]}{place}: {shown}"))
        if len(ordered) > MAX_PROBLEMS:
            more = len(ordered) - MAX_PROBLEMS
            problems.append(printable(f"{self.path}: ... and {more} more problem(s)"))
        return problems

    def remember_document_secrets(self, root: Node) -> None:
        """Note every scalar written under a secret's key, wherever it is (an alias could show it
        in another field's message, even from a section the loader does not read)."""
        verdicts: dict[str, bool] = {}  # key text: whether it names a secret
        seen = {id(root)}
        pending = [root]
        while pending:
            node = pending.pop()
            if isinstance(node, MappingNode):
                for key_node, value_node in node.value:
                    # (type() first: nearly every key and most values are plain scalars)
                    keyed = type(key_node) is ScalarNode or isinstance(key_node, ScalarNode)
                    scalar = type(value_node) is ScalarNode or isinstance(value_node, ScalarNode)
                    if not keyed and id(key_node) not in seen:
                        seen.add(id(key_node))
                        pending.append(key_node)
                    if not scalar and id(value_node) not in seen:
                        seen.add(id(value_node))
                        pending.append(value_node)
                    if not keyed:
                        continue
                    key = str(key_node.value)
                    secret = verdicts.get(key)
                    if secret is None:
                        secret = verdicts[key] = _is_secret_key(key)
                        self.remember_key_tail(key)
                    if not secret:
                        continue
                    if scalar:
                        self.remember_secret(str(value_node.value))
                        continue
                    subtree = list(_distinct_nodes(value_node))
                    paths = {  # {file: PATH} names a file, it is not the secret
                        id(value)
                        for sub in subtree
                        if isinstance(sub, MappingNode)
                        for key, value in sub.value
                        if isinstance(key, ScalarNode) and key.value == "file"
                    }
                    for sub in subtree:
                        if isinstance(sub, ScalarNode) and id(sub) not in paths:
                            self.remember_secret(str(sub.value))
            elif isinstance(node, SequenceNode):
                for child in node.value:
                    if not isinstance(child, ScalarNode) and id(child) not in seen:
                        seen.add(id(child))
                        pending.append(child)

    def remember_key_tail(self, key: str) -> None:
        """Note the value in a key whose colon was mistyped (``password  VALUE`` or
        ``password=VALUE`` in a flow mapping: one key, shown as an unknown key's name)."""
        match = _KEY_THEN_VALUE.fullmatch(key)
        if match is not None and _is_secret_key(match[1]):
            self.remember_secret(match[2])

    def remember_secret(self, value: str | bytes) -> None:
        """Note a secret value so that no message can show it (see :attr:`problems`). A
        ``${NAME}`` is not one: it names the variable, whose value is noted when it is read
        (and a message may name the variable)."""
        text = value if isinstance(value, str) else value.decode("utf-8", "replace")
        if text in self._secrets:  # (each is met two or three times: in the document, read)
            return  # (and with it its strip(): added together, or it is a strip() itself)
        for each in (text, text.strip()):
            if _ENV_REFERENCE.fullmatch(each) is None:
                self._secrets.add(each)

    def report(self, line: int | None, text: _Text) -> None:
        """Record one problem of the file being read at a 1-based line (None: not tied to a
        line)."""
        place = "" if line is None else f":{line}"
        self._problems.append((self._source, line or 0, place, text))

    def report_in(self, source: _Source, line: int | None, text: str) -> None:
        """Record one problem of the file ``source``, which is read from now on."""
        self._source = source
        self.report(line, text)

    def within(self, section: _Values) -> _Values:
        """``section``, its file being read from now on (its problems name it)."""
        self._source = section.source
        return section

    def problem(self, node: Node | None, where: str, message: _Text) -> None:
        """Record a problem with a field or section, at the line of ``node``."""
        if isinstance(message, str):
            self.report(_line(node), f"{where}: {message}")
        else:
            self.report(_line(node), functools.partial(_written_after, f"{where}: ", message))

    def load(
        self, path: Path, documents: Sequence[tuple[_Source, bytes]], complete: bool = True
    ) -> Config | None:
        """The configuration of one file (one document, its source ``(0, path)``) or of the
        files of the directory ``path`` in order (``complete`` False when some could not be
        read); None when no document could be read as a mapping."""
        tops: list[tuple[_Source, Node, dict[str, tuple[Node, Node]]]] = []
        for source, data in documents:
            self._source = source
            root = self.compose(data)
            top = None if root is None else self.mapping(root, "the top level")
            if root is None or top is None:
                complete = False
                continue
            for key, (key_node, _) in top.items():
                if key not in _TOP_LEVEL:
                    self.problem(key_node, f"section '{_clip(key)}'", self.unknown(key, _TOP_LEVEL))
            tops.append((source, root, top))
        if not tops:
            return None
        placed: dict[str, tuple[_Source, Node, Node]] = {}  # section: its file, key and value
        lists: list[tuple[_Source, Node]] = []  # the webhooks lists, in file order
        for source, _root, top in tops:
            for key, (key_node, value_node) in top.items():
                if key == "webhooks":
                    lists.append((source, value_node))
                elif key in _SECTIONS and key not in placed:
                    placed[key] = (source, key_node, value_node)
                elif key in _SECTIONS:
                    self._source = source
                    first, first_key, _ = placed[key]
                    self.problem(
                        key_node,
                        f"section '{key}'",
                        f"also in {_place(first[1], _line(first_key))} (a section other "
                        "than 'webhooks' may be in one file of the directory only)",
                    )
        sections = {}
        for name, spec in _SECTIONS.items():
            entry = placed.get(name)
            self._source = (0, self.path) if entry is None else entry[0]  # absent: the directory
            sections[name] = self.section(entry and entry[2], spec, _section_where(name))
            self.refuse_shown_secrets(sections[name], tuple(sections[name].values))
        delivery_values = sections["delivery"].values
        in_flight = delivery_values.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT)
        delivery_values.setdefault("max_idle_connections", IDLE_PER_IN_FLIGHT * in_flight)
        tls = self.tls(self.within(sections["delivery"]), TlsSettings())
        delivery = DeliveryConfig(
            **{k: v for k, v in delivery_values.items() if k not in _TLS_FIELDS}, tls=tls
        )
        webhooks: tuple[Webhook, ...] = ()
        if lists:
            webhooks = self.webhooks(lists, delivery)
        elif tops[0][0][0] == 0:  # a lone file (not a directory's): at its first line
            self._source, root, _top = tops[0]
            self.problem(root, "section 'webhooks'", "missing (required; may be an empty list [])")
        elif complete:
            self.report_in(
                (0, self.path),
                None,
                "section 'webhooks': missing from every file (required in one of them; may be "
                "an empty list [])",
            )
        config = Config(
            path=path,
            kafka=self.kafka(self.within(sections["kafka"])),
            schemas=self.schemas(self.within(sections["schemas"])),
            topics=self.topics(self.within(sections["topics"])),
            retry=RetryConfig(**sections["retry"].values),
            delivery=delivery,
            metrics=MetricsConfig(**sections["metrics"].values),
            logging=LoggingConfig(**sections["logging"].values),
            webhooks=webhooks,
            sources=tuple(self.sources),
        )
        self.check_shown()
        self.settle_texts()
        return config

    def compose(self, data: bytes) -> Node | None:
        """The YAML node graph of the file (an empty file is an empty mapping), or None and a
        problem. With :attr:`Reuse.texts`, the webhooks whose text was met before are left out
        of it (see :meth:`compose_reusing`)."""
        try:
            text = _decode(data)
        except _Invalid as exc:
            self.report(None, str(exc))
            return None
        shape = None if self.reuse is None else layout(text)
        if shape is not None and self.reuse is not None and self.reuse.texts:
            root = self.compose_reusing(text, shape)
            if root is not None:
                return root
        root = self.compose_text(text)
        if shape is not None and root is not None:
            everything = list(range(len(shape.spans)))
            items = agrees(root, shape, everything)
            if items is not None:
                self.note_texts(text, shape, items, everything, {})
        return root

    def compose_reusing(self, text: str, shape: Layout) -> Node | None:
        """The document with the webhooks whose text is in :attr:`Reuse.texts` left out (their
        lines blank), its secrets remembered, those webhooks' records in their place in
        :attr:`_entries`; or None, having changed nothing, when that would not read the file as
        a full compose does (see :mod:`bridge.config.segments`) or there is nothing to leave
        out."""
        assert self.reuse is not None
        key, known = self.reuse.key, self.reuse.texts
        lines = shape.lines
        parts = [text[: shape.spans[0][0]]]
        composed: list[int] = []
        digests: dict[int, bytes] = {}
        pieces: dict[int, _Piece] = {}
        for index, (start, end) in enumerate(shape.spans):
            segment = text[start:end]
            digest = _text_digest(segment, key)
            noted = known.get(digest) if index else None  # (the first: the list's node)
            if noted is None:
                composed.append(index)
                digests[index] = digest
                parts.append(segment)
            else:
                pieces[index] = _Piece(digest, noted, lines[index] + 1)
                parts.append("\n" * (lines[index + 1] - lines[index]))
        if not pieces:
            return None
        parts.append(text[shape.end :])
        blanked = "".join(parts)
        extra = sum(piece.noted[5] for piece in pieces.values())  # the nodes not composed
        budget = self._nodes_left - extra  # (counted as the full compose counts them)
        try:
            if budget < 0:
                raise _TooMany(None)
            fast, root, nodes = _compose(blanked, budget)
        except Exception:  # (_TooMany too) said as it should be by the full compose
            return None
        items = agrees(root, shape, composed)
        if root is None or items is None:
            return None
        counted = nodes if fast else None
        if _may_start_token(blanked, "&") and _shape_problem(root, extra, counted) is not None:
            return None
        self._nodes_left = budget - nodes
        self.remember_document_secrets(root)
        for piece in pieces.values():
            for secret in piece.noted[3]:
                self.remember_secret(secret)
        self.note_texts(text, shape, items, composed, digests)
        written = iter(items.value)
        self._entries[id(items)] = [
            pieces[index] if index in pieces else next(written) for index in range(len(lines) - 1)
        ]
        return root

    def note_texts(
        self,
        text: str,
        shape: Layout,
        items: SequenceNode,
        composed: list[int],
        digests: Mapping[int, bytes],
    ) -> None:
        """Note the digest of the text of each webhook of ``items`` (the segments ``composed``
        of ``shape``; ``digests``: those known) that may be noted in :attr:`Reuse.texts_read`
        once it is read."""
        assert self.reuse is not None
        key = self.reuse.key
        for item, index in zip(items.value, composed, strict=True):
            start, end = shape.spans[index]
            segment = text[start:end]
            if _may_note(segment):
                digest = digests.get(index)
                self._text_of[id(item)] = digest or _text_digest(segment, key)

    def compose_text(self, text: str) -> Node | None:
        """The YAML node graph of ``text``, checked (aliases, nesting), its secrets remembered;
        or None and a problem."""
        try:
            composed, root, nodes = _compose(text, self._nodes_left)
        except _TooMany as exc:
            self.too_many(exc)
            return None
        except _TooDeep as exc:
            self.report(exc.line, f"invalid YAML: nested more than {MAX_NESTING} levels deep")
            return None
        except yaml.reader.ReaderError as exc:
            at = text.count("\n", 0, max(exc.position, 0)) + 1
            self.report(at, "invalid YAML: a control character that YAML does not allow")
            return None
        except yaml.MarkedYAMLError as exc:
            # Only the problem and the line: the usual snippet could show an inline secret.
            line = None if exc.problem_mark is None else exc.problem_mark.line + 1
            self.report(line, f"invalid YAML: {_yaml_problem(exc)}")
            return None
        except yaml.YAMLError as exc:
            self.report(None, f"invalid YAML ({type(exc).__name__})")
            return None
        except RecursionError:
            self.report(None, "invalid YAML: nested too deeply")
            return None
        self._nodes_left -= nodes
        if root is None:
            return MappingNode(_MAP_TAG, [])
        # A tree (no anchor, so no alias) has no recursion and adds no nodes, and the composer
        # already refused nesting deeper than MAX_NESTING: only a graph with aliases is walked
        # (an anchor's '&' starts a token; '&' in 'a=1&b=2' does not).
        counted = nodes if composed else None
        shape = _shape_problem(root, 0, counted) if _may_start_token(text, "&") else None
        if shape is not None:
            node, message = shape
            self.problem(node, "invalid YAML", message)
            return None
        self.remember_document_secrets(root)
        return root

    def too_many(self, exc: _TooMany) -> None:
        """The problem of a configuration past MAX_NODES (its files together)."""
        self.report(
            exc.line,
            f"invalid YAML: more than {MAX_NODES:,} nodes (keys, values and list items) in the "
            "configuration; is it the configuration file?",
        )

    @staticmethod
    def unknown(key: str, known: tuple[str, ...]) -> Callable[[], str]:
        """What writes the problem of an unknown key (its suggestion is looked for only if the
        problem is listed)."""
        return functools.partial(_unknown_key, key, known)

    def mapping(self, node: Node, where: str) -> dict[str, tuple[Node, Node]] | None:
        """Keys of a mapping node with their key and value nodes; None (and a problem) if not one.

        Merge keys (``<<: *anchor``) are applied; keys given twice are reported.
        """
        if not isinstance(node, MappingNode):
            self.problem(node, where, "must be a mapping of keys to values")
            return None
        if node.tag != _MAP_TAG:
            self.problem(
                node, where, f"must be a plain mapping, without a tag ({_tag_name(node.tag)})"
            )
            return None
        explicit: dict[str, tuple[Node, Node]] = {}
        flatten = False  # merge keys to apply, or '=' keys to read as strings
        for key_node, value_node in node.value:
            tag = key_node.tag
            if tag == _MERGE_TAG:
                flatten = True
                continue
            if not isinstance(key_node, ScalarNode) or tag != _STR_TAG:
                flatten = flatten or tag == _VALUE_TAG
                self.problem(key_node, where, "keys must be strings")
            elif key_node.value in explicit:
                self.problem(key_node, where, f"key '{_clip(key_node.value)}' is given twice")
                explicit[key_node.value] = (key_node, value_node)  # the last one counts
            else:
                explicit[key_node.value] = (key_node, value_node)
        if not flatten:  # flatten_mapping would change nothing
            return explicit
        try:
            self._constructor.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            self.problem(node, where, f"cannot merge: {_yaml_words(exc.problem)}")
            return None
        return {
            key_node.value: (key_node, value_node)
            for key_node, value_node in node.value
            if isinstance(key_node, ScalarNode) and key_node.tag == _STR_TAG
        }

    def section(self, node: Node | None, spec: Mapping[str, _Field], where: Where) -> _Values:
        """Convert the fields of one mapping; absent and null fields are left out (defaults)."""
        result = _Values({}, {}, node, where, source=self._source)
        entries = {} if node is None else self.mapping(node, where(""))
        if entries is None:
            return result
        order, required = _spec_order(spec)
        if spec.keys() >= entries.keys():  # (nearly always: no unknown key)
            names = entries.keys() | required if required else entries.keys()
        else:
            names = {*required}
            for key, (key_node, _) in entries.items():
                if key in spec:
                    names.add(key)
                else:
                    self.problem(key_node, where(_clip(key)), self.unknown(key, tuple(spec)))
        values, nodes, given = result.values, result.nodes, result.given
        # The fields given and the required ones, in the spec's order (that of the problems).
        for name in sorted(names, key=order.__getitem__):
            spec_field = spec[name]
            entry = entries.get(name)
            if entry is None:  # absent: the default
                self.problem(node, where(name), "missing (required)")
                continue
            value_node = entry[1]
            if spec_field.node:
                if value_node is not None and value_node.tag != _NULL_TAG:
                    given.add(name)
                    values[name] = nodes[name] = value_node
                continue
            try:
                if type(value_node) is ScalarNode and value_node.tag == _STR_TAG:
                    raw = value_node.value  # (the common case of value())
                else:
                    raw = self.value(value_node)
                    if raw is None:
                        if spec_field.required:
                            self.problem(value_node, where(name), "missing (required)")
                        continue
                given.add(name)
                nodes[name] = value_node
                if name in _SECRET_FIELD_NAMES and isinstance(raw, str):
                    self.remember_secret(raw)
                values[name] = spec_field.convert(raw)
            except _Invalid as exc:
                given.add(name)
                self.problem(value_node, where(name), str(exc))
        return result

    def value(self, node: Node) -> Any:
        """The Python value of a node; any failure (a bad tag, a malformed scalar) is _Invalid
        naming the tag, never the value."""
        # The common shapes first, as the constructor builds them: a string, a list of strings.
        if isinstance(node, ScalarNode) and node.tag == _STR_TAG:
            return node.value
        if isinstance(node, SequenceNode) and node.tag == _SEQ_TAG:
            items = node.value
            if all(isinstance(item, ScalarNode) and item.tag == _STR_TAG for item in items):
                return [item.value for item in items]
        for sub in _distinct_nodes(node):
            if sub.tag not in _KNOWN_TAGS:
                column = sub.start_mark.column + 1
                raise _Invalid(f"{_tag_name(sub.tag)} at column {column} ({_UNNAMED_TAG})")
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            self._constructor = SafeConstructor()  # its state is left half-way by the error
            raise _Invalid(f"cannot read the value: {_yaml_words(exc.problem)}") from None
        except Exception:
            self._constructor = SafeConstructor()
            tag = _failing_tag(node)
            short = tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else ""
            kind = _TAG_KINDS.get(short, "tagged")
            raise _Invalid(f"cannot read the value as {kind} ({_tag_name(tag)})") from None

    def kafka(self, section: _Values) -> KafkaConfig:
        values = section.values
        values["properties"] = self.kafka_properties(section)
        password_variable = self.environ.get("KAFKA_SASL_PASSWORD")
        if password_variable:
            values.pop("sasl_password", None)
            values.pop("sasl_password_file", None)
            values["sasl_password"] = self.environment_secret(
                None, "environment variable KAFKA_SASL_PASSWORD", password_variable
            )
        else:
            values["sasl_password"] = self.secret(section, "sasl_password")
        for variable, name in KAFKA_ENVIRONMENT.items():
            raw = self.environ.get(variable)
            if raw and name != "sasl_password":
                try:
                    values[name] = _SECTIONS["kafka"][name].convert(raw)
                except _Invalid as exc:
                    self.problem(None, f"environment variable {variable}", str(exc))
                    continue
                where = functools.partial(_environment_where, variable)
                self._shown.append((raw, self._source, where, [(name, raw, None)], None))
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

    def refuse_shown_secrets(
        self, section: _Values, keys: Iterable[str], naming: tuple[str | None, int] | None = None
    ) -> None:
        """Note each of ``keys`` (but a key naming a secret) whose value is text or a path, to
        be reported by :meth:`check_shown` if it holds a secret's value: every other value may
        be shown (logs, metrics, messages, the configuration's repr). ``naming``: a webhook's id
        as written and its place in its list."""
        values, nodes = section.values, section.nodes
        shown: list[_ShownField] = [
            (key, str(value), nodes.get(key))
            for key in keys
            if isinstance(value := values.get(key), (str, Path)) and not _secret_key(key)
        ]
        if naming is not None:  # a webhook: bridge check shows its url's authority too
            shown = _with_shown_host(shown)
        if shown:
            # Looked up together first (one call, not one per field: a tenth of a load): a
            # value holding a secret makes the joined text hold it, so only then one by one.
            text = shown[0][1] if len(shown) == 1 else "\0".join(each[1] for each in shown)
            # (a webhook is named in check_shown: its ``where`` is not kept, 10,000 closures)
            where = section.where if naming is None else None
            self._shown.append((text, self._source, where, shown, naming))

    def check_shown(self) -> None:
        """Report each shown value noted (:meth:`refuse_shown_secrets`, :meth:`kept`...) that
        holds a secret, once every secret of the load is known, whatever the order they came
        in: inline, ``${ENV}`` or file, a webhook's, Kafka's (``KAFKA_SASL_PASSWORD``, its
        properties) or the registry's. A webhook is named by its id only if that holds none."""
        found_in = self._secrets.found_in
        for text, source, where, shown, naming in self._shown:
            if not found_in(text):
                continue
            self._source = source
            if naming is not None:
                given_id, index = naming
                named = given_id is not None and not found_in(given_id)
                where = _webhook_where(f"webhook '{given_id}'" if named else f"webhook #{index}")
            assert where is not None  # (only a webhook's is left out)
            if isinstance(shown, MappingNode):  # a kept webhook: plain scalars, each key once
                shown = _with_shown_host(
                    [
                        (key.value, value.value, value)
                        for key, value in shown.value
                        if key.value in _SHOWN_WEBHOOK_KEYS and value.tag == _STR_TAG
                    ]
                )
            refused = set()  # (a URL and the authority shown of it: one problem)
            for key, value, node in shown:
                if key not in refused and found_in(value):
                    refused.add(key)
                    self.problem(node, where(key), _SHOWN_SECRET)

    def kafka_properties(self, section: _Values) -> Mapping[str, str | Secret]:
        """``kafka.properties``, each value a string, ``"${ENV_VAR}"`` or ``{file: PATH}``;
        credentials (:func:`is_kafka_credential`) and every value read from the environment or
        a file become Secrets (whoever reads a value indirectly may well keep a secret there)."""
        node = section.values.pop("properties", None)
        if node is None:
            return MappingProxyType({})
        entries = self.mapping(node, section.where("properties")) or {}
        properties: dict[str, str | Secret] = {}
        for name, (key_node, value_node) in entries.items():
            if not _PROPERTY_NAME.fullmatch(name):
                message = f"{_quoted(name)} is not a librdkafka property name"
                self.problem(key_node, section.where("properties"), message)
                continue
            where = section.where(f"properties.{name}")
            if name in _KAFKA_FIELD_KEYS:
                self.problem(
                    key_node, where, f"set it with kafka.{_KAFKA_FIELD_KEYS[name]} instead"
                )
                continue
            try:
                value = self.kafka_property(value_node, where, is_kafka_credential(name))
            except _Invalid as exc:
                self.problem(value_node, where, str(exc))
                continue
            if isinstance(value, str):  # shown (checked by check_shown)
                shown = [(f"properties.{name}", value, value_node)]
                self._shown.append((value, self._source, section.where, shown, None))
            if value is not None:
                properties[name] = value
        return MappingProxyType(properties)

    def kafka_property(self, node: Node, where: str, credential: bool) -> str | Secret | None:
        """One property value (None when a problem was reported): a Secret when it is a
        credential or was read from the environment or a file."""
        raw = self.value(node)
        indirect = False
        if credential and isinstance(raw, str):
            self.remember_secret(raw)
        if isinstance(raw, dict):
            if set(raw) != {"file"}:
                raise _Invalid("a mapping value must be {file: PATH} (a file holding the value)")
            secret = self.secret_file(node, where, _file_path(raw["file"]), credential)
            if secret is None:
                return None
            indirect = True
            try:
                text = secret.reveal().decode("utf-8")
            except UnicodeDecodeError:
                raise _Invalid(f"file {_clip(raw['file'], 200)} is not UTF-8 text") from None
        elif isinstance(raw, str):
            reference = _ENV_REFERENCE.fullmatch(raw)
            if reference is not None:
                variable = reference.group(1)
                text = self.environ.get(variable, "")
                if not text:
                    raise _Invalid(f"environment variable {variable} is not set or empty")
                self.remember_secret(text)
                indirect = True
            elif "${" in raw:
                raise _Invalid("write ${NAME} alone to read an environment variable")
            else:
                text = raw
        elif credential:
            raise _Invalid(
                f"expected a string, got {_kind(raw)} (quote the value: a credential is text)"
            )
        elif isinstance(raw, bool):
            text = "true" if raw else "false"
        elif isinstance(raw, int | float):
            written = _written(raw)
            if written is None:
                raise _Invalid(f"expected a property value, got {_number(raw)}")
            text = written
        else:
            raise _Invalid(
                f'expected a string, number, boolean, "${{ENV_VAR}}" or {{file: PATH}}, '
                f"got {_kind(raw)}"
            )
        if _SURROGATE.search(text) or "\0" in text:
            raise _Invalid("must be text without NUL characters or lone surrogates")
        if not (credential or indirect):
            return text
        if credential and not text.strip():
            raise _Invalid("must not be empty")
        return Secret(text.encode("utf-8"))

    def schemas(self, section: _Values) -> SchemasConfig:
        values = section.values
        values["registry_password"] = self.secret(section, "registry_password")
        schemas = SchemasConfig(**values)
        if schemas.mode == "registry" and "registry_url" not in section.given:
            self.problem(section.node, section.where("registry_url"), "required in registry mode")
        has_username = "registry_username" in section.given
        has_password = bool({"registry_password", "registry_password_file"} & section.given)
        if has_username != has_password:
            missing, given = ("registry_password", "registry_username")
            if has_password:
                missing, given = given, missing
            message = f"required with {given} (HTTP basic authentication needs both)"
            self.problem(section.node, section.where(missing), message)
        reader = schemas.directory / "transaction_outcome.avsc"
        if not reader.is_file():
            self.problem(
                section.node,
                section.where("directory"),
                f"{_clip(str(schemas.directory), 200)!r} holds no transaction_outcome.avsc "
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
        self.remember_secret(inline)
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
        return self.environment_secret(node, where, value)

    def environment_secret(self, node: Node | None, where: str, value: str) -> Secret | None:
        """The Secret of an environment variable's value (undecodable bytes kept as they were)."""
        self.remember_secret(value)
        try:
            return Secret(value.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            self.problem(node, where, "the environment variable's value is not valid text")
            return None

    def secret_file(
        self, node: Node, where: str, path: str, credential: bool = True
    ) -> Secret | None:
        """Read a secret file (one trailing newline stripped) and remember it as a source; its
        content is masked in every message. ``credential`` False only words the messages as a
        plain file (the value of a Kafka property that is not a credential)."""
        kind = "secret file" if credential else "file"
        shown = _clip(path, 200)
        try:
            data = read_regular_file(Path(path), SECRET_FILE_LIMIT_BYTES)
        except FileRefused as exc:
            limit = SECRET_FILE_LIMIT_BYTES // 1024
            message = f"cannot read {kind} {shown}: {exc.reason}"
            if exc.too_large:
                message = f"{kind} {shown} is larger than {limit} KiB"
            self.problem(node, where, message)
            return None
        self.sources.append((Path(path), sha256_hex(data)))
        value = data[:-2] if data.endswith(b"\r\n") else data.removesuffix(b"\n")
        self.remember_secret(value)
        if not value:
            self.problem(node, where, f"{kind} {shown} is empty")
            return None
        return Secret(value)

    def webhooks(
        self, lists: Sequence[tuple[_Source, Node]], delivery: DeliveryConfig
    ) -> tuple[Webhook, ...]:
        """The webhooks of every ``webhooks`` list (one per file), joined in order; an id given
        twice is a problem naming where it was first given."""
        webhooks: list[Webhook] = []
        first: dict[str, tuple[_Source, int | None]] = {}  # each id: its file and line
        reuse = self.reuse
        context = b""  # what building a webhook reads besides its own YAML
        if reuse is not None:
            context = keyed_digest((delivery, sorted(self.environ.items())), reuse.key)
            self._context = context
        for source, node in lists:
            self._source = source
            if not isinstance(node, SequenceNode) or node.tag != _SEQ_TAG:
                self.problem(node, "section 'webhooks'", "must be a list of webhooks")
                continue
            entries: Sequence[Node | _Piece] = self._entries.get(id(node)) or node.value
            for index, item in enumerate(entries, start=1):
                if isinstance(item, _Piece):
                    assert reuse is not None
                    if self.duplicate(first, item.given_id, source, item.line):
                        raise _Recompose  # to report it from its nodes
                    self.keep_uncomposed(item, reuse, context)
                    continue
                given_id = _given_id(item)
                if (
                    given_id is not None
                    and not self.duplicate(first, given_id, source, _line(item))
                    and reuse is not None
                    and self.kept_node(item, given_id, index, reuse, context)
                ):
                    continue
                # (an id holding a secret, or part of one, would be masked in every message)
                named = given_id and not self._secrets.found_in(given_id)
                webhook = self.webhook(
                    item,
                    f"webhook '{given_id}'" if named else f"webhook #{index}",
                    delivery,
                    (given_id, index),
                )
                if webhook is None:
                    continue
                # An id from a merge key (``<<: {id: ...}``) is known only now.
                line = _line(item)
                if given_id is None and self.duplicate(first, webhook.id, source, line):
                    continue
                webhooks.append(webhook)
                if reuse is not None:
                    reuse.order.append(webhook.id)
        return tuple(webhooks)

    def duplicate(
        self,
        first: dict[str, tuple[_Source, int | None]],
        webhook_id: str,
        source: _Source,
        line: int | None,
    ) -> bool:
        """Whether ``webhook_id`` (of the webhook at ``line``) was given before (reported,
        naming where); else it is noted as given here."""
        seen = first.get(webhook_id)
        if seen is None:
            first[webhook_id] = (source, line)
            return False
        place = _place(seen[0][1], seen[1])
        if seen[0] == source:
            place = "an earlier line" if seen[1] is None else f"line {seen[1]}"
        message = f"duplicate webhook id (first defined on {place})"
        self.report(line, f"webhook '{webhook_id}': field 'id': {message}")
        return True

    def kept_node(
        self, item: Node, given_id: str, index: int, reuse: Reuse, context: bytes
    ) -> bool:
        """:meth:`kept` for the webhook composed as ``item`` (``index``: its place in its
        list); its text is noted for the next load (:meth:`settle_texts`) when it may be."""
        content = _reusable_content(item)
        if content is None:
            return False
        kept = self.kept(content, given_id, reuse, context)
        if kept:  # its shown fields, as written (checked by check_shown, as a built one's)
            assert isinstance(item, MappingNode)  # (_reusable_content says so)
            self._shown.append((_shown(content), self._source, None, item, (given_id, index)))
        text = self._text_of.get(id(item))
        if text is not None:
            self._fresh.append((text, _noted(content, given_id, reuse.read[given_id])))
        return kept

    def keep_uncomposed(self, piece: _Piece, reuse: Reuse, context: bytes) -> None:
        """What :meth:`kept` does, for a webhook whose text was met before, its shown fields
        left to :meth:`settle_texts`; raises _Recompose when it is not kept."""
        given_id, digest, shown, _secrets, variables, _nodes = piece.noted
        reuse.read[given_id] = digest
        # In another context its digest differs from the one in force: it would be built.
        if context != reuse.context or reuse.known.get(given_id) != digest:
            raise _Recompose  # to build it from its nodes
        for name in variables:
            variable = self.environ.get(name)
            if variable:
                self.remember_secret(variable)
        reuse.order.append(given_id)
        reuse.texts_read[piece.digest] = piece.noted
        reuse.uncomposed += 1
        self._uncomposed_shown.append(shown)

    def settle_texts(self) -> None:
        """Once every secret of the load is known: the shown fields of the webhooks kept from
        their text alone checked against the secrets the load that noted them lacked (one that
        holds one: _Recompose), and the texts composed that may be noted noted if their shown
        fields hold no secret (see :class:`Reuse`)."""
        reuse = self.reuse
        if reuse is None:
            return
        held = self._secrets.held()  # (settled last: every secret of the load is known)
        if self._uncomposed_shown and _Secrets(held - reuse.secrets).found_in(
            "\n".join(self._uncomposed_shown)
        ):
            raise _Recompose
        found_in = self._secrets.found_in
        for text, noted in self._fresh:
            if not found_in(noted[2]):
                reuse.texts_read[text] = noted
        reuse.secrets_read, reuse.context_read = held, self._context

    def kept(self, content: _Content, given_id: str, reuse: Reuse, context: bytes) -> bool:
        """Whether the webhook of plain data ``content`` (its id valid and not a duplicate) is
        kept (see :class:`Reuse`); notes its digest in ``reuse.read`` when it may be kept next
        time. (:meth:`keep_uncomposed` does the same from what was noted of its text.)"""
        data = marshal.dumps((context, content), 2)
        digest = hashlib.blake2b(data, key=reuse.key, digest_size=16).digest()
        reuse.read[given_id] = digest
        if reuse.known.get(given_id) != digest:
            return False
        # What building it does that depends on the rest of the document: the value of a ${VAR}
        # secret remembered (as :meth:`secret` does). Its shown fields are checked by
        # check_shown, as written (their converters return them unchanged, but for the TLS
        # version, which no secret fits in), as a built webhook's are.
        for key, tag, value in content:
            if key in _SECRET_NAMES and tag == _STR_TAG:
                reference = _ENV_REFERENCE.fullmatch(value)
                variable = self.environ.get(reference.group(1)) if reference else None
                if variable:
                    self.remember_secret(variable)
        reuse.order.append(given_id)
        return True

    def webhook(
        self, node: Node, name: str, delivery: DeliveryConfig, naming: tuple[str | None, int]
    ) -> Webhook | None:
        """Read one webhook named ``name`` in messages (``naming``: its id as written and its
        place in its list); None when it has problems."""
        before = len(self._problems)
        section = self.section(node, _WEBHOOK_FIELDS, _webhook_where(name))
        if not isinstance(node, MappingNode):
            return None
        values = section.values
        secrets = {
            key: self.secret(section, key, required=key == "secret") for key in _SECRET_NAMES
        }
        self.check_secrets(section, secrets)
        # shown in logs, metrics, /status and the configuration's repr
        self.refuse_shown_secrets(section, _SHOWN_WEBHOOK_KEYS, naming)
        if "url" in values:
            self.check_destination(section, values["url"], delivery)
        secret = secrets["secret"]
        if len(self._problems) > before or secret is None:
            return None
        tls = self.tls(section, delivery.tls)
        for name in _TLS_FIELDS:
            values.pop(name, None)
        if len(self._problems) > before:
            return None
        timeout_seconds = values.pop("timeout_seconds", delivery.timeout_seconds)
        concurrency = values.pop("concurrency", delivery.concurrency_per_webhook)
        return Webhook(
            secret=secret,
            previous_secret=secrets["previous_secret"],
            standard_webhooks_secret=secrets["standard_webhooks_secret"],
            previous_standard_webhooks_secret=secrets["previous_standard_webhooks_secret"],
            timeout_seconds=timeout_seconds,
            concurrency=concurrency,
            tls=tls,
            **values,
        )

    def tls(self, section: _Values, default: TlsSettings) -> TlsSettings:
        """The ``tls_*`` keys of a section over ``default``; the files must be readable, and a
        client certificate and its key come together. ``default`` itself when the section sets
        none of them and it is whole (most webhooks: one object shared, not one each)."""
        values = section.values
        if values.keys().isdisjoint(_TLS_FIELDS) and (default.client_cert_file is None) == (
            default.client_key_file is None
        ):
            return default
        for name in ("tls_ca_file", "tls_client_cert_file", "tls_client_key_file"):
            path = values.get(name)
            if path is not None and not os.access(path, os.R_OK):
                self.problem(section.nodes[name], section.where(name), f"cannot read {path}")
        settings = TlsSettings(
            ca_file=values.get("tls_ca_file", default.ca_file),
            client_cert_file=values.get("tls_client_cert_file", default.client_cert_file),
            client_key_file=values.get("tls_client_key_file", default.client_key_file),
            min_version=values.get("tls_min_version", default.min_version),
        )
        if (settings.client_cert_file is None) != (settings.client_key_file is None):
            message = "tls_client_cert_file and tls_client_key_file go together"
            self.problem(section.node, section.where("tls_client_cert_file"), message)
        return settings

    def check_secrets(self, section: _Values, secrets: Mapping[str, Secret | None]) -> None:
        """The rules between a webhook's secrets, its signature scheme and its URL.

        ``webhook-signature`` is keyed by ``standard_webhooks_secret`` when set, else by
        ``secret``; with ``signature: secret`` the secret itself travels in a header, so it must
        be long and go over https only, and webhook-signature needs its own key.
        """

        def report(name: str, message: str) -> None:
            node = section.nodes.get(name) or section.nodes.get(f"{name}_file") or section.node
            self.problem(node, section.where(name), message)

        secret, previous = secrets["secret"], secrets["previous_secret"]
        standard = secrets["standard_webhooks_secret"]
        previous_standard = secrets["previous_standard_webhooks_secret"]
        given = section.given
        sent_as_header = section.values.get("signature", DEFAULT_SIGNATURE) == "secret"
        if sent_as_header and secret is not None:
            if not _HEADER_SAFE.fullmatch(secret.reveal()):
                report(
                    "secret",
                    "with signature 'secret' it is sent as a header, so printable "
                    "ASCII only (no spaces)",
                )
            elif len(secret.reveal()) < SECRET_HEADER_MIN_LENGTH:
                report(
                    "secret",
                    f"with signature 'secret' it is sent as a header, so at least "
                    f"{SECRET_HEADER_MIN_LENGTH} characters",
                )
        url = section.values.get("url")
        if sent_as_header and url is not None and not url.lower().startswith("https://"):
            report(
                "url",
                "must be https:// with signature 'secret' (the secret itself is sent "
                "in the x-service-secret header)",
            )
        has_standard = {"standard_webhooks_secret", "standard_webhooks_secret_file"} & given
        if sent_as_header and not has_standard:
            report(
                "standard_webhooks_secret",
                "required with signature 'secret': x-service-secret "
                "carries the secret itself, so anyone who sees the header could forge a "
                "webhook-signature keyed with it; set a different 'standard_webhooks_secret' "
                "(or 'standard_webhooks_secret_file')",
            )
        has_previous = {"previous_secret", "previous_secret_file"} & given
        if has_previous and (sent_as_header or has_standard):
            keyed_by = "signature 'secret'" if sent_as_header else "standard_webhooks_secret"
            report(
                "previous_secret",
                f"has no effect with {keyed_by}: webhook-signature is keyed "
                "by standard_webhooks_secret and x-service-secret uses the current secret only; "
                "rotate webhook-signature's key with 'previous_standard_webhooks_secret'",
            )
        if {"previous_standard_webhooks_secret", "previous_standard_webhooks_secret_file"} & (
            given
        ) and not has_standard:
            report("previous_standard_webhooks_secret", "only with 'standard_webhooks_secret'")
        signing = (
            ("standard_webhooks_secret", standard),
            ("previous_standard_webhooks_secret", previous_standard),
        )
        if not has_standard:
            signing = (("secret", secret), ("previous_secret", previous))
        for name, each in signing:
            if each is not None:
                try:
                    standard_webhooks_key(each.reveal())
                except ValueError as exc:
                    report(name, str(exc))
        if not has_standard:
            return
        exposed = {key for each in (secret, previous) if each is not None for key in _keys(each)}
        for name, each in signing:
            if each is not None and exposed & _keys(each):
                report(
                    name,
                    "must differ from 'secret' and 'previous_secret' (also as a whsec_ "
                    "key): it keys webhook-signature, which must not be computable from them",
                )

    def check_destination(self, section: _Values, url: str, delivery: DeliveryConfig) -> None:
        """Refuse at load a URL whose host is a literal IP address the outbound policy refuses."""
        parsed = _parsed_url(url)  # the converter accepted it
        if not parsed.is_ip:
            return
        if self._policy is None or self._policy[0] is not delivery:
            policy = DestinationPolicy(delivery.allow_private_networks, delivery.allowed_networks)
            self._policy = (delivery, policy, {})
        _, policy, refusals = self._policy
        if parsed.host not in refusals:
            refusals[parsed.host] = policy.refusal(parsed.host)
        refusal = refusals[parsed.host]
        if refusal is not None:
            message = f"{refusal} (see delivery.allow_private_networks and allowed_networks)"
            self.problem(section.nodes["url"], section.where("url"), message)


def _unknown_key(key: str, known: tuple[str, ...]) -> str:
    """The problem of an unknown key, with the known key it is closest to, if any."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
    return f"unknown key ({hint})"


def _written_after(head: str, write: Callable[[], str]) -> str:
    """``head`` then the text ``write`` writes (a problem written only when it is listed)."""
    return head + write()


def _keys(secret: Secret) -> set[bytes]:
    """The raw bytes of a secret and, when it is a valid ``whsec_`` secret, its decoded key."""
    keys = {secret.reveal()}
    with contextlib.suppress(ValueError):
        keys.add(standard_webhooks_key(secret.reveal()))
    return keys


def _failing_tag(node: Node) -> str:
    """The tag of the first scalar under ``node`` that cannot be built (else ``node``'s tag)."""
    for sub in _distinct_nodes(node):
        if isinstance(sub, ScalarNode):
            try:
                SafeConstructor().construct_object(sub)
            except Exception:
                return str(sub.tag)
    return str(node.tag)


def _section_where(section: str) -> Where:
    return lambda key: f"field '{section}.{key}'" if key else f"section '{section}'"


def _webhook_where(name: str) -> Where:
    return lambda key: f"{name}: field '{key}'" if key else name


def _environment_where(variable: str, _key: str) -> str:
    return f"environment variable {variable}"


def _given_id(node: Node) -> str | None:
    """The valid ``id`` written in a webhook's mapping, if any (read before validation)."""
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if (
                isinstance(key_node, ScalarNode)
                and key_node.value == "id"
                and isinstance(value_node, ScalarNode)
                and value_node.tag == _STR_TAG
                and _WEBHOOK_ID.fullmatch(value_node.value)
            ):
                return str(value_node.value)
    return None
