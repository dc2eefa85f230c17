"""The cyclic garbage collector's settings and figures (bridge.ops.collector)."""

from __future__ import annotations

import gc
import itertools
from collections import deque
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from bridge.ops import collector
from bridge.ops.collector import THRESHOLDS, CollectorTime
from bridge.ops.metrics import Metrics


@pytest.fixture
def restored() -> Iterator[None]:
    """Whatever a test does to the collector is undone after it."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        gc.enable()


def _collections_under_load(thresholds: tuple[int, int, int]) -> tuple[int, int]:
    """(middle, full) collections while objects are made in batches, each batch kept for the
    next twenty and then dropped, as deliveries waiting on their receivers are: they outlive
    several young collections. What existed before is frozen, as a running bridge's is."""
    counted = CollectorTime()
    gc.collect()
    gc.freeze()
    gc.collect()  # (the collection before the freeze counted the frozen objects as long-lived:
    # until a quarter as many were promoted, no full collection would run, however large the heap)
    gc.set_threshold(*thresholds)
    gc.callbacks.append(counted)
    try:
        in_flight: deque[list[list[int]]] = deque(maxlen=20)
        for batch in range(1_500):
            in_flight.append([[batch, n] for n in range(1_000)])
    finally:
        gc.callbacks.remove(counted)
        in_flight.clear()
        gc.unfreeze()
    return counted.collections[1], counted.collections[2]


def test_full_collections_are_a_tenth_as_frequent_as_with_the_defaults(restored: None) -> None:
    """Under a load that promotes what is in flight, CPython's defaults run a full collection
    after every ten middle ones; the bridge's thresholds after every hundred."""
    middle, full = _collections_under_load((700, 10, 10))
    assert middle > 100
    assert full >= middle // 11 - 1, "the defaults do collect in full this often"
    middle, full = _collections_under_load(THRESHOLDS)
    assert middle > 100
    assert full <= middle // 100 + 1


def test_settle_freezes_what_exists_and_sets_the_thresholds(restored: None) -> None:
    kept = [[n] for n in range(10)]
    assert any(each is kept[0] for each in gc.get_objects())
    collector.settle()
    assert gc.get_threshold() == THRESHOLDS
    assert gc.get_freeze_count() > len(kept)
    assert not any(each is kept[0] for each in gc.get_objects()), "frozen: never walked again"


def test_collections_and_their_seconds_are_exported_by_generation(restored: None) -> None:
    clock = itertools.count(step=0.25)  # each collection takes 0.25 "seconds"
    registry = CollectorRegistry()
    counted = Metrics(registry).collector_time
    counted.clock = lambda: next(clock)
    sample = registry.get_sample_value
    assert sample("bridge_gc_collections_total", {"generation": "2"}) == 0  # not started yet
    gc.collect(2)
    assert sample("bridge_gc_collections_total", {"generation": "2"}) == 0
    counted.start()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
        full = sample("bridge_gc_collections_total", {"generation": "2"})
        assert full is not None and full >= 2
        assert sample("bridge_gc_seconds_total", {"generation": "2"}) == 0.25 * full
        assert (sample("bridge_gc_collections_total", {"generation": "0"}) or 0) >= 1
        assert sample("bridge_gc_seconds_total", {"generation": "1"}) is not None
    finally:
        counted.stop()
    assert counted not in gc.callbacks
    gc.collect(2)
    assert sample("bridge_gc_collections_total", {"generation": "2"}) == full, "stopped"


def test_start_twice_counts_each_collection_once(restored: None) -> None:
    counted = CollectorTime()
    counted.start()
    counted.start()
    try:
        before = counted.collections[2]
        gc.collect(2)
        assert counted.collections[2] == before + 1
    finally:
        counted.stop()
    assert counted not in gc.callbacks


def test_nothing_of_the_collector_is_exported_with_metrics_disabled() -> None:
    registry = CollectorRegistry()
    Metrics(registry, enabled=False)
    assert registry.get_sample_value("bridge_gc_collections_total", {"generation": "0"}) is None


def test_a_collection_under_way_when_counting_starts_is_not_counted(restored: None) -> None:
    """start() while a collection runs (in another thread that has the GIL during a finalizer,
    here the finalizer itself): its end, without its start, adds nothing."""
    counted = CollectorTime()

    class StartsCounting:
        def __del__(self) -> None:
            counted.start()

    ring = StartsCounting()
    ring.me = ring  # type: ignore[attr-defined]
    del ring
    try:
        gc.collect()
        assert counted.seconds[2] < 1.0, "the time since boot was counted as one collection"
    finally:
        counted.stop()
