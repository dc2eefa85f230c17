"""Prometheus metrics of the bridge, on a registry passed in (tests use a fresh one).

The series count does not grow with the number of configured webhooks. Series labelled by webhook
exist only for a bounded set of webhooks (:class:`TrackedWebhooks`: at most ``webhook_series``,
failing or stalled ones first, then the most recently active); the traffic of every other webhook
is counted under ``webhook="(other)"``, so sums over webhooks count every event. Other labels are
bounded by the code: outcome, status class, rung, reason, kind, and topic and partition of the
bridge's own topics. Never a URL, a transaction or an account.

At 10,000 configured webhooks a scrape is about a hundred series plus two per assigned partition,
and at most about 30 more per tracked webhook: milliseconds to render with the default ten tracked
webhooks, about 0.15-0.2 s with the most (1,000), so ``/metrics`` is written in slices that give
the event loop back (:mod:`bridge.ops.exposition`).

The series written per delivery or per record are written on the event loop's thread only, and
take no lock (:class:`LoopCounter`, :class:`LoopHistogram`); the others may be written from the
Kafka clients' threads and keep prometheus_client's.
"""

from __future__ import annotations

import contextlib
import platform
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from bridge import __version__
from bridge.kafka.lag import Reading
from bridge.ops.collector import CollectorTime

# Webhook deliveries take milliseconds to seconds and time out at 10 s by default.
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
# First attempts arrive within tens of milliseconds; the retry ladder adds seconds, parking in the
# delay topics (30 s a time by default) minutes.
END_TO_END_BUCKETS = (0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0)
LATENESS_BUCKETS = (0.005, 0.025, 0.1, 0.5, 2.5)

RX_IDLE_LIMIT_US = 15_000_000
"""A broker connection silent this long (microseconds; librdkafka's ``rxidle``) is not counted as
up for readiness."""
DEFAULT_WEBHOOK_SERIES = 10
# A member of the tracked set without traffic for this long gives its place to a newcomer.
IDLE_AFTER_S = 600.0
# A member with a failure this recent keeps its place when a failing newcomer comes (no churn
# among webhooks that fail on and off).
RECENT_FAILURE_S = 600.0
# The ``webhook`` label of the webhooks outside the tracked set (not a valid webhook id).
OTHER = "(other)"
# The ``webhook`` label of dead letters that belong to no webhook (poison records).
NO_WEBHOOK = ""

_Series = tuple[MetricWrapperBase, tuple[str, ...]]


def status_class(status: int | None, error_reason: str = "") -> str:
    """The ``status_class`` label: ``2xx`` to ``5xx`` for an answer, else the error kind."""
    if status is not None:
        return f"{status // 100}xx"
    return error_reason or "error"


@dataclass(slots=True)
class _Member:
    """A tracked webhook: when it last had traffic and last failed, and every series labelled
    with it."""

    last_seen: float
    last_failure: float = float("-inf")
    series: set[_Series] = field(default_factory=set)
    received: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)  # by HTTP status
    children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = field(default_factory=dict)
    """Its series' children by metric and the labels after ``webhook`` (they go with it)."""


class TrackedWebhooks:
    """Which webhooks get series of their own (at most ``limit``), and which ones fail now.

    A webhook joins on its first traffic while there is room. Once the set is full, a newcomer
    takes the place of the member idle longest if that one has had no traffic for
    ``IDLE_AFTER_S``; a failing or stalled newcomer also takes the place of the least recently
    active member without a failure in ``RECENT_FAILURE_S``. Otherwise the newcomer's traffic
    counts under ``OTHER``.
    A member leaves when it gives its place or is removed from the configuration, and its series
    go with it. Whether a webhook fails now (its latest attempt was not received, or a delivery
    was parked because it is stalled) is kept for every configured webhook.
    """

    def __init__(
        self,
        limit: int,
        failing_since: Gauge,
        failing_count: Gauge,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limit = limit
        self.clock = clock
        self.members: OrderedDict[str, _Member] = OrderedDict()  # least recently active first
        self.failing: dict[str, float] = {}  # webhook -> when its current run of failures began
        self.configured: frozenset[str] | None = None  # None: every webhook id is accepted
        self._failing_since = failing_since
        self._failing_count = failing_count
        self._all_failed_until = float("-inf")  # no member can give way to a failing one before

    def enter(self, webhook: str, failing: bool | None) -> _Member | None:
        """Record traffic of ``webhook``; its member record, or None when it is not tracked (its
        traffic counts under ``OTHER``).

        ``failing`` says what the traffic tells: True for an attempt not received or a deferral,
        False for an attempt received, None for nothing new (a duration, a dead letter).
        """
        now = self.clock()
        configured = self.configured is None or webhook in self.configured
        if failing is not None and configured:
            self._mark(webhook, failing, now)
        member = self.members.get(webhook)
        if member is None:
            if not configured:
                return None
            member = self._admit(webhook, bool(failing), now)
        else:
            member.last_seen = now
            self.members.move_to_end(webhook)
        if failing and member is not None:
            member.last_failure = now
        return member

    def own(self, webhook: str, metric: MetricWrapperBase, values: tuple[str, ...]) -> None:
        """Note that ``metric`` has a series ``values`` of the tracked ``webhook``."""
        member = self.members.get(webhook)
        if member is not None:
            member.series.add((metric, values))

    def configure(self, webhooks: Iterable[str]) -> None:
        """The webhooks now configured: every other one leaves the set and the failing list."""
        self.configured = frozenset(webhooks)
        for webhook in [w for w in {*self.members, *self.failing} if w not in self.configured]:
            self.forget(webhook)

    def forget(self, webhook: str) -> None:
        """Drop ``webhook``'s series and failing state: it is no longer configured, or its id now
        names another account holder's webhook (what the old one did is not the new one's)."""
        if webhook in self.members:
            self._evict(webhook)
        if self.failing.pop(webhook, None) is not None:
            self._failing_count.set(len(self.failing))

    def _mark(self, webhook: str, failing: bool, now: float) -> None:
        if failing:
            if webhook in self.failing:
                return
            self.failing[webhook] = now
            if webhook in self.members:
                self._show_failing(webhook)
        elif self.failing.pop(webhook, None) is not None:
            member = self.members.get(webhook)
            if member is not None:
                values = (webhook,)
                member.series.discard((self._failing_since, values))
                with contextlib.suppress(KeyError):
                    self._failing_since.remove(*values)
        else:
            return
        self._failing_count.set(len(self.failing))

    def _show_failing(self, webhook: str) -> None:
        self._failing_since.labels(webhook).set(self.failing[webhook])
        self.members[webhook].series.add((self._failing_since, (webhook,)))

    def _admit(self, webhook: str, failing: bool, now: float) -> _Member | None:
        if len(self.members) >= self.limit:
            victim = self._victim(failing, now)
            if victim is None:
                return None
            self._evict(victim)
        member = self.members[webhook] = _Member(now)
        self._all_failed_until = float("-inf")  # (the newcomer may have no failure)
        if webhook in self.failing:
            self._show_failing(webhook)
        return member

    def _victim(self, failing: bool, now: float) -> str | None:
        """The member that gives its place to a newcomer, if any."""
        if not self.members:
            return None
        oldest, member = next(iter(self.members.items()))
        if now - member.last_seen >= IDLE_AFTER_S:
            return oldest
        if failing and now >= self._all_failed_until:
            victim = next(
                (w for w, m in self.members.items() if now - m.last_failure >= RECENT_FAILURE_S),
                None,
            )
            if victim is None:  # failures only move later: none gives way before the first ages
                first = min(m.last_failure for m in self.members.values())
                self._all_failed_until = first + RECENT_FAILURE_S
            return victim
        return None

    def _evict(self, webhook: str) -> None:
        member = self.members.pop(webhook)
        for metric, values in member.series:
            with contextlib.suppress(KeyError):
                metric.remove(*values)


class _ByWebhook:
    """A metric whose first label is a webhook id, recorded under the id's bounded label."""

    def __init__(
        self,
        metric: MetricWrapperBase,
        webhooks: TrackedWebhooks,
        failing: Callable[[tuple[str, ...]], bool | None] = lambda _rest: None,
    ) -> None:
        self.metric = metric
        self.webhooks = webhooks
        self.failing = failing

    def labels(self, webhook: str, *rest: str) -> Any:
        """The child for ``webhook`` (its own series when tracked, else ``OTHER``'s).

        A tracked webhook's children are kept on its member record (a parked record of nine
        webhooks asks for nine deferral children): they are removed from the metric only when
        the member leaves, and the cache goes with it."""
        metric = self.metric
        if webhook == NO_WEBHOOK:
            return metric.labels(webhook, *rest)
        member = self.webhooks.enter(webhook, self.failing(rest))
        if member is None or webhook == OTHER:  # (OTHER's series is nobody's to own)
            return metric.labels(OTHER, *rest)
        key = (metric, rest)
        child = member.children.get(key)
        if child is None:
            values = (webhook, *rest)
            member.series.add((metric, values))
            child = member.children[key] = metric.labels(*values)
        return child


class _ByRung:
    """The retries counter: called with the webhook id like the others, labelled by rung only (a
    failing webhook's attempts are in ``bridge_deliveries_total`` already)."""

    def __init__(self, metric: MetricWrapperBase) -> None:
        self.metric = metric

    def labels(self, _webhook: str, rung: str) -> Any:
        """The child for ``rung``."""
        return self.metric.labels(rung)


class _LoopValue:
    """A series' value written by one thread only, the event loop's: no lock to take.

    prometheus_client guards every value with a lock (two acquisitions per histogram
    observation), a third of the metrics' cost per delivery. The hot path's series are written
    on the event loop only (attempts, records taken), and read there at a scrape as well."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = 0.0

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, _timestamp: float | None = None) -> None:
        self._value = value

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> None:
        return None


class LoopCounter(Counter):
    """A counter written on the event loop only (:class:`_LoopValue`)."""

    def _metric_init(self) -> None:
        self._value = _LoopValue()
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        """Add ``amount`` (not negative)."""
        if amount < 0 or exemplar:
            raise ValueError("a counter only goes up, and without exemplars")
        self._value.inc(amount)


class LoopHistogram(Histogram):
    """A histogram written on the event loop only (:class:`_LoopValue`), its bucket found by
    bisection; an observation equal to a bound counts in that bound's bucket, as in
    prometheus_client."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._sum = _LoopValue()
        self._buckets = [_LoopValue() for _bound in self._upper_bounds]

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Count ``amount`` in the first bucket whose bound is not below it (NaN in none, as in
        prometheus_client)."""
        if exemplar:
            raise ValueError("exemplars are not recorded on the loop's series")
        self._sum.inc(amount)
        if amount == amount:
            self._buckets[bisect_left(self._upper_bounds, amount)].inc(1)


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

    def set_function(self, _read: Callable[[], float]) -> None:
        pass

    def remove(self, *_args: str) -> None:
        pass


class CommitAges:
    """``bridge_commit_age_seconds``, read at each scrape from ``ages`` (set by the engine):
    per assigned partition, how long its commit has been held back by unfinished records."""

    def __init__(self) -> None:
        self.ages: Callable[[], Iterable[tuple[str, int, float]]] = tuple

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "bridge_commit_age_seconds",
            "Seconds since the committed position of each assigned partition last moved while "
            "records taken from it are unfinished; 0 when none is (the retry rungs hold theirs "
            "until due).",
            labels=["topic", "partition"],
        )
        for topic, partition, age in self.ages():
            family.add_metric([topic, str(partition)], round(age, 3))
        yield family


class GroupFigures:
    """The consumer group's figures, read from the cluster by :class:`bridge.kafka.lag.GroupLag`
    (``reading`` replaced whole by the reader's thread, read at each scrape; empty while the
    last reading failed): every partition of the bridge's topics, whoever holds it. Every
    replica reports the same group: take the max across replicas."""

    def __init__(self) -> None:
        self.reading = Reading()
        self.rung_of: Mapping[str, str] = {}  # delay topic -> rung label (Metrics.name_rungs)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        reading = self.reading
        lag, commit_age = reading.lag, reading.commit_age
        lags = GaugeMetricFamily(
            "bridge_group_lag",
            "Records between the consumer group's committed offset and the end of each "
            "partition of the bridge's topics, held by a replica or not (read from the cluster "
            "every 5 s; every replica reports the same group: take the max).",
            labels=["topic", "partition"],
        )
        ages = GaugeMetricFamily(
            "bridge_group_commit_age_seconds",
            "Seconds the consumer group's committed offset of each partition has not moved "
            "while records wait behind it, held by a replica or not; 0 when none wait (read "
            "every 5 s, so up to 5 s short; take the max across replicas).",
            labels=["topic", "partition"],
        )
        depth = GaugeMetricFamily(
            "bridge_group_ladder_depth",
            "Deliveries waiting in each rung of the retry ladder (rung 1.., and parked): the "
            "group's lag on the rung's delay topic, all partitions (take the max across "
            "replicas).",
            labels=["rung"],
        )
        waiting = dict.fromkeys(self.rung_of.values(), 0) if lag else {}
        for (topic, partition), behind in sorted(lag.items()):
            lags.add_metric([topic, str(partition)], behind)
            ages.add_metric([topic, str(partition)], commit_age.get((topic, partition), 0.0))
            rung = self.rung_of.get(topic)
            if rung is not None:
                waiting[rung] += behind
        for rung, count in waiting.items():
            depth.add_metric([rung], count)
        yield from (lags, ages, depth)


class Metrics:
    """Every metric the bridge exports, registered on ``registry``.

    ``webhook_series`` bounds how many webhooks have series of their own (:class:`TrackedWebhooks`).
    With ``enabled=False`` nothing is recorded (only ``bridge_build_info`` is exported): the
    benchmark uses it to measure what metrics cost the hot path.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        enabled: bool = True,
        webhook_series: int = DEFAULT_WEBHOOK_SERIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.enabled = enabled
        self.records_consumed = LoopCounter(
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
        self.webhook_failing_since = Gauge(
            "bridge_webhook_failing_since_timestamp_seconds",
            "When the current run of failed attempts (or deferrals) of a tracked webhook began; "
            "present while its latest attempt was not received.",
            ["webhook"],
            registry=registry,
        )
        self.webhooks_failing = Gauge(
            "bridge_webhooks_failing",
            "Configured webhooks whose latest attempt was not received or that are stalled, "
            "tracked or not.",
            registry=registry,
        )
        self.webhooks = TrackedWebhooks(
            webhook_series, self.webhook_failing_since, self.webhooks_failing, clock
        )
        by_webhook = "by webhook (the tracked ones; the others as (other))"
        self._deliveries = LoopCounter(
            "bridge_deliveries",
            f"HTTP delivery attempts {by_webhook}, outcome and status class.",
            ["webhook", "outcome", "status_class"],
            registry=registry,
        )
        self._request_duration = LoopHistogram(
            "bridge_request_duration_seconds",
            f"Duration of delivery HTTP requests, {by_webhook}.",
            ["webhook"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self._end_to_end = LoopHistogram(
            "bridge_end_to_end_latency_seconds",
            f"From the source record's timestamp to the 2xx answer of the webhook, {by_webhook}.",
            ["webhook"],
            buckets=END_TO_END_BUCKETS,
            registry=registry,
        )
        self._retries = Counter(
            "bridge_retries_scheduled",
            "Deliveries handed to a delay topic, by rung.",
            ["rung"],
            registry=registry,
        )
        self._deferrals = Counter(
            "bridge_deferrals",
            f"Deliveries parked in a delay topic without using an attempt (webhook saturated), "
            f"{by_webhook}.",
            ["webhook"],
            registry=registry,
        )
        self._dead_letters = Counter(
            "bridge_dead_letters",
            f"Records written to the dead-letter topic, {by_webhook}, empty for poison records, "
            "and reason.",
            ["webhook", "reason"],
            registry=registry,
        )
        self.deliveries = _ByWebhook(
            self._deliveries, self.webhooks, lambda rest: rest[0] != "received"
        )
        self.request_duration = _ByWebhook(self._request_duration, self.webhooks)
        self.end_to_end = _ByWebhook(self._end_to_end, self.webhooks)
        self.retries = _ByRung(self._retries)
        self.deferrals = _ByWebhook(self._deferrals, self.webhooks, lambda _rest: True)
        self.dead_letters = _ByWebhook(self._dead_letters, self.webhooks)
        self._other_received: dict[int, tuple[Any, Any, Any]] = {}
        self.retry_lateness = LoopHistogram(
            "bridge_retry_lateness_seconds",
            "How late a retry was taken from its delay topic, after its due time.",
            buckets=LATENESS_BUCKETS,
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
        self.brokers_reachable = Gauge(
            "bridge_kafka_brokers_reachable",
            "Kafka brokers connected and heard from in the last 15 s (librdkafka's statistics, "
            "every 5 s); 0 when none is.",
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
        self.ladder_depth = Gauge(
            "bridge_retry_ladder_depth",
            "Deliveries waiting in each rung of the retry ladder (rung 1.., and parked): the lag "
            "of the rung's delay-topic partitions assigned here (librdkafka's statistics).",
            ["rung"],
            registry=registry,
        )
        self.commit_ages = CommitAges()
        self.group = GroupFigures()
        self.collector_time = CollectorTime()  # counts once the service starts it
        if enabled:
            registry.register(self.commit_ages)
            registry.register(self.group)
            registry.register(self.collector_time)
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
                if isinstance(metric, _ByWebhook | _ByRung):
                    setattr(self, name, _Unrecorded())
                elif isinstance(metric, MetricWrapperBase) and metric is not self.build_info:
                    registry.unregister(metric)
                    if not name.startswith("_"):
                        setattr(self, name, _Unrecorded())
        self.consumed_source = self.records_consumed.labels("source")  # the hot path's children
        self.consumed_retry = self.records_consumed.labels("retry")

    def delivery_received(
        self, webhook: str, status: int, duration: float, end_to_end: float
    ) -> None:
        """Count one 2xx answer and observe its durations (the hot path: children are cached)."""
        if not self.enabled:
            return
        member = self.webhooks.enter(webhook, False)
        cache = self._other_received if member is None else member.received
        children = cache.get(status)
        if children is None:
            label = OTHER if member is None else webhook
            children = cache[status] = (
                self._own(self._deliveries, label, "received", status_class(status)),
                self._own(self._request_duration, label),
                self._own(self._end_to_end, label),
            )
        children[0].inc()
        children[1].observe(duration)
        children[2].observe(end_to_end)

    def _own(self, metric: MetricWrapperBase, *values: str) -> Any:
        if values[0] != OTHER:
            self.webhooks.own(values[0], metric, values)
        return metric.labels(*values)

    def register_webhooks(self, webhook_ids: Iterable[str], rungs: int) -> None:
        """Take the configured webhooks (removed ones lose their series) and create the main
        series of ``OTHER`` and of each rung at zero, so rates see their first events."""
        if not self.enabled:
            return
        self.webhooks.configure(webhook_ids)
        self._deliveries.labels(OTHER, "received", "2xx")
        self._deliveries.labels(OTHER, "failed", "5xx")
        self._request_duration.labels(OTHER)
        self._end_to_end.labels(OTHER)
        self._dead_letters.labels(OTHER, "retries_exhausted")
        for rung in range(1, rungs + 1):
            self._retries.labels(str(rung))

    def forget_webhooks(self, webhook_ids: Iterable[str]) -> None:
        """Webhook ids that now name another account holder's webhooks (see
        :meth:`TrackedWebhooks.forget`)."""
        if not self.enabled:
            return
        for webhook_id in webhook_ids:
            self.webhooks.forget(webhook_id)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop the per-partition series of a partition no longer assigned here."""
        for gauge in (self.consumer_lag, self.committed_offset):
            with contextlib.suppress(KeyError):
                gauge.remove(topic, str(partition))

    def name_rungs(self, delay_topics: Iterable[str], parked_topic: str) -> None:
        """Which topic is which rung, for ``bridge_retry_ladder_depth`` (each at 0 at first)."""
        rung_of = {topic: str(rung) for rung, topic in enumerate(delay_topics, 1)}
        rung_of[parked_topic] = "parked"
        self.group.rung_of = rung_of  # one mapping, read by the statistics and the group's figures
        for rung in rung_of.values():
            self.ladder_depth.labels(rung).set(0)

    def record_statistics(self, stats: dict[str, object]) -> int:
        """Update lag, committed offsets and the brokers reachable from librdkafka statistics;
        return how many brokers are up:
        connected, and heard from in the last :data:`RX_IDLE_LIMIT_US` (a member of a group hears
        from its coordinator at every heartbeat, 3 s, and a fetching consumer from its brokers at
        least every ``fetch.wait.max.ms``). A connection whose packets are silently dropped (a
        network cut) stays "UP" until librdkafka's requests time out, a minute by default; its
        silence shows at once."""
        topics = stats.get("topics", {})
        rung_of = self.group.rung_of
        depth = dict.fromkeys(rung_of.values(), 0)
        for topic, data in topics.items() if isinstance(topics, dict) else ():
            for partition, info in data.get("partitions", {}).items():
                if partition == "-1" or not info.get("desired"):
                    continue
                if info.get("consumer_lag", -1) >= 0:
                    self.consumer_lag.labels(topic, partition).set(info["consumer_lag"])
                    if topic in rung_of:
                        depth[rung_of[topic]] += info["consumer_lag"]
                if info.get("committed_offset", -1) >= 0:
                    self.committed_offset.labels(topic, partition).set(info["committed_offset"])
        for rung, waiting in depth.items():
            self.ladder_depth.labels(rung).set(waiting)
        brokers = stats.get("brokers", {})
        reachable = sum(
            1
            for b in (brokers.values() if isinstance(brokers, dict) else ())
            if b.get("state") == "UP"
            and b.get("nodeid", -1) >= 0
            and b.get("rxidle", -1) < RX_IDLE_LIMIT_US
        )
        self.brokers_reachable.set(reachable)
        return reachable
