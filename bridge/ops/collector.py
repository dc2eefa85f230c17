"""The cyclic garbage collector, set for a process whose deliveries stay in flight.

CPython's defaults (thresholds 700, 10, 10) run a full collection after every ten collections of
the middle generation, provided the objects promoted since the last one are a quarter of the
oldest generation. A delivery that waits on its receiver for longer than a few young collections
(a slow receiver, or 2,000 deliveries in flight on a busy host) is promoted to the oldest
generation with its task, coroutines, futures and timers, so under load both conditions hold all
the time and a full collection walks every live object of the process more than once a second.
Measured with 10,000 webhooks on 500 hosts and 2,000 deliveries in flight (``bench --only
many``): 38 full collections in 20 s, 88 ms of CPU each, 3.3 s of the run (about 35 µs of every
delivery), each one a pause of every delivery.

:data:`THRESHOLDS` keep the young generations as they are (their pauses stay short: a young
collection walks only what was allocated since the last one) and let the middle generation be
collected a hundred times, not ten, before a full collection: full collections are ten times
rarer. Objects that are no longer used and hold no cycle are freed when their last reference
goes, whatever the collector does; what a full collection finds (cycles promoted to the oldest
generation) waits for it ten times longer.

:func:`settle` is called once the process has built what it keeps (modules, schemas, the
configuration): it is frozen, so no collection walks it again. :class:`CollectorTime` counts
collections and their duration by generation for ``/metrics``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

THRESHOLDS: Final = (700, 10, 100)
"""``gc.set_threshold`` of a running bridge: CPython's first two, a tenth as many full
collections."""


def settle() -> None:
    """Collect once, freeze what survives (modules, schemas, the configuration), then set
    :data:`THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


class CollectorTime(Collector):
    """Collections and the seconds they took, by generation, exported as
    ``bridge_gc_collections_total`` and ``bridge_gc_seconds_total`` (registered by
    :class:`bridge.ops.metrics.Metrics`; counting between :meth:`start` and :meth:`stop`).

    A hook in ``gc.callbacks`` notes the start and the end of each collection (two calls of a
    few hundred nanoseconds); the figures are read at each scrape. The seconds are wall time:
    the pause every task of the event loop waited through.
    """

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.clock = clock
        self.collections = [0] * 3
        self.seconds = [0.0] * 3
        self._started: float | None = None  # the collection under way, if its start was seen

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = self.clock()
            return
        started, self._started = self._started, None
        if started is None:  # joined gc.callbacks during this collection: its start was not seen
            return
        generation = info["generation"]
        self.collections[generation] += 1
        self.seconds[generation] += self.clock() - started

    def start(self) -> None:
        """Start counting (the hook joins ``gc.callbacks``, once)."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def stop(self) -> None:
        """Stop counting."""
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def collect(self) -> Iterator[CounterMetricFamily]:
        collections = CounterMetricFamily(
            "bridge_gc_collections",
            "Collections of the cyclic garbage collector, by generation (2: full).",
            labels=["generation"],
        )
        seconds = CounterMetricFamily(
            "bridge_gc_seconds",
            "Wall seconds the cyclic garbage collector ran, by generation: a pause of every "
            "delivery in progress.",
            labels=["generation"],
        )
        for generation in range(3):
            collections.add_metric([str(generation)], self.collections[generation])
            seconds.add_metric([str(generation)], self.seconds[generation])
        yield collections
        yield seconds
