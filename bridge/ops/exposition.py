"""The ``/metrics`` text of a registry, written in slices of the event loop's time.

``prometheus_client.generate_latest`` writes a whole registry in one call, on the event loop that
makes every tenant's deliveries. With ``webhook_series: 1000`` a scrape is about 32,000 samples
(2.4 MB), and that call held the loop for 0.2 s (on a host about 1.5x slower than usual); even
making one metric's family, a per-webhook histogram of 13,000 samples, took 40-55 ms in one
piece. :func:`render` writes the same bytes (a test compares them with ``generate_latest``'s),
one sample at a time, in slices that give the loop and the other threads their turn
(:mod:`bridge.core.slices`: about 2 ms, then a wait of 1 ms).

A metric of ``prometheus_client`` (a :class:`MetricWrapperBase`) is read through its samples'
generator (its children copied under its lock, then read one at a time, as its own ``collect()``
does); any other collector (the bridge's own, a few dozen samples each, or a metric class with a
``collect()`` of its own) through ``collect()``, a slice ending after each family it makes. A
registry that is not a plain :class:`CollectorRegistry` of collectors, or a metric without that
generator, is read through ``collect()``: the same text, in larger pieces.

The figures of one answer are read over the slices, not at one instant (a counter may move
between two of its series), as a scrape of ``prometheus_client`` in a threaded server reads them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from bridge.core.slices import Slices

_CHECK_EVERY: Final = 32
"""Samples written between two looks at the clock."""
_OPENMETRICS_SUFFIXES: Final = ("_created", "_gsum", "_gcount")
"""Samples the text format shows as a gauge family of their own, after their family."""
_SHOWN_SUFFIX: Final = {"counter": "_total", "info": "_info"}
"""What the text format adds to the name of a family of these types."""
_SHOWN_TYPE: Final = {
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}
"""The text format's type of these OpenMetrics types (the others are their own)."""
_INVALID_NAME_CHARACTER = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL_CHARACTER = re.compile(r"[^a-zA-Z0-9_]")  # (no ":" in a label name)

_Sample = tuple[str, dict[str, str], float, Any]  # name, labels, value, timestamp


async def render(registry: CollectorRegistry, slices: Slices | None = None) -> bytes:
    """The text exposition of ``registry`` (what ``generate_latest(registry)`` returns), written
    in ``slices`` (whose ``held`` then says how long it held the loop)."""
    slices = slices or Slices()
    output: list[str] = []
    written = 0
    for collector in _collectors(registry):
        for name, documentation, kind, samples in _families(collector):
            shown_name = _name(name + _SHOWN_SUFFIX.get(kind, ""))
            help_text = _help(documentation)
            output.append(f"# HELP {shown_name} {help_text}\n")
            output.append(f"# TYPE {shown_name} {_SHOWN_TYPE.get(kind, kind)}\n")
            apart = {name + suffix: suffix for suffix in _OPENMETRICS_SUFFIXES}
            trailing: dict[str, list[str]] = {}
            for sample_name, labels, value, timestamp in samples:
                line = _line(sample_name, labels, value, timestamp)
                suffix = apart.get(sample_name)
                if suffix is None:
                    output.append(line)
                else:
                    trailing.setdefault(suffix, []).append(line)
                written += 1
                if written % _CHECK_EVERY == 0:
                    await slices.after_piece()
            for suffix, lines in sorted(trailing.items()):
                output.append(f"# HELP {_name(name + suffix)} {help_text}\n")
                output.append(f"# TYPE {_name(name + suffix)} gauge\n")
                output.extend(lines)
            await slices.after_piece()  # (a collector's families are made one by one)
    return "".join(output).encode("utf-8")


def _collectors(registry: CollectorRegistry) -> list[Collector]:
    """The registry's collectors in its order, or the registry itself when they cannot be read
    one by one (a target-info metric, or another kind of registry)."""
    by_collector = getattr(registry, "_collector_to_names", None)
    lock = getattr(registry, "_lock", None)
    if (
        type(registry) is not CollectorRegistry
        or by_collector is None
        or lock is None
        or registry.get_target_info()
    ):
        return [registry]
    with lock:
        return list(by_collector)


def _families(collector: Collector) -> Iterator[tuple[str, str, str, Iterable[_Sample]]]:
    """Each family of ``collector``: its name, documentation, type and samples, the samples of a
    ``prometheus_client`` metric read one at a time."""
    if (
        isinstance(collector, MetricWrapperBase)
        and type(collector).collect is MetricWrapperBase.collect  # (not one of its own)
        and callable(getattr(collector, "_samples", None))
    ):
        family = collector._get_metric()  # type: ignore[no-untyped-call]
        prefix = collector._name
        yield (
            family.name,
            family.documentation,
            family.type,
            ((prefix + s.name, s.labels, s.value, s.timestamp) for s in collector._samples()),
        )
        return
    for family in collector.collect():
        yield (
            family.name,
            family.documentation,
            family.type,
            ((s.name, s.labels, s.value, s.timestamp) for s in family.samples),
        )


def _line(name: str, labels: dict[str, str], value: float, timestamp: Any) -> str:
    """One sample's line, as ``generate_latest`` writes it."""
    shown = ""
    if labels:
        shown = (
            "{"
            + ",".join(
                f'{_name(k, _INVALID_LABEL_CHARACTER)}="{_label_value(v)}"'
                for k, v in sorted(labels.items())
            )
            + "}"
        )
    stamp = "" if timestamp is None else f" {int(float(timestamp) * 1000):d}"
    number = floatToGoString(value)  # type: ignore[no-untyped-call]
    return f"{_name(name)}{shown} {number}{stamp}\n"


def _name(name: str, invalid: re.Pattern[str] = _INVALID_NAME_CHARACTER) -> str:
    """A metric name (or with ``invalid`` the label pattern, a label name) in the legacy character
    set (the bridge's all are): others get ``_`` for each character outside it and for a leading
    digit, as ``generate_latest`` writes them by default."""
    if not invalid.search(name) and not name[:1].isdigit():
        return name
    shown = invalid.sub("_", name)
    return "_" + shown[1:] if shown[:1].isdigit() else shown


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(documentation: str) -> str:
    return documentation.replace("\\", r"\\").replace("\n", r"\n")
