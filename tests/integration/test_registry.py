"""The schema-registry path against a real Apicurio Registry (its Confluent-compatible API)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bridge.codec.decoding import Decoder
from bridge.codec.encoding import encode_confluent, load_schema_file
from bridge.codec.registry import SchemaRegistryClient
from bridge.core.envelope import header_map
from bridge.core.errors import DecodeError, RegistryUnavailableError
from devtools.devregistry import Registry
from devtools.samples import make_record
from tests.bridge_harness import BridgeSetup, webhook
from tests.kafka_helpers import unique_name, wait_for
from tests.receiver import Receiver

pytestmark = pytest.mark.integration

Setup = Callable[..., BridgeSetup]

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
V1 = load_schema_file(SCHEMAS / "transaction_outcome.v1.avsc")
V2 = load_schema_file(SCHEMAS / "transaction_outcome.avsc")
UNREGISTERED_ID = 2_000_000_000  # far beyond the ids a fresh registry hands out
PERFORMED_AT = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


USER, PASSWORD = "bridge", "registry-Password-5e0c2a"
AUTH = (USER, PASSWORD)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One Apicurio Registry for the module (fetched into .cache/apicurio/ on first use) that
    requires HTTP basic authentication of every request, as production registries do."""
    owned = Registry(tmp_path_factory.mktemp("registry"), users={USER: PASSWORD})
    try:
        owned.start()
        yield owned
    finally:
        owned.stop()


def registry_schemas(registry: Registry, workdir: Path, password: str | None) -> dict[str, Any]:
    """The ``schemas`` section of a bridge on ``registry``: the user, and ``password`` from a
    file (none at all with None)."""
    if password is None:
        return {"mode": "registry", "registry_url": registry.ccompat_url}
    secret = workdir / "registry-password"
    secret.write_text(password + "\n")
    return {
        "mode": "registry",
        "registry_url": registry.ccompat_url,
        "registry_username": USER,
        "registry_password_file": str(secret),
    }


def run_bridge_command(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def v1_record(transaction_id: str) -> dict[str, Any]:
    """A record as a version-1 producer writes it: no merchantReference."""
    record = make_record(transaction_id, "acct_1", performed_at=PERFORMED_AT)
    del record["merchantReference"]
    return record


def v2_record(transaction_id: str, merchant_reference: str) -> dict[str, Any]:
    """A record as a version-2 (current) producer writes it."""
    record = make_record(transaction_id, "acct_1", performed_at=PERFORMED_AT)
    return {**record, "merchantReference": merchant_reference}


def test_client_registers_and_fetches_both_schema_versions(registry: Registry) -> None:
    subject = unique_name("tx") + "-value"
    with SchemaRegistryClient(registry.ccompat_url, auth=AUTH) as producer_side:
        id_v1 = producer_side.register(subject, V1)
        id_v2 = producer_side.register(subject, V2)
        assert producer_side.register(subject, V1) == id_v1, "registering again is idempotent"
    assert id_v1 != id_v2

    with SchemaRegistryClient(registry.ccompat_url, auth=AUTH) as client:
        assert client.cached(id_v1) is None, "a new client fetches over HTTP"
        assert client.fetch(id_v1) == V1
        assert client.fetch(id_v2) == V2
        decoder = Decoder(V2, registry=client)
        old = decoder.decode(encode_confluent(id_v1, V1, v1_record("tx-v1")))
        new = decoder.decode(encode_confluent(id_v2, V2, v2_record("tx-v2", "ref-2")))
    assert old == {**v1_record("tx-v1"), "merchantReference": None}
    assert new == v2_record("tx-v2", "ref-2")


def test_unknown_schema_id_is_a_non_retriable_decode_error(registry: Registry) -> None:
    value = encode_confluent(UNREGISTERED_ID, V2, v2_record("tx-unknown", "ref-x"))
    with SchemaRegistryClient(registry.ccompat_url, auth=AUTH) as client:
        with pytest.raises(DecodeError) as fetched:
            client.fetch(UNREGISTERED_ID)
        with pytest.raises(DecodeError) as decoded:
            Decoder(V2, registry=client).decode(value)
    assert fetched.value.reason == "unknown_schema_id"
    assert not fetched.value.retriable
    assert decoded.value.reason == "unknown_schema_id"
    assert decoded.value.raw == value, "the raw bytes are kept for the dead-letter topic"


def test_stopped_registry_is_a_retriable_unavailable_error(tmp_path: Path) -> None:
    own = Registry(tmp_path / "registry")
    try:
        own.start()
        url = own.ccompat_url
        with SchemaRegistryClient(url, timeout=2) as warm, SchemaRegistryClient(url) as cold:
            schema_id = warm.register(unique_name("tx") + "-value", V2)
            own.stop()
            assert warm.fetch(schema_id) == V2, "a known id is served from the cache"
            with pytest.raises(RegistryUnavailableError) as caught:
                cold.fetch(schema_id)
    finally:
        own.stop()
    assert caught.value.retriable
    assert url in str(caught.value)


def test_bridge_reads_v1_and_v2_records_and_dead_letters_unknown_ids(
    registry: Registry, receiver: Receiver, bridge_setup: Setup, tmp_path: Path
) -> None:
    """Through a registry that requires authentication, the password from a file."""
    setup = bridge_setup(
        [webhook("hook", "acct_1", receiver.url("/hook"))],
        partitions=1,
        schemas=registry_schemas(registry, tmp_path, PASSWORD),
    )
    with SchemaRegistryClient(registry.ccompat_url, auth=AUTH) as client:
        id_v1 = client.register(f"{setup.source}-value", V1)
        id_v2 = client.register(f"{setup.source}-value", V2)
    unknown = encode_confluent(UNREGISTERED_ID, V2, v2_record("tx-unknown", "ref-x"))
    bridge = setup.start_bridge()
    setup.produce_raw(
        [
            encode_confluent(id_v1, V1, v1_record("tx-v1")),
            unknown,
            encode_confluent(id_v2, V2, v2_record("tx-v2", "ref-2")),
        ]
    )

    letters = setup.dead_letters(1)
    wait_for(lambda: len(receiver.on("/hook")) == 2, 30, message="the v1 and v2 records")
    bodies = [json.loads(request.body) for request in receiver.on("/hook")]
    assert sorted(body["transactionId"] for body in bodies) == ["tx-v1", "tx-v2"]
    assert all("merchantReference" not in body for body in bodies)
    headers = header_map(letters[0].headers())
    assert letters[0].value() == unknown
    assert headers["bridge-kind"] == "poison"
    assert headers["bridge-reason"] == "unknown_schema_id"
    assert str(UNREGISTERED_ID) in headers["bridge-detail"]
    assert bridge.process is not None and bridge.process.poll() is None, "the bridge never crashes"
    assert bridge.terminate() == 0


def test_check_says_the_registry_answers_with_the_right_credentials(
    registry: Registry, bridge_setup: Setup, tmp_path: Path
) -> None:
    setup = bridge_setup([], schemas=registry_schemas(registry, tmp_path, PASSWORD))
    checked = run_bridge_command("check", "-c", str(setup.config_path))
    assert checked.returncode == 0, checked.stderr
    assert f"schema registry: answering at {registry.ccompat_url}" in checked.stdout


@pytest.mark.parametrize(
    ("password", "who"), [("wrong-Password-81d3f7", "user 'bridge'"), (None, "no credentials")]
)
def test_a_refused_registry_login_is_said_at_check_and_ends_run_at_once(
    registry: Registry, bridge_setup: Setup, tmp_path: Path, password: str | None, who: str
) -> None:
    """A wrong password (or none) is said by ``bridge check`` and ends ``bridge run`` at start
    with exit 1 (no retry mends it), naming the registry and the user, never a password."""
    setup = bridge_setup([], schemas=registry_schemas(registry, tmp_path, password))
    expected = (
        f"schema registry at {registry.ccompat_url} refused the request with {who} (HTTP 401)"
    )
    checked = run_bridge_command("check", "-c", str(setup.config_path))
    started = time.monotonic()
    ran = run_bridge_command("run", "-c", str(setup.config_path), timeout=60)
    elapsed = time.monotonic() - started
    for result in (checked, ran):
        assert result.returncode == 1, result.stderr
        assert f"error: {expected}" in result.stderr
        assert "hint: check schemas.registry_username" in result.stderr
        for secret in (password or PASSWORD, PASSWORD):
            assert secret not in result.stdout + result.stderr
    assert elapsed < 20, f"bridge run took {elapsed:.1f}s to give up"
