"""``metrics.webhook_series``: read from the file, bounded, and handed to the metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from bridge.config.loader import load_config
from bridge.core.errors import ConfigError
from bridge.ops.metrics import Metrics


def _config(tmp_path: Path, metrics: str) -> Path:
    path = tmp_path / "bridge.yaml"
    path.write_text(
        f'kafka: {{bootstrap_servers: "127.0.0.1:9092"}}\nmetrics: {metrics}\nwebhooks: []\n'
    )
    return path


def test_webhook_series_defaults_to_ten_and_is_read(tmp_path: Path) -> None:
    assert load_config(_config(tmp_path, "{}")).metrics.webhook_series == 10
    assert load_config(_config(tmp_path, "{webhook_series: 3}")).metrics.webhook_series == 3


@pytest.mark.parametrize("value", ["-1", "1001", "ten", "2.5"])
def test_webhook_series_out_of_range_names_the_field(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="webhook_series"):
        load_config(_config(tmp_path, f"{{webhook_series: {value}}}"))


def test_the_tracked_set_is_as_large_as_configured() -> None:
    metrics = Metrics(CollectorRegistry(), webhook_series=3)
    for index in range(10):
        metrics.deliveries.labels(f"hook-{index}", "received", "2xx").inc()
    text = "\n".join(
        f"{sample.labels.get('webhook')}"
        for family in metrics.registry.collect()
        if family.name == "bridge_deliveries"
        for sample in family.samples
    )
    tracked = {w for w in text.split("\n") if w.startswith("hook-")}
    assert tracked == {"hook-0", "hook-1", "hook-2"}
    assert "(other)" in text
