"""Session-wide fixtures: the real Kafka broker, or the cluster in KAFKA_BOOTSTRAP_SERVERS."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.devkafka import CACHE, Broker
from tests.kafka_helpers import unique_name


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker | None]:
    """The broker this test session owns, or None when an external cluster is used."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield None
        return
    owned = Broker(CACHE / f"test-broker-{os.getpid()}")
    owned.start()
    try:
        yield owned
    finally:
        owned.stop()
        import shutil

        shutil.rmtree(owned.home, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_bootstrap(broker: Broker | None) -> str:
    """Bootstrap address of the Kafka cluster under test."""
    if broker is None:
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    address = broker.bootstrap()
    assert address is not None, "the test broker is not running"
    return address


@pytest.fixture
def group_id() -> str:
    """A consumer group no other test uses."""
    return unique_name("group")


@pytest.fixture
def repo_root() -> Path:
    """The repository's top folder."""
    return Path(__file__).resolve().parents[1]
