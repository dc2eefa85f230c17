"""Prometheus metrics of the bridge, on a registry passed in (tests use a fresh one).

Label sets are bounded by configuration and code: webhook id, outcome, status class, rung, reason,
topic and partition of the bridge's own topics. Never a URL, a transaction or an account.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from bridge import __version__

REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
END_TO_END_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


def status_class(status: int | None, error_reason: str = "") -> str:
    """The ``status_class`` label: ``2xx`` to ``5xx`` for an answer, else the error kind."""
    if status is not None:
        return f"{status // 100}xx"
    return error_reason or "error"


class _Unrecorded:
    """Stands in for a metric when recording is switched off: every call does nothing."""

    def labels(self, *_args: str) -> _Unrecorded:
        return self

    def inc(self, _amount: float = 1) -> None:
        pass

    def dec(self, _amount: float = 1) -> None:
        pass

    def set(self, _value: float) -> None:
        pass

    def observe(self, _value: float) -> None:
        pass

    def remove(self, *_args: str) -> None:
        pass


class Metrics:
    """Every metric the bridge exports, registered on ``registry``.

    With ``enabled=False`` nothing is recorded (only ``bridge_build_info`` is exported): the
    benchmark uses it to measure what metrics cost the hot path.
    """

    def __init__(self, registry: CollectorRegistry, enabled: bool = True) -> None:
        self.registry = registry
        self._received: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
        self.records_consumed = Counter(
            "bridge_records_consumed",
            "Records consumed, by kind of topic (source or retry).",
            ["kind"],
            registry=registry,
        )
        self.record_failures = Counter(
            "bridge_record_failures",
            "Source records that could not be decoded or mapped.",
            ["reason"],
            registry=registry,
        )
        self.deliveries = Counter(
            "bridge_deliveries",
            "HTTP delivery attempts by webhook, outcome and status class.",
            ["webhook", "outcome", "status_class"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "bridge_request_duration_seconds",
            "Duration of delivery HTTP requests.",
            ["webhook"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.end_to_end = Histogram(
            "bridge_end_to_end_latency_seconds",
            "From the source record's timestamp to the 2xx answer of the webhook.",
            ["webhook"],
            buckets=END_TO_END_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "bridge_retries_scheduled",
            "Deliveries handed to a delay topic, by webhook and rung.",
            ["webhook", "rung"],
            registry=registry,
        )
        self.deferrals = Counter(
            "bridge_deferrals",
            "Deliveries parked in a delay topic without using an attempt (webhook saturated).",
            ["webhook"],
            registry=registry,
        )
        self.retry_lateness = Histogram(
            "bridge_retry_lateness_seconds",
            "How late a retry was taken from its delay topic, after its due time.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.dead_letters = Counter(
            "bridge_dead_letters",
            "Records written to the dead-letter topic, by webhook (empty for poison records) "
            "and reason.",
            ["webhook", "reason"],
            registry=registry,
        )
        self.produce_failures = Counter(
            "bridge_produce_failures",
            "Failed writes to the bridge's own topics (retried until they succeed).",
            ["kind"],
            registry=registry,
        )
        self.delivery_errors = Counter(
            "bridge_delivery_errors",
            "Delivery attempts ended by the engine's guard instead of the HTTP client, by kind "
            "(deadline_exceeded, internal_error); each became a not-received outcome.",
            ["kind"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "bridge_deliveries_in_flight",
            "Deliveries started and not yet finished.",
            registry=registry,
        )
        self.paused_partitions = Gauge(
            "bridge_paused_partitions",
            "Assigned partitions currently paused.",
            registry=registry,
        )
        self.assigned_partitions = Gauge(
            "bridge_assigned_partitions",
            "Partitions assigned to this instance.",
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "bridge_consumer_lag",
            "Records behind the end of each assigned partition.",
            ["topic", "partition"],
            registry=registry,
        )
        self.committed_offset = Gauge(
            "bridge_committed_offset",
            "Last committed offset of each partition.",
            ["topic", "partition"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "bridge_config_reloads",
            "Configuration reloads by result (applied or rejected).",
            ["result"],
            registry=registry,
        )
        self.config_reload_ok = Gauge(
            "bridge_config_last_reload_successful",
            "1 when the configuration file in force is the latest one on disk, 0 while a newer "
            "file is rejected.",
            registry=registry,
        )
        self.config_reload_ok.set(1)
        for result in ("applied", "rejected"):
            self.config_reloads.labels(result)
        for kind in ("source", "retry"):
            self.records_consumed.labels(kind)
        self.webhooks_configured = Gauge(
            "bridge_webhooks_configured",
            "Enabled webhooks in the configuration in force.",
            registry=registry,
        )
        self.build_info = Gauge(
            "bridge_build_info",
            "Version of the bridge and of Python; always 1.",
            ["version", "python"],
            registry=registry,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        if not enabled:
            for name, metric in list(vars(self).items()):
                if isinstance(metric, MetricWrapperBase) and metric is not self.build_info:
                    registry.unregister(metric)
                    setattr(self, name, _Unrecorded())
        self.consumed_source = self.records_consumed.labels("source")  # the hot path's children
        self.consumed_retry = self.records_consumed.labels("retry")

    def delivery_received(
        self, webhook: str, status: int, duration: float, end_to_end: float
    ) -> None:
        """Count one 2xx answer and observe its durations (the hot path: children are cached)."""
        key = (webhook, status)
        children = self._received.get(key)
        if children is None:
            children = self._received[key] = (
                self.deliveries.labels(webhook, "received", status_class(status)),
                self.request_duration.labels(webhook),
                self.end_to_end.labels(webhook),
            )
        children[0].inc()
        children[1].observe(duration)
        children[2].observe(end_to_end)

    def register_webhooks(self, webhook_ids: Iterable[str], rungs: int) -> None:
        """Create each webhook's main series at zero, so rates see their first events."""
        for webhook in webhook_ids:
            self.deliveries.labels(webhook, "received", "2xx")
            self.deliveries.labels(webhook, "failed", "5xx")
            self.request_duration.labels(webhook)
            self.end_to_end.labels(webhook)
            self.dead_letters.labels(webhook, "retries_exhausted")
            for rung in range(1, rungs + 1):
                self.retries.labels(webhook, str(rung))

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop the per-partition series of a partition no longer assigned here."""
        for gauge in (self.consumer_lag, self.committed_offset):
            with contextlib.suppress(KeyError):
                gauge.remove(topic, str(partition))

    def record_statistics(self, stats: dict[str, object]) -> bool:
        """Update lag and committed offsets from librdkafka statistics; True if a broker is up."""
        topics = stats.get("topics", {})
        for topic, data in topics.items() if isinstance(topics, dict) else ():
            for partition, info in data.get("partitions", {}).items():
                if partition == "-1" or not info.get("desired"):
                    continue
                if info.get("consumer_lag", -1) >= 0:
                    self.consumer_lag.labels(topic, partition).set(info["consumer_lag"])
                if info.get("committed_offset", -1) >= 0:
                    self.committed_offset.labels(topic, partition).set(info["committed_offset"])
        brokers = stats.get("brokers", {})
        return any(
            b.get("state") == "UP" and b.get("nodeid", -1) >= 0
            for b in (brokers.values() if isinstance(brokers, dict) else ())
        )
