"""Configuration loading: example files, defaults, environment overrides and every problem found."""

from __future__ import annotations

import base64
import difflib
import ipaddress
import os
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from bridge.config import loader
from bridge.config.loader import load_config
from bridge.core.errors import ConfigError
from bridge.core.settings import (
    Config,
    DeliveryConfig,
    KafkaConfig,
    TopicsConfig,
    is_kafka_credential,
)
from bridge.core.webhook import Secret, Webhook
from tests.special_files import NOT_REGULAR, make_sparse, make_special
from tests.yaml_nodes import yaml_nodes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, params=["libyaml", "pure"])
def yaml_loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs twice: with libyaml composing (the pure loader taking over whatever it
    declines), and with the pure-Python loader alone (PyYAML built without libyaml)."""
    if request.param == "pure":
        monkeypatch.setattr(loader, "FAST_YAML_LOADER", None)
    elif loader.FAST_YAML_LOADER is None:
        pytest.skip("PyYAML is built without libyaml here")
    return str(request.param)


def write(tmp_path: Path, text: str, name: str = "bridge.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ or {})
    assert caught.value.path == str(path)
    return caught.value.problems


def test_test_and_demo_configs_load_with_private_networks_and_inline_secrets() -> None:
    for name in ("test.yaml", "demo.yaml"):
        config = load_config(REPO / "config" / name, {})
        assert config.delivery.allow_private_networks
        assert config.webhooks
        assert all(w.secret.reveal() for w in config.webhooks)


def test_example_config_loads_with_its_environment_and_secret_files(tmp_path: Path) -> None:
    example = (REPO / "config" / "bridge.example.yaml").read_text(encoding="utf-8")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "shop-alerts").write_text("alerts-current\n")
    (secrets / "shop-alerts-previous").write_text("alerts-previous\n")
    path = write(tmp_path, example.replace("/var/run/secrets/bridge", str(secrets)))

    config = load_config(path, {"SHOP_MAIN_SECRET": "from-the-environment"})

    main, alerts = config.webhooks
    assert main.secret.reveal() == b"from-the-environment"
    assert main.events == {"transaction.success", "transaction.failed"}
    assert (main.timeout_seconds, main.concurrency) == (10.0, 32)
    assert alerts.secret.reveal() == b"alerts-current"
    assert alerts.previous_secret is not None
    assert alerts.previous_secret.reveal() == b"alerts-previous"
    assert (alerts.signature, alerts.timeout_seconds, alerts.concurrency) == (
        "hmac-sha256",
        5.0,
        8,
    )
    assert config.delivery.allowed_networks == (ipaddress.ip_network("10.20.0.0/16"),)
    assert config.kafka_settings()["socket.keepalive.enable"] == "true"
    assert [source for source, _ in config.sources] == [
        path,
        secrets / "shop-alerts",
        secrets / "shop-alerts-previous",
    ]


def test_defaults_fill_every_section(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "webhooks: []\n"), {})

    assert config == Config(path=config.path, sources=config.sources)
    assert config.delay_topics == tuple(f"transactions.outcomes.retry.{n}" for n in range(1, 6))
    assert config.dead_letter_topic == "transactions.outcomes.dlq"
    assert config.kafka.group_id == "transaction-webhook-bridge"
    assert config.kafka_settings() == {
        "bootstrap.servers": "localhost:9092",
        "client.id": "transaction-webhook-bridge",
    }


def test_topic_names_derive_from_the_source_and_follow_the_attempts(tmp_path: Path) -> None:
    text = "topics: {source: payments.out}\nretry: {attempts: 2}\nwebhooks: []\n"
    config = load_config(write(tmp_path, text), {})

    assert config.topics == TopicsConfig(
        source="payments.out",
        retry_prefix="payments.out.retry",
        parked="payments.out.parked",
        dead_letter="payments.out.dlq",
    )
    assert config.parked_topic == "payments.out.parked"
    assert config.delay_topics == ("payments.out.retry.1", "payments.out.retry.2")


def test_null_takes_the_default_and_webhook_overrides_resolve(tmp_path: Path) -> None:
    text = """\
delivery: {timeout_seconds: 4, concurrency_per_webhook: 7, allow_private_networks: null}
webhooks:
  - {id: a, account: x, url: "https://a.example", events: [transaction.failed], secret: s,
     timeout_seconds: null, concurrency: null}
  - {id: b, account: x, url: "https://b.example", events: [transaction.failed], secret: s,
     timeout_seconds: 1.5, concurrency: 2, enabled: false}
"""
    config = load_config(write(tmp_path, text), {})

    assert config.delivery.allow_private_networks is False
    first, second = config.webhooks
    assert (first.timeout_seconds, first.concurrency, first.enabled) == (4.0, 7, True)
    assert (second.timeout_seconds, second.concurrency, second.enabled) == (1.5, 2, False)


def test_environment_overrides_the_kafka_connection(tmp_path: Path) -> None:
    text = """\
kafka:
  bootstrap_servers: file:9092
  group_id: file-group
  security_protocol: PLAINTEXT
  properties: {acks: all, linger.ms: 5, enable.idempotence: true}
webhooks: []
"""
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": "env-1:9093,env-2:9093",
        "KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "KAFKA_SASL_MECHANISM": "scram-sha-512",
        "KAFKA_SASL_USERNAME": "bridge",
        "KAFKA_SASL_PASSWORD": "env-password",
        "KAFKA_GROUP_ID": "env-group",
    }
    config = load_config(write(tmp_path, text), environ)

    assert config.kafka.group_id == "env-group"
    assert config.kafka_settings() == {
        "bootstrap.servers": "env-1:9093,env-2:9093",
        "client.id": "transaction-webhook-bridge",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bridge",
        "sasl.password": "env-password",
        "acks": "all",
        "linger.ms": "5",
        "enable.idempotence": "true",
    }
    assert "env-password" not in repr(config)


def test_empty_environment_variables_do_not_override(tmp_path: Path) -> None:
    path = write(tmp_path, "kafka: {bootstrap_servers: 'file:9092'}\nwebhooks: []\n")
    config = load_config(path, {"KAFKA_BOOTSTRAP_SERVERS": ""})
    assert config.kafka.bootstrap_servers == "file:9092"


def test_invalid_environment_override_is_a_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "webhooks: []\n")
    assert problems_of(path, {"KAFKA_SECURITY_PROTOCOL": "tls"}) == [
        f"{path}: environment variable KAFKA_SECURITY_PROTOCOL: unknown value 'tls' "
        "(expected PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)"
    ]


def test_sasl_password_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "password").write_text("from-file\n")
    text = f"""\
kafka:
  security_protocol: SASL_SSL
  sasl_username: bridge
  sasl_password_file: {tmp_path / "password"}
webhooks: []
"""
    config = load_config(write(tmp_path, text), {})
    assert config.kafka.sasl_password == Secret(b"from-file")


def test_secret_forms(tmp_path: Path) -> None:
    (tmp_path / "crlf").write_bytes(b"file-secret\r\n")
    (tmp_path / "two-newlines").write_bytes(b"kept\n\n")
    text = f"""\
webhooks:
  - {{id: inline, account: a, url: "https://x.example", events: [transaction.failed],
     secret: "inline value"}}
  - {{id: env, account: a, url: "https://x.example", events: [transaction.failed],
     secret: "${{HOOK_SECRET}}", previous_secret: "${{OLD_SECRET}}"}}
  - {{id: file, account: a, url: "https://x.example", events: [transaction.failed],
     secret_file: {tmp_path / "crlf"}, previous_secret_file: {tmp_path / "two-newlines"}}}
"""
    environ = {"HOOK_SECRET": "env value", "OLD_SECRET": "old value"}
    inline, env, file = load_config(write(tmp_path, text), environ).webhooks

    assert (inline.secret.reveal(), inline.previous_secret) == (b"inline value", None)
    assert env.secret.reveal() == b"env value"
    assert env.previous_secret == Secret(b"old value")
    assert file.secret.reveal() == b"file-secret"
    assert file.previous_secret == Secret(b"kept\n")


def test_secrets_never_show_in_reprs() -> None:
    secret = Secret(b"hunter2")
    webhook = Webhook("w", "a", "https://x.example", frozenset({"transaction.failed"}), secret)
    kafka = KafkaConfig(sasl_password=Secret(b"hunter3"))
    for text in (repr(secret), str(secret), repr(webhook), str(webhook), repr(kafka)):
        assert "hunter" not in text
    assert repr(secret) == "Secret('***')"
    assert secret.reveal() == b"hunter2"


def test_yaml_anchors_and_merge_keys_share_webhook_settings(tmp_path: Path) -> None:
    text = """\
webhooks:
  - &first
    id: one
    account: acct_1
    url: https://one.example
    events: [transaction.success, transaction.failed]
    secret: shared
  - <<: *first
    id: two
    events: [transaction.failed]
"""
    one, two = load_config(write(tmp_path, text), {}).webhooks
    assert (two.id, two.account, two.url, two.secret) == ("two", one.account, one.url, one.secret)
    assert two.events == {"transaction.failed"}


def test_every_problem_is_reported_at_once_with_file_line_webhook_and_field(
    tmp_path: Path,
) -> None:
    text = """\
kafka:
  bootstrap_server: "kafka:9092"
retry:
  attempts: 25
  first_delay_ms: "500"
delivery:
  timeout_seconds: 0
logging: {level: loud}
webhook: []
webhooks:
  - id: shop-main
    account: acct_123
    url: "https://example.com/hooks"
    events: [transaction.success, transaction.refund]
    secret: "${SHOP_MAIN_SECRET}"
  - id: shop-main
    account: 12345
    url: "ftp://example.com/hooks"
    events: []
    secret: "inline"
    timout_seconds: 3
  - account: acct_9
    url: "https://example.com/hooks"
    events: [transaction.failed]
"""
    path = write(tmp_path, text)
    expected = "(expected transaction.success, transaction.failed)"
    assert problems_of(path) == [
        f"{path}:2: field 'kafka.bootstrap_server': unknown key "
        "(did you mean 'bootstrap_servers'?)",
        f"{path}:4: field 'retry.attempts': must be between 1 and 20, got 25",
        f"{path}:5: field 'retry.first_delay_ms': expected an integer, got a string",
        f"{path}:7: field 'delivery.timeout_seconds': must be above 0 and at most 300, got 0",
        f"{path}:8: field 'logging.level': unknown value 'loud' "
        "(expected debug, info, warning, error, critical)",
        f"{path}:9: section 'webhook': unknown key (did you mean 'webhooks'?)",
        f"{path}:14: webhook 'shop-main': field 'events': unknown event "
        f"'transaction.refund' {expected}",
        f"{path}:15: webhook 'shop-main': field 'secret': environment variable "
        "SHOP_MAIN_SECRET is not set or empty",
        f"{path}:16: webhook 'shop-main': field 'id': duplicate webhook id "
        "(first defined on line 11)",
        f"{path}:17: webhook 'shop-main': field 'account': expected a string, "
        "got an integer (quote the value)",
        f"{path}:18: webhook 'shop-main': field 'url': must be an absolute http:// or https:// URL",
        f"{path}:19: webhook 'shop-main': field 'events': must name at least one event {expected}",
        f"{path}:21: webhook 'shop-main': field 'timout_seconds': unknown key "
        "(did you mean 'timeout_seconds'?)",
        f"{path}:22: webhook #3: field 'id': missing (required)",
        f"{path}:22: webhook #3: field 'secret': missing (set 'secret' or 'secret_file')",
    ]


SINGLE_PROBLEMS = [
    pytest.param(
        "webhooks: {}\n", "1: section 'webhooks': must be a list of webhooks", id="webhooks-map"
    ),
    pytest.param("kafka: {}\n", "1: section 'webhooks': missing (required;", id="no-webhooks"),
    pytest.param("- a\n- b\n", "1: the top level: must be a mapping", id="top-level-list"),
    pytest.param("retry: 5\nwebhooks: []\n", "1: section 'retry': must be a mapping", id="scalar"),
    pytest.param(
        "retry: {attempts: 1, attempts: 2}\nwebhooks: []\n",
        "1: section 'retry': key 'attempts' is given twice",
        id="duplicate-key",
    ),
    pytest.param(
        "schemas: {mode: registry}\nwebhooks: []\n",
        "1: field 'schemas.registry_url': required in registry mode",
        id="registry-url",
    ),
    pytest.param(
        "delivery: {allowed_networks: ['10.0.0.1/8']}\nwebhooks: []\n",
        "1: field 'delivery.allowed_networks': invalid network '10.0.0.1/8': "
        "10.0.0.1/8 has host bits set",
        id="network",
    ),
    pytest.param(
        "delivery: {connect_timeout_seconds: .nan}\nwebhooks: []\n",
        "1: field 'delivery.connect_timeout_seconds': must be above 0 and at most 300, got nan",
        id="nan",
    ),
    pytest.param(
        "metrics: {port: true}\nwebhooks: []\n",
        "1: field 'metrics.port': expected an integer, got a boolean",
        id="bool-is-not-int",
    ),
    pytest.param(
        "topics: {dead_letter: 'dead letters'}\nwebhooks: []\n",
        "1: field 'topics.dead_letter': invalid Kafka topic name 'dead letters'",
        id="topic",
    ),
    pytest.param(
        "kafka: {properties: {group.id: other}}\nwebhooks: []\n",
        "1: field 'kafka.properties.group.id': set it with kafka.group_id instead",
        id="reserved-property",
    ),
    pytest.param(
        "kafka: {sasl_username: bridge, sasl_password: pw}\nwebhooks: []\n",
        "1: field 'kafka.security_protocol': SASL credentials are set, so it must be "
        "SASL_PLAINTEXT or SASL_SSL",
        id="sasl-without-protocol",
    ),
    pytest.param(
        "kafka: {security_protocol: SASL_SSL, sasl_username: bridge}\nwebhooks: []\n",
        "1: field 'kafka.sasl_password': required with SASL_SSL and sasl_mechanism PLAIN",
        id="sasl-without-password",
    ),
    pytest.param(
        "retry: {attempts: !!binary 'not base64!'}\nwebhooks: []\n",
        "1: field 'retry.attempts': cannot read the value: failed to decode base64 data",
        id="bad-tag",
    ),
    pytest.param(
        "webhooks:\n  - [not, a, mapping]\n",
        "2: webhook #1: must be a mapping of keys to values",
        id="webhook-list",
    ),
]


@pytest.mark.parametrize(("text", "problem"), SINGLE_PROBLEMS)
def test_single_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    problems = problems_of(path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}:{problem}")


def webhook_yaml(**fields: str | None) -> str:
    """A file with one webhook: valid fields, changed (or removed with None) by ``fields``."""
    values: dict[str, str | None] = {
        "id": "shop-main",
        "account": "acct_123",
        "url": "https://shop.example.com/hooks",
        "events": "[transaction.success]",
        "secret": "inline-secret",
        **fields,
    }
    items = [f"{key}: {value}" for key, value in values.items() if value is not None]
    return "webhooks:\n  - " + "\n    ".join(items) + "\n"


SHOP = "webhook 'shop-main': field"
SHOWN_SECRET = (  # the problem of a shown field holding a secret or part of one
    "holds a secret or 16 characters of one in a row: a secret belongs in a secret field only, "
    "and is not made from a value that is shown (such as the webhook's id)"
)
WEBHOOK_PROBLEMS = [
    ({"id": "'no spaces'"}, "webhook #1: field 'id': must be 1 to 64 characters among"),
    ({"url": "/relative"}, f"{SHOP} 'url': must be an absolute http:// or https:// URL"),
    ({"url": "'https://x.example:99999/'"}, f"{SHOP} 'url': the port is not a number from 1"),
    ({"url": "'http://10.1.2.3/hook'"}, f"{SHOP} 'url': 10.1.2.3 is a private address"),
    ({"url": "'http://[::1]:8080/'"}, f"{SHOP} 'url': ::1 is a loopback address"),
    ({"events": "transaction.failed"}, f"{SHOP} 'events': expected a list of events"),
    ({"events": "[[transaction.failed]]"}, f"{SHOP} 'events': expected event names, got a list"),
    ({"signature": "rsa"}, f"{SHOP} 'signature': unknown value 'rsa'"),
    ({"enabled": "'yes'"}, f"{SHOP} 'enabled': expected true or false, got a string"),
    ({"concurrency": "0"}, f"{SHOP} 'concurrency': must be between 1 and 10000, got 0"),
    ({"timeout_seconds": "301"}, f"{SHOP} 'timeout_seconds': must be above 0 and at most 300"),
    ({"secret": "''"}, f"{SHOP} 'secret': must not be empty"),
    ({"secret": "12345"}, f"{SHOP} 'secret': expected a string, got an integer"),
    ({"secret": None}, f"{SHOP} 'secret': missing (set 'secret' or 'secret_file')"),
    ({"secret": "'x-${HOOK}'"}, f"{SHOP} 'secret': write ${{NAME}} alone to read an environment"),
    ({"secret": "'whsec_%%%'"}, f"{SHOP} 'secret': the part after 'whsec_' is not valid base64"),
    (
        {
            "secret": "'two words and enough characters to be long'",
            "signature": "secret",
            "standard_webhooks_secret": "other-key",
        },
        f"{SHOP} 'secret': with signature 'secret' it is sent as a header, so printable ASCII only",
    ),
    (
        {"secret": None, "secret_file": "/no/such/file"},
        f"{SHOP} 'secret_file': cannot read secret file /no/such/file: No such file or directory",
    ),
]


@pytest.mark.parametrize(("fields", "problem"), WEBHOOK_PROBLEMS)
def test_webhook_problem(tmp_path: Path, fields: dict[str, str | None], problem: str) -> None:
    path = write(tmp_path, webhook_yaml(**fields))
    problems = problems_of(path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}:"), problems
    assert problems[0].split(": ", 1)[1].startswith(problem), problems


def test_secret_file_problems(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    text = webhook_yaml(secret=None, secret_file=str(tmp_path / "empty"))
    path = write(tmp_path, text)
    assert problems_of(path) == [
        f"{path}:6: webhook 'shop-main': field 'secret_file': secret file "
        f"{tmp_path / 'empty'} is empty"
    ]
    both = text + "    secret: also-inline\n"
    path.write_text(both)
    assert problems_of(path) == [
        f"{path}:7: webhook 'shop-main': field 'secret': set 'secret' or 'secret_file', not both"
    ]


def test_private_destinations_are_accepted_when_allowed(tmp_path: Path) -> None:
    text = webhook_yaml(url="http://10.20.1.2:8080/hooks")
    allowed = "delivery: {allowed_networks: ['10.20.0.0/16']}\n" + text
    assert load_config(write(tmp_path, allowed), {}).webhooks[0].url.startswith("http://10.20")
    private = "delivery: {allow_private_networks: true}\n" + text
    assert load_config(write(tmp_path, private), {}).webhooks[0].url.startswith("http://10.20")


def test_yaml_syntax_error_names_the_line_and_hides_the_text(tmp_path: Path) -> None:
    path = write(tmp_path, webhook_yaml(secret="hunter2: inline"))
    assert problems_of(path) == [
        f"{path}:6: invalid YAML: mapping values are not allowed here",
    ]


def test_secret_values_never_appear_in_errors(tmp_path: Path) -> None:
    text = webhook_yaml(secret="hunter2 with spaces", signature="secret")
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), {})
    assert "hunter2 with spaces" not in str(caught.value)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "\ufeff"])
def test_an_empty_file_lacks_its_webhooks_section(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    assert problems_of(path) == [
        f"{path}: section 'webhooks': missing (required; may be an empty list [])"
    ]


def test_every_problem_has_a_place_whatever_node_it_is_about() -> None:
    """A node the loader makes itself (the empty mapping of an empty file) has no place in the
    text: its problems name the file alone, never fail."""
    from yaml.nodes import MappingNode

    reader = loader._Loader("bridge.yaml", {})
    made = MappingNode("tag:yaml.org,2002:map", [])
    reader.problem(made, "section 'webhooks'", "missing")
    first: dict[str, tuple[tuple[int, str], int | None]] = {}
    source = (0, "bridge.yaml")
    assert not reader.duplicate(first, "shop", source, loader._line(made))
    assert reader.duplicate(first, "shop", source, 4)
    assert reader.duplicate(first, "shop", (1, "other.yaml"), loader._line(made))
    assert reader.problems == [
        "bridge.yaml: section 'webhooks': missing",
        "bridge.yaml: webhook 'shop': field 'id': duplicate webhook id (first defined on "
        "bridge.yaml)",
        "bridge.yaml:4: webhook 'shop': field 'id': duplicate webhook id (first defined on an "
        "earlier line)",
    ]


def test_unreadable_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "missing.yaml", {})
    assert caught.value.problems == [
        f"{tmp_path / 'missing.yaml'}: cannot read the file: No such file or directory"
    ]


def test_dataclasses_are_frozen() -> None:
    delivery = DeliveryConfig()
    with pytest.raises(AttributeError):
        delivery.timeout_seconds = 1.0  # type: ignore[misc]


def test_sasl_without_a_mechanism_means_plain(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(
        "kafka:\n  security_protocol: SASL_SSL\n  sasl_username: u\n  sasl_password: p\n"
        f"schemas:\n  directory: {Path('schemas').resolve()}\nwebhooks: []\n"
    )
    settings = load_config(path, environ={}).kafka_settings()
    assert settings["sasl.mechanism"] == "PLAIN"


def test_a_schema_directory_without_the_reader_schema_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(f"schemas:\n  directory: {tmp_path}\nwebhooks: []\n")
    with pytest.raises(ConfigError, match=r"holds no transaction_outcome\.avsc"):
        load_config(path, environ={})


# ---- malformed input never crashes and never leaks --------------------------------------------

PLANTED = "planted-Secret-Value-4f1c9e"
"""A secret value written into test files; it must never appear in any message."""


def only_problem(path: Path, environ: dict[str, str] | None = None) -> str:
    """The one problem of a rejected file, without its ``file:line: `` prefix; checks no leak."""
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ or {})
    assert PLANTED not in str(caught.value)
    assert len(caught.value.problems) == 1, caught.value.problems
    problem = caught.value.problems[0]
    assert problem.startswith(f"{path}")
    return problem.split(": ", 1)[1]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (f"!!int {PLANTED}", "cannot read the value as an integer (!!int)"),
        (f"!!float {PLANTED}", "cannot read the value as a number (!!float)"),
        (f"!!bool {PLANTED}", "cannot read the value as a boolean (true or false) (!!bool)"),
        (f"!!timestamp {PLANTED}", "cannot read the value as a timestamp (!!timestamp)"),
        ("!!timestamp 2026-13-45", "cannot read the value as a timestamp (!!timestamp)"),
        ("!!binary 'abcde'", "cannot read the value: failed to decode base64 data"),
        ("!!binary aGVsbG8=", "expected a string, got bytes"),
        (f"!!set {{{PLANTED}}}", "expected a string, got set"),
        (f"!!omap [{PLANTED}]", "cannot read the value: expected a mapping of length 1"),
        (f"!!pairs {PLANTED}", "cannot read the value: expected a sequence"),
        (f"!!str [{PLANTED}]", "cannot read the value: expected a scalar node"),
        (f"!!map {PLANTED}", "cannot read the value: expected a mapping node"),
        (f"!!python/object:os.system {PLANTED}", "a !!python/ tag at column 13 (only the"),
        (f"!!python/name:os.system {PLANTED}", "a !!python/ tag at column 13"),
        (f"!!custom {PLANTED}", "an unknown !! tag at column 13"),
        (f"!custom {PLANTED}", "an unknown local tag at column 13 (only the standard YAML"),
        (f"!<tag:example.com,2000:x> {PLANTED}", "an unknown global tag at column 13"),
        (f"!!merge {PLANTED}", "cannot read the value: could not determine a constructor"),
        (f"[!!int {PLANTED}]", "cannot read the value as an integer (!!int)"),
        (f"{{a: !!float {PLANTED}}}", "cannot read the value as a number (!!float)"),
    ],
)
def test_tagged_secrets_are_problems_naming_the_tag_never_the_value(
    tmp_path: Path, value: str, message: str
) -> None:
    path = write(tmp_path, webhook_yaml(secret=value))
    assert only_problem(path).startswith(f"{SHOP} 'secret': {message}")


@pytest.mark.parametrize(
    "text",
    [
        "retry: {attempts: !!int abc}\n",
        "retry: {attempts: !!bool maybe}\n",
        "delivery: {allow_private_networks: !!bool perhaps}\n",
        "delivery: {timeout_seconds: !!float x}\n",
        "delivery: {allowed_networks: [!!timestamp nope]}\n",
        "metrics: {port: !!int 0x}\n",
        "kafka: {properties: {linger.ms: !!int five}}\n",
        "logging: !!set {level}\n",
        "retry: !custom {attempts: 3}\n",
        "retry: {attempts: !<tag:example.com,2000:x> 3}\n",
    ],
)
def test_bad_tags_in_any_section_are_problems(tmp_path: Path, text: str) -> None:
    """A standard tag is named; any other is not (its name may be a secret written without
    quotes), but the line and column say where it is."""
    path = write(tmp_path, text + "webhooks: []\n")
    tag = text.split("!", 1)[1].split(" ", 1)[0]
    problem = only_problem(path)
    if tag.startswith("!") and "python" not in tag:
        assert f"!{tag}" in problem
    else:
        assert f"!{tag}" not in problem
        assert "unknown" in problem and "tag" in problem


def test_python_tags_are_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    call = f"['touch {marker}']"
    text = webhook_yaml(secret=f"!!python/object/apply:os.system {call}")
    text += f"retry: {{attempts: !!python/object/new:os.system {call}}}\n"
    text += f"logging: !!python/object/apply:os.system {call}\n"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), {})
    assert [problem.split(": ", 1)[1] for problem in caught.value.problems] == [
        f"{SHOP} 'secret': a !!python/ tag at column 13 (only the standard YAML tags are read; "
        "the tag is not shown, as a value written without quotes that starts with '!' is read "
        "as a tag)",
        "field 'retry.attempts': a !!python/ tag at column 19 (only the standard YAML tags are "
        "read; the tag is not shown, as a value written without quotes that starts with '!' is "
        "read as a tag)",
        "section 'logging': must be a mapping of keys to values",
    ]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("retry: {attempts: " + "9" * 5000 + "}\n", "retry.attempts': cannot read the value as"),
        ("retry: {attempts: " + "9" * 400 + "}\n", "must be between 1 and 20, got a number of 400"),
        ("delivery: {timeout_seconds: " + "9" * 400 + "}\n", "got a number of 400 digits"),
        # Past 4,300 digits Python refuses to write an integer out: its length is given.
        ("retry: {attempts: 0x" + "f" * 4000 + "}\n", "got a number of about 4817 digits"),
        ("retry: {attempts: 0x" + "f" * 400_000 + "}\n", "got a number of about 481648 digits"),
        ("retry: {attempts: 0b1" + "0" * 20_000 + "}\n", "got a number of about 6021 digits"),
        ("retry:\n  attempts: 59" + ":59" * 3999 + "\n", "got a number of about 7113 digits"),
        (
            "delivery: {timeout_seconds: -0x" + "f" * 4000 + "}\n",
            "at most 300, got a number of about 4817 digits",
        ),
        (
            "kafka: {properties: {fetch.max.bytes: 0x" + "f" * 4000 + "}}\n",
            "expected a property value, got a number of about 4817 digits",
        ),
        ("delivery: {timeout_seconds: 1.0e+400}\n", "at most 300, got inf"),
        ("delivery: {timeout_seconds: -.inf}\n", "at most 300, got -inf"),
        ("delivery: {shutdown_grace_seconds: .nan}\n", "at most 3600, got nan"),
        ("metrics: {port: 1e400}\n", "expected an integer, got a string"),
        ('logging: {level: "\\ud800"}\n', "contains a lone surrogate"),
        ('metrics: {host: "local\\udfffhost"}\n', "contains a lone surrogate"),
        ('schemas: {directory: "sch\\0emas"}\n', "a path must not contain a NUL character"),
    ],
)
def test_odd_scalars_are_problems(tmp_path: Path, text: str, message: str) -> None:
    assert message in only_problem(write(tmp_path, text + "webhooks: []\n"))


def test_a_number_is_described_whatever_limit_python_sets_on_writing_it(tmp_path: Path) -> None:
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # (the lowest PYTHONINTMAXSTRDIGITS allows)
    try:
        path = write(tmp_path, "retry: {attempts: 0x" + "f" * 600 + "}\nwebhooks: []\n")
        assert only_problem(path) == (
            "field 'retry.attempts': must be between 1 and 20, got a number of about 723 digits"
        )
    finally:
        sys.set_int_max_str_digits(before)


def test_surrogates_and_nul_in_secrets_are_problems(tmp_path: Path) -> None:
    path = write(tmp_path, webhook_yaml(secret=f'"{PLANTED}\\udc80"'))
    assert only_problem(path) == (
        f"{SHOP} 'secret': contains a lone surrogate (\\ud800 to \\udfff), which is not text"
    )
    path = write(tmp_path, webhook_yaml(secret=None, secret_file=f'"{tmp_path}/\\0"'))
    assert only_problem(path) == f"{SHOP} 'secret_file': a path must not contain a NUL character"
    environ = {"HOOK": "env-\udcff-value"}  # an undecodable byte from a real environment
    path = write(tmp_path, webhook_yaml(secret="'${HOOK}'"))
    assert load_config(path, environ).webhooks[0].secret.reveal() == b"env-\xff-value"


@pytest.mark.parametrize(
    ("account", "code"),
    [
        ('"acct\\e[2J\\e]0;owned\\a\\r\\nfake  row"', "U+001B"),
        ('"acct\\N"', "U+0085"),  # next line
        ('"acct\\u202e321"', "U+202E"),  # right-to-left override
        ('"acct\\u061c321"', "U+061C"),  # Arabic letter mark
        ('"acct\\u200f321"', "U+200F"),  # right-to-left mark
        ('"acct\\u2066321"', "U+2066"),  # left-to-right isolate
        ('"acct\\L_1"', "U+2028"),  # line separator
        ('"acct\\P_1"', "U+2029"),  # paragraph separator
        ('"acct\\t1"', "U+0009"),
    ],
)
def test_an_account_with_control_characters_or_bidi_controls_is_a_problem(
    tmp_path: Path, account: str, code: str
) -> None:
    problem = only_problem(write(tmp_path, webhook_yaml(account=account)))
    assert problem.startswith(
        f"{SHOP} 'account': contains a control character, line separator or bidi control ({code})"
    )
    assert problem.isprintable()


@pytest.mark.parametrize(
    "account",
    [
        "+221770000000",
        "acct 42",
        "compte-\u00e9t\u00e9",
        "\u53e3\u5ea7/7",
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian, a ZWNJ (U+200C)
        "team-\U0001f468\u200d\U0001f4bb",  # an emoji ZWJ sequence (U+200D)
        "acct-\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",  # a flag
        "acct\u00ad42",  # a soft hyphen
        "\ufeffacct42",  # a byte order mark
        "acct\u200b_1",  # a zero-width space
        "acct\u00a042",  # a no-break space
    ],
)
def test_an_account_of_printable_or_format_characters_is_taken_as_written(
    tmp_path: Path, account: str
) -> None:
    written = account.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    config = load_config(write(tmp_path, webhook_yaml(account=f'"{written}"')), {})
    assert config.webhooks[0].account == account


@pytest.mark.parametrize(
    "account", ['"\\u200b"', '"\\ufeff\\u00ad"', '" \\u200b "', '"\\u2060\\u00a0"']
)
def test_an_account_made_of_format_characters_alone_is_a_problem(
    tmp_path: Path, account: str
) -> None:
    """Nothing would show it (a JSON log or a metric label prints it as it is)."""
    problem = only_problem(write(tmp_path, webhook_yaml(account=account)))
    assert problem == (
        f"{SHOP} 'account': has no visible character (only format characters or spaces): an "
        "account holder id is text that can be shown"
    )


def test_a_file_name_cannot_split_its_problem_line(tmp_path: Path) -> None:
    (tmp_path / "a\n  - injected line.yaml").write_text("webhooks: {\n", encoding="utf-8")
    (tmp_path / "b.yaml").write_text("webhooks: []\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {})
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith(f"{tmp_path}/a\\n  - injected line.yaml:")
    assert str(caught.value).count("\n") == 1  # the heading, then the one problem


def test_bytes_that_are_not_utf8_text(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_bytes(b"webhooks: []\nlogging: {level: \xff\xfe}\n")
    assert only_problem(path) == "the file is not UTF-8 text (line 2)"
    path.write_bytes(b"webhooks: []\nlogging: {level: 'a\x00b'}\n")
    assert only_problem(path) == "invalid YAML: a control character that YAML does not allow"
    path.write_bytes(b"webhooks: []\n\x1b[31m\n")
    assert only_problem(path) == "invalid YAML: a control character that YAML does not allow"


def test_utf16_and_bom_files_load(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    text = webhook_yaml(account="'compte-é'")
    for data in (text.encode("utf-16"), b"\xef\xbb\xbf" + text.encode()):
        path.write_bytes(data)
        assert load_config(path, {}).webhooks[0].account == "compte-é"


def test_a_directory_and_an_oversized_file_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "config.d"
    folder.mkdir()
    (empty,) = problems_of(folder)  # a directory is read (tests/unit/test_config_directory.py)
    assert empty.startswith(f"{folder}: no configuration file in the directory")
    big = write(tmp_path, "webhooks: []\n" + "#" * 2000 + "\n")
    monkeypatch.setattr("bridge.config.loader.CONFIG_FILE_LIMIT_BYTES", 1024 * 1024 + 1)
    load_config(big, {})
    monkeypatch.setattr("bridge.config.loader.CONFIG_FILE_LIMIT_BYTES", 1024)
    (problem,) = problems_of(big)
    assert problem.startswith(f"{big}: the file is larger than")


def test_the_config_file_limit_is_64_mib(tmp_path: Path) -> None:
    from bridge.config.loader import CONFIG_FILE_LIMIT_BYTES

    assert CONFIG_FILE_LIMIT_BYTES == 64 * 1024 * 1024
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as handle:  # sparse: no disk space used
        handle.truncate(CONFIG_FILE_LIMIT_BYTES + 1)
    assert problems_of(huge) == [
        f"{huge}: the file is larger than 64 MiB; is it the configuration file?"
    ]


def test_oversized_and_special_secret_files(tmp_path: Path) -> None:
    big = tmp_path / "big-secret"
    big.write_bytes(b"x" * (1024 * 1024 + 1))
    path = write(tmp_path, webhook_yaml(secret=None, secret_file=str(big)))
    assert only_problem(path) == f"{SHOP} 'secret_file': secret file {big} is larger than 1024 KiB"
    path = write(tmp_path, webhook_yaml(secret=None, secret_file=str(tmp_path)))
    assert only_problem(path) == (
        f"{SHOP} 'secret_file': cannot read secret file {tmp_path}: Is a directory"
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_what_is_not_a_regular_file_is_refused_without_waiting(tmp_path: Path, kind: str) -> None:
    reason = NOT_REGULAR[kind]
    special = make_special(tmp_path / kind, kind)
    if kind != "directory":  # (a directory is a configuration directory)
        assert problems_of(special) == [f"{special}: cannot read the file: {reason}"]
    path = write(tmp_path, webhook_yaml(secret=None, secret_file=str(special)))
    assert only_problem(path) == (
        f"{SHOP} 'secret_file': cannot read secret file {special}: {reason}"
    )
    text = f"kafka: {{properties: {{ssl.key.password: {{file: '{special}'}}}}}}\nwebhooks: []\n"
    assert only_problem(write(tmp_path, text)) == (
        f"field 'kafka.properties.ssl.key.password': cannot read secret file {special}: {reason}"
    )
    text = f"kafka: {{properties: {{ssl.ca.location: {{file: '{special}'}}}}}}\nwebhooks: []\n"
    assert only_problem(write(tmp_path, text)) == (
        f"field 'kafka.properties.ssl.ca.location': cannot read file {special}: {reason}"
    )
    folder = tmp_path / "config.d"
    folder.mkdir()
    (folder / "a.yaml").write_text("webhooks: []\n")
    (folder / "b.yaml").symlink_to(special)
    assert problems_of(folder) == [f"{folder / 'b.yaml'}: cannot read the file: {reason}"]


def test_no_file_is_read_past_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huge = make_sparse(tmp_path / "huge", 1 << 40)
    reads: list[int] = []
    real_read = os.read

    def counted(fd: int, size: int) -> bytes:
        reads.append(size)
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", counted)
    assert problems_of(huge) == [
        f"{huge}: the file is larger than 64 MiB; is it the configuration file?"
    ]
    path = write(tmp_path, webhook_yaml(secret=None, secret_file=str(huge)))
    assert only_problem(path) == f"{SHOP} 'secret_file': secret file {huge} is larger than 1024 KiB"
    assert sum(reads) < 1000, "only the configuration files were read, not the 1 TiB one"
    reads.clear()
    # A file that grows after its size was looked at is read one byte past the limit, no further.
    grows = write(tmp_path, "webhooks: []\n" + "#" * 2000 + "\n")
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((0o100644, *[0] * 9)))
    monkeypatch.setattr(loader, "CONFIG_FILE_LIMIT_BYTES", 1024)
    (problem,) = problems_of(grows)
    assert problem.startswith(f"{grows}: the file is larger than")
    assert sum(reads) == 1025


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"webhooks: {deep(70)}\n", "invalid YAML: nested more than 64 levels deep"),
        (f"webhooks: {deep(5000)}\n", "invalid YAML: nested more than 64 levels deep"),
        ("webhooks: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "nested more than 64 levels"),
        (
            f"a: &a {deep(40)}\nb: &b {'[' * 30}*a{']' * 30}\nwebhooks: [*b]\n",
            "invalid YAML: nested more than 64 levels deep (through aliases)",
        ),
        (
            f"a: {'[' * 30}&a {deep(40)}{']' * 30}\nwebhooks: []\n",
            "invalid YAML: nested more than 64 levels deep",
        ),
        ("&a [*a]\n", "invalid YAML: recursive alias"),
        ("retry: &r {attempts: *r}\nwebhooks: []\n", "invalid YAML: recursive alias"),
        ("a: &a\n  b: *a\nwebhooks: *a\n", "invalid YAML: recursive alias"),
        ("a: &a {<<: *a}\nwebhooks: []\n", "invalid YAML: recursive alias"),
    ],
)
def test_deep_and_recursive_documents_are_refused(tmp_path: Path, text: str, message: str) -> None:
    started = time.perf_counter()
    assert message in only_problem(write(tmp_path, text))
    assert time.perf_counter() - started < 10.0  # a guard against blow-ups, not a speed target


def laughs(kind: str, levels: int = 9, width: int = 10) -> str:
    """A billion-laughs document: each anchor refers to the previous one ``width`` times."""
    if kind == "list":
        lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
        lines += [
            f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * width) + "]" for n in range(1, levels)
        ]
    else:  # merge keys: each mapping merges the previous one width times
        lines = ["a0: &a0 {lol: 1}"]
        lines += [
            f"a{n}: &a{n} {{<<: [" + ", ".join([f"*a{n - 1}"] * width) + "]}"
            for n in range(1, levels)
        ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("kind", ["list", "merge"])
@pytest.mark.parametrize(
    "use",
    [
        "webhooks: *a{top}\n",
        "webhooks: []\nretry: {{attempts: *a{top}}}\n",
        "webhooks: []\nkafka: {{properties: *a{top}}}\n",
        "webhooks: [{{<<: *a{top}, id: x}}]\n",
    ],
)
def test_alias_bombs_are_refused_at_once(tmp_path: Path, kind: str, use: str) -> None:
    path = write(tmp_path, laughs(kind) + use.format(top=8))
    started = time.perf_counter()
    assert "invalid YAML: aliases would expand the document by more than 100000 nodes" in (
        only_problem(path)
    )
    assert time.perf_counter() - started < 10.0  # a guard against blow-ups, not a speed target


def test_modest_sharing_through_aliases_is_fine(tmp_path: Path) -> None:
    text = "webhooks:\n  - &hook {id: hook-0, account: acct, url: 'https://x.example/h', "
    text += "events: [transaction.failed], secret: s}\n"
    text += "".join(f"  - {{<<: *hook, id: hook-{n}}}\n" for n in range(1, 2000))
    started = time.perf_counter()
    config = load_config(write(tmp_path, text), {})
    assert [hook.id for hook in config.webhooks] == [f"hook-{n}" for n in range(2000)]
    assert {hook.url for hook in config.webhooks} == {"https://x.example/h"}
    assert time.perf_counter() - started < 20.0  # a guard against blow-ups, not a speed target


def too_many(limit: int) -> str:
    return (
        f"invalid YAML: more than {limit:,} nodes (keys, values and list items) in the "
        "configuration; is it the configuration file?"
    )


@pytest.mark.parametrize("ending", ["\n", ""], ids=["line-break-at-the-end", "none"])
def test_a_configuration_of_as_many_nodes_as_the_limit_loads_and_one_more_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """The file limit bounds bytes, the node limit what they compose to. Without a line break at
    the end the pure-Python composer reads the file, libyaml present or not."""
    text = webhook_yaml(events="&events [transaction.success]") + "logging: {level: *events}\n"
    text = text[:-1] + ending
    nodes = yaml_nodes(text)  # (the alias adds none)
    monkeypatch.setattr(loader, "MAX_NODES", nodes)
    (problem,) = problems_of(write(tmp_path, text))
    assert "logging" in problem  # composed whole: the level is a list, not a string
    monkeypatch.setattr(loader, "MAX_NODES", nodes - 1)
    assert only_problem(write(tmp_path, text)) == too_many(nodes - 1)


@pytest.mark.parametrize("ending", ["\n", ""], ids=["line-break-at-the-end", "none"])
@pytest.mark.parametrize("items", ["a, ", "{}, ", "[a], "])
def test_a_flow_list_past_the_node_limit_is_refused_at_its_line_without_composing_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str, items: str
) -> None:
    """One-character items make a node for every two bytes (an 8 MiB list took the loader to
    1.3 GB, 32 MiB to 5 GB): the composer stops where the limit is passed."""
    monkeypatch.setattr(loader, "MAX_NODES", 1000)
    head = webhook_yaml() + "retry:\n  attempts: 5\n"
    text = head + "logging:\n  level: [" + items * 100_000 + "a]" + ending
    started = time.process_time()
    path = write(tmp_path, text)
    assert problems_of(path) == [f"{path}:10: {too_many(1000)}"]
    assert time.process_time() - started < 5.0  # a guard against composing it all, not a target


def test_an_unexpected_exception_names_only_its_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bridge.config.loader

    def explode(*_args: object) -> None:
        raise ValueError(f"invalid literal for int() with base 10: '{PLANTED}'")

    monkeypatch.setattr(bridge.config.loader._Loader, "load", explode)
    path = write(tmp_path, webhook_yaml())
    assert problems_of(path) == [
        f"{path}: internal error while reading the configuration (ValueError); please report it"
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert PLANTED not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_secret_echoed_through_an_alias_is_masked(tmp_path: Path) -> None:
    text = webhook_yaml(secret=f"&s {PLANTED}", signature="*s")
    assert only_problem(write(tmp_path, text)) == (
        f"{SHOP} 'signature': unknown value '***' (expected hmac-sha256, secret)"
    )
    text = f"kafka: {{properties: {{ssl.key.password: &p {PLANTED}}}}}\n"
    text += "logging: {level: *p}\nwebhooks: []\n"
    assert "unknown value '***'" in only_problem(write(tmp_path, text))


@pytest.mark.parametrize(
    ("section", "where"),
    [
        (f"kafka: {{bootstrap_servers: {PLANTED}}}", "field 'kafka.bootstrap_servers'"),
        (f"kafka: {{group_id: {PLANTED}}}", "field 'kafka.group_id'"),
        (f"kafka: {{client_id: x{PLANTED}x}}", "field 'kafka.client_id'"),
        (f"kafka: {{properties: {{ssl.ca.location: {PLANTED}}}}}", "'kafka.properties.ssl.ca"),
        (f"topics: {{source: {PLANTED}}}", "field 'topics.source'"),
        (f"metrics: {{host: {PLANTED}}}", "field 'metrics.host'"),
        (
            f"schemas: {{registry_username: {PLANTED}, registry_password: pw}}",
            "field 'schemas.registry_username'",
        ),
    ],
)
def test_a_field_that_is_shown_never_holds_a_secrets_value(
    tmp_path: Path, section: str, where: str
) -> None:
    """Whatever is not a secret may be shown (logs, metrics, messages, the repr): a field holding
    a secret's value (or a part of it) is refused, in every section, not only a webhook's id."""
    text = f"{section}\n" + webhook_yaml(secret=PLANTED)
    problem = only_problem(write(tmp_path, text))
    assert where in problem and problem.endswith(SHOWN_SECRET)


def test_a_webhook_url_holding_a_secret_is_refused(tmp_path: Path) -> None:
    text = webhook_yaml(secret=PLANTED, url=f"https://shop.example.com/hooks/{PLANTED}")
    assert only_problem(write(tmp_path, text)) == f"{SHOP} 'url': {SHOWN_SECRET}"


HOST_SECRET = "zq9xwlmn8pkdr4tyvb2c"


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(char) + 0xFEE0) for char in text)


@pytest.mark.parametrize(
    ("host", "secret"),
    [
        (HOST_SECRET.upper(), HOST_SECRET),  # lowercased when shown
        (_fullwidth(HOST_SECRET), HOST_SECRET),  # mapped to ASCII (UTS-46)
        (_fullwidth(HOST_SECRET.upper()), HOST_SECRET),
        (f"{HOST_SECRET[:10]}\uff0e{HOST_SECRET[10:]}", f"{HOST_SECRET[:10]}.{HOST_SECRET[10:]}"),
        (
            f"{HOST_SECRET[:10]}\u3002{HOST_SECRET[10:].upper()}",
            f"{HOST_SECRET[:10]}.{HOST_SECRET[10:]}",
        ),
    ],
)
def test_a_webhook_url_whose_host_shown_holds_a_secret_is_refused(
    tmp_path: Path, host: str, secret: str
) -> None:
    """``bridge check`` shows a URL's host lowercased and mapped: what it shows is checked, not
    only the URL as written (once: one problem for the field)."""
    text = webhook_yaml(secret=f'"{secret}"', url=f'"https://{host}.example.com/h"')
    assert only_problem(write(tmp_path, text)) == f"{SHOP} 'url': {SHOWN_SECRET}"


SHOWN_PART = 16  # what the loader's messages say: "16 characters of one in a row"


@pytest.mark.parametrize(
    ("secret", "field", "value"),
    [
        # found by the grammar fuzz test: the account held a URL whose password was the end of
        # the webhook's secret, and the configuration's repr showed it
        ("S" * 32 + PLANTED, "account", f"https://alice:{PLANTED}@x.example/"),
        (f"prefix-{PLANTED}", "account", PLANTED),  # the secret's prefix left out
        (f"{PLANTED}-and-its-tail", "id", PLANTED),  # cut short
        (PLANTED, "url", f"https://shop.example.com/{PLANTED[3 : 3 + SHOWN_PART]}/x"),
        (PLANTED, "account", f"acct-{PLANTED[-SHOWN_PART:]}"),
    ],
)
def test_a_shown_field_holding_16_characters_of_a_secret_in_a_row_is_refused(
    tmp_path: Path, secret: str, field: str, value: str
) -> None:
    """A part of a secret shown in a log gives that much of it away: 16 characters of one in a
    row count as the secret, wherever they stand in it and in the field."""
    text = webhook_yaml(secret=f"'{secret}'", **{field: f"'{value}'"})
    problem = only_problem(write(tmp_path, text))
    assert f"field '{field}': {SHOWN_SECRET}" in problem, problem


def test_a_shown_field_holding_15_characters_of_a_secret_in_a_row_is_kept(tmp_path: Path) -> None:
    """One character short of the part that counts: the field is the account holder's to
    choose (a secret may well share a word with it)."""
    part = PLANTED[: SHOWN_PART - 1]
    text = webhook_yaml(secret=f"'{PLANTED}'", account=f"'acct-{part}'")
    assert load_config(write(tmp_path, text)).webhooks[0].account == f"acct-{part}"


def test_a_secret_made_from_the_webhooks_id_is_refused_naming_the_webhook_by_place(
    tmp_path: Path,
) -> None:
    """A secret holding 16 characters of a shown value in a row is half given away by it: the
    problem says so on the shown field, and names the webhook by its place in the list (its id
    would be masked in the message)."""
    hook_id = "payments-production-eu"
    second = webhook_yaml(id=hook_id, secret=f"'whsec-{hook_id}-7'").removeprefix("webhooks:\n")
    path = write(tmp_path, webhook_yaml() + second)
    assert problems_of(path) == [f"{path}:7: webhook #2: field 'id': {SHOWN_SECRET}"]


def test_a_long_secret_counts_by_a_32nd_of_it_and_8(tmp_path: Path) -> None:
    """A secret of more than 256 characters (a key in a file, say) is indexed by 32 stretches
    of its length: a 32nd of it and 8 characters more in a row count as it, 16 do not."""
    secret = "".join(f"{n:04x}" for n in range(200))  # 800 characters, all runs distinct
    need = len(secret) // 32 + 8
    shown = secret[400 : 400 + need]
    text = webhook_yaml(secret=f"'{secret}'", account=f"'acct-{shown}'")
    assert only_problem(write(tmp_path, text)) == f"{SHOP} 'account': {SHOWN_SECRET}"
    text = webhook_yaml(secret=f"'{secret}'", account=f"'acct-{shown[:-1]}'")
    assert load_config(write(tmp_path, text)).webhooks[0].account == f"acct-{shown[:-1]}"


def test_a_message_masks_16_characters_of_a_secret_in_a_row(tmp_path: Path) -> None:
    """What a shown field may not hold, no message shows: an unknown key named by a part of
    the secret is masked in the message that names it."""
    part = PLANTED[2 : 2 + SHOWN_PART]
    text = webhook_yaml(secret=f"'{PLANTED}'").replace("secret:", f"{part}: 1\n    secret:", 1)
    problem = only_problem(write(tmp_path, text))
    assert part not in problem and "***" in problem, problem


@pytest.mark.parametrize("joint", ["  ", "=", " = "])
def test_a_secret_keys_value_in_the_key_itself_is_masked(tmp_path: Path, joint: str) -> None:
    """Found by the loader's fuzz test (a flipped colon in a flow mapping): the key and its value
    make one key, shown as an unknown key's name; the value is masked there."""
    text = f"schemas: {{registry_password{joint}{PLANTED}}}\n" + webhook_yaml()
    problem = only_problem(write(tmp_path, text))
    assert "unknown key" in problem and PLANTED not in problem, problem


@pytest.mark.parametrize("joint", ["\t", " \t", "=\t", "\t="])
def test_a_tab_between_a_secret_key_and_its_value_shows_neither(tmp_path: Path, joint: str) -> None:
    """A tab there is not YAML: the message names the character, not the text around it."""
    text = f"schemas: {{registry_password{joint}{PLANTED}}}\n" + webhook_yaml()
    problem = only_problem(write(tmp_path, text))
    assert "invalid YAML" in problem and "'\\t'" in problem, problem
    assert PLANTED[:SHOWN_PART] not in problem and PLANTED[-SHOWN_PART:] not in problem, problem


def test_an_environment_reference_is_not_a_secret_to_mask(tmp_path: Path) -> None:
    """``${NAME}`` names a variable: a message may say which one is unset (its value, when it
    is set, is the secret)."""
    text = webhook_yaml(secret="${SHOP_MAIN_WEBHOOK_SECRET}")
    assert only_problem(write(tmp_path, text), {}) == (
        f"{SHOP} 'secret': environment variable SHOP_MAIN_WEBHOOK_SECRET is not set or empty"
    )


def test_shown_fields_are_judged_one_by_one_not_joined(tmp_path: Path) -> None:
    """The shown fields are asked together first (one call per webhook): a secret made of the
    end of one field and the start of the next, across the joint, is in neither of them."""
    joint = '"shop-main\\0acct_123"'  # the id, a NUL (what joins them), the account
    assert load_config(write(tmp_path, webhook_yaml(secret=joint))).webhooks[0].id == "shop-main"
    planted = webhook_yaml(secret=joint, account=f"acct_{PLANTED}")
    text = planted.replace("secret:", f"previous_secret: {PLANTED}\n    secret:")
    assert only_problem(write(tmp_path, text)) == f"{SHOP} 'account': {SHOWN_SECRET}"


def test_at_most_1000_problems_are_listed(tmp_path: Path) -> None:
    text = "retry:\n" + "".join(f"  unknown{n}: 1\n" for n in range(1500)) + "webhooks: []\n"
    problems = problems_of(write(tmp_path, text))
    assert len(problems) == 1001
    assert problems[-1] == f"{tmp_path / 'bridge.yaml'}: ... and 500 more problem(s)"


def test_only_the_problems_listed_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tens of thousands of unknown keys: a suggestion is looked for only for the 1000 listed."""
    suggestions: list[str] = []
    real = difflib.get_close_matches

    def counted(word: str, possibilities: list[str], n: int) -> list[str]:
        suggestions.append(word)
        return real(word, possibilities, n=n)

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    hooks = "".join(
        f"  - {{id: w{n}, {', '.join(f'k{n}_{k}: 1' for k in range(10))}}}\n" for n in range(3000)
    )
    problems = problems_of(write(tmp_path, "webhooks:\n" + hooks))
    assert len(problems) == 1001 and 0 < len(suggestions) <= 1000
    assert problems[-1].endswith(" more problem(s)")


def test_a_problem_is_never_longer_than_the_limit_whatever_it_echoes(tmp_path: Path) -> None:
    host = "a!" * 4000  # 8,000 characters, anchored once and aliased into every webhook
    text = f'u: &u "https://{host}.com/"\nwebhooks:\n' + "".join(
        f"  - {{id: w{n}, account: a, url: *u, events: [transaction.success], secret: s}}\n"
        for n in range(1500)
    )
    path = write(tmp_path, text)
    problems = problems_of(path)
    assert len(problems) == 1001
    assert max(len(problem) for problem in problems) < len(str(path)) + 200
    reader = loader._Loader("bridge.yaml", {})
    reader.report(1, "x" * 10 * loader.PROBLEM_LIMIT)
    (problem,) = reader.problems
    assert len(problem) == len("bridge.yaml:1: ") + loader.PROBLEM_LIMIT


# ---- URLs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://[::1/x", "not a valid URL (malformed IPv6 address in the host)"),
        ("http://[::1", "not a valid URL (malformed IPv6 address in the host)"),
        ("http://[not-ipv6]/", "not a valid URL (malformed IPv6 address in the host)"),
        ("http://[::1]x/", "an IPv6 address in brackets may only be followed by ':port'"),
        ("http://[fe80::1%25eth0]/", "an IPv6 zone id (%...) is not allowed"),
        ("http://[::ffff:10.0.0.1]/", "a private address"),
        ("http://[::ffff:a00:1]/", "a private address"),
        ("https://a..example.com/hook", "host 'a..example.com' has an empty label"),
        ("https://.example.com/", "has an empty label"),
        ("https://" + "a" * 64 + ".example/", "has a label longer than 63 characters"),
        ("https://" + ".".join(["a" * 63] * 4) + "/", "host name longer than 253 characters"),
        ("https://-lead.example/", "has an invalid label '-lead'"),
        ("https://bad!.example/", "has an invalid label"),
        ("https://xn--a.example/", "is not a valid internationalised name"),
        ("https://☃.example/", "is not a valid internationalised name"),
        ("https://exa\u200dmple.com/", "is not a valid internationalised name"),
        ("https://127.1/", "host '127.1' ends in a number"),
        ("https://0x7f.1/", "ends in a number"),
        ("https://x.example:0/", "port 0 is not a destination"),
        ("https://x.example:65536/", "the port is not a number from 1 to 65535"),
        ("https://x.example:http/", "the port is not a number from 1 to 65535"),
        ("https://x.example/#top", "must not contain a fragment"),
        ("https://x.example/a b", "contains whitespace at position"),
        ("https://x.example/\u0085", "contains whitespace at position 18"),
        ("ftp://x.example/", "must be an absolute http:// or https:// URL"),
        ("https:///path", "must have a host"),
        ("//x.example/", "must be an absolute http:// or https:// URL"),
        ("https://" + "x" * 9000, "longer than 8192 characters"),
    ],
)
def test_invalid_webhook_urls(tmp_path: Path, url: str, message: str) -> None:
    problem = only_problem(write(tmp_path, webhook_yaml(url=f"'{url}'")))
    assert problem.startswith(f"{SHOP} 'url': "), problem
    assert message in problem, problem


@pytest.mark.parametrize(
    "url",
    [
        "https://faß.de/hook",
        "https://ÉCOLE.example/hook",
        "https://example.com./hook",
        "https://under_score.example/hook",
        "https://[2606:4700:4700::1111]:8443/hook?x=1",
        "https://1.1.1.1/hook",
        "http://shop.example.com:8080/a/b?c=d&e=f",
    ],
)
def test_valid_webhook_urls(tmp_path: Path, url: str) -> None:
    config = load_config(write(tmp_path, webhook_yaml(url=f"'{url}'")), {})
    assert config.webhooks[0].url == url


@pytest.mark.parametrize(
    "url",
    [
        f"https://alice:{PLANTED}@shop.example/hook",
        f"https://{PLANTED}@shop.example/hook",
        f"https://alice:{PLANTED}@shop.example:99999/hook",
        f"https://alice:{PLANTED}@[::1/x",
        f"https://alice:{PLANTED}\uff20shop.example/hook",  # a fullwidth @ (NFKC: @)
        f"https://alice:{PLANTED}@a..example/hook",
        f"http://:{PLANTED}@10.0.0.1/",
    ],
)
def test_userinfo_is_refused_without_being_echoed(tmp_path: Path, url: str) -> None:
    problem = only_problem(write(tmp_path, webhook_yaml(url=f"'{url}'")))
    assert problem.startswith(
        f"{SHOP} 'url': must not contain userinfo (user:password before the host)"
    )
    assert "alice" not in problem
    text = f"schemas: {{mode: registry, registry_url: '{url}'}}\nwebhooks: []\n"
    problem = only_problem(write(tmp_path, text))
    assert problem.startswith("field 'schemas.registry_url': must not contain userinfo")
    assert "schemas.registry_username and schemas.registry_password" in problem
    assert "alice" not in problem


@pytest.mark.parametrize(
    "url",
    [
        f"https://alice:{PLANTED}@shop.example/hook",
        f"https://{PLANTED}@shop.example",
        f"https:///alice:{PLANTED}@shop.example//x",
        f"https://alice:{PLANTED}\uff20shop.example/",
    ],
)
def test_a_url_in_a_path_field_is_shown_without_its_userinfo(tmp_path: Path, url: str) -> None:
    """A path field shows its value as a Path, which writes "https://" as "https:/": the
    message still names the path, with the userinfo masked."""
    text = f"schemas: {{directory: '{url}'}}\nwebhooks: []\n"
    problem = only_problem(write(tmp_path, text))
    assert problem.startswith("field 'schemas.directory': 'https:/***")
    assert "alice" not in problem
    text = f"delivery: {{tls_ca_file: '{url}'}}\nwebhooks: []\n"
    assert "alice" not in only_problem(write(tmp_path, text))


@pytest.mark.parametrize("slashes", ["/", "//", "///"])
@pytest.mark.parametrize("user", ["", "alice:", ":", "a%40b:"])
@pytest.mark.parametrize("at", ["@", "\uff20", "\ufe6b"])
def test_userinfo_is_masked_after_any_number_of_slashes(slashes: str, user: str, at: str) -> None:
    for scheme in ("https", "http", "ftp", "x-y.z+1"):
        text = f"see '{scheme}:{slashes}{user}{PLANTED}{at}host.example/p@q', then more"
        masked = loader._mask_userinfo(text)
        assert PLANTED not in masked and "alice" not in masked
        assert masked.startswith(f"see '{scheme}:{slashes}***")
        assert masked.endswith("host.example/***@q', then more")  # (any text before an @)


@pytest.mark.parametrize(
    "written",
    ["https //alice:{p}@h/", "https;//alice:{p}@h/", "alice:{p}@h", "{p}\ufe6bh", "x=({p}@h)"],
)
def test_whatever_stands_before_an_at_sign_is_masked(written: str) -> None:
    """A URL whose scheme was mistyped still ends its userinfo with an @ (or a character NFKC
    makes one): the text before it is masked, URL or not."""
    masked = loader._mask_userinfo(f"key '{written.format(p=PLANTED)}' is unknown")
    assert PLANTED not in masked and "alice" not in masked and "***" in masked
    assert masked.startswith("key '") and masked.endswith("' is unknown")


def test_the_at_signs_masked_are_every_character_nfkc_makes_one() -> None:
    nfkc_at = {c for c in map(chr, range(0x110000)) if "@" in unicodedata.normalize("NFKC", c)}
    assert nfkc_at == set(loader._AT_SIGNS)


@pytest.mark.parametrize("end", [" host.example/", "' and more", "", "\tx"])
def test_a_userinfo_that_lost_its_at_sign_is_masked(end: str) -> None:
    """Without an @ the colon is taken for a port only when digits follow it: a userinfo whose
    @ was mistyped (or cut away with the rest of a message) is masked whole."""
    masked = loader._mask_userinfo(f"field 'https://alice:{PLANTED}{end}")
    assert masked == f"field 'https://***{end}"
    for shown in ("https://x.example:8443/a", "https://[::1]:80/", "https://x.example:/"):
        assert loader._mask_userinfo(f"'{shown}'") == f"'{shown}'"


def test_literal_ip_destinations_are_checked_after_parsing(tmp_path: Path) -> None:
    for url, refused in (
        ("http://169.254.169.254/latest", "is a cloud metadata address"),
        ("http://[::1]:8080/", "::1 is a loopback address"),
        ("http://[0:0:0:0:0:0:0:1]/", "::1 is a loopback address"),
        ("http://0.0.0.0/", "unspecified address"),
        # other full stops: the address they map to (UTS-46), judged as such
        ("http://169\uff0e254\uff0e169\uff0e254/latest", "169.254.169.254 is a cloud metadata"),
        ("http://127\u30020\uff610\uff0e1:8080/", "127.0.0.1 is a loopback address"),
    ):
        problem = only_problem(write(tmp_path, webhook_yaml(url=f"'{url}'")))
        assert refused in problem, problem
    allowed = "delivery: {allow_private_networks: true}\n" + webhook_yaml(url="'http://[::1]:80/'")
    assert load_config(write(tmp_path, allowed), {}).webhooks[0].url == "http://[::1]:80/"


def test_registry_credentials(tmp_path: Path) -> None:
    (tmp_path / "registry-password").write_text(f"{PLANTED}\n")
    base = "schemas:\n  mode: registry\n  registry_url: 'https://registry.example:8081/api'\n"
    text = base + "  registry_username: bridge\n"
    text += f"  registry_password_file: {tmp_path / 'registry-password'}\nwebhooks: []\n"
    config = load_config(write(tmp_path, text), {})
    assert config.schemas.registry_username == "bridge"
    assert config.schemas.registry_password == Secret(PLANTED.encode())
    assert (tmp_path / "registry-password") in [source for source, _ in config.sources]
    assert PLANTED not in repr(config)

    text = base + "  registry_username: bridge\n  registry_password: '${REGISTRY_PASSWORD}'\n"
    config = load_config(write(tmp_path, text + "webhooks: []\n"), {"REGISTRY_PASSWORD": "pw"})
    assert config.schemas.registry_password == Secret(b"pw")

    text = base + f"  registry_password: '{PLANTED}'\nwebhooks: []\n"
    assert only_problem(write(tmp_path, text)) == (
        "field 'schemas.registry_username': required with registry_password "
        "(HTTP basic authentication needs both)"
    )
    text = base + "  registry_username: 'a:b'\n  registry_password: x\nwebhooks: []\n"
    assert "must not contain ':'" in only_problem(write(tmp_path, text))
    text = base.replace("'https://registry.example:8081/api'", "'https://reg..example/'")
    assert only_problem(write(tmp_path, text + "webhooks: []\n")) == (
        "field 'schemas.registry_url': host 'reg..example' has an empty label"
    )


# ---- signature: secret -----------------------------------------------------------------------

LONG = "S" * 32  # the shortest secret that may be sent as is
STANDARD_KEY = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def secret_mode(**fields: str | None) -> str:
    values: dict[str, str | None] = {
        "url": "https://shop.example.com/hooks",
        "signature": "secret",
        "secret": LONG,
        "standard_webhooks_secret": STANDARD_KEY,
        **fields,
    }
    return webhook_yaml(**values)


def test_secret_mode_with_https_a_long_secret_and_its_own_standard_key(tmp_path: Path) -> None:
    (hook,) = load_config(write(tmp_path, secret_mode()), {}).webhooks
    assert hook.signature == "secret"
    assert hook.secret.reveal() == LONG.encode()
    assert hook.standard_webhooks_secret == Secret(STANDARD_KEY.encode())
    assert hook.previous_standard_webhooks_secret is None
    assert STANDARD_KEY not in repr(hook)


def test_secret_mode_standard_key_forms_and_rotation(tmp_path: Path) -> None:
    (tmp_path / "standard").write_text("from-a-file\n")
    text = secret_mode(
        standard_webhooks_secret=None,
        standard_webhooks_secret_file=str(tmp_path / "standard"),
        previous_standard_webhooks_secret="'${OLD_STANDARD}'",
    )
    config = load_config(write(tmp_path, text), {"OLD_STANDARD": "old-standard"})
    (hook,) = config.webhooks
    assert hook.standard_webhooks_secret == Secret(b"from-a-file")
    assert hook.previous_standard_webhooks_secret == Secret(b"old-standard")
    assert (tmp_path / "standard") in [source for source, _ in config.sources]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            {"url": "http://shop.example.com/hooks"},
            f"{SHOP} 'url': must be https:// with signature 'secret' (the secret itself is sent "
            "in the x-service-secret header)",
        ),
        (
            {"url": "'http://[2606:4700:4700::1111]/'"},
            f"{SHOP} 'url': must be https:// with signature 'secret'",
        ),
        (
            {"secret": "S" * 31},
            f"{SHOP} 'secret': with signature 'secret' it is sent as a header, so at least 32 "
            "characters",
        ),
        ({"secret": "'" + "S" * 31 + " '"}, f"{SHOP} 'secret': with signature 'secret' it is"),
        ({"secret": "'" + "é" * 32 + "'"}, f"{SHOP} 'secret': with signature 'secret' it is sent"),
        (
            {"standard_webhooks_secret": None},
            f"{SHOP} 'standard_webhooks_secret': required with signature 'secret': "
            "x-service-secret carries the secret itself, so anyone who sees the header could "
            "forge a webhook-signature keyed with it",
        ),
        ({"standard_webhooks_secret": LONG}, f"{SHOP} 'standard_webhooks_secret': must differ"),
        (
            {"standard_webhooks_secret": "whsec_" + base64.b64encode(LONG.encode()).decode()},
            f"{SHOP} 'standard_webhooks_secret': must differ from 'secret' and 'previous_secret'",
        ),
        (
            {"previous_secret": "old-raw-secret"},
            f"{SHOP} 'previous_secret': has no effect with signature 'secret'",
        ),
        (
            {"previous_standard_webhooks_secret": LONG},
            f"{SHOP} 'previous_standard_webhooks_secret': must differ from 'secret'",
        ),
        (
            {"standard_webhooks_secret": "whsec_%%%"},
            f"{SHOP} 'standard_webhooks_secret': the part after 'whsec_' is not valid base64",
        ),
        (
            {"standard_webhooks_secret": "x", "standard_webhooks_secret_file": "/x"},
            f"{SHOP} 'standard_webhooks_secret': set 'standard_webhooks_secret' or "
            "'standard_webhooks_secret_file', not both",
        ),
    ],
)
def test_secret_mode_problems(tmp_path: Path, fields: dict[str, str | None], problem: str) -> None:
    assert only_problem(write(tmp_path, secret_mode(**fields))).startswith(problem)


def test_secret_mode_length_boundary(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, secret_mode(secret="S" * 32)), {}).webhooks
    assert load_config(write(tmp_path, secret_mode(secret="'" + "~!" * 16 + "'")), {}).webhooks
    with pytest.raises(ConfigError, match="at least 32 characters"):
        load_config(write(tmp_path, secret_mode(secret="S" * 31)), {})
    # The length applies to the secret sent as is only, not to the default HMAC scheme.
    assert load_config(write(tmp_path, webhook_yaml(secret="s")), {}).webhooks


def test_hmac_scheme_may_have_its_own_standard_webhooks_key(tmp_path: Path) -> None:
    text = webhook_yaml(url="'http://[2606:4700:4700::1111]/'", standard_webhooks_secret="k2")
    (hook,) = load_config(write(tmp_path, text), {}).webhooks
    assert (hook.signature, hook.standard_webhooks_secret) == ("hmac-sha256", Secret(b"k2"))
    text = webhook_yaml(standard_webhooks_secret="inline-secret")
    assert only_problem(write(tmp_path, text)).startswith(
        f"{SHOP} 'standard_webhooks_secret': must differ from 'secret'"
    )
    text = webhook_yaml(standard_webhooks_secret="k2", previous_secret="old")
    assert only_problem(write(tmp_path, text)).startswith(
        f"{SHOP} 'previous_secret': has no effect with standard_webhooks_secret"
    )
    text = webhook_yaml(previous_standard_webhooks_secret="k2")
    assert only_problem(write(tmp_path, text)) == (
        f"{SHOP} 'previous_standard_webhooks_secret': only with 'standard_webhooks_secret'"
    )
    # With the default scheme and no standard key, the secret keeps keying webhook-signature.
    (hook,) = load_config(write(tmp_path, webhook_yaml(previous_secret="old")), {}).webhooks
    assert hook.standard_webhooks_secret is None and hook.previous_secret == Secret(b"old")


def test_secret_mode_secrets_never_appear_in_errors(tmp_path: Path) -> None:
    text = secret_mode(
        url="http://shop.example.com/",
        secret=f"'{PLANTED} with spaces'",
        standard_webhooks_secret=None,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), {})
    assert len(caught.value.problems) == 3
    assert PLANTED not in str(caught.value)


# ---- Kafka credentials -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "credential"),
    [
        ("ssl.key.password", True),
        ("ssl.keystore.password", True),
        ("ssl.key.pem", True),
        ("ssl_key", True),
        ("sasl.jaas.config", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.oauthbearer.config", True),
        ("sasl.oauthbearer.assertion.private.key.pem", True),
        ("sasl.oauthbearer.assertion.private.key.passphrase", True),
        ("SSL.KEY.PASSWORD", True),
        ("ssl.key.location", False),
        ("ssl.keystore.location", False),
        ("ssl.certificate.pem", False),
        ("ssl.ca.pem", False),
        ("ssl.ca.location", False),
        ("sasl.kerberos.keytab", False),
        ("sasl.oauthbearer.client.id", False),
        ("linger.ms", False),
    ],
)
def test_which_kafka_properties_are_credentials(name: str, credential: bool) -> None:
    assert is_kafka_credential(name) is credential


def test_kafka_properties_from_the_environment_and_files(tmp_path: Path) -> None:
    (tmp_path / "key-password").write_text(f"{PLANTED}-file\n")
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n")
    text = f"""\
kafka:
  properties:
    ssl.key.password: {{file: {tmp_path / "key-password"}}}
    sasl.oauthbearer.client.secret: "${{OAUTH_SECRET}}"
    ssl.keystore.password: "{PLANTED}-inline"
    ssl.ca.pem: {{file: {tmp_path / "ca.pem"}}}
    sasl.oauthbearer.client.id: "${{OAUTH_ID}}"
    linger.ms: 5
    enable.idempotence: true
webhooks: []
"""
    environ = {"OAUTH_SECRET": f"{PLANTED}-env", "OAUTH_ID": "bridge-client"}
    config = load_config(write(tmp_path, text), environ)

    properties = config.kafka.properties
    assert properties["ssl.key.password"] == Secret(f"{PLANTED}-file".encode())
    assert properties["sasl.oauthbearer.client.secret"] == Secret(f"{PLANTED}-env".encode())
    assert properties["ssl.keystore.password"] == Secret(f"{PLANTED}-inline".encode())
    # read from a file or the environment: kept as a Secret even when not a credential
    assert properties["ssl.ca.pem"] == Secret(b"-----BEGIN CERTIFICATE-----\nMIIB")
    assert properties["sasl.oauthbearer.client.id"] == Secret(b"bridge-client")
    settings = config.kafka_settings()
    assert settings["ssl.ca.pem"] == "-----BEGIN CERTIFICATE-----\nMIIB"
    assert settings["sasl.oauthbearer.client.id"] == "bridge-client"
    assert settings["ssl.key.password"] == f"{PLANTED}-file"
    assert settings["sasl.oauthbearer.client.secret"] == f"{PLANTED}-env"
    assert settings["ssl.keystore.password"] == f"{PLANTED}-inline"
    assert (settings["linger.ms"], settings["enable.idempotence"]) == ("5", "true")
    for text in (repr(config), str(config), repr(config.kafka), repr(properties)):
        assert PLANTED not in text
    assert [source for source, _ in config.sources][1:] == [
        tmp_path / "key-password",
        tmp_path / "ca.pem",
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("ssl.key.password: '${UNSET}'", "environment variable UNSET is not set or empty"),
        ("ssl.key.password: '${EMPTY}'", "environment variable EMPTY is not set or empty"),
        ("linger.ms: '${UNSET}'", "environment variable UNSET is not set or empty"),
        (f"ssl.key.password: 'x-${{{PLANTED}}}'", "write ${NAME} alone"),
        ("ssl.key.password: 12345", "expected a string, got an integer (quote the value"),
        ("ssl.key.password: true", "expected a string, got a boolean"),
        ("ssl.key.password: ''", "must not be empty"),
        ("ssl.key.password: {file: /no/such/file}", "cannot read secret file /no/such/file"),
        ("ssl.ca.pem: {file: /no/such/file}", "cannot read file /no/such/file"),
        (f"ssl.key.password: {{path: {PLANTED}}}", "a mapping value must be {file: PATH}"),
        (f"ssl.key.password: [{PLANTED}]", "expected a string, got a list"),
        ("linger.ms: [5]", "expected a string, number, boolean"),
        ("linger.ms: null", "expected a string, number, boolean"),
        (f'ssl.key.password: "{PLANTED}\\0"', "must be text without NUL characters"),
        (f"ssl.key.password: !!int {PLANTED}", "cannot read the value as an integer (!!int)"),
    ],
)
def test_kafka_property_problems(tmp_path: Path, entry: str, message: str) -> None:
    text = f"kafka:\n  properties:\n    {entry}\nwebhooks: []\n"
    name = entry.split(":", 1)[0]
    problem = only_problem(write(tmp_path, text), {"EMPTY": ""})
    assert problem.startswith(f"field 'kafka.properties.{name}': {message}"), problem


def test_kafka_property_names_are_checked(tmp_path: Path) -> None:
    text = "kafka:\n  properties: {'bad name': 1, sasl.password: x, sasl.mechanisms: PLAIN}\n"
    problems = problems_of(write(tmp_path, text + "webhooks: []\n"))
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "field 'kafka.properties': 'bad name' is not a librdkafka property name",
        "field 'kafka.properties.sasl.password': set it with kafka.sasl_password instead",
        "field 'kafka.properties.sasl.mechanisms': set it with kafka.sasl_mechanism instead",
    ]


def test_kafka_credentials_are_masked_in_errors(tmp_path: Path) -> None:
    (tmp_path / "password").write_text(PLANTED)
    text = f"""\
kafka:
  properties:
    ssl.key.password: {{file: {tmp_path / "password"}}}
    sasl.jaas.config: &jaas "{PLANTED} required;"
    ssl.keystore.password: "${{KEYSTORE}}"
  client_id: *jaas
  group_id: ["{PLANTED}"]
retry: {{attempts: 0}}
webhooks: []
"""
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), {"KEYSTORE": PLANTED})
    # client_id holds a credential's value (through the alias), group_id is not text, and
    # retry.attempts is out of range
    assert len(caught.value.problems) == 3
    assert PLANTED not in str(caught.value)
    assert PLANTED not in repr(caught.value)


@pytest.mark.parametrize(
    ("delivery", "idle"),
    [
        ("", 2000),  # twice the default max_in_flight
        ("  max_in_flight: 300\n", 600),  # twice the one given
        ("  max_in_flight: 300\n  max_idle_connections: 7\n", 7),
        ("  max_idle_connections: 0\n", 0),  # none kept
    ],
)
def test_idle_connections_default_to_twice_the_in_flight_limit(
    tmp_path: Path, delivery: str, idle: int
) -> None:
    text = webhook_yaml()
    if delivery:
        text = text.replace("webhooks:", f"delivery:\n{delivery}webhooks:")
    assert load_config(write(tmp_path, text), {}).delivery.max_idle_connections == idle


def test_a_negative_idle_connection_bound_is_refused(tmp_path: Path) -> None:
    text = webhook_yaml().replace("webhooks:", "delivery:\n  max_idle_connections: -1\nwebhooks:")
    (problem,) = problems_of(write(tmp_path, text))
    assert "delivery.max_idle_connections" in problem and "0" in problem, problem


def test_receiver_tls_settings_default_from_delivery_and_override_per_webhook(
    tmp_path: Path,
) -> None:
    for name in ("ca.pem", "cert.pem", "key.pem", "other-ca.pem"):
        (tmp_path / name).write_text("pem")
    text = webhook_yaml(tls_ca_file=f"'{tmp_path / 'other-ca.pem'}'", tls_min_version="TLSv1.3")
    text = text.replace(
        "webhooks:",
        f"delivery:\n  tls_ca_file: '{tmp_path / 'ca.pem'}'\n"
        f"  tls_client_cert_file: '{tmp_path / 'cert.pem'}'\n"
        f"  tls_client_key_file: '{tmp_path / 'key.pem'}'\nwebhooks:",
    )
    config = load_config(write(tmp_path, text), {})
    (hook,) = config.webhooks
    assert config.delivery.tls.ca_file == str(tmp_path / "ca.pem")
    assert hook.tls.ca_file == str(tmp_path / "other-ca.pem")  # its own
    assert hook.tls.client_cert_file == str(tmp_path / "cert.pem")  # the default's
    assert hook.tls.min_version == "TLSv1.3"


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"tls_ca_file": "'/nonexistent/ca.pem'"}, "field 'tls_ca_file': cannot read"),
        ({"tls_client_cert_file": "'{ca}'"}, "tls_client_cert_file and tls_client_key_file go"),
        ({"tls_min_version": "TLSv1.1"}, "field 'tls_min_version': unknown value 'TLSv1.1'"),
    ],
)
def test_receiver_tls_problems_name_the_field(
    tmp_path: Path, fields: dict[str, str], problem: str
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    text = webhook_yaml(**{k: v.replace("{ca}", str(ca)) for k, v in fields.items()})
    assert any(problem in line for line in problems_of(write(tmp_path, text))), problem


# ---- many webhooks: what is remembered across webhooks changes no verdict ----------------------


def test_each_webhook_on_a_refused_address_is_named(tmp_path: Path) -> None:
    hooks = "".join(
        f"  - {{id: h{n}, account: a, url: '{url}', events: [transaction.failed], secret: s}}\n"
        for n, url in enumerate(
            (
                "http://10.0.0.1/a",
                "http://10.0.0.1/b",
                "https://10.0.0.1:8443/c",
                "http://169.254.169.254/d",
                "http://10.20.0.9/e",
                "http://10.20.0.9/f",
                "http://93.184.216.34/g",
            )
        )
    )
    text = "delivery: {allowed_networks: ['10.20.0.0/16']}\nwebhooks:\n" + hooks
    path = write(tmp_path, text)
    private = "10.0.0.1 is a private address (see delivery.allow_private_networks and allowed_"
    assert problems_of(path) == [
        f"{path}:3: webhook 'h0': field 'url': {private}networks)",
        f"{path}:4: webhook 'h1': field 'url': {private}networks)",
        f"{path}:5: webhook 'h2': field 'url': {private}networks)",
        f"{path}:6: webhook 'h3': field 'url': 169.254.169.254 is a cloud metadata address "
        "(see delivery.allow_private_networks and allowed_networks)",
    ]
    private_allowed = text.replace(
        "allowed_networks: ['10.20.0.0/16']", "allow_private_networks: true"
    )
    assert problems_of(write(tmp_path, private_allowed)) == [
        f"{path}:6: webhook 'h3': field 'url': 169.254.169.254 is a cloud metadata address "
        "(see delivery.allow_private_networks and allowed_networks)",
    ]


def test_each_webhook_with_a_refused_url_is_named(tmp_path: Path) -> None:
    bad = "https://a..example.com/hook"
    hooks = "".join(
        f"  - {{id: h{n}, account: a, url: '{bad}', events: [transaction.failed], secret: s}}\n"
        for n in range(3)
    )
    path = write(tmp_path, "webhooks:\n" + hooks)
    message = f"host {bad.split('/')[2]!r} has an empty label"
    assert problems_of(path) == [
        f"{path}:{n + 2}: webhook 'h{n}': field 'url': {message}" for n in range(3)
    ]


def test_a_large_file_loads_with_its_lines(tmp_path: Path) -> None:
    hooks = "".join(
        f"  - id: hook-{n}\n"
        f"    account: acct_{n % 7}\n"
        f"    url: https://h{n % 50}.example.com/hooks/{n}\n"
        "    events: [transaction.success]\n"
        "    secret: inline-secret\n"
        for n in range(2000)
    )
    config = load_config(write(tmp_path, "webhooks:\n" + hooks), {})
    assert [hook.id for hook in config.webhooks] == [f"hook-{n}" for n in range(2000)]
    duplicate = (
        hooks + "  - {id: hook-1999, account: a, url: 'https://x.example', events: "
        "[transaction.failed], secret: s}\n"
    )
    path = write(tmp_path, "webhooks:\n" + duplicate)
    assert problems_of(path) == [
        f"{path}:10002: webhook 'hook-1999': field 'id': duplicate webhook id "
        "(first defined on line 9997)"
    ]


def test_the_collector_is_left_as_it_was(tmp_path: Path) -> None:
    import gc

    good = write(tmp_path, "webhooks: []\n")
    bad = write(tmp_path, "webhooks: [\n", "bad.yaml")
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            load_config(good, {})
            assert gc.isenabled() is enabled
            with pytest.raises(ConfigError):
                load_config(bad, {})
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_libyaml_never_composes_deep_enough_to_crash(tmp_path: Path) -> None:
    # libyaml's composer recurses in C: 100,000 levels overflow the C stack (a crash, no error).
    for levels in (63, 64, 65, 200_000):
        problems = problems_of(write(tmp_path, f"webhooks: {deep(levels)}\n"))
        if levels < 64:  # (the webhooks list is level 2)
            assert "nested more than" not in problems[0]
        else:
            assert problems == [
                f"{tmp_path / 'bridge.yaml'}:1: invalid YAML: nested more than 64 levels deep"
            ]


@pytest.mark.parametrize(
    ("text", "composed"),
    [
        ("webhooks: []\n", True),
        ("webhooks: []", False),  # no line break at the end
        ("webhooks: []\t\n", False),
        ("webhooks: !!seq []\n", False),
        ("a: !x\nwebhooks: []\n", False),
        ("a: |\n  x\nwebhooks: []\n", False),
        ("a: >\n  x\nwebhooks: []\n", False),
        ("%YAML 1.1\n---\nwebhooks: []\n", False),
        ("a: x\n\ufeffwebhooks: []\n", False),
        ("a: pa!ss|wo>rd%\nwebhooks: []\n", True),
        ("a: &x 1\nb: *x\nwebhooks: []\n", True),
        ("webhooks: [\n", False),  # refused: the pure loader words the error
    ],
)
def test_what_libyaml_composes(yaml_loader: str, text: str, composed: bool) -> None:
    assert loader._compose_fast(text)[0] is (composed and yaml_loader == "libyaml")


@pytest.mark.parametrize("merged_first", [True, False])
def test_an_id_given_through_a_merge_key_is_checked_for_duplicates(
    tmp_path: Path, merged_first: bool
) -> None:
    """An id that comes from ``<<:`` is known only once the webhook is built; two webhooks with
    one id were accepted when one of them took it so."""
    explicit = (
        "  - id: w1\n    account: acct_1\n    url: https://one.example/x\n"
        "    events: [transaction.failed]\n    secret: secret-one-0123456789\n"
    )
    merged = (
        "  - <<: {id: w1}\n    account: acct_m\n    url: https://m.example/x\n"
        "    events: [transaction.failed]\n    secret: secret-m-0123456789\n"
    )
    hooks = merged + explicit if merged_first else explicit + merged
    path = write(tmp_path, "webhooks:\n" + hooks)
    assert problems_of(path) == [
        f"{path}:7: webhook 'w1': field 'id': duplicate webhook id (first defined on line 2)"
    ]


def test_a_webhook_url_holding_a_secret_read_with_a_trailing_newline_is_refused(
    tmp_path: Path,
) -> None:
    """The secret is remembered with its surrounding blanks and without them (the second is a
    part of the first): the url holding the stripped value is refused."""
    text = webhook_yaml(secret="${SHOP_SECRET}", url=f"https://shop.example.com/hooks/{PLANTED}")
    assert only_problem(write(tmp_path, text), {"SHOP_SECRET": f"{PLANTED}\n"}) == (
        f"{SHOP} 'url': {SHOWN_SECRET}"
    )


HELD = "Zq9XwLmN8pKdR4tYvB2c"  # a secret, 20 characters
HOOK = (
    '  - id: "{id}"\n    account: "{account}"\n    url: "{url}"\n'
    "    events: [transaction.success]\n"
)
SHOWN_PLACES = {  # where a value is shown: (document part, webhook fields, what the problem names)
    "webhook id": ("", {"id": HELD}, "webhook #{index}: field 'id'"),  # (its id masked)
    "webhook account": ("", {"account": f"acct-{HELD}"}, "webhook 'shown': field 'account'"),
    "webhook url": ("", {"url": f"https://x.example/{HELD}"}, "webhook 'shown': field 'url'"),
    "kafka.client_id": (f"kafka:\n  client_id: {HELD}\n", {}, "field 'kafka.client_id'"),
    "kafka.group_id": (f"kafka:\n  group_id: g-{HELD}\n", {}, "field 'kafka.group_id'"),
    "a property": (
        f"kafka:\n  properties:\n    client.rack: {HELD}\n",
        {},
        "field 'kafka.properties.client.rack'",
    ),
    "topics.source": (f"topics:\n  source: {HELD}\n", {}, "field 'topics.source'"),
    "KAFKA_GROUP_ID": ("", {}, "environment variable KAFKA_GROUP_ID"),
}
SECRET_SOURCES = {  # where the secret comes from: (document part, webhook secret, environment)
    "a webhook's secret, inline": ("", f'"{HELD}"', {}),
    "a webhook's secret, ${ENV}": ("", "${HELD}", {"HELD": HELD}),
    "a webhook's secret_file": ("", "FILE", {}),
    "KAFKA_SASL_PASSWORD": ("", None, {"KAFKA_SASL_PASSWORD": HELD}),
    "kafka.sasl_password, ${ENV}": ("kafka:\n  sasl_password: ${HELD}\n", None, {"HELD": HELD}),
    "kafka.sasl_password_file": ("kafka:\n  sasl_password_file: FILE\n", None, {}),
    "schemas.registry_password, ${ENV}": (
        "schemas:\n  registry_username: u\n  registry_password: ${HELD}\n",
        None,
        {"HELD": HELD},
    ),
    "schemas.registry_password_file": (
        "schemas:\n  registry_username: u\n  registry_password_file: FILE\n",
        None,
        {},
    ),
    "a credential property, ${ENV}": (
        "kafka:\n  properties:\n    ssl.key.password: ${HELD}\n",
        None,
        {"HELD": HELD},
    ),
    "a property, {file:}": ("kafka:\n  properties:\n    socket.x: {file: FILE}\n", None, {}),
}


def _merged_sections(*parts: str) -> str:
    """Document parts (``section:`` then indented lines) with a section given twice merged (a
    line given twice, such as ``properties:``, once)."""
    merged: dict[str, list[str]] = {}
    for part in parts:
        section = ""
        for line in part.splitlines():
            if not line.startswith(" "):
                section = line
                merged.setdefault(section, [])
            elif line not in merged[section]:
                merged[section].append(line)
    return "".join(
        f"{head}\n" + "".join(f"{line}\n" for line in body) for head, body in merged.items()
    )


@pytest.mark.parametrize("secret_first", [True, False], ids=["secret first", "shown first"])
@pytest.mark.parametrize("source", list(SECRET_SOURCES))
@pytest.mark.parametrize("place", list(SHOWN_PLACES))
def test_a_shown_value_holding_a_secret_is_refused_whatever_the_order(
    tmp_path: Path, place: str, source: str, secret_first: bool
) -> None:
    """Every shown value is checked once every secret of the file is known: a secret read from
    the environment or a file, a webhook's (before or after the one showing it) or Kafka's or
    the registry's (read after the webhooks), is found in every shown field, and the problem
    names the field as for a secret written inline before it."""
    secret_file = tmp_path / "held.secret"
    secret_file.write_text(HELD + "\n")
    shown_part, shown_fields, named = SHOWN_PLACES[place]
    source_part, hook_secret, environ = SECRET_SOURCES[source]
    environ = {**environ, **({"KAFKA_GROUP_ID": HELD} if place == "KAFKA_GROUP_ID" else {})}
    fields = {"id": "shown", "account": "acct", "url": "https://x.example/h", **shown_fields}
    shown_hook = HOOK.format(**fields) + '    secret: "another-secret-0123456789"\n'
    holder = HOOK.format(id="holder", account="acct", url="https://y.example/h")
    if hook_secret == "FILE":
        holder += f"    secret_file: {secret_file}\n"
    else:
        holder += f"    secret: {hook_secret or 'yet-another-secret-0123456789'}\n"
    hooks = [holder, shown_hook] if secret_first else [shown_hook, holder]
    sections = _merged_sections(shown_part, source_part.replace("FILE", str(secret_file)))
    webhooks = "webhooks:\n" + "".join(hooks)
    text = sections + webhooks if secret_first else webhooks + sections
    problems = problems_of(write(tmp_path, text), environ)
    named = named.format(index=2 if secret_first else 1)
    assert any(f"{named}: {SHOWN_SECRET}" in problem for problem in problems), problems
    shown = "\n".join(problems)
    assert not any(HELD[at : at + 16] in shown for at in range(len(HELD) - 15)), shown


@pytest.mark.parametrize(
    "host",
    [
        f"{HELD}!.example.com",  # an invalid label, echoed lowercased
        f"{HELD}.123",  # ends in a number
        f"{HELD.upper()}.example.com:99999",
        f"{HELD}-.example.com",
        f"x.{HELD}{HELD}{HELD}{HELD}.com",  # a label longer than 63 characters
    ],
)
def test_a_message_echoing_a_secret_in_another_case_masks_it(tmp_path: Path, host: str) -> None:
    """A URL's host is lowercased before a message echoes it: the secret in it is masked
    whatever the case of its letters, as it is where it is written as it was."""
    text = webhook_yaml(secret=f'"{HELD}"', url=f'"https://{host}/h"')
    shown = "\n".join(problems_of(write(tmp_path, text))).lower()
    assert not any(HELD[at : at + 16].lower() in shown for at in range(len(HELD) - 15)), shown
