"""The bridge against a broker that requires TLS and authentication (issue 20, first part).

One broker for the module (devtools.devkafka with BrokerSecurity): SASL_SSL requiring
SCRAM-SHA-512, SSL requiring a client certificate (mutual TLS), the StandardAuthorizer on (the
bridge's users get only the ACLs the bridge needs), certificates made here with trustme. The
tests' own admin, producer and reader use the broker's plaintext listener (a super user there);
the bridge is configured with the secured address only, its credentials in environment
variables and files.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import KafkaError
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from bridge.kafka.security import security_failure
from devtools.devkafka import Broker, BrokerSecurity
from devtools.samples import make_record
from tests.bridge_harness import REPO, BridgeProcess, BridgeSetup, secret_of, webhook
from tests.kafka_helpers import QUIET, committed_offsets, wait_for
from tests.receiver import Receiver, fail_first

pytestmark = pytest.mark.integration

SCRAM_USER = "bridge"
READER = "bridge-reader"  # granted Read only, never Write anywhere (other tests grant SCRAM_USER)
PASSWORD = "correct-horse-battery-staple"
CERT_USER = "bridge-mtls"  # the CN of the client certificate, its principal (User:bridge-mtls)
START_FAILURE_S = 30.0  # a refused start ends well within this (process start included)
CHECK_TIMEOUT_S = 20.0  # bridge check --timeout: a security failure is reported long before


@dataclass(frozen=True)
class Secured:
    """The secured broker's addresses and the files a client needs."""

    folder: Path
    tools: str  # plaintext listener: topics, ACLs, test records (super user)
    sasl_ssl: str
    ssl: str
    ca_file: Path
    untrusted_ca_file: Path  # a CA that did not sign the broker's certificate
    client_cert_file: Path
    client_key_file: Path
    password_file: Path
    wrong_password_file: Path


@pytest.fixture(autouse=True)
def _no_kafka_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bridge's KAFKA_* variables come from each test alone (an external cluster's
    KAFKA_BOOTSTRAP_SERVERS would send the bridge elsewhere)."""
    for name in [n for n in os.environ if n.startswith("KAFKA_")]:
        monkeypatch.delenv(name)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secured-kafka")
    ca, stranger = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost", common_name="kafka-broker")
    client = ca.issue_cert(f"{CERT_USER}.clients.test", common_name=CERT_USER)
    broker = Broker(
        folder / "broker",
        security=BrokerSecurity(
            key_pem=server.private_key_pem.bytes(),
            cert_chain_pem=b"".join(pem.bytes() for pem in server.cert_chain_pems),
            trusted_pem=ca.cert_pem.bytes(),
            scram_users={SCRAM_USER: PASSWORD, READER: PASSWORD},
        ),
    )
    tools = broker.start()
    try:
        yield Secured(
            folder=folder,
            tools=tools,
            sasl_ssl=broker.address("SASL_SSL"),
            ssl=broker.address("SSL"),
            ca_file=_write(folder / "ca.pem", ca.cert_pem.bytes()),
            untrusted_ca_file=_write(folder / "stranger-ca.pem", stranger.cert_pem.bytes()),
            client_cert_file=_write(folder / "client.pem", client.cert_chain_pems[0].bytes()),
            client_key_file=_write(folder / "client.key", client.private_key_pem.bytes()),
            password_file=_write(folder / "password", PASSWORD.encode() + b"\n"),
            wrong_password_file=_write(folder / "wrong-password", b"not-the-password\n"),
        )
    finally:
        broker.stop()


def scram_kafka(secured: Secured, **properties: Any) -> dict[str, Any]:
    """The kafka section for SASL_SSL with SCRAM-SHA-512 (the password comes separately)."""
    return {
        "bootstrap_servers": secured.sasl_ssl,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": SCRAM_USER,
        "properties": {"ssl.ca.location": str(secured.ca_file), **properties},
    }


def mtls_kafka(secured: Secured, **properties: Any) -> dict[str, Any]:
    """The kafka section for SSL with a client certificate."""
    return {
        "bootstrap_servers": secured.ssl,
        "security_protocol": "SSL",
        "properties": {
            "ssl.ca.location": str(secured.ca_file),
            "ssl.certificate.location": str(secured.client_cert_file),
            "ssl.key.location": str(secured.client_key_file),
            **properties,
        },
    }


_MADE: list[BridgeSetup] = []
"""The set-ups of the running test, whose bridges are stopped when it ends, passed or not."""


@pytest.fixture(autouse=True)
def _stop_bridges() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().stop_all()


def make_setup(
    secured: Secured, receiver: Receiver, tmp_path: Path, kafka: dict[str, Any], **options: Any
) -> BridgeSetup:
    """A set-up whose bridge talks to the secured listener; topics made over plaintext."""
    setup = BridgeSetup(
        secured.tools,
        tmp_path,
        [webhook("hook", "acct_1", receiver.url("/hook"))],
        partitions=1,
        kafka=kafka,
        **options,
    )
    setup.create_topics()
    _MADE.append(setup)
    return setup


def grant(
    secured: Secured,
    principal: str,
    setup: BridgeSetup,
    topic_operations: tuple[AclOperation, ...] = (AclOperation.READ, AclOperation.WRITE),
) -> None:
    """The ACLs the bridge needs, and no more: read and write its topics (the source's name
    is the prefix of every one), read its consumer group. Waits until the broker has them.
    (``topic_operations`` grants less, to see the bridge refused.)"""
    user = f"User:{principal}"
    allow = AclPermissionType.ALLOW
    bindings = [
        AclBinding(
            ResourceType.TOPIC, setup.source, ResourcePatternType.PREFIXED, user, "*", op, allow
        )
        for op in topic_operations
    ] + [
        AclBinding(
            ResourceType.GROUP,
            setup.group,
            ResourcePatternType.LITERAL,
            user,
            "*",
            AclOperation.READ,
            allow,
        )
    ]
    admin = AdminClient({"bootstrap.servers": secured.tools, **QUIET})
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)
    mine = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        user,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )

    def granted() -> bool:
        found = admin.describe_acls(mine).result(timeout=10)
        return {(b.name, b.operation) for b in found} >= {(b.name, b.operation) for b in bindings}

    wait_for(granted, 30, interval=0.2, message=f"the ACLs of {user}")


def bridge_check(setup: BridgeSetup, *command: str) -> tuple[int, str, float]:
    """``bridge check`` (or ``command``) against the set-up's file: exit code, output, seconds
    taken."""
    config = str(setup.write_config())
    started = time.monotonic()
    arguments = command or ("check", "--timeout", str(CHECK_TIMEOUT_S))
    result = subprocess.run(
        [sys.executable, "-m", "bridge", *arguments, "-c", config],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **setup.env},
        timeout=CHECK_TIMEOUT_S + 30,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr, time.monotonic() - started


def delivered(receiver: Receiver, transaction: str) -> bool:
    """Whether the receiver answered 2xx to the notification of ``transaction`` on /hook."""
    return any(
        200 <= request.status < 300 and json.loads(request.body)["transactionId"] == transaction
        for request in receiver.on("/hook")
    )


def start_to_exit(setup: BridgeSetup, why: str) -> BridgeProcess:
    """Start ``bridge run`` and wait (at most START_FAILURE_S) until it has exited."""
    bridge = setup.start_bridge(wait_assigned=False)
    process = bridge.process
    assert process is not None
    wait_for(
        lambda: process.poll() is not None,
        START_FAILURE_S,
        interval=0.1,
        message=f"bridge run to exit {why} (log: {bridge.log_path})",
    )
    return bridge


def deliver_one(setup: BridgeSetup, receiver: Receiver) -> BridgeProcess:
    """Start the bridge, produce a record, and see it delivered, signed, to the receiver."""
    bridge = setup.start_bridge()  # waits until the group assigned its partition
    setup.produce_records([make_record("tx-secured", "acct_1", success=True)])
    wait_for(lambda: receiver.received_ids("/hook"), 30, message="the delivery")
    request = receiver.on("/hook")[0]
    expected = hmac.new(secret_of("hook").encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-service-secret"] == expected
    assert request.headers["webhook-signature"].startswith("v1,")
    assert json.loads(request.body)["transactionId"] == "tx-secured"
    return bridge


def test_delivers_over_sasl_ssl_with_scram_credentials_from_env_and_files(
    secured: Secured, receiver: Receiver, tmp_path: Path
) -> None:
    """The password in KAFKA_SASL_PASSWORD for ``bridge run``, in a file for ``bridge check``;
    the CA in a file; nothing secret in the configuration file or the log."""
    env = {"KAFKA_SASL_PASSWORD": PASSWORD}
    setup = make_setup(secured, receiver, tmp_path, scram_kafka(secured), env=env)
    grant(secured, SCRAM_USER, setup)
    assert PASSWORD not in setup.config_path.read_text()

    bridge = deliver_one(setup, receiver)
    assert bridge.terminate() == 0
    assert PASSWORD not in bridge.log_path.read_text()

    setup.env = {}
    setup.kafka["sasl_password_file"] = str(secured.password_file)
    code, output, _took = bridge_check(setup)
    assert code == 0, output
    assert f"1 broker(s) reachable at {secured.sasl_ssl}" in output


def test_delivers_over_mutual_tls_with_a_client_certificate_from_files(
    secured: Secured, receiver: Receiver, tmp_path: Path
) -> None:
    setup = make_setup(secured, receiver, tmp_path, mtls_kafka(secured))
    grant(secured, CERT_USER, setup)

    code, output, _took = bridge_check(setup)
    assert code == 0, output
    bridge = deliver_one(setup, receiver)
    assert bridge.terminate() == 0


REFUSALS = {
    "wrong password": ("authentication failed", "SCRAM-SHA-512"),
    "untrusted broker certificate": (
        "certificate verification failed",
        "certificate verify failed",
    ),
    "no client certificate": ("the broker refused the client certificate", "alert"),
}


def refused_kafka(secured: Secured, case: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The kafka section and environment of one refused start."""
    if case == "wrong password":
        kafka = scram_kafka(secured)
        kafka["sasl_password_file"] = str(secured.wrong_password_file)
        return kafka, {}
    if case == "untrusted broker certificate":
        kafka = scram_kafka(secured, **{"ssl.ca.location": str(secured.untrusted_ca_file)})
        return kafka, {"KAFKA_SASL_PASSWORD": PASSWORD}
    kafka = mtls_kafka(secured)
    del kafka["properties"]["ssl.certificate.location"]
    del kafka["properties"]["ssl.key.location"]
    return kafka, {}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_connection_is_a_clear_error_in_check_and_at_start(
    secured: Secured, receiver: Receiver, tmp_path: Path, case: str
) -> None:
    """A wrong password, a broker certificate signed by a CA the bridge does not trust, or no
    client certificate where the broker requires one: ``bridge check`` exits 1 at once with
    one line naming it; ``bridge run`` exits 1 within seconds (never hangs), its log
    naming it too, without a traceback."""
    words, detail = REFUSALS[case]
    kafka, env = refused_kafka(secured, case)
    setup = make_setup(secured, receiver, tmp_path, kafka, env=env)

    code, output, check_took = bridge_check(setup)
    assert code == 1, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output
    assert errors[0].startswith(f"error: Kafka at {kafka['bootstrap_servers']}: {words}")
    assert detail in errors[0]
    assert check_took < CHECK_TIMEOUT_S / 2, f"check took {check_took:.1f}s to report {case}"
    # The other commands that reach Kafka say the same at once (not after their own timeouts).
    for command in (("topics",), ("dlq", "list"), ("dlq", "replay", "--all")):
        code, output, took = bridge_check(setup, *command)
        assert code == 1, (command, output)
        assert f"error: Kafka at {kafka['bootstrap_servers']}: {words}" in output, command
        assert took < CHECK_TIMEOUT_S / 2, f"{command} took {took:.1f}s to report {case}"

    started = time.monotonic()
    bridge = start_to_exit(setup, f"on {case}")
    process = bridge.process
    assert process is not None
    took = time.monotonic() - started
    assert process.returncode == 1, bridge.log_tail()
    failed = [json.loads(line) for line in bridge.log_lines() if '"kafka.start_failed"' in line]
    assert len(failed) == 1, bridge.log_tail()
    assert failed[0]["reason"].startswith(words), failed[0]
    assert failed[0]["bootstrap_servers"] == kafka["bootstrap_servers"]
    text = bridge.log_path.read_text()
    assert f"error: Kafka at {kafka['bootstrap_servers']}: {words}" in text
    assert "Traceback" not in text
    assert PASSWORD not in bridge.log_path.read_text()
    print(f"{case}: check exited 1 in {check_took:.1f}s, run {process.returncode} in {took:.1f}s")


def test_a_principal_that_may_not_write_ends_the_bridge_and_loses_nothing(
    secured: Secured, receiver: Receiver, tmp_path: Path
) -> None:
    """With Read but no Write on its topics, the cluster refuses the bridge's idempotent
    producer an id (CLUSTER_AUTHORIZATION_FAILED, fatal in librdkafka: that producer can never
    write). ``bridge run`` exits 1 within seconds with one line naming it and a hint (it used
    to run on with a dead polling thread, every retry and dead letter failing for ever), and
    nothing is committed past a record it did not finish: granted Write, the next start
    delivers it."""
    receiver.behaviours["/hook"] = fail_first(1, 503)  # its delivery needs a retry rung
    env = {"KAFKA_SASL_PASSWORD": PASSWORD}
    kafka = {**scram_kafka(secured), "sasl_username": READER}
    setup = make_setup(secured, receiver, tmp_path, kafka, env=env)
    # Write on no topic at all: with Write on any topic the cluster grants the id (KIP-679),
    # and a topic the principal may not write fails each record instead (tried again, below).
    grant(secured, READER, setup, topic_operations=(AclOperation.READ,))
    setup.produce_records([make_record("tx-unwritable", "acct_1", success=True)])

    bridge = start_to_exit(setup, "when it may not write")
    assert bridge.process is not None and bridge.process.returncode == 1, bridge.log_tail()
    failed = [json.loads(line) for line in bridge.log_lines() if '"kafka.producer_failed"' in line]
    assert len(failed) == 1, bridge.log_tail()
    assert failed[0]["reason"].startswith("not authorized to write the bridge's topics; "), failed
    assert "Cluster authorization failed" in failed[0]["reason"]
    text = bridge.log_path.read_text()
    words = f"error: Kafka at {secured.sasl_ssl}: not authorized to write the bridge's topics"
    assert words in text
    assert "hint: the bridge's principal needs Read and Write on its topics" in text
    assert "Traceback" not in text
    assert PASSWORD not in text
    assert committed_offsets(secured.tools, setup.group, setup.source)[0] <= 0, (
        "committed past a record whose retry could not be written"
    )

    grant(secured, READER, setup)  # now Write as well
    bridge = setup.start_bridge()

    wait_for(
        lambda: delivered(receiver, "tx-unwritable"),
        60,
        message="the record delivered once the principal may write",
    )
    assert bridge.terminate() == 0


def test_a_topic_the_principal_may_not_write_holds_its_records_until_granted(
    secured: Secured, receiver: Receiver, tmp_path: Path
) -> None:
    """With Write on some other topic (so the cluster grants the idempotent producer its id)
    but only Read on the bridge's, each write to a rung fails with TOPIC_AUTHORIZATION_FAILED:
    the bridge keeps running and ready, says so (``produce.failed`` naming the topic,
    ``bridge_produce_failures_total``, the BridgeProduceFailing alert), commits nothing past
    the record, and delivers it once Write is granted, without a restart."""
    receiver.behaviours["/hook"] = fail_first(1, 503)  # its delivery needs a retry rung
    env = {"KAFKA_SASL_PASSWORD": PASSWORD}
    setup = make_setup(secured, receiver, tmp_path, scram_kafka(secured), env=env)
    grant(secured, SCRAM_USER, setup, topic_operations=(AclOperation.READ,))
    decoy = AclBinding(
        ResourceType.TOPIC,
        f"elsewhere-{setup.source}",
        ResourcePatternType.LITERAL,
        f"User:{SCRAM_USER}",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    admin = AdminClient({"bootstrap.servers": secured.tools, **QUIET})
    for future in admin.create_acls([decoy]).values():
        future.result(timeout=30)
    setup.produce_records([make_record("tx-rung-refused", "acct_1", success=True)])

    bridge = setup.start_bridge()
    rung = setup.delay_topic(1)

    def refused_writes() -> list[dict[str, Any]]:
        return [
            entry
            for entry in map(json.loads, bridge.log_lines())
            if entry.get("event") == "produce.failed"
            and entry.get("topic") == rung
            and "TOPIC_AUTHORIZATION_FAILED" in entry.get("error", "")
        ]

    wait_for(lambda: len(refused_writes()) >= 2, 30, message=f"writes to {rung} refused")
    assert bridge.gauge("bridge_produce_failures_total", 'kind="retry"') >= 2
    assert bridge.http("/readyz")[0] == 200, "still consuming and delivering the rest"
    assert bridge.process is not None and bridge.process.poll() is None
    assert committed_offsets(secured.tools, setup.group, setup.source)[0] <= 0

    grant(secured, SCRAM_USER, setup)  # Write on the bridge's topics: no restart needed
    wait_for(
        lambda: delivered(receiver, "tx-rung-refused"),
        60,
        message="the record delivered once its rung may be written",
    )
    wait_for(
        lambda: committed_offsets(secured.tools, setup.group, setup.source)[0] == 1,
        30,
        message="the record committed",
    )
    assert bridge.terminate() == 0


@pytest.mark.parametrize(
    ("code", "text", "words"),
    [
        (
            KafkaError._AUTHENTICATION,
            "sasl_ssl://h:1/bootstrap: SASL authentication error: "
            "Authentication failed (after 3ms in state AUTH_REQ)",
            "authentication failed",
        ),
        (
            KafkaError._SSL,
            "ssl://h:1/1: SSL handshake failed: error:0A000086:SSL routines::"
            "certificate verify failed (after 5ms in state SSL_HANDSHAKE)",
            "certificate verification failed",
        ),
        (
            KafkaError._TRANSPORT,
            "ssl://h:1/bootstrap: Receive failed: ssl/tls alert bad "
            "certificate: SSL alert number 42",
            "the broker refused the client certificate",
        ),
        (
            KafkaError._TRANSPORT,
            "ssl://h:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
            None,
        ),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down", None),
    ],
)
def test_only_security_failures_are_recognised(code: int, text: str, words: str | None) -> None:
    reason = security_failure(KafkaError(code, text))
    if words is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(words), reason
        assert "(after" not in reason and " said: " in reason
