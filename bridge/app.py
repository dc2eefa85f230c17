"""App lifecycle for ``bridge run``: build the pipeline from the configuration, serve the operator
port, watch the configuration file, and shut down cleanly on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import time
from typing import Any

from aiohttp import web
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from bridge.codec.build import build_decoder
from bridge.config.reload import ConfigWatcher, Primer
from bridge.core.errors import ConfigError
from bridge.core.settings import Config
from bridge.engine.pipeline import Pipeline, run_until
from bridge.http.sender import HttpSender
from bridge.kafka.consumer import ThreadedConsumer, consumer_settings
from bridge.kafka.lag import GroupLag, Reading
from bridge.kafka.producer import DurableProducer
from bridge.kafka.security import KafkaFatalError, producer_failure
from bridge.ops import collector
from bridge.ops.health import health_app, start_health_server
from bridge.ops.limits import OTHER_FILES, OpenFiles, raise_open_file_limit, wanted_open_files
from bridge.ops.logs import LIBRDKAFKA
from bridge.ops.metrics import Metrics

log = logging.getLogger("bridge.app")
FAILED_GRACE_S = 5.0
"""The shutdown grace after the producer failed for good (at most ``shutdown_grace_seconds``):
nothing more can be parked or dead-lettered, so there is nothing to wait for but the commit of
what is finished."""


class Reachability:
    """Whether Kafka is reachable, for ``bridge_kafka_brokers_reachable`` and ``/readyz``.

    :attr:`brokers_up` is how many brokers librdkafka's statistics (every 5 s) counted connected
    and heard from lately, lowered between two statistics by the errors that say a broker went:
    none once all are down; none after a lost connection if at most one was up (it was that one);
    otherwise as many as before (librdkafka reports each failed reconnect to a dead node, and one
    node of three lost is not "no broker").

    Readiness has a grace of :data:`SILENCE_S`: Kafka is reachable while the statistics counted a
    broker up, or a record was fetched, that recently. A lost connection, or librdkafka's
    "0/5 brokers are down" when its one open connection (connections are opened as needed) went to
    a node that died, is not the cluster lost: it connects to another node within seconds. (A
    cluster scenario saw /readyz answer 503 for 1.5 s with two nodes of three serving.) A cluster
    lost for longer shows after the grace.
    """

    SILENCE_S = 10.0

    def __init__(self) -> None:
        self.brokers_up = 0
        self.seen_at = float("-inf")  # monotonic time of the last statistics counting a broker

    def counted(self, brokers_up: int, now: float) -> None:
        """librdkafka's statistics counted ``brokers_up`` brokers."""
        self.brokers_up = brokers_up
        if brokers_up:
            self.seen_at = now

    def failed(self, code: int) -> bool:
        """A librdkafka error; True when it lowered :attr:`brokers_up`."""
        before = self.brokers_up
        if code == KafkaError._ALL_BROKERS_DOWN or (code == KafkaError._TRANSPORT and before <= 1):
            self.brokers_up = 0
        return self.brokers_up != before

    def reachable(self, now: float, last_record: float) -> bool:
        """Whether a broker was counted up, or a record fetched, within the grace."""
        return now - self.seen_at < self.SILENCE_S or now - last_record < self.SILENCE_S


def bound_port(runner: web.AppRunner) -> int:
    """The port the operator server listens on (the one the system chose for port 0)."""
    address = runner.addresses[0]
    return int(address[1])


class App:
    """Everything ``bridge run`` starts, wired together."""

    def __init__(
        self,
        config: Config,
        registry: CollectorRegistry | None = None,
        primer: Primer | None = None,
    ) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(
            self.registry,
            enabled=config.metrics.enabled,
            webhook_series=config.metrics.webhook_series,
        )
        self.kafka = Reachability()
        self.failure: KafkaFatalError | None = None  # ends ``run`` (raised after the shutdown)
        self._loop = asyncio.get_running_loop()  # built inside ``bridge run``'s event loop
        # First: schema files it cannot read end the start (a ConfigError) before any Kafka
        # client has a thread that would outlive it.
        decoder = build_decoder(config)
        settings = config.kafka_settings()
        self.consumer = ThreadedConsumer(
            consumer_settings(
                settings,
                config.kafka.group_id,
                {
                    "statistics.interval.ms": 5000,
                    "stats_cb": self._on_stats,
                    "error_cb": self._on_kafka_error,
                    "logger": LIBRDKAFKA,
                    "log_level": 3,
                },
            )
        )
        self.producer = DurableProducer(
            {**settings, "error_cb": self._on_kafka_error, "logger": LIBRDKAFKA, "log_level": 3},
            on_fatal=self._on_producer_fatal,
        )
        self.sender = HttpSender.from_settings(config.delivery)
        self.pipeline = Pipeline(
            config,
            consumer=self.consumer,
            producer=self.producer,
            sender=self.sender,
            decoder=decoder,
            metrics=self.metrics,
        )
        # Only with metrics: an idle reader still looks up the group's coordinator (2 connections)
        # and, never started, would never be closed.
        self.group_lag = (
            GroupLag(
                {**settings, "logger": LIBRDKAFKA, "log_level": 2},  # the others log outages
                config.kafka.group_id,
                self.pipeline.topics(),
                self._on_group_lag,
            )
            if config.metrics.enabled
            else None
        )
        self.stop_requested = asyncio.Event()
        self.clean = True  # False when shutdown had to leave something behind at the deadline
        # Loaded in a child process: parsing 10,000 webhooks in a thread held the interpreter
        # lock, and so every delivery, for seconds (bridge/config/reload.py).
        self.watcher = ConfigWatcher(
            config, self._apply, self._rejected, isolated=True, primer=primer
        )

    def _on_stats(self, stats_json: str) -> None:
        up = self.metrics.record_statistics(json.loads(stats_json))
        self.kafka.counted(up, time.monotonic())

    def _on_group_lag(self, reading: Reading | None) -> None:
        """On the lag reader's thread: a scrape sees the figures of one reading or the last."""
        self.metrics.group.reading = reading or Reading()

    def _on_kafka_error(self, error: Any) -> None:
        if self.kafka.failed(error.code()):
            self.metrics.brokers_reachable.set(self.kafka.brokers_up)
        log.warning("kafka.error", extra={"fields": {"error": error.str(), "code": error.code()}})

    def _on_producer_fatal(self, error: KafkaError) -> None:
        """On a Kafka client's thread: hand the producer's fatal error to the event loop (unless
        the loop is gone: the bridge has ended already)."""
        with contextlib.suppress(RuntimeError):  # "Event loop is closed"
            self._loop.call_soon_threadsafe(self._producer_failed, error)

    def _producer_failed(self, error: KafkaError) -> None:
        """The producer can never write again: say so and end the bridge (exit 1), leaving
        what it could not park or dead-letter uncommitted for whoever consumes next."""
        if self.failure is not None:
            return
        bootstrap = self.config.kafka.bootstrap_servers
        self.failure = producer_failure(bootstrap, error)
        log.error(
            "kafka.producer_failed",
            extra={"fields": {"bootstrap_servers": bootstrap, "reason": self.failure.failure}},
        )
        self.request_stop()

    def readiness(self) -> dict[str, bool]:
        """The checks behind ``/readyz``."""
        return {
            "config_loaded": True,
            "broker_reachable": self.kafka.reachable(time.monotonic(), self.pipeline.last_message),
            "consuming": not self.pipeline.stopping,
            "producing": self.failure is None,
        }

    def config_state(self) -> dict[str, object]:
        """The ``config`` part of ``/readyz``: whether the file on disk is the one in force."""
        rejected = self.watcher.rejected
        return {"path": str(self.config.path), "in_force": not rejected, "rejected": rejected}

    def status(self) -> dict[str, object]:
        """The body of ``/status``: the engine's per-webhook detail and totals, and the
        configuration in force (never its secrets: a path, counts and times)."""
        body: dict[str, object] = self.pipeline.status()
        watcher = self.watcher
        rejected = watcher.rejected
        body["config"] = {
            "path": str(self.config.path),
            "webhooks": len(watcher.current.webhooks),
            "generation": watcher.generation,
            "applied_at": round(watcher.applied_at, 3),
            "in_force": not rejected,
            "rejected_problems": len(rejected),
        }
        return body

    def _apply(self, config: Config) -> None:
        """Apply a reloaded configuration (raising leaves the old one in force: the watcher
        counts it as rejected)."""
        self.pipeline.apply_config(config, self.watcher.changed(config))
        self.metrics.config_reloads.labels("applied").inc()
        self.metrics.config_reload_ok.set(1)
        frozen = [
            name
            for name in ("kafka", "schemas", "topics", "retry", "delivery", "metrics", "logging")
            if getattr(config, name) != getattr(self.config, name)
        ]
        if frozen:
            log.warning(
                "config.restart_required",
                extra={"fields": {"sections": frozen, "applied": "webhooks only"}},
            )

    def _rejected(self, error: ConfigError) -> None:
        self.metrics.config_reloads.labels("rejected").inc()
        self.metrics.config_reload_ok.set(0)

    def request_stop(self) -> None:
        """Begin a graceful shutdown (SIGTERM/SIGINT)."""
        if not self.stop_requested.is_set():
            log.info("shutdown.requested")
            self.stop_requested.set()

    async def run(self) -> None:
        """Run until a stop is requested, then drain, commit and leave the group."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        files = self._raise_open_file_limit()
        runner = await start_health_server(
            health_app(
                self.registry,
                lambda: self.pipeline.last_loop,
                self.readiness,
                self.config_state,
                self.status,
            ),
            self.config.metrics.host,
            self.config.metrics.port,
        )
        # Everything built so far (modules, schemas, the configuration) lives as long as the
        # process: frozen, the collector never walks it again; and full collections a tenth as
        # often as CPython's defaults (bridge.ops.collector).
        thresholds = gc.get_threshold()
        collector.settle()
        if self.metrics.enabled:
            self.metrics.collector_time.start()
        watch_task = asyncio.create_task(self.watcher.run())
        run_task = asyncio.create_task(self.pipeline.run())
        if self.group_lag is not None:
            self.group_lag.start()
        log.info(
            "bridge.started",
            extra={
                "fields": {
                    "topics": self.pipeline.topics(),
                    "group": self.config.kafka.group_id,
                    "webhooks": len(self.config.webhooks),
                    "metrics_port": bound_port(runner),  # the real one, also with port 0
                    "open_files_limit": files.soft,
                }
            },
        )
        stop_task = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({run_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        self.pipeline.stopping = True
        try:
            await run_task  # re-raises if the consume loop failed
        finally:
            stop_task.cancel()
            watch_task.cancel()
            if self.group_lag is not None:
                self.group_lag.stop()
            try:
                self.clean = await self._shut_down(runner)
            finally:
                self.metrics.collector_time.stop()
                gc.set_threshold(*thresholds)
        if self.failure is not None:
            raise self.failure

    def _raise_open_file_limit(self) -> OpenFiles:
        """Raise the soft open-file limit to what the delivery settings may hold open; warn
        when the hard limit is lower."""
        delivery = self.config.delivery
        files = raise_open_file_limit(
            wanted_open_files(delivery.max_in_flight, delivery.max_idle_connections)
        )
        if not files.enough:
            detail = (
                "the hard open-file limit is below delivery.max_in_flight + "
                f"delivery.max_idle_connections + {OTHER_FILES}: a connection past it fails its "
                "delivery (connection_error); raise the limit or lower the settings"
            )
            fields = {"soft": files.soft, "hard": files.hard, "wanted": files.wanted}
            log.warning("open_files.limit_low", extra={"fields": {**fields, "detail": detail}})
        return files

    async def _shut_down(self, runner: web.AppRunner) -> bool:
        """Drain, commit, leave the group and flush, all within the shutdown grace period
        whatever the broker does; True when every step finished in time."""
        loop = asyncio.get_running_loop()
        grace = self.config.delivery.shutdown_grace_seconds
        if self.failure is not None:
            grace = min(grace, FAILED_GRACE_S)
        deadline = loop.time() + grace
        unsettled = await self.pipeline.drain(deadline)
        left_group = await run_until(self.consumer.close(), deadline)
        remaining = max(0.0, deadline - loop.time())
        unflushed = await loop.run_in_executor(None, self.producer.close, remaining)
        await self.sender.close()
        await runner.cleanup()
        log.info(
            "bridge.stopped",
            extra={
                "fields": {
                    "undelivered_bridge_records": unflushed,
                    "deliveries_left_for_redelivery": unsettled,
                    "left_group": left_group,
                }
            },
        )
        return left_group and unsettled == 0
