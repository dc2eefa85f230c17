"""The ``/metrics`` text written in slices: the same bytes as ``generate_latest`` for every kind of
metric and label value, and the event loop given back while a large registry is written."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator

import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bridge.core.slices import Slices
from bridge.kafka.lag import Reading
from bridge.ops import exposition
from bridge.ops.exposition import render
from bridge.ops.metrics import Metrics, status_class


def rendered(registry: CollectorRegistry, slices: Slices | None = None) -> bytes:
    return asyncio.run(render(registry, slices))


def bridge_registry(webhooks: int) -> CollectorRegistry:
    """The bridge's own metrics, ``webhooks`` of them tracked with traffic of every kind, the
    partitions' and the group's figures set."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, webhook_series=webhooks)
    ids = [f"wh-{n}" for n in range(webhooks + 3)]  # (three more than tracked: under (other))
    metrics.register_webhooks(ids, 3)
    metrics.name_rungs(["tx.retry.1", "tx.retry.2", "tx.retry.3"], "tx.parked")
    for n, webhook in enumerate(ids):
        metrics.delivery_received(webhook, 200 + n % 3, 0.02 * n, 0.5 * n)
        if n % 4 == 0:
            metrics.deliveries.labels(webhook, "failed", status_class(503)).inc()
            metrics.retries.labels(webhook, "1").inc()
        if n % 5 == 0:
            metrics.deferrals.labels(webhook).inc()
            metrics.dead_letters.labels(webhook, "retries_exhausted").inc()
    partitions = {str(p): {"desired": True, "consumer_lag": p} for p in range(8)}
    metrics.record_statistics(
        {
            "brokers": {"b/1": {"state": "UP", "nodeid": 1, "rxidle": 0}},
            "topics": {"tx": {"partitions": partitions}},
        }
    )
    metrics.commit_ages.ages = lambda: [("tx", 0, 1.25), ("tx", 1, 0.0)]
    metrics.group.reading = Reading({("tx", 1): 7}, {("tx", 1): 12.5})
    return registry


def test_the_bridges_metrics_render_as_generate_latest_writes_them() -> None:
    registry = bridge_registry(200)
    assert rendered(registry) == generate_latest(registry)


def test_every_kind_of_metric_and_odd_label_values_render_as_generate_latest_writes_them() -> None:
    registry = CollectorRegistry()
    Counter("plain", "A counter\nover two lines, with a \\ in it.", registry=registry).inc(3)
    Counter("empty_family", "Labelled, no child yet.", ["a"], registry=registry)
    labelled = Gauge("labelled", "g", ["b", "a"], registry=registry)
    for value in ['quote " here', "back\\slash", "new\nline", "ünïcödé ✓", "", "a,b=c}"]:
        labelled.labels(value, value[::-1]).set(float("inf") if not value else -1.5e-7)
    Histogram("latency", "h", ["route"], buckets=(0.1, 1.0), registry=registry).labels("x").observe(
        0.5
    )
    Summary("sizes", "s", registry=registry).observe(12)
    Info("build", "i", registry=registry).info({"version": "1.0"})
    Enum("state", "e", states=["a", "b"], registry=registry).state("b")
    Gauge("nan_gauge", "n", registry=registry).set(float("nan"))

    class Custom:
        def collect(self) -> list[object]:
            counter = CounterMetricFamily("custom_events", "c", labels=["k"])
            counter.add_metric(["v"], 2, timestamp=1_700_000_000.123)
            gauge = GaugeMetricFamily("custom_level", "g")
            gauge.add_metric([], 4)
            return [counter, gauge]

    registry.register(Custom())  # type: ignore[arg-type]
    assert rendered(registry) == generate_latest(registry)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.text(max_size=12), min_size=1, max_size=6),
    numbers=st.lists(
        st.floats(allow_nan=False) | st.integers(-(2**70), 2**70).map(float), min_size=1
    ),
)
def test_any_label_value_and_number_renders_as_generate_latest_writes_it(
    values: list[str], numbers: list[float]
) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("g", "any", ["v"], registry=registry)
    for value, number in zip(values, itertools.cycle(numbers), strict=False):
        gauge.labels(value).set(number)
    assert rendered(registry) == generate_latest(registry)


def test_a_registry_with_target_info_renders_in_one_piece_and_the_same() -> None:
    registry = CollectorRegistry(target_info={"service": "bridge"})
    Counter("c", "c", registry=registry).inc()
    assert rendered(registry) == generate_latest(registry)


def test_a_large_registry_gives_the_loop_back_while_it_is_written() -> None:
    """1,000 tracked webhooks (about 32,000 samples): with a clock that says every slice is over
    the moment it is looked at, the loop is given back every ``_CHECK_EVERY`` samples; and on a
    real event loop, another task runs between the slices (nothing measured against a time)."""
    registry = bridge_registry(1000)
    expected = generate_latest(registry)
    samples = expected.count(b"\n") - expected.count(b"\n#")
    pauses = []

    async def pause() -> None:
        pauses.append(1)

    ticks = itertools.count()
    text = rendered(registry, Slices(pause, lambda: float(next(ticks)), slice_s=0.5))
    assert text == expected
    assert len(pauses) >= samples // exposition._CHECK_EVERY - 1

    async def beside() -> tuple[int, int]:
        turns = 0
        done = False

        async def other() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        runner = asyncio.create_task(other())
        await asyncio.sleep(0)
        slices = []

        async def counted_pause() -> None:
            slices.append(1)
            await asyncio.sleep(0)

        before = turns
        await render(registry, Slices(counted_pause, slice_s=0.0))
        between = turns - before
        done = True
        await runner
        return between, len(slices)

    between, slices = asyncio.run(beside())
    assert slices >= samples // exposition._CHECK_EVERY - 1
    assert between >= slices


def test_what_the_render_held_the_loop_for_excludes_the_turns_given_away() -> None:
    """The held time is the sum of the slices: the clock's time inside the pauses is not in it."""
    registry = bridge_registry(50)
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # 1 ms a look
        return now[0]

    async def pause() -> None:
        now[0] += 10.0  # the loop away for 10 s

    slices = Slices(pause, clock, slice_s=0.0)
    text = asyncio.run(render(registry, slices))
    held = slices.held
    assert text == generate_latest(registry)
    assert 0 < held < 10.0


def test_other_threads_get_the_interpreter_between_the_slices() -> None:
    """A call to the executor (how the consumer takes records from Kafka) made while a large
    registry is being written returns before the writing ends. Between slices that only turned
    the loop (``sleep(0)``), the executor's thread never got the interpreter's lock until the
    render ended, on asyncio's loop and on uvloop's alike."""
    registry = bridge_registry(1000)

    async def race() -> list[str]:
        order: list[str] = []
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, time.sleep, 0)  # (its thread started beforehand)
        writing = asyncio.create_task(render(registry))
        writing.add_done_callback(lambda _task: order.append("render"))
        await asyncio.sleep(0)  # (the render's first slice)
        await loop.run_in_executor(None, time.sleep, 0.001)
        order.append("executor")
        await writing
        return order

    assert asyncio.run(race()) == ["executor", "render"]
    assert uvloop.run(race()) == ["executor", "render"]


def test_label_and_metric_names_outside_the_legacy_set_render_as_generate_latest_writes_them() -> (
    None
):
    """A label name may not hold ``:`` (a metric name may): written as ``generate_latest`` does."""
    registry = CollectorRegistry()
    Gauge("g:with_colon", "g", ["a:b", "ok"], registry=registry).labels("1", "2").set(1)

    class Custom:
        def collect(self) -> list[object]:
            family = GaugeMetricFamily("custom.dotted-name", "c", labels=["x.y", "1st"])
            family.add_metric(["v", "w"], 2)
            return [family]

    registry.register(Custom())  # type: ignore[arg-type]
    assert rendered(registry) == generate_latest(registry)


def test_a_metric_class_with_a_collect_of_its_own_is_read_through_it() -> None:
    class Filtered(Gauge):
        def collect(self) -> list[object]:  # type: ignore[override]
            (family,) = super().collect()
            family.samples = [s for s in family.samples if s.labels["tenant"] != "secret"]
            return [family]

    registry = CollectorRegistry()
    gauge = Filtered("g", "g", ["tenant"], registry=registry)
    gauge.labels("public").set(1)
    gauge.labels("secret").set(2)
    assert b"secret" not in rendered(registry)
    assert rendered(registry) == generate_latest(registry)


def test_the_loop_is_given_away_between_the_families_of_a_collector() -> None:
    """A collector's families are made one by one (its ``collect()`` a generator): a slice can
    end after each, however few samples it holds."""

    class ManyFamilies:
        def collect(self) -> Iterator[GaugeMetricFamily]:
            for n in range(10):
                family = GaugeMetricFamily(f"family_{n}", "f")
                family.add_metric([], n)
                yield family

    registry = CollectorRegistry()
    registry.register(ManyFamilies())  # type: ignore[arg-type]
    pauses = []

    async def pause() -> None:
        pauses.append(1)

    assert rendered(registry, Slices(pause, slice_s=0.0)) == generate_latest(registry)
    assert len(pauses) >= 10
