"""Metric helpers: status classes and librdkafka statistics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from bridge.ops.metrics import Metrics, status_class


def test_status_class() -> None:
    assert status_class(204) == "2xx"
    assert status_class(302) == "3xx"
    assert status_class(None, "timeout") == "timeout"


def test_statistics_set_lag_and_committed_offsets_and_broker_state() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    up = metrics.record_statistics(
        {
            "brokers": {"127.0.0.1:9092/1": {"state": "UP", "nodeid": 1}},
            "topics": {
                "tx": {
                    "partitions": {
                        "0": {"desired": True, "consumer_lag": 7, "committed_offset": 40},
                        "1": {"desired": False, "consumer_lag": 3, "committed_offset": 2},
                        "-1": {"desired": False, "consumer_lag": -1},
                    }
                }
            },
        }
    )
    assert up is True
    assert registry.get_sample_value("bridge_consumer_lag", {"topic": "tx", "partition": "0"}) == 7
    assert (
        registry.get_sample_value("bridge_committed_offset", {"topic": "tx", "partition": "0"})
        == 40
    )
    assert (
        registry.get_sample_value("bridge_consumer_lag", {"topic": "tx", "partition": "1"}) is None
    )
    metrics.forget_partition("tx", 0)
    assert (
        registry.get_sample_value("bridge_consumer_lag", {"topic": "tx", "partition": "0"}) is None
    )


def test_no_broker_up_means_unreachable() -> None:
    metrics = Metrics(CollectorRegistry())
    assert metrics.record_statistics({"brokers": {"boot": {"state": "UP", "nodeid": -1}}}) is False


def test_disabled_metrics_record_nothing_but_build_info() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, enabled=False)
    metrics.deliveries.labels("hook", "received", "2xx").inc()
    metrics.request_duration.labels("hook").observe(0.1)
    names = {sample.name for family in registry.collect() for sample in family.samples}
    assert names == {"bridge_build_info"}
