"""The configuration-load benchmark's generator: its files load through the real loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import loader
from bridge.config.loader import load_config
from bridge.core.errors import ConfigError
from devtools.bench_config import (
    SECRET_ENV,
    SECRET_VALUE,
    SIZES,
    config_text,
    scenario_config_load,
    write_config,
)
from tests.yaml_nodes import yaml_nodes

ENVIRON = {SECRET_ENV: SECRET_VALUE}


def test_a_generated_file_loads_with_every_webhook(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bridge.yaml", 120)

    config = load_config(path, ENVIRON)

    hooks = config.webhooks
    assert [hook.id for hook in hooks] == [f"wh-{index:06d}" for index in range(120)]
    assert len({hook.url for hook in hooks}) == 120
    assert {hook.signature for hook in hooks} == {"hmac-sha256", "secret"}
    assert any(hook.secret.reveal() == SECRET_VALUE.encode() for hook in hooks)
    assert any(hook.secret.reveal().startswith(b"whsec_") for hook in hooks)
    assert any(hook.previous_secret is not None for hook in hooks)
    assert any(hook.standard_webhooks_secret is not None for hook in hooks)
    assert any(not hook.enabled for hook in hooks)
    assert any(hook.tls.min_version == "TLSv1.3" for hook in hooks)
    assert {hook.events for hook in hooks} == {
        frozenset({"transaction.failed"}),
        frozenset({"transaction.success", "transaction.failed"}),
    }
    hosts = {hook.url.split("/")[2] for hook in hooks}
    assert any(host.startswith("[") for host in hosts)  # IPv6 literals
    assert any(host[0].isdigit() for host in hosts)  # IPv4 literals
    assert any(not host.isascii() for host in hosts)  # IDNA names
    assert len(hosts) < len(hooks)  # webhooks share hosts


def test_the_secret_comes_from_the_environment(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bridge.yaml", 10)

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert any(f"environment variable {SECRET_ENV} is not set" in p for p in caught.value.problems)


def test_both_ways_of_writing_yaml_are_in_a_generated_file() -> None:
    text = config_text(40)

    assert '  - id: "wh-000000"' in text  # quoted, flow lists
    assert "  - id: wh-000001" in text  # plain, block lists
    assert text.count("&both") == 1 and text.count("*both") > 5  # an anchor and its aliases


def test_no_webhooks_and_the_same_text_each_time(tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path / "empty.yaml", 0), ENVIRON).webhooks == ()
    assert config_text(25) == config_text(25)


@pytest.mark.skipif(loader.FAST_YAML_LOADER is None, reason="PyYAML built without libyaml")
def test_generated_files_take_the_libyaml_path() -> None:
    composed, root, _ = loader._compose_fast(config_text(50))

    assert composed
    assert root is not None


def test_the_largest_benchmarked_configuration_is_well_within_the_node_limit() -> None:
    """The node limit refuses what no configuration of the scale the product is measured at
    needs: the benchmark's largest size has well under two thirds of it."""
    per_webhook = (yaml_nodes(config_text(2000)) - yaml_nodes(config_text(0))) / 2000
    assert 10 < per_webhook < 20  # (the generated webhooks: 13 nodes each on average)
    assert max(SIZES) * per_webhook < loader.MAX_NODES * 2 / 3


def test_the_scenario_times_bridge_check_in_a_child(tmp_path: Path) -> None:
    result = scenario_config_load(tmp_path, sizes=(20,), rounds=1)

    (size,) = result["sizes"].values()
    assert size["webhooks"] == 20
    assert len(size["rounds"]) == 1
    for key in ("wall_s", "cpu_s", "peak_rss_mb"):
        spread = size[key]
        assert 0 < spread["min"] <= spread["median"] <= spread["max"], key
    assert size["peak_rss_mb"]["min"] > 10  # the child's own peak, in MB
