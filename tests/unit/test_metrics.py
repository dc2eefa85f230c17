"""Metrics: status classes, librdkafka statistics, and series bounded whatever the number of
configured webhooks (the tracked set: at most N webhooks with series of their own, failing ones
first, removed ones dropped; every other webhook's traffic under ``(other)``)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter

from bridge.kafka.lag import Reading
from bridge.ops.metrics import (
    END_TO_END_BUCKETS,
    IDLE_AFTER_S,
    NO_WEBHOOK,
    OTHER,
    RECENT_FAILURE_S,
    RX_IDLE_LIMIT_US,
    LoopCounter,
    LoopHistogram,
    Metrics,
    status_class,
)

RUNGS = 5


class FakeClock:
    """Wall time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def received(metrics: Metrics, webhook: str) -> None:
    """What the engine records for an attempt answered 2xx."""
    metrics.delivery_received(webhook, 200, 0.02, 0.05)


def failed(metrics: Metrics, webhook: str, rung: int = 1) -> None:
    """What the engine records for an attempt answered 503 and sent up the ladder."""
    metrics.deliveries.labels(webhook, "failed", status_class(503)).inc()
    metrics.request_duration.labels(webhook).observe(0.3)
    metrics.retries.labels(webhook, str(rung)).inc()


def dead_lettered(metrics: Metrics, webhook: str) -> None:
    """The last attempt failed: the delivery goes to the dead-letter topic."""
    metrics.deliveries.labels(webhook, "failed", "timeout").inc()
    metrics.dead_letters.labels(webhook, "retries_exhausted").inc()


def deferred(metrics: Metrics, webhook: str) -> None:
    """The webhook is stalled: a delivery is parked without an attempt."""
    metrics.deferrals.labels(webhook).inc()


def series(registry: CollectorRegistry) -> list[tuple[str, dict[str, str]]]:
    """Every sample the registry exports: (name, labels)."""
    return [
        (sample.name, sample.labels) for family in registry.collect() for sample in family.samples
    ]


def webhook_labels(registry: CollectorRegistry) -> set[str]:
    """The values of the ``webhook`` label across every exported series."""
    return {labels["webhook"] for _name, labels in series(registry) if "webhook" in labels}


def tracked(registry: CollectorRegistry) -> set[str]:
    """The webhooks that have series of their own."""
    return webhook_labels(registry) - {OTHER, NO_WEBHOOK}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def test_status_class() -> None:
    assert status_class(204) == "2xx"
    assert status_class(302) == "3xx"
    assert status_class(None, "timeout") == "timeout"


def _samples(registry: CollectorRegistry) -> list[tuple[str, list[tuple[str, str]], float]]:
    return sorted(
        (sample.name, sorted(sample.labels.items()), sample.value)
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    )


@pytest.mark.parametrize("seed", range(4))
def test_the_loop_s_series_export_what_prometheus_client_s_own_would(seed: int) -> None:
    """The lock-free counter and histogram of the hot path count exactly as prometheus_client's:
    observations on a bound (in that bound's bucket), between bounds, at 0, beyond the last,
    negative, infinite; by label set."""
    rng = random.Random(seed)
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    metrics = [
        (
            kind("t_hist", "h", ["webhook"], buckets=END_TO_END_BUCKETS, registry=registry),
            kind2("t_count", "c", ["outcome"], registry=registry),
        )
        for kind, kind2, registry in (
            (Histogram, PromCounter, theirs),
            (LoopHistogram, LoopCounter, ours),
        )
    ]
    values = [*END_TO_END_BUCKETS, 0.0, -1.0, float("inf"), 1e9]
    for _ in range(2000):
        amount = rng.choice(values) if rng.random() < 0.5 else rng.uniform(-1, 2000)
        webhook = rng.choice(["a", "b", "c"])
        step = rng.choice([1, 1, 2.5, 0])
        for histogram, counter in metrics:
            histogram.labels(webhook).observe(amount)
            counter.labels(webhook).inc(step)
    assert _samples(ours) == _samples(theirs)
    with pytest.raises(ValueError):
        metrics[1][1].labels("a").inc(-1)


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
    assert up == 1
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


def test_ladder_depth_is_the_lag_of_each_rungs_partitions_assigned_here() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.name_rungs(["tx.retry.1", "tx.retry.2"], "tx.parked")

    def depth(rung: str) -> float | None:
        return registry.get_sample_value("bridge_retry_ladder_depth", {"rung": rung})

    assert [depth(rung) for rung in ("1", "2", "parked")] == [0, 0, 0]
    partitions = {
        "0": {"desired": True, "consumer_lag": 4},
        "1": {"desired": True, "consumer_lag": 5},
        "2": {"desired": False, "consumer_lag": 100},  # not assigned here: another's to count
    }
    metrics.record_statistics(
        {
            "topics": {
                "tx": {"partitions": {"0": {"desired": True, "consumer_lag": 1000}}},
                "tx.retry.1": {"partitions": partitions},
                "tx.parked": {"partitions": {"0": {"desired": True, "consumer_lag": 2}}},
            }
        }
    )
    assert [depth(rung) for rung in ("1", "2", "parked")] == [9, 0, 2]
    metrics.record_statistics({"topics": {}})  # every partition revoked: nothing waits here
    assert [depth(rung) for rung in ("1", "2", "parked")] == [0, 0, 0]


def test_no_broker_up_means_unreachable() -> None:
    metrics = Metrics(CollectorRegistry())
    assert metrics.record_statistics({"brokers": {"boot": {"state": "UP", "nodeid": -1}}}) == 0


def test_disabled_metrics_record_nothing_but_build_info() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, enabled=False)
    metrics.deliveries.labels("hook", "received", "2xx").inc()
    metrics.request_duration.labels("hook").observe(0.1)
    names = {sample.name for family in registry.collect() for sample in family.samples}
    assert names == {"bridge_build_info"}


def test_commit_ages_are_read_at_each_scrape_one_series_per_partition() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    ages = [("tx", 0, 12.3456), ("tx.retry.1", 2, 0.0)]
    metrics.commit_ages.ages = lambda: ages
    text = generate_latest(registry).decode()
    assert 'bridge_commit_age_seconds{partition="0",topic="tx"} 12.346' in text
    assert 'bridge_commit_age_seconds{partition="2",topic="tx.retry.1"} 0.0' in text
    ages = [("tx", 0, 1.0)]  # a partition revoked: its series goes with it
    assert "tx.retry.1" not in generate_latest(registry).decode()


def test_group_figures_show_the_latest_reading_and_nothing_after_a_failed_one() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.name_rungs(["tx.retry.1", "tx.retry.2"], "tx.parked")
    metrics.group.reading = Reading(
        {("tx", 1): 7, ("tx.retry.1", 0): 2, ("tx.retry.1", 1): 3, ("tx.parked", 0): 0},
        {("tx", 1): 12.5, ("tx.retry.1", 0): 0.0, ("tx.retry.1", 1): 4.0, ("tx.parked", 0): 0.0},
    )
    text = generate_latest(registry).decode()
    assert 'bridge_group_lag{partition="1",topic="tx"} 7.0' in text
    assert 'bridge_group_commit_age_seconds{partition="1",topic="tx"} 12.5' in text
    assert 'bridge_group_ladder_depth{rung="1"} 5.0' in text
    assert 'bridge_group_ladder_depth{rung="2"} 0.0' in text  # no partition read: none waiting
    assert 'bridge_group_ladder_depth{rung="parked"} 0.0' in text
    metrics.group.reading = Reading()  # what the app sets when a reading failed: no stale figure
    text = generate_latest(registry).decode()
    assert "bridge_group_lag{" not in text
    assert "bridge_group_commit_age_seconds{" not in text
    assert "bridge_group_ladder_depth{" not in text


# ---- bounded series ----------------------------------------------------------------------------


def traffic(metrics: Metrics) -> None:
    """The same traffic whatever the configuration: a busy healthy webhook, a failing one (up the
    ladder to a dead letter), a stalled one, and a poison record."""
    for _ in range(50):
        received(metrics, "busy")
    for rung in range(1, RUNGS + 1):
        failed(metrics, "down", rung)
    dead_lettered(metrics, "down")
    deferred(metrics, "stalled")
    metrics.dead_letters.labels(NO_WEBHOOK, "truncated").inc()


def test_the_series_count_does_not_grow_with_the_configured_webhooks() -> None:
    exported = {}
    for configured in (10, 10_000):
        registry = CollectorRegistry()
        metrics = Metrics(registry)
        ids = ["busy", "down", "stalled", *(f"idle-{n}" for n in range(configured - 3))]
        metrics.register_webhooks(ids, RUNGS)
        traffic(metrics)
        exported[configured] = series(registry)
        assert len(generate_latest(registry)) < 50_000
    assert len(exported[10]) == len(exported[10_000])
    assert len(exported[10_000]) < 500
    assert {w for _, labels in exported[10_000] for w in [labels.get("webhook")] if w} == {
        "busy",
        "down",
        "stalled",
        OTHER,
    }


def test_configured_webhooks_without_traffic_have_no_series() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.register_webhooks([f"hook-{n}" for n in range(1000)], RUNGS)
    assert tracked(registry) == set()
    assert webhook_labels(registry) == {OTHER}


def test_the_tracked_set_never_exceeds_its_limit_and_other_takes_the_rest() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = Metrics(registry, webhook_series=5, clock=clock)
    hooks = [f"hook-{n}" for n in range(40)]
    metrics.register_webhooks(hooks, RUNGS)
    rng = random.Random(23)
    attempts = 0
    for step in range(3000):
        clock.now += rng.choice((0.001, 1.0, 60.0, IDLE_AFTER_S))
        hook = rng.choice(hooks)
        action = rng.random()
        if action < 0.6:
            received(metrics, hook)
            attempts += 1
        elif action < 0.9:
            failed(metrics, hook)
            attempts += 1
        else:
            deferred(metrics, hook)
        assert len(metrics.webhooks.members) <= 5
        if step % 100 == 0:
            assert tracked(registry) == set(metrics.webhooks.members)
    assert value(registry, "bridge_deliveries_total", webhook=OTHER) > 0
    assert len(metrics.webhooks.failing) == value(registry, "bridge_webhooks_failing")
    assert 0 < value(registry, "bridge_deliveries_total") <= attempts


def test_a_member_series_count_its_traffic_since_it_last_joined() -> None:
    """Members leave and come back (idle, or giving way to failing newcomers): each time a
    webhook joins, its series start from nothing, and while it stays each of its deferrals and
    failed attempts is counted on them (its children are cached while it is a member, never
    after it left)."""
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = Metrics(registry, webhook_series=3, clock=clock)
    hooks = [f"hook-{n}" for n in range(8)]
    metrics.register_webhooks(hooks, RUNGS)
    rng = random.Random(5)
    since_joined: dict[str, Counter[str]] = {}
    rejoined = 0
    for step in range(1500):
        clock.now += rng.choice((0.01, 1.0, IDLE_AFTER_S, RECENT_FAILURE_S))
        hook = rng.choice(hooks)
        before = metrics.webhooks.members.get(hook)
        kind = rng.choice(("deferred", "failed", "received"))
        {"deferred": deferred, "failed": failed, "received": received}[kind](metrics, hook)
        member = metrics.webhooks.members.get(hook)
        if member is None:
            continue
        if member is not before:
            rejoined += before is None and hook in since_joined
            since_joined[hook] = Counter()
        since_joined[hook][kind] += 1
        for webhook in metrics.webhooks.members if step % 25 == 0 else (hook,):
            counts = since_joined[webhook]
            assert value(registry, "bridge_deferrals_total", webhook=webhook) == counts["deferred"]
            assert (
                value(registry, "bridge_deliveries_total", webhook=webhook, outcome="failed")
                == counts["failed"]
            )
    assert rejoined > 200, "members left and came back"


def test_a_failing_newcomer_takes_the_place_of_the_first_failure_to_age() -> None:
    """Every member failing lately (an outage): a failing newcomer goes to OTHER until a
    member's last failure is RECENT_FAILURE_S old, then takes its place. (While none can give
    way the members are not scanned again for each failed delivery: 70 µs each with 1,000.)"""
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = Metrics(registry, webhook_series=3, clock=clock)
    metrics.register_webhooks(["a", "b", "c", "d"], RUNGS)
    start = clock.now
    for hook in ("a", "b", "c"):  # failing at start, start + 10, start + 20
        failed(metrics, hook)
        clock.now += 10
    clock.now = start + 550
    for hook in ("a", "b", "c"):
        received(metrics, hook)  # active lately: no member gives way as idle
    for later in (560.0, 590.0, 599.0):
        clock.now = start + later
        failed(metrics, "d")
        assert set(metrics.webhooks.members) == {"a", "b", "c"}, later
    clock.now = start + RECENT_FAILURE_S  # a's failure is that old now
    failed(metrics, "d")
    assert set(metrics.webhooks.members) == {"b", "c", "d"}


def test_counts_are_exact_while_no_member_gives_its_place() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, webhook_series=2)
    metrics.register_webhooks(["a", "b", "c", "d"], RUNGS)
    for hook in ("a", "b", "c", "d", "a", "c"):
        received(metrics, hook)
    assert tracked(registry) == {"a", "b"}
    assert value(registry, "bridge_deliveries_total", webhook="a") == 2
    assert value(registry, "bridge_deliveries_total", webhook=OTHER) == 3
    assert value(registry, "bridge_deliveries_total") == 6
    assert value(registry, "bridge_end_to_end_latency_seconds_count") == 6


def test_a_failing_webhook_takes_the_place_of_the_least_recently_active_healthy_one() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = Metrics(registry, webhook_series=2, clock=clock)
    metrics.register_webhooks(["a", "b", "c", "d", "e"], RUNGS)
    received(metrics, "a")
    clock.now += 1
    received(metrics, "b")
    clock.now += 1
    received(metrics, "c")  # healthy and the set is full: counted under (other)
    assert tracked(registry) == {"a", "b"}
    failed(metrics, "d")  # failing: takes the place of "a", the least recently active
    assert tracked(registry) == {"b", "d"}
    assert value(registry, "bridge_webhook_failing_since_timestamp_seconds", webhook="d") == (
        clock.now
    )
    deferred(metrics, "e")  # stalled counts as failing: takes the place of "b"
    assert tracked(registry) == {"d", "e"}
    failed(metrics, "c")  # every member is failing: nobody gives way
    assert tracked(registry) == {"d", "e"}
    assert value(registry, "bridge_webhooks_failing") == 3
    assert value(registry, "bridge_deliveries_total", webhook=OTHER, outcome="failed") == 1


def test_a_member_that_failed_recently_keeps_its_place_against_failing_newcomers() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = Metrics(registry, webhook_series=1, clock=clock)
    metrics.register_webhooks(["flaky", "down"], RUNGS)
    failed(metrics, "flaky")
    received(metrics, "flaky")  # healthy now, but failed a moment ago
    failed(metrics, "down")
    assert tracked(registry) == {"flaky"}
    clock.now += RECENT_FAILURE_S - 1
    received(metrics, "flaky")
    failed(metrics, "down")
    assert tracked(registry) == {"flaky"}
    clock.now += 1
    failed(metrics, "down")
    assert tracked(registry) == {"down"}


def test_an_idle_member_gives_its_place_to_a_newcomer() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = Metrics(registry, webhook_series=1, clock=clock)
    metrics.register_webhooks(["old", "new"], RUNGS)
    received(metrics, "old")
    clock.now += IDLE_AFTER_S - 1
    received(metrics, "new")
    assert tracked(registry) == {"old"}
    clock.now += 1
    received(metrics, "new")
    assert tracked(registry) == {"new"}


def test_failing_since_marks_the_start_of_a_run_of_failures_until_a_2xx() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = Metrics(registry, clock=clock)
    metrics.register_webhooks(["down"], RUNGS)
    began = clock.now
    failed(metrics, "down", 1)
    clock.now += 30
    failed(metrics, "down", 2)
    deferred(metrics, "down")
    since = "bridge_webhook_failing_since_timestamp_seconds"
    assert registry.get_sample_value(since, {"webhook": "down"}) == began
    assert registry.get_sample_value("bridge_webhooks_failing") == 1
    received(metrics, "down")
    assert registry.get_sample_value(since, {"webhook": "down"}) is None
    assert registry.get_sample_value("bridge_webhooks_failing") == 0
    clock.now += 30
    failed(metrics, "down")
    assert registry.get_sample_value(since, {"webhook": "down"}) == clock.now


def test_a_removed_webhook_loses_its_series_and_its_failing_state() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.register_webhooks(["gone", "kept"], RUNGS)
    for rung in range(1, RUNGS + 1):
        failed(metrics, "gone", rung)
    dead_lettered(metrics, "gone")
    deferred(metrics, "gone")
    received(metrics, "kept")
    assert tracked(registry) == {"gone", "kept"}
    metrics.register_webhooks(["kept"], RUNGS)
    assert tracked(registry) == {"kept"}
    assert registry.get_sample_value("bridge_webhooks_failing") == 0
    # A retry of the removed webhook that comes due is dead-lettered under (other).
    metrics.dead_letters.labels("gone", "webhook_removed").inc()
    failed(metrics, "gone")
    assert tracked(registry) == {"kept"}
    assert (
        value(registry, "bridge_dead_letters_total", webhook=OTHER, reason="webhook_removed") == 1
    )
    assert registry.get_sample_value("bridge_webhooks_failing") == 0


def test_poison_dead_letters_keep_their_empty_webhook_label() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, webhook_series=0)
    metrics.register_webhooks(["a"], RUNGS)
    metrics.dead_letters.labels(NO_WEBHOOK, "corrupt").inc()
    assert value(registry, "bridge_dead_letters_total", webhook=NO_WEBHOOK, reason="corrupt") == 1


def test_a_broker_silent_for_longer_than_the_limit_is_not_up() -> None:
    """A connection whose packets are dropped stays UP in librdkafka's eyes for a minute; its
    silence (rxidle) says it is gone."""
    metrics = Metrics(CollectorRegistry())

    def up(rxidle: int) -> bool:
        broker = {"state": "UP", "nodeid": 1, "rxidle": rxidle}
        return metrics.record_statistics({"brokers": {"b/1": broker}}) == 1

    assert up(2_000_000) is True
    assert up(-1) is True  # nothing received yet: connecting, not silent
    assert up(RX_IDLE_LIMIT_US) is False
    assert up(RX_IDLE_LIMIT_US * 4) is False


def test_a_webhook_id_given_to_another_account_loses_the_old_one_s_series_and_failing_state() -> (
    None
):
    """The tracked set is kept by id: after a reload gave the id to another account holder,
    ``/status``, the failing gauge and the series showed the old webhook's failures as the new
    one's. Its series go (a counter that starts again), and its failing state."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.register_webhooks(["moved", "kept"], RUNGS)
    failed(metrics, "moved")
    failed(metrics, "kept")
    assert tracked(registry) == {"moved", "kept"}
    assert registry.get_sample_value("bridge_webhooks_failing") == 2
    metrics.register_webhooks(["moved", "kept"], RUNGS)  # (the id is still configured)
    metrics.forget_webhooks(["moved"])
    assert tracked(registry) == {"kept"}
    assert registry.get_sample_value("bridge_webhooks_failing") == 1
    assert "moved" not in metrics.webhooks.failing
    received(metrics, "moved")  # the new webhook's own traffic: series of its own again
    assert tracked(registry) == {"moved", "kept"}
    assert value(registry, "bridge_deliveries_total", webhook="moved") == 1, "only its own"
