"""Fuzzing the configuration loader with YAML built from a grammar, and with raw bytes.

The grammar writes YAML text itself (not through a dumper), so that documents carry what a dumper
never writes: tags (every yaml.org tag, Python's and unknown ones), anchors and aliases (merge keys
``<<`` included, recursive ones too), escaped lone surrogates, NUL, bidi marks, numbers such as
``1.0e+400``, ``10**400``, ``.inf`` and ``.nan``, and deep nesting. A known secret is planted in
every secret position it can take (inline, tagged, anchored and aliased into other fields, from
the environment, from a file, in a URL's userinfo).

Whatever the document: ``load_config`` returns a Config or raises ConfigError, never anything
else; the error names the file and shows the planted secret nowhere; each problem is one
printable line; and each load is fast.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge.config import loader
from bridge.config.loader import load_config
from bridge.core.errors import ConfigError
from bridge.core.keys import KEY, Choice, inputs, sections
from bridge.core.settings import Config
from bridge.core.webhook import EVENTS, Secret, Webhook

PLANTED = "Fuzz-Planted-Secret-7c1d0e9b"
ENVIRON = {"FUZZ_SECRET": f"{PLANTED}-env", "FUZZ_EMPTY": "", "FUZZ_PLAIN": "plain-value"}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""The whole file runs in about 20 seconds per YAML loader (libyaml, pure), and the comparisons of
the two at the end in about 10."""
SECONDS_PER_LOAD = 10.0  # a guard against blow-ups, not a speed target: a load takes ms


@dataclass(frozen=True)
class Files:
    """Where the fuzzed document is written, and a secret file it may name."""

    config: Path
    secret: Path
    folder: Path


LIBYAML = loader.FAST_YAML_LOADER
"""The libyaml loader (None when PyYAML is built without it), whatever a test has set."""


@pytest.fixture(scope="module", autouse=True, params=["libyaml", "pure"])
def yaml_loader(request: pytest.FixtureRequest) -> Iterator[str]:
    """The whole file runs twice: libyaml composing (the pure loader taking over whatever it
    declines), then the pure-Python loader alone (PyYAML built without libyaml)."""
    if request.param == "libyaml" and LIBYAML is None:
        pytest.skip("PyYAML is built without libyaml here")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loader, "FAST_YAML_LOADER", LIBYAML if request.param == "libyaml" else None)
        yield str(request.param)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    folder = tmp_path_factory.mktemp("config-fuzz")
    secret = folder / "planted-secret"
    secret.write_text(f"{PLANTED}-file\n")
    return Files(folder / "bridge.yaml", secret, folder)


def load(files: Files, data: bytes) -> Config | None:
    """Load ``data``: a Config, or None after checking the ConfigError says nothing it must not."""
    files.config.write_bytes(data)
    started = time.perf_counter()
    try:
        return load_config(files.config, ENVIRON)
    except ConfigError as error:
        message = str(error)
        assert error.problems, "a rejected file says what is wrong"
        assert str(files.config) in message, "the message names the file"
        assert PLANTED not in message, "a secret appears in the message"
        assert PLANTED not in repr(error)
        message.encode("utf-8")  # no lone surrogate: the message can be printed
        for problem in error.problems:
            assert problem.startswith(str(files.config)), problem
            assert problem.isprintable(), f"not one printable line: {problem!r}"
        return None
    finally:
        elapsed = time.perf_counter() - started
        assert elapsed < SECONDS_PER_LOAD, f"a load took {elapsed:.2f}s"


def check_config(config: Config | None) -> None:
    """A loaded configuration keeps every secret out of its repr: the planted secret wherever a
    secret field holds it, and every secret value it holds (written in another field too, say
    the account, it is refused: ``holds a secret or 16 characters of one``), unless that value
    is text every configuration shows whatever its secrets (:func:`public_text`: a secret
    ``transaction.success`` is shown by the events, ``embedded`` by the default schema mode;
    the grammar draws such words as secrets now and then, and hypothesis found the first)."""
    if config is None:
        return
    shown = repr(config) + str(config)
    values = [secret.reveal().decode("utf-8", "replace") for secret in secrets_of(config)]
    if any(PLANTED in value for value in values):
        assert PLANTED not in shown
    for value in values:
        if len(value.strip()) >= 8 and value.strip() not in public_text():
            assert value.strip() not in shown


@functools.cache
def public_text() -> str:
    """What a configuration shows whatever its secrets: the repr and str of a small one (class
    and field names, every default) and every value a key may only choose from (event names,
    signature schemes, modes, protocols, mechanisms, levels)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bridge.yaml"
        path.write_text(
            "webhooks:\n  - {id: reference, account: acct_reference, url: https://r.example/,\n"
            "     events: [transaction.success], secret: reference-secret-value}\n"
        )
        reference = load_config(path, {})
    choices = [
        value
        for declared in [*sections(Config).values(), Webhook]
        for each in dataclasses.fields(declared)
        if KEY in each.metadata
        for _name, leaf in inputs(each)
        if isinstance(leaf, Choice)
        for value in leaf.values
    ]
    return "\n".join([repr(reference), str(reference), *EVENTS, *choices])


def secrets_of(value: object, seen: set[int] | None = None) -> Iterator[Secret]:
    """Every :class:`Secret` in a configuration (dataclasses, mappings and sequences walked)."""
    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, str | bytes | int | float | Path | type(None)):
        return
    seen.add(id(value))
    if isinstance(value, Secret):
        yield value
    elif dataclasses.is_dataclass(value):
        for item in dataclasses.fields(value):
            yield from secrets_of(getattr(value, item.name), seen)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from secrets_of(item, seen)
    elif isinstance(value, tuple | list | frozenset | set):
        for item in value:
            yield from secrets_of(item, seen)


# ---- the grammar ----------------------------------------------------------------------------

SECTIONS = ("kafka", "schemas", "topics", "retry", "delivery", "metrics", "logging")
FIELDS = {
    "kafka": (
        "bootstrap_servers",
        "group_id",
        "client_id",
        "security_protocol",
        "sasl_mechanism",
        "sasl_username",
        "sasl_password",
        "sasl_password_file",
        "properties",
    ),
    "schemas": (
        "mode",
        "directory",
        "registry_url",
        "registry_username",
        "registry_password",
        "registry_password_file",
        "max_record_bytes",
    ),
    "topics": ("source", "retry_prefix", "parked", "dead_letter", "partitions"),
    "retry": ("attempts", "first_delay_ms", "increment_ms", "park_delay_ms", "max_parks"),
    "delivery": (
        "timeout_seconds",
        "connect_timeout_seconds",
        "concurrency_per_webhook",
        "allow_private_networks",
        "allowed_networks",
    ),
    "metrics": ("host", "port", "enabled"),
    "logging": ("format", "level"),
    "webhook": (
        "id",
        "account",
        "url",
        "events",
        "secret",
        "secret_file",
        "previous_secret",
        "previous_secret_file",
        "standard_webhooks_secret",
        "standard_webhooks_secret_file",
        "previous_standard_webhooks_secret",
        "previous_standard_webhooks_secret_file",
        "signature",
        "enabled",
        "timeout_seconds",
        "concurrency",
    ),
}
PROPERTIES = (
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.key.pem",
    "sasl.jaas.config",
    "sasl.oauthbearer.client.secret",
    "ssl.ca.location",
    "linger.ms",
    "enable.idempotence",
    "sasl.oauthbearer.client.id",
    "group.id",
    "bad name",
    "bad\u202ename",
)
SECRET_KEYS = frozenset(
    {
        "secret",
        "previous_secret",
        "standard_webhooks_secret",
        "previous_standard_webhooks_secret",
        "sasl_password",
        "registry_password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.jaas.config",
        "sasl.oauthbearer.client.secret",
    }
)
TAGS = (
    *(
        f"!!{name}"
        for name in (
            "null",
            "bool",
            "int",
            "float",
            "binary",
            "timestamp",
            "omap",
            "pairs",
            "set",
            "str",
            "seq",
            "map",
            "merge",
            "value",
            "yaml",
        )
    ),
    "!!python/object:os.system",
    "!!python/object/apply:os.system",
    "!!python/object/new:builtins.exec",
    "!!python/name:os.system",
    "!!python/tuple",
    "!!python/unicode",
    "!custom",
    "!!unknown",
    "!<tag:example.com,2000:thing>",
    "!<tag:yaml.org,2002:int>",
    "!",
    "!e!undefined-handle",
)
NUMBERS = (
    "0",
    "1",
    "-1",
    "3",
    "20",
    "300",
    "65535",
    "65536",
    "1e400",
    "1.0e+400",
    "-1.0e+400",
    "1" + "0" * 400,
    "9" * 5000,
    ".inf",
    "-.inf",
    ".nan",
    ".NaN",
    "0x1F",
    "0o17",
    "017",
    "0b101",
    "1_000",
    "190:20:30",
    "1.5",
    "-0.0",
    "2026-03-14",
    "2026-03-14T09:26:53.589Z",
)
WORDS = (
    "~",
    "null",
    "true",
    "false",
    "yes",
    "off",
    "=",
    "<<",
    "transaction.success",
    "transaction.failed",
    "hmac-sha256",
    "secret",
    "registry",
    "embedded",
    "json",
    "text",
    "DEBUG",
    "SASL_SSL",
    "PLAIN",
    "SCRAM-SHA-512",
    "acct_1",
    "shop",
    "schemas",
    "10.0.0.0/8",
    "10.0.0.1/8",
    "'10.20.0.0/16'",
    "topic.name",
    "'dead letters'",
    "'${FUZZ_SECRET}'",
    "'${FUZZ_EMPTY}'",
    "'${FUZZ_UNSET}'",
    "'x-${FUZZ_PLAIN}'",
    "https://shop.example.com/hooks",
    "'http://127.0.0.1:8080/h'",
    "'http://[::1]:80/'",
    "'http://[::1/x'",
    "'http://[fe80::1%25eth0]/'",
    "'http://[::ffff:10.0.0.1]/'",
    "'https://a..example.com/hook'",
    f"'https://{'a' * 64}.example/'",
    "'https://faß.de/h'",
    "'https://xn--a.example/'",
    "'https://127.1/'",
    "'https://x.example:0/'",
    "'https://x.example:99999/'",
    "'https://x.example/#f'",
    "ftp://x.example/",
    f"'https://alice:{PLANTED}@x.example/'",
    f"'https://{PLANTED}@x.example/'",
    f"'https://alice:{PLANTED}{PLANTED}{PLANTED}@x.example/'",
    f"'https://alice:{PLANTED}\uff20x.example/'",
    f"'http://u:{PLANTED}@[::1/x'",
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "'whsec_%%%'",
    "whsec_",
    "S" * 31,
    "S" * 32,
)
TEXT_ESCAPES = (
    "\\ud800",
    "\\udfff",
    "\\udc80",
    "\\0",
    "\\x00",
    "\\u200f",
    "\\u202e",
    "\\u2066",
    "\\u200b",
    "\\ufeff",
    "\\x85",
    "\\N",
    "\\L",
    "\\P",
    "\\e",
    "\\x1b[2J",
    "\\t",
    "\\n",
    "\\U0001F600",
    "\\U0010FFFF",
)
PLANTED_FORMS = (
    PLANTED,
    f'"{PLANTED}"',
    f"'{PLANTED}'",
    f'"{PLANTED} with spaces"',
    f'"{PLANTED}\\ud800"',
    f'"{PLANTED}\\0"',
    f'"{PLANTED}\\u202e"',
    f"!!str {PLANTED}",
    f"!!int {PLANTED}",
    f"!!float {PLANTED}",
    f"!!bool {PLANTED}",
    f"!!timestamp {PLANTED}",
    f"!!binary {PLANTED}",
    f"!!null {PLANTED}",
    f"!custom {PLANTED}",
    f"!!python/object:os.system {PLANTED}",
    f"[{PLANTED}]",
    f"{{a: {PLANTED}}}",
    f"whsec_{PLANTED}",
    f"'{PLANTED}-${{FUZZ_SECRET}}'",
    "'${FUZZ_SECRET}'",
)


FILE = "{secret_file}"  # replaced by the secret file's path
GOOD = {
    "bootstrap_servers": ("'kafka:9092'",),
    "group_id": ("group",),
    "client_id": ("client",),
    "security_protocol": ("SASL_SSL", "PLAINTEXT"),
    "sasl_mechanism": ("SCRAM-SHA-512", "PLAIN"),
    "sasl_username": ("bridge",),
    "sasl_password": (PLANTED, "'${FUZZ_SECRET}'"),
    "sasl_password_file": (FILE,),
    "mode": ("embedded", "registry"),
    "directory": ("schemas",),
    "registry_url": ("'https://registry.example:8081/api'",),
    "registry_username": ("bridge",),
    "registry_password": (PLANTED,),
    "registry_password_file": (FILE,),
    "max_record_bytes": ("1024",),
    "source": ("t.source",),
    "retry_prefix": ("t.retry",),
    "parked": ("t.parked",),
    "dead_letter": ("t.dlq",),
    "partitions": ("3",),
    "attempts": ("3",),
    "first_delay_ms": ("100",),
    "increment_ms": ("100",),
    "park_delay_ms": ("1000",),
    "max_parks": ("2",),
    "timeout_seconds": ("5", "2.5"),
    "connect_timeout_seconds": ("1",),
    "concurrency_per_webhook": ("4",),
    "allow_private_networks": ("true", "false"),
    "allowed_networks": ("['10.20.0.0/16']",),
    "host": ("127.0.0.1",),
    "port": ("0",),
    "enabled": ("true", "false"),
    "format": ("text",),
    "level": ("debug",),
    "id": ("shop", "hook-1", "hook-2"),
    "account": ("acct_1",),
    "url": (
        "https://shop.example.com/hooks",
        "'http://[2606:4700:4700::1111]/h'",
        "'https://faß.de/h'",
    ),
    "events": ("[transaction.success]", "[transaction.failed, transaction.success]"),
    "secret": (PLANTED, f"'{'S' * 32}{PLANTED}'", "'${FUZZ_SECRET}'"),
    "secret_file": (FILE,),
    "previous_secret": (f"{PLANTED}-old",),
    "previous_secret_file": (FILE,),
    "standard_webhooks_secret": ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", f"{PLANTED}-standard"),
    "standard_webhooks_secret_file": (FILE,),
    "previous_standard_webhooks_secret": (f"{PLANTED}-standard-old",),
    "previous_standard_webhooks_secret_file": (FILE,),
    "signature": ("hmac-sha256", "secret"),
    "concurrency": ("2",),
}
"""Values that are valid alone: documents drawn "good" mostly use them, so some load."""
REQUIRED = ("id", "account", "url", "events", "secret")


@dataclass
class Grammar:
    """Drawing state: whether values are mostly good, and the anchors defined so far (aliases may
    name them, or a missing one)."""

    draw: st.DrawFn
    secret_file: str
    good: bool = False
    anchors: list[str] = field(default_factory=list)
    ids: int = 0

    def pick(self, options: tuple[str, ...] | list[str]) -> str:
        return self.draw(st.sampled_from(options))

    def chance(self, probability: float) -> bool:
        return self.draw(st.integers(0, 99)) < probability * 100

    def decorated(self, text: str) -> str:
        """``text`` with, sometimes, an anchor and a tag in front."""
        if self.chance(0.02 if self.good else 0.1):
            text = f"{self.pick(TAGS)} {text}"
        if self.chance(0.12):
            name = f"a{len(self.anchors)}"
            self.anchors.append(name)
            text = f"&{name} {text}"
        return text

    def alias(self) -> str:
        if self.anchors and (self.good or self.chance(0.95)):
            return f"*{self.pick(self.anchors)}"
        return "*undefined"

    def quoted(self) -> str:
        """A double-quoted scalar of random text and escapes (JSON escapes are YAML escapes)."""
        parts = self.draw(
            st.lists(
                st.one_of(
                    st.text(max_size=12).map(lambda text: json.dumps(text)[1:-1]),
                    st.sampled_from(TEXT_ESCAPES),
                ),
                max_size=4,
            )
        )
        return '"' + "".join(parts) + '"'

    def scalar(self, key: str | None) -> str:
        if key in SECRET_KEYS and self.chance(0.6):
            return self.pick(PLANTED_FORMS)
        if key is not None and key.endswith("_file") and self.chance(0.6):
            return self.pick([self.secret_file, "/no/such/file", '"/tmp/\\0"', "/tmp"])
        kind = self.draw(st.integers(0, 9))
        if kind <= 3:
            return self.pick(WORDS)
        if kind <= 6:
            return self.pick(NUMBERS)
        if kind <= 8:
            return self.quoted()
        return "''"  # the planted secret goes to secret positions only (and aliases of them)

    def value(self, depth: int, key: str | None = None) -> str:
        """A flow-style node: scalar, alias, list, mapping (with merge keys) or deep nesting."""
        if self.good and key in GOOD and self.chance(0.9):
            if key == "id":
                self.ids += 1
                return f"hook-{self.ids}"
            return self.pick(GOOD[key]).replace(FILE, self.secret_file)
        kind = self.draw(st.integers(0, 12)) if depth < 4 else 0
        if kind <= 5:
            return self.decorated(self.scalar(key))
        if kind == 6:
            return self.alias()
        if kind == 7:
            levels = self.draw(st.integers(1, 200))
            return "[" * levels + self.scalar(None) + "]" * levels
        if kind <= 9:
            items = self.draw(st.integers(0, 4))
            inner = ", ".join(self.value(depth + 1, key) for _ in range(items))
            return self.decorated(f"[{inner}]")
        return self.decorated(self.mapping(depth + 1, FIELDS["webhook"]))

    def mapping(self, depth: int, keys: tuple[str, ...], required: tuple[str, ...] = ()) -> str:
        if self.good:  # the required keys, then a few others, each once
            taken = {*required, *(f"{key}_file" for key in required)}
            others = [key for key in keys if key not in taken]
            chosen = self.draw(st.lists(st.sampled_from(others), max_size=3, unique=True))
            entries = [f"{key}: {self.value(depth, key)}" for key in (*required, *chosen)]
            return "{" + ", ".join(entries) + "}"
        entries = []
        for _ in range(self.draw(st.integers(0, 6))):
            if self.anchors and self.chance(0.1):
                merged = self.alias() if self.chance(0.6) else f"[{self.alias()}, {self.alias()}]"
                entries.append(f"<<: {merged}")
                continue
            key = self.pick(keys) if self.chance(0.85) else self.pick((*WORDS, "'bad key'"))
            entries.append(f"{key}: {self.value(depth, key)}")
        return "{" + ", ".join(entries) + "}"

    def properties(self) -> str:
        entries = []
        for _ in range(self.draw(st.integers(0, 5))):
            name = self.pick(PROPERTIES[:-3] if self.good else PROPERTIES)
            if self.chance(0.2):
                value = self.pick([f"{{file: {self.secret_file}}}", "{file: /no/such/file}"])
            elif self.good and self.chance(0.9):
                # The planted secret in a credential only: any other property is shown as
                # written (a value from the environment is masked whatever the property).
                planted = [PLANTED, f"'{PLANTED}-2'"] if name in SECRET_KEYS else []
                value = self.pick([*planted, "'${FUZZ_SECRET}'", "'5'"])
            else:
                value = self.value(3, name)
            entries.append(f"{json.dumps(name)}: {value}")
        return self.decorated("{" + ", ".join(entries) + "}")


@st.composite
def documents(draw: st.DrawFn, secret_file: str) -> str:
    """A configuration-shaped YAML document: known sections and fields, odd values."""
    grammar = Grammar(draw, secret_file, good=draw(st.booleans()))
    lines = []
    if grammar.good:
        names = [*draw(st.lists(st.sampled_from(SECTIONS), max_size=4, unique=True)), "webhooks"]
    else:
        choices = (*SECTIONS, "webhooks", "webhooks", "junk")
        names = draw(st.lists(st.sampled_from(choices), max_size=8))
    for name in names:
        if name == "webhooks":
            if grammar.good or grammar.chance(0.8):
                lines.append("webhooks:")
                for _ in range(draw(st.integers(0, 4))):
                    item = grammar.mapping(1, FIELDS["webhook"], REQUIRED)
                    lines.append(f"  - {grammar.decorated(item) if grammar.chance(0.3) else item}")
            else:
                lines.append(f"webhooks: {grammar.value(0)}")
        elif name == "junk":
            lines.append(f"{grammar.pick(WORDS)}: {grammar.value(0)}")
        else:
            if grammar.good or grammar.chance(0.8):
                body = grammar.mapping(1, FIELDS[name])
                if name == "kafka" and grammar.chance(0.6):
                    entry = f"properties: {grammar.properties()}"
                    body = f"{{{entry}}}" if body == "{}" else f"{body[:-1]}, {entry}}}"
                body = grammar.decorated(body) if grammar.chance(0.2) and not grammar.good else body
            else:
                body = grammar.value(1)
            lines.append(f"{name}: {body}")
    return "\n".join(lines) + "\n"


# ---- the properties ---------------------------------------------------------------------------


def test_the_grammar_writes_valid_documents_too(files: Files) -> None:
    text = f"""\
kafka: {{security_protocol: SASL_SSL, sasl_username: u, sasl_password: {PLANTED},
  properties: {{"ssl.key.password": {{file: {files.secret}}}, "linger.ms": 5}}}}
webhooks:
  - {{id: shop, account: acct_1, url: https://shop.example.com/hooks,
     events: [transaction.success], secret: &s {PLANTED}, signature: hmac-sha256}}
  - {{<<: {{account: acct_1, events: [transaction.failed]}}, id: b, signature: secret,
     url: 'https://x.example/h', secret: '${{FUZZ_SECRET}}', standard_webhooks_secret: {"S" * 32}}}
"""
    config = load(files, text.encode())
    assert config is not None
    assert [hook.id for hook in config.webhooks] == ["shop", "b"]
    check_config(config)
    text = text.replace("signature: hmac-sha256", "signature: *s")
    assert load(files, text.encode()) is None


@FUZZ
@given(data=st.data())
def test_grammar_documents_load_or_raise_config_error(files: Files, data: st.DataObject) -> None:
    text = data.draw(documents(str(files.secret)))
    check_config(load(files, text.encode("utf-8", "surrogatepass")))


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_grammar_documents_with_bytes_flipped(files: Files, data: st.DataObject) -> None:
    encoded = bytearray(data.draw(documents(str(files.secret))).encode("utf-8", "surrogatepass"))
    for _ in range(data.draw(st.integers(1, 4))):
        if encoded:
            at = data.draw(st.integers(0, len(encoded) - 1))
            encoded[at] = data.draw(st.integers(0, 255))
    check_config(load(files, bytes(encoded)))


@settings(FUZZ, max_examples=300)
@given(data=st.binary(max_size=400))
@example(data=b"\xff\xfe\x00\x00")
@example(data=b"\xfe\xff\xd8\x00")  # UTF-16 with a lone surrogate
@example(data=b"\xef\xbb\xbf\xef\xbb\xbfwebhooks: []")
@example(data=b"webhooks: []\x00")
@example(data=b"webhooks: [\x1b[2J]")
@example(data=b"%YAML 1.1\n%TAG ! tag:yaml.org,2002:python/\n--- !object:os.system x\n")
@example(data=b"--- a\n--- b\n")
@example(data=b"&a [*a, *a]")
@example(data=b"a: &a [&b [*a]]")
def test_random_bytes_load_or_raise_config_error(files: Files, data: bytes) -> None:
    check_config(load(files, data))


@settings(max_examples=30, deadline=None)
@given(levels=st.integers(5, 12), width=st.integers(2, 12), merge=st.booleans())
def test_alias_bombs_are_refused_quickly(
    files: Files, levels: int, width: int, merge: bool
) -> None:
    if merge:
        lines = ["a0: &a0 {lol: 1}"]
        lines += [
            f"a{n}: &a{n} {{<<: [" + ", ".join([f"*a{n - 1}"] * width) + "]}"
            for n in range(1, levels)
        ]
    else:
        lines = ["a0: &a0 [lol]"]
        lines += [
            f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * width) + "]" for n in range(1, levels)
        ]
    text = "\n".join(lines) + f"\nwebhooks: []\nretry: {{attempts: *a{levels - 1}}}\n"
    config = load(files, text.encode())
    assert config is None


# ---- libyaml and the pure loader agree ---------------------------------------------------------
#
# libyaml composes the documents it accepts (and the pure loader takes over the rest): wherever it
# composes, the node graph must be the pure loader's (kinds, tags, values, lines, shared nodes),
# and a load must end the same either way, to the last word of every message.

YAML_PIECES = (
    *"ab1 :-?,[]{}#&*!|>'\"\\%@`\n\t.=~",
    *("\n  ", "\n    ", "\n- ", ": ", "- ", "- - ", "? ", "---", "---\n", "...", "...\n"),
    *("&a ", "&b ", "*a", "*b", "<<: ", "<<: *a\n", "&a [*a]", "!!str ", "!x ", "!", "%YAML 1.1\n"),
    *(" #c", "#c\n", "\n\n", "   ", "\r", "\r\n", "\x85", "\u2028", "\u2029", "\ufeff", "é"),
    *('"\\u00e9"', "'it''s'", '"\\/"', '"\\x41"', '"a\\\n  b"', "'a\n\n  b'", '"\\t"', '"\\N"'),
    *("|\n  x\n", ">-\n  y\n", "|+\n\n", "|#c\n", "|2-\n   x\n", "? - a\n: - b\n"),
    *("null", "~", "0x1f", "1e3", "1_000", "yes", "{a: [b, {c: d}]}", "[a: b]", "{? a}"),
    *("http://x/?a=1&b=2", "x" * 1030, "é" * 600),
)


def same_graph(pure: yaml.Node | None, fast: yaml.Node | None) -> bool:
    """Whether two node graphs are the same: kinds, tags, values, lines, and which nodes are one
    (aliases, cycles included)."""
    paired: dict[int, yaml.Node] = {}
    pending = [(pure, fast)]
    while pending:
        a, b = pending.pop()
        if a is None or b is None:
            if a is not b:
                return False
            continue
        if id(a) in paired:
            if paired[id(a)] is not b:
                return False
            continue
        paired[id(a)] = b
        if type(a) is not type(b) or a.tag != b.tag or a.start_mark.line != b.start_mark.line:
            return False
        if isinstance(a, yaml.ScalarNode):
            if a.value != b.value:
                return False
            continue
        if len(a.value) != len(b.value):
            return False
        if isinstance(a, yaml.MappingNode):
            for (key_a, value_a), (key_b, value_b) in zip(a.value, b.value, strict=True):
                pending += [(key_a, key_b), (value_a, value_b)]
        else:
            pending += zip(a.value, b.value, strict=True)
    return True


def check_libyaml_composes_as_pure(text: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loader, "FAST_YAML_LOADER", LIBYAML)
        composed, fast, nodes = loader._compose_fast(text)
    if not composed:
        return
    # The count the alias walk takes for the graph's distinct nodes (_shape_problem).
    counted = 0 if fast is None else sum(1 for _ in loader._distinct_nodes(fast))
    assert nodes == counted, f"miscounted: {text!r}"
    try:
        pure = yaml.compose(text, Loader=loader._YamlLoader)
    except yaml.YAMLError as exc:
        raise AssertionError(f"libyaml composed what PyYAML refuses ({exc}): {text!r}") from None
    assert same_graph(pure, fast), f"libyaml composed otherwise: {text!r}"


def load_outcome(files: Files, data: bytes, fast: type[yaml.CSafeLoader] | None) -> object:
    """What loading ``data`` ends in: the Config, or the problems."""
    files.config.write_bytes(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loader, "FAST_YAML_LOADER", fast)
        try:
            return load_config(files.config, ENVIRON)
        except ConfigError as error:
            return error.problems


def check_loads_agree(files: Files, data: bytes) -> None:
    assert load_outcome(files, data, LIBYAML) == load_outcome(files, data, None), data


@st.composite
def block_documents(draw: st.DrawFn) -> str:
    """Block-style YAML: nested mappings and lists, indentless and compact lists, explicit keys,
    empty values, anchors, aliases and merges, comments, multi-line scalars, odd indents."""
    anchors: list[str] = []
    lines: list[str] = []

    def scalar() -> str:
        return draw(
            st.sampled_from(
                (
                    "a",
                    "b c",
                    "1",
                    "~",
                    "",
                    "'q ''x'''",
                    '"d\\te"',
                    "x # c",
                    "https://h.example/p?a=1&b=2",
                    "[1, a]",
                    "{k: v}",
                    "a:b",
                    "-x",
                    "*a" if anchors else "z",
                )
            )
        )

    def node(indent: int, depth: int) -> None:
        kind = draw(st.integers(0, 3)) if depth < 4 else 0
        pad = " " * indent
        if kind <= 1:  # a mapping
            for key in draw(st.lists(st.sampled_from(("id", "url", "k", "<<", "? q")), max_size=4)):
                anchor = ""
                if draw(st.integers(0, 9)) == 0:
                    anchor = f"&a{len(anchors)} "
                    anchors.append(f"a{len(anchors)}")
                if key == "<<" and anchors:
                    lines.append(f"{pad}<<: *{draw(st.sampled_from(anchors))}")
                elif key == "? q":
                    lines.append(f"{pad}? {scalar()}")
                    if draw(st.booleans()):
                        lines.append(f"{pad}: {scalar()}")
                elif draw(st.booleans()):
                    lines.append(f"{pad}{key}: {anchor}{scalar()}".rstrip())
                else:
                    lines.append(f"{pad}{key}: {anchor}".rstrip())
                    node(indent + draw(st.sampled_from((0, 1, 2, 4))), depth + 1)
                if draw(st.integers(0, 7)) == 0:
                    lines.append(draw(st.sampled_from(("", "# c", f"{pad}# c", f"{pad}  more"))))
        elif kind == 2:  # a list
            for _ in range(draw(st.integers(0, 3))):
                if draw(st.booleans()):
                    lines.append(f"{pad}- {scalar()}".rstrip())
                elif draw(st.booleans()):
                    lines.append(f"{pad}- k: {scalar()}".rstrip())
                    lines.append(f"{pad}  j: {scalar()}".rstrip())
                else:
                    lines.append(f"{pad}-")
                    node(indent + draw(st.sampled_from((1, 2, 3))), depth + 1)
        else:
            lines.append(f"{pad}{scalar()}")

    if draw(st.booleans()):
        lines.append("---")
    node(0, 0)
    return "\n".join(lines) + draw(st.sampled_from(("\n", "\n...\n", "\n\n", "", "\r\n")))


_SCRUB_ALPHABET = st.characters(blacklist_characters="*", blacklist_categories=("Cs",))


@st.composite
def _woven(draw: st.DrawFn, shortest: int) -> tuple[list[str], str]:
    """Secrets of at least ``shortest`` characters (now and then one of hundreds), and a text
    weaving some of them, or parts of them, (overlapping, nested, adjacent) between pieces of
    other text."""
    alphabet = draw(st.sampled_from([_SCRUB_ALPHABET, st.sampled_from("abc")]))
    short = st.text(alphabet, min_size=shortest, max_size=40)
    secrets = draw(st.lists(short | st.text(alphabet, min_size=257, max_size=900), max_size=8))
    pieces = draw(st.lists(st.text(alphabet, max_size=12), max_size=8))
    picks = draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 900), st.integers(0, 900))))
    woven = []
    for piece, (pick, start, length) in zip(pieces, picks, strict=False):
        secret = secrets[pick % len(secrets)] if secrets else ""
        start = start % (len(secret) + 1) if start % 3 else 0  # (a whole one, a third of the time)
        end = len(secret) if start == 0 else start + length
        woven += [piece, secret[start:end]]
    return secrets, "".join(woven)


def holds(text: str, secret: str) -> bool:
    """What the loader means by a text holding a secret, said plainly: a secret of at least 8
    characters, all of it or 16 characters of it in a row (a 32nd of it and 8 more, for a secret
    longer than 256), looked for at every offset of the secret."""
    if len(secret) < 8:
        return False
    need = min(len(secret), max(16, len(secret) // 32 + 8))
    return any(secret[at : at + need] in text for at in range(len(secret) - need + 1))


def too_alike(secrets: list[str], text: str, *, every: bool) -> bool:
    """Whether the index declares ``text`` too much like the secrets to measure (a periodic
    secret's window, or more placements than the bound): it is then taken to hold one. The
    positions looked at: every one (``every``, as for a message) or one in a stride."""
    from bridge.config.loader import _Secrets, _TooAlike

    index = _Secrets(secrets)
    last = len(text) - 7
    try:
        list(index._spans(text, range(0, max(last, 0), 1 if every else index._stride)))
    except _TooAlike:
        return True
    return False


@settings(max_examples=300, deadline=None)
@given(_woven(shortest=8))
def test_scrubbing_leaves_no_secret_in_a_message(woven: tuple[list[str], str]) -> None:
    """Whatever the secrets (overlapping, nested, adjacent, whole or in part) and however they
    are woven into a message, none is left in it, and a message without one is unchanged
    (unless the index declares it too alike: then all of it is masked)."""
    from bridge.config.loader import _Secrets

    secrets, text = woven
    masked = _Secrets(secrets).scrub(text)
    assert not any(holds(masked, secret) for secret in secrets)
    if too_alike(secrets, text, every=True):
        assert masked == ("***" if text else text)
    elif not any(holds(text, secret) for secret in secrets):
        assert masked == text


@settings(max_examples=300, deadline=None)
@given(_woven(shortest=1))
def test_a_text_holds_a_secret_exactly_when_one_of_them_is_in_it(
    woven: tuple[list[str], str],
) -> None:
    """``found_in`` (its windows cut in C) says what :func:`holds` says of each secret, line
    breaks and all."""
    from bridge.config.loader import _Secrets

    secrets, text = woven
    found = _Secrets(secrets).found_in(text)
    if too_alike(secrets, text, every=False):
        assert found
    else:
        assert found == any(holds(text, secret) for secret in secrets)


def test_scrubbing_masks_among_ten_thousand_secrets() -> None:
    """10,000 secrets (a file of 10,000 webhooks) and 2,000 messages, each naming one: each is
    masked (the scrubber looks at each position of a message once, not once per secret; the
    per-secret replace it replaces made 20 million calls on such a file)."""
    from bridge.config.loader import _Secrets

    secrets = [f"whsec_{n:08d}_secret" for n in range(10_000)]
    scrub = _Secrets(secrets).scrub
    messages = [f"webhook {n}: field 'url': bad near whsec_{n:08d}_secret" for n in range(2000)]
    assert all(scrub(m).endswith("bad near ***") for m in messages)


def test_a_periodic_secrets_window_makes_a_text_too_alike_to_measure() -> None:
    """A window met at more than 8 places of one secret (``abab...``) is not measured place by
    place (a text of its period cost 200 s at 450 KB): a text holding it is taken to hold the
    secret, refused if shown and masked whole in a message. Other texts are unaffected."""
    from bridge.config.loader import _Secrets

    index = _Secrets(["ab" * 50, "an-ordinary-secret-value-0123456789"])
    assert index.found_in("acc-abababab")  # (8 characters of it: taken to hold it)
    assert index.scrub("near abababab here") == "***"
    assert not index.found_in("acct-ababab-x")
    assert index.scrub("near ordinary-secret-value-0 and ab") == "near *** and ab"


def _counting(monkeypatch: pytest.MonkeyPatch, owner: object, attribute: str) -> list[int]:
    """A list that grows by one at each call of ``owner.<attribute>`` (a module's function or a
    class's method)."""
    calls: list[int] = []
    real = getattr(owner, attribute)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, counted)
    return calls


def test_measuring_is_bounded_by_the_length_of_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 secrets sharing their first 40 characters, and a message holding those: each is
    held, but the message is not measured against each of them (a config author's template, 2,000
    measurements per occurrence): past the bound the message is masked whole."""
    from bridge.config.loader import _WORK_BASE, _WORK_PER_CHARACTER, _Secrets

    shared = "sk-shared-template-prefix-0123456789abcd"
    index = _Secrets([f"{shared}{n:06d}" for n in range(2000)])
    text = f"bad value {shared}!"
    agreements = _counting(monkeypatch, loader, "_agreement")
    assert index.scrub(text) == "***"
    assert len(agreements) <= 2 * (_WORK_BASE + _WORK_PER_CHARACTER * len(text))


def test_measuring_is_bounded_for_the_whole_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each text within its own bound, a thousand of them could still measure millions of
    placements (a file of 1,000 problems made of its template secrets in capitals: 33 s to
    mask). One index measures at most _WORK_PER_LOAD in all, its lowercase twin's included;
    past that every text that meets a secret's window is masked whole."""
    from bridge.config.loader import _Secrets

    monkeypatch.setattr(loader, "_WORK_PER_LOAD", 20_000)  # (smaller: the test stays quick)
    shared = "Sk-Shared-Template-Prefix-0123456789ABCD"
    index = _Secrets([f"{shared}{n:06d}" for n in range(3000)])
    texts = [
        f"unknown key {shared[:20].upper()}{n} (known keys: {shared[:30]} and more)"
        for n in range(1000)
    ]
    agreements = _counting(monkeypatch, loader, "_agreement")
    scrubbed = [index.scrub(text) for text in texts]
    assert len(agreements) <= 2 * 20_000  # (each placement measures two ways)
    for text in scrubbed:
        assert shared[:16].lower() not in text.lower()
    assert index.scrub("an ordinary message") == "an ordinary message"


def test_the_load_bound_is_for_messages_not_for_the_shown_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shown values' work grows with the file, each within its own bound: a valid file of
    100,000 webhooks whose ids each share 11 characters with their secret spent the whole load's
    bound, and the ids after it were refused as holding a secret."""
    from bridge.config.loader import _Secrets

    monkeypatch.setattr(loader, "_WORK_PER_LOAD", 100)
    index = _Secrets([f"{n:06d}-hook_{n * 7919:012x}secret" for n in range(3000)])
    assert not any(index.found_in(f"{n:06d}-hook") for n in range(3000))
    assert index.found_in(f"000042-hook_{42 * 7919:012x}")  # (16 in a row and more: held)


def test_long_secrets_sharing_16_characters_are_told_apart_by_their_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Secrets of 300 characters count from 17 in a row (a 32nd and 8): 2,000 of them sharing
    their first 16 characters, and a text holding only those 16, are told apart by the 17
    characters around the window, without measuring any (10,000 took 67 s to 300 s)."""
    from bridge.config.loader import _Secrets

    shared = "Q7mZ-common-16ch"
    index = _Secrets([shared + f"{n:x}".rjust(284, "0") for n in range(2000)])
    agreements = _counting(monkeypatch, loader, "_agreement")
    assert not index.found_in(f"https://hooks.example.com/{shared}/1")
    assert index.scrub(f"at {shared}/1") == f"at {shared}/1"
    assert agreements == []
    assert index.found_in(f"https://hooks.example.com/{shared}{'0' * 8}/1")


def test_a_shared_window_is_split_once_however_many_secrets_come_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loader adds each webhook's secret, then asks of its shown values: a split of a shared
    window dropped at each add was rebuilt from every secret so far (n² at 10,000 webhooks of
    one template, 132 s); it is kept and each new secret keyed into it."""
    from bridge.config.loader import _Secrets

    splits = _counting(monkeypatch, loader._Secrets, "_split")
    index = _Secrets()
    for n in range(1000):
        index.add(f"sk_live_{n:012d}")
        assert not index.found_in(f"https://x.example/sk_live_/{n}")
        assert index.found_in(f"https://x.example/sk_live_{n:012d}"[:-2])  # (18 of its 20)
    assert len(splits) == 1


def test_a_long_text_does_not_fill_the_cut_cache() -> None:
    """Shown values are short, and their cuts are cached by length; a long text (a message, a
    100 KB value) is cut as it comes: 50 such texts once held 323 MiB after the load."""
    from bridge.config.loader import _CUTS_CACHED, _cuts, _Secrets

    index = _Secrets(["an-ordinary-secret-value-0123456789"])
    _cuts.cache_clear()
    for extra in range(5):
        assert not index.found_in("x" * (_CUTS_CACHED + 1 + extra))
    assert _cuts.cache_info().currsize == 0
    assert not index.found_in("x" * _CUTS_CACHED)  # (the longest cached)
    assert _cuts.cache_info().currsize == 1


@pytest.mark.parametrize("word", ["transaction.success", "embedded", "hmac-sha256"])
def test_a_secret_that_is_a_word_every_configuration_shows_is_not_a_leak(
    tmp_path: Path, word: str
) -> None:
    """Found by the grammar fuzz test at random (`secret: &a0 transaction.success`): such a
    secret is shown by the events, the default schema mode or the signature scheme, not leaked;
    the oracle knows those words, and still catches a secret shown through a field."""
    path = tmp_path / "bridge.yaml"
    path.write_text(
        "webhooks:\n  - {id: hook-1, account: acct_1, url: https://shop.example.com/hooks,\n"
        f"     events: [transaction.success], signature: hmac-sha256, secret: &a0 {word}}}\n"
    )
    check_config(load_config(path, {}))
    path.write_text(path.read_text().replace(f"&a0 {word}", "not-a-public-word-1234"))
    config = load_config(path, {})
    shown = dataclasses.replace(config.webhooks[0], account="not-a-public-word-1234")
    with pytest.raises(AssertionError):  # (the loader refuses this; made by hand here)
        check_config(dataclasses.replace(config, webhooks=(shown,)))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([_SCRUB_ALPHABET, st.sampled_from("ab")]).flatmap(
        lambda alphabet: st.lists(
            st.tuples(st.text(alphabet, min_size=1, max_size=24), st.text(alphabet, max_size=60)),
            max_size=12,
        )
    )
)
def test_a_text_holds_a_secret_exactly_when_one_of_them_is_in_it_as_they_come(
    steps: list[tuple[str, str]],
) -> None:
    """Secrets added one by one, longest or shortest first, each followed by a question:
    ``found_in`` (which samples the text, one position in a stride that shrinks as shorter
    secrets come) says what :func:`holds` says of the secrets so far, of a text that holds the
    newest, or its last 16 characters, at every offset. (Two letters make secrets share
    windows.)"""
    from bridge.config.loader import _SCRUB_MIN_LENGTH, _Secrets

    held = _Secrets()
    known: list[str] = []
    for secret, text in steps:
        held.add(secret)
        known.append(secret)
        assert (secret in held) == (len(secret) >= _SCRUB_MIN_LENGTH)  # (remember_secret asks)
        for part in {secret, secret[-16:]}:
            for shift in range(9):
                woven = text[:shift] + part + text[shift:]
                expected = any(holds(woven, each) for each in known)
                if too_alike(known, woven, every=False):
                    expected = True
                assert held.found_in(woven) == expected
        alike = too_alike(known, text, every=False)
        assert held.found_in(text) == (alike or any(holds(text, each) for each in known))


_FLOW_THEN_QUESTION = re.compile(r"(?:^|[ ,\[{])[\[{](?:[^\n]*\?|[^\]}\n]*\n)", re.MULTILINE)
"""What ``_flow_then_question`` answers, as the regular expression it replaced (which tried a
match at every space of the file: 32 ms of a 10,000-webhook load, against 5)."""


@settings(max_examples=2000, deadline=None)
@given(st.text(st.sampled_from("[{]}?\n ,a/"), max_size=40))
def test_a_flow_collection_then_a_question_mark_is_found_as_the_expression_finds_it(
    text: str,
) -> None:
    from bridge.config.loader import _flow_then_question

    assert _flow_then_question(text) == (_FLOW_THEN_QUESTION.search(text) is not None)


@pytest.mark.parametrize(
    "secrets",
    [
        ("0123456789abcdefXYZ", "123456789abcdefX"),  # stride 8, no rebuild
        ("abcdefghij", "bcdefghij"),  # the stride shrinks: the longer one is sampled first
        ("hunter2hunter2hunter2\n", "hunter2hunter2hunter2"),  # what remember_secret adds
    ],
)
def test_a_secret_inside_another_one_added_before_it_is_found(secrets: tuple[str, str]) -> None:
    """A secret that is a part of one added before it (a value and its ``strip()``) shares
    sampled windows with it: it is found all the same, at every offset of a text."""
    from bridge.config.loader import _Secrets

    held = _Secrets(secrets)
    for shift in range(9):
        assert held.found_in("x" * shift + secrets[1] + "y")


NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
"""What an anchor or an alias name may hold (PyYAML), and a tag's suffix too."""
_NAMED_SECRET_FIELDS = {
    "secret": "webhook",
    "previous_secret": "webhook",
    "standard_webhooks_secret": "webhook",
    "previous_standard_webhooks_secret": "webhook",
    "sasl_password": "kafka",
    "properties.sasl.oauthbearer.client.secret": "kafka",
    "registry_password": "schemas",
}


def _naming_document(field_name: str, written: str, twice: bool) -> str:
    """A document whose ``field_name`` is the secret ``written`` without quotes (twice: in two
    places, so that an anchor is a duplicate one)."""
    section = _NAMED_SECRET_FIELDS[field_name]
    hook = (
        '  - id: "w1"\n    account: "a"\n    url: "https://example.com/h"\n'
        '    events: ["transaction.success"]\n'
    )
    if section == "webhook":
        hook += f"    {field_name}: {written}\n"
        if field_name != "secret":
            hook += '    secret: "another-secret-value-0123456789"\n'
    else:
        hook += '    secret: "another-secret-value-0123456789"\n'
    top = ""
    if section == "kafka" and field_name.startswith("properties."):
        top = f"kafka:\n  properties:\n    {field_name.removeprefix('properties.')}: {written}\n"
    elif section == "kafka":
        top = "kafka:\n  security_protocol: SASL_SSL\n  sasl_username: u\n"
        top += f"  sasl_password: {written}\n"
    elif section == "schemas":
        top = f"schemas:\n  registry_username: u\n  registry_password: {written}\n"
    if twice:
        hook += f'  - id: "w2"\n    account: {written}\n    url: "https://example.com/h"\n'
    return f"{top}webhooks:\n{hook}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.sampled_from(["!", "!!", "!<", "*", "&", "!a!", "!!python/name:", "!<!"]),
    name=st.text(st.sampled_from(NAME_CHARS), min_size=16, max_size=48),
    after=st.sampled_from(["", " x", ' "quoted"', "\n"]),
    field_name=st.sampled_from(sorted(_NAMED_SECRET_FIELDS)),
    twice=st.booleans(),
)
def test_a_secret_read_as_a_tag_an_alias_or_an_anchor_is_never_shown(
    files: Files, prefix: str, name: str, after: str, field_name: str, twice: bool
) -> None:
    """A secret written without quotes that starts with ``!``, ``*`` or ``&`` is read by YAML as
    a tag, an alias or an anchor: never a value, so never remembered as a secret. Whatever the
    message says of it (an unknown tag, an undefined alias, a duplicate anchor, an undefined tag
    handle), no 16 characters of it in a row are shown; a standard tag is still named."""
    written = f"{prefix}{name}>" if prefix.startswith("!<") else f"{prefix}{name}"
    text = _naming_document(field_name, written + after.rstrip("\n"), twice)
    files.config.write_text(text)
    try:
        load_config(files.config, ENVIRON)
    except ConfigError as error:
        message = "\n".join(error.problems)
    else:
        message = ""
    for start in range(len(name) - 15):
        assert name[start : start + 16] not in message, (text, message)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a: *Zq9XwLmN8pKdR4tYvB2c\n", ":1: invalid YAML: found an undefined alias at column 4"),
        (
            "a: &Zq9XwLmN8pKdR4tYvB2c x\nb: &Zq9XwLmN8pKdR4tYvB2c y\n",
            ":2: invalid YAML: found a duplicate anchor at column 4 (first at line 1)",
        ),
        (
            "a: !Zq9XwLmN8p!KdR4tYvB2c x\n",
            ":1: invalid YAML: while parsing a node: found an undefined tag handle at column 4",
        ),
        (
            "%TAG !Zq9XwLmN8pKdR4tYvB2c! tag:a,2000:\n%TAG !Zq9XwLmN8pKdR4tYvB2c! tag:b:\n--- a\n",
            ":2: invalid YAML: found a duplicate tag handle at column 1",
        ),
        (
            'retry: {attempts: !!binary "Zq9Xw\u00e9"}\nwebhooks: []\n',
            "cannot read the value: failed to convert base64 data into ascii: 'ascii' codec",
        ),
    ],
)
def test_yaml_errors_say_what_is_wrong_without_the_names_of_the_document(
    files: Files, text: str, said: str
) -> None:
    """PyYAML quotes the name of an alias, an anchor or a tag handle, which may be a secret
    written without quotes: the message says what is wrong and where, not the name."""
    files.config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(files.config, ENVIRON)
    assert said in caught.value.problems[0]
    assert "Zq9XwLmN" not in str(caught.value)


@pytest.mark.parametrize(
    ("words", "said"),
    [
        ("found character '\\t' that cannot start any token", None),
        ("expected <block end>, but found '<scalar>'", None),
        ("expected ',' or ']', but got '<block mapping start>'", None),
        ("could not determine a constructor for the tag 'tag:yaml.org,2002:merge'", None),
        (
            "could not determine a constructor for the tag '!Zq9XwLmN8pKdR4tYvB2c'",
            "could not determine a constructor for the tag '...'",
        ),
        ('expected a name, but found "it\'s a name"', "expected a name, but found '...'"),
        ("found undefined alias 'a'", "found an undefined alias"),
    ],
)
def test_pyyaml_words_keep_single_characters_and_token_names_only(
    words: str, said: str | None
) -> None:
    from bridge.config.loader import _yaml_words

    assert _yaml_words(words) == (words if said is None else said)


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(st.sampled_from("AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_"), min_size=16),
    case=st.sampled_from([str.lower, str.upper, str.swapcase, str.title]),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
)
def test_scrubbing_masks_a_secret_whatever_the_case_of_its_letters(
    secret: str, case: Callable[[str], str], before: str, after: str
) -> None:
    """A message may echo a value with its case changed (a URL's host lowercased): the secret
    is masked all the same, and no 16 characters of it in a row are left, in any case."""
    from bridge.config.loader import _Secrets

    masked = _Secrets([secret]).scrub(f"{before}{case(secret)}{after}").lower()
    assert not any(secret[at : at + 16].lower() in masked for at in range(len(secret) - 15)), masked


_ECHO_CHARS = (
    "AbCdEfGhIjKlMnOp0123456789-./:\\'\"\t\n \xa0\x01\x1b\x7f\x85\u00e9\u5b57\u202e\U0001f600"
)
"""Letters and digits, and what a message's ``repr`` or a printed line escapes or may change."""


def _yaml_string(text: str) -> str:
    """``text`` as a YAML double-quoted scalar, every character but printable ASCII escaped."""
    return '"{}"'.format(
        "".join(
            char
            if " " <= char <= "~" and char not in '"\\'
            else f"\\{char}"
            if char in '"\\'
            else f"\\u{ord(char):04x}"
            if ord(char) < 0x10000
            else f"\\U{ord(char):08x}"
            for char in text
        )
    )


_ECHOING_FIELDS = {  # the document with the secret in one field whose problem echoes it
    "events": ("", 'url: "https://example.com/h"\n    events: [{q}]'),
    "topic": ("topics:\n  source: {q}\n", ""),
    "choice": ("logging:\n  level: {q}\n", ""),
    "network": ("delivery:\n  allowed_networks: [{q}]\n", ""),
    "property name": ("kafka:\n  properties:\n    {q}: x\n", ""),
    "host": ("", 'url: "https://{e}.example.com/h"\n    events: ["transaction.success"]'),
    "label": ("", 'url: "https://ok.{e}.example.com/h"\n    events: ["transaction.success"]'),
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    secret=st.text(st.sampled_from(_ECHO_CHARS), min_size=16, max_size=40),
    field_name=st.sampled_from(sorted(_ECHOING_FIELDS)),
)
@example(secret="Kx7\\vQ9m\\Lp2Rt8Wz", field_name="events")
@example(secret="Kx7vQ9mL\tp2Rt8WzAbcdEf", field_name="events")
def test_a_secret_echoed_by_repr_or_printed_escaped_is_masked(
    files: Files, secret: str, field_name: str
) -> None:
    """A message quotes a value with ``repr`` (backslashes, tabs, line breaks and characters
    that are not printable escaped) and a problem line is printed escaped: no 16 characters in
    a row of the secret, of its ``repr`` or of its printed form are shown, in any case."""
    from bridge.core.errors import printable

    top, hook = _ECHOING_FIELDS[field_name]
    quoted = _yaml_string(secret)
    written = {"q": quoted, "e": quoted[1:-1]}
    hook = (
        hook.format(**written)
        or 'url: "https://example.com/h"\n    events: ["transaction.success"]'
    )
    files.config.write_text(
        f'{top.format(**written)}webhooks:\n  - id: "w1"\n    account: "a"\n    {hook}\n'
        f"    secret: {quoted}\n",
        encoding="utf-8",
    )
    try:
        load_config(files.config, ENVIRON)
    except ConfigError as error:
        shown = str(error).lower()
    else:
        shown = ""
    for form in {secret, repr(secret)[1:-1], printable(secret)}:
        for at in range(len(form) - 15):
            assert form[at : at + 16].lower() not in shown, shown
