"""Configuration loading: example files, defaults, environment overrides and every problem found."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from bridge.config import (
    Config,
    DeliveryConfig,
    KafkaConfig,
    Secret,
    TopicsConfig,
    Webhook,
    load_config,
)
from bridge.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


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
    assert (alerts.signature, alerts.timeout_seconds, alerts.concurrency) == ("secret", 5.0, 8)
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
        f"{path}:18: webhook 'shop-main': field 'url': must be an absolute http:// or "
        "https:// URL with a host",
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
        "1: field 'kafka.properties': set 'group.id' with kafka.group_id instead",
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
WEBHOOK_PROBLEMS = [
    ({"id": "'no spaces'"}, "webhook #1: field 'id': must be 1 to 64 characters among"),
    ({"url": "/relative"}, f"{SHOP} 'url': must be an absolute http:// or https:// URL"),
    ({"url": "'https://x.example:99999/'"}, f"{SHOP} 'url': invalid port"),
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
        {"secret": "'two words'", "signature": "secret"},
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
