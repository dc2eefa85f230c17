"""Integration fixtures: a real receiver on loopback and bridge set-ups with their own topics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.bridge_harness import BridgeSetup, setups
from tests.receiver import Receiver


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
