"""Integration fixtures: a real receiver on loopback and bridge set-ups with their own topics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.bridge_harness import BridgeProcess, BridgeSetup, setups
from tests.prometheus_server import Prometheus
from tests.receiver import Receiver
from tests.unit.test_prometheus_rules import ALERTS


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on 127.0.0.1 recording every request."""
    server = Receiver().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bridge_setup(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., BridgeSetup]]:
    """Make a set-up (own topics, group, config) for webhooks; bridges are stopped at the end."""
    yield from setups(kafka_bootstrap, tmp_path)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """Start Prometheus scraping a bridge, evaluating ``rule_files`` (the alert rules unless
    told otherwise); every server started is stopped at the end."""
    started: list[Prometheus] = []

    def start(bridge: BridgeProcess, rule_files: tuple[Path, ...] = (ALERTS,)) -> Prometheus:
        folder = tmp_path / f"prometheus-{len(started)}"
        folder.mkdir()
        server = Prometheus(folder, bridge.port, rule_files)
        started.append(server)
        server.wait_ready()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
