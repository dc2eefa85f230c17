"""The metrics scenario of the benchmark: scrapes beside a steady stream, with 10,000 webhooks.

The bridge runs with ``webhooks`` webhooks configured (one, ``busy``, receives a steady ``rate``
records/s; every other one is idle) while a scraper in its own process GETs ``/metrics`` every
``interval`` seconds, as Prometheus would. Reported: the series count, the response size and time
of each scrape (median, max), and the longest gap between two consecutive deliveries to ``busy``
at the receiver (at 200/s the nominal gap is 5 ms; a scrape that holds the bridge's event loop
shows as a gap as long as the scrape): overall, among the gaps that overlap a scrape, and among
the others (what the shared machine, the broker and the load generator cause by themselves).

The reload scenario (:func:`scenario_reload`) runs the same bridge and stream, and rewrites the
configuration file a few times during the window (each a real change: one webhook's timeout, and
one webhook more). Reported per reload: the time from the write to the moment the bridge counted
it in ``bridge_config_reloads_total{result="applied"}`` (polled every 50 ms, so up to 50 ms late),
the p99 end-to-end latency of ``busy``'s deliveries whose lifetime overlaps a reload (from the
write to one second after it was applied) against the others, and the longest gap between
deliveries in a reload against elsewhere; medians over the reloads.

``python -m devtools.bench_metrics`` runs the scrape scenario alone (its own broker unless
``KAFKA_BOOTSTRAP_SERVERS`` is set) and prints the result as JSON, ``python -m
devtools.bench_metrics reload`` the reload scenario; ``devtools.bench`` calls
:func:`scenario_metrics_scrape` (and :func:`scenario_reload`) with the other scenarios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from bridge.core.signing import message_id
from devtools.bench import (
    SUCCESS,
    WARMUP_S,
    Stage,
    _wait,
    _wait_assigned,
    bench_broker,
    stop_bench_broker,
    summary_ms,
)
from devtools.devkafka import CACHE, stop_process

WEBHOOKS = 10_000
RATE = 200.0
SCRAPE_INTERVAL_S = 1.0
BUSY = "busy"
RELOADS = 3
RELOAD_TAIL_S = 1.0  # deliveries this long after a reload applied still count as "during" it
APPLIED_POLL_S = 0.05  # how often the reload scenario looks for the applied counter to move
APPLIED_TIMEOUT_S = 60.0
_APPLIED = re.compile(rb'^bridge_config_reloads_total\{result="applied"\} (\S+)$', re.M)


def count_series(exposition: bytes) -> int:
    """Samples in a Prometheus text exposition: the lines that are neither empty nor comments."""
    return exposition.count(b"\n") - exposition.count(b"\n#") - exposition.startswith(b"#")


def longest_gaps(arrivals: list[float], scrapes: list[tuple[float, float]]) -> tuple[float, float]:
    """The longest time between two consecutive arrivals (seconds) that overlaps one of the
    ``scrapes`` (start, end), and the longest that overlaps none (the machine's own noise)."""
    at_scrape, elsewhere = 0.0, 0.0
    for a, b in pairwise(sorted(arrivals)):
        if any(a < end and start < b for start, end in scrapes):
            at_scrape = max(at_scrape, b - a)
        else:
            elsewhere = max(elsewhere, b - a)
    return at_scrape, elsewhere


def idle_hooks(stage: Stage, count: int) -> list[dict[str, Any]]:
    """``count`` webhooks of accounts that never get a record."""
    return [
        {"id": f"idle-{n:05d}", "account": f"acct_idle_{n}", "url": stage.url(f"/ok/idle/{n}")}
        for n in range(count)
    ]


def metrics_url(stage: Stage, topic: str) -> str:
    """The ``/metrics`` URL of the bridge :meth:`Stage.bridge` runs on ``topic`` (its port is in
    the configuration file the stage wrote)."""
    config = yaml.safe_load((stage.workdir / f"{topic}.yaml").read_text())
    return f"http://127.0.0.1:{config['metrics']['port']}/metrics"


def scrape(url: str, timeout: float = 30.0) -> tuple[float, float, int, int]:
    """One GET of ``url``: (wall time it started, seconds until the whole body was read, bytes,
    series)."""
    wall, started = time.time(), time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
    return wall, time.perf_counter() - started, len(body), count_series(body)


def start_scraper(url: str, interval: float, out: Path) -> subprocess.Popen[bytes]:
    """The scraper in its own process (reading a large exposition would otherwise take the
    load generator's interpreter away from its schedule)."""
    out.unlink(missing_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devtools.bench_metrics",
            "scrape",
            url,
            "--interval",
            str(interval),
            "--out",
            str(out),
        ]
    )


def scrape_loop(url: str, interval: float, out: Path) -> None:
    """Scrape ``url`` every ``interval`` seconds (on a fixed schedule) until SIGTERM, one JSON
    line per scrape: [wall time it started, seconds, bytes, series]."""
    running = True

    def stop(_signum: int, _frame: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    next_at = time.monotonic()
    with out.open("a") as log:
        while running:
            try:
                log.write(json.dumps(scrape(url)) + "\n")
            except OSError as exc:
                log.write(json.dumps({"error": str(exc)}) + "\n")
            log.flush()
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))


def _median_max(values: list[float], scale: float = 1.0, digits: int = 2) -> dict[str, float]:
    if not values:
        return {"median": 0.0, "max": 0.0}
    return {
        "median": round(statistics.median(values) * scale, digits),
        "max": round(max(values) * scale, digits),
    }


def scenario_metrics_scrape(
    stage: Stage,
    seconds: float,
    webhooks: int = WEBHOOKS,
    rate: float = RATE,
    interval: float = SCRAPE_INTERVAL_S,
    tracked: int = 0,
) -> dict[str, Any]:
    """``webhooks`` webhooks configured, ``busy`` receiving ``rate`` records/s for ``seconds``
    (after a warm-up), ``/metrics`` scraped every ``interval`` s throughout (0: never, for a
    control run). With ``tracked``, ``metrics.webhook_series`` is that many and as many idle
    webhooks get one delivery each first, so each has series of its own (about 30 samples)."""
    topic = stage.new_topics()
    hooks = [
        {"id": BUSY, "account": "acct_busy", "url": stage.url("/ok/busy")},
        *idle_hooks(stage, webhooks - 1),
    ]
    scrapes_file = stage.workdir / f"{topic}.scrapes.jsonl"
    with stage.bridge(topic, hooks, webhook_series=tracked or None) as process:
        url = metrics_url(stage, topic)
        _wait(lambda: _answers(url), 120, "the bridge's /metrics", 0.2, process)
        _wait_assigned(stage, topic)
        if tracked:  # (busy's own deliveries take one place: the rest go to idle webhooks)
            accounts = [hook["account"] for hook in hooks[1:tracked]]
            stage.produce_records(topic, accounts)
            _wait(lambda: stage.received() >= len(accounts), 120, "the tracked", 0.2, process)
            stage.dump()  # (their arrivals are not the measured stream's; the count starts again)
        scrapes_file.write_text("")
        scraper = start_scraper(url, interval, scrapes_file) if interval > 0 else None
        try:
            stamps, warm = stage.produce_at_rate(topic, rate, seconds, ["acct_busy"], WARMUP_S)
            expected = len(stamps) + warm
            # Generous: a bridge stalled by its scrapes falls minutes behind, and that is a result
            # to report, not a reason to abort the benchmark.
            _wait(lambda: stage.received() >= expected, 600, "every busy delivery", 0.2, process)
        finally:
            if scraper is not None:
                stop_process(scraper, 30)
    arrivals = {e[2]: e[0] for e in stage.dump() if e[3] == 200 and e[1] == "/ok/busy"}
    measured = {
        message_id(tx, SUCCESS, BUSY): ts
        for tx, (ts, _account) in stamps.items()
        if message_id(tx, SUCCESS, BUSY) in arrivals
    }
    lines = [json.loads(line) for line in scrapes_file.read_text().splitlines()]
    done = [line for line in lines if isinstance(line, list)]
    times = [line[1] for line in done]
    sizes = [float(line[2]) for line in done]
    series = [float(line[3]) for line in done]
    at_scrape, elsewhere = longest_gaps(
        [arrivals[m] for m in measured], [(line[0], line[0] + line[1]) for line in done]
    )
    return {
        "webhooks": webhooks,
        "webhook_series": tracked or "default",
        "rate_per_s": rate,
        "seconds": seconds,
        "scrape_interval_s": interval,
        "scrapes": len(done),
        "scrape_errors": len(lines) - len(done),
        "series": _median_max(series, digits=0),
        "response_bytes": _median_max(sizes, digits=0),
        "response_ms": _median_max(times, 1000),
        "series_max": max(series, default=0),
        "response_ms_max": round(max(times, default=0.0) * 1000, 2),
        "max_gap_ms": round(max(at_scrape, elsewhere) * 1000, 2),
        "max_gap_at_scrape_ms": round(at_scrape * 1000, 2),
        "max_gap_between_scrapes_ms": round(elsewhere * 1000, 2),
        "end_to_end": summary_ms([arrivals[m] - ts for m, ts in measured.items()]),
        "producer_lag_ms": stage.schedule_lag,
    }


def config_variants(text: str, count: int) -> list[bytes]:
    """``count`` real changes of the configuration ``text`` (a file :meth:`Stage.bridge` wrote),
    serialised ahead of time: variant ``k`` (from 1) gives the second webhook a timeout of
    ``1 + k`` seconds and adds ``k`` webhooks ``extra-1`` ... ``extra-k`` (idle, like the
    others)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    document = yaml.load(text, Loader=loader)
    hooks = document["webhooks"]
    template = hooks[-1]
    variants = []
    for k in range(1, count + 1):
        changed = [dict(hooks[0]), {**hooks[1], "timeout_seconds": float(1 + k)}, *hooks[2:]]
        extras = [
            {**template, "id": f"extra-{n}", "account": f"acct_extra_{n}"} for n in range(1, k + 1)
        ]
        body = yaml.dump({**document, "webhooks": changed + extras}, Dumper=dumper)
        variants.append(body.encode())
    return variants


def applied_reloads(url: str) -> float | None:
    """``bridge_config_reloads_total{result="applied"}`` from ``/metrics`` at ``url``; None when
    the bridge does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read()
    except OSError:
        return None
    match = _APPLIED.search(body)
    return float(match.group(1)) if match else 0.0


def write_atomically(path: Path, data: bytes) -> float:
    """Replace ``path`` with ``data`` (a temporary file renamed over it); the wall time after."""
    temporary = path.with_suffix(".next")
    temporary.write_bytes(data)
    temporary.replace(path)
    return time.time()


def rewrite_on_schedule(
    path: Path, variants: list[bytes], offsets: list[float], url: str
) -> tuple[threading.Thread, list[tuple[float, float | None]]]:
    """A thread that writes ``variants[k]`` over ``path`` ``offsets[k]`` seconds after it starts
    and waits for the bridge at ``url`` (``/metrics``) to count it as applied. It fills the list
    returned with (wall time written, wall time the applied counter was seen to move, or None)."""
    done: list[tuple[float, float | None]] = []

    def run() -> None:
        started = time.monotonic()
        for data, offset in zip(variants, offsets, strict=True):
            time.sleep(max(0.0, started + offset - time.monotonic()))
            before = applied_reloads(url) or 0.0
            written = write_atomically(path, data)
            seen = None
            deadline = time.monotonic() + APPLIED_TIMEOUT_S
            while time.monotonic() < deadline:
                count = applied_reloads(url)
                if count is not None and count > before:
                    seen = time.time()
                    break
                time.sleep(APPLIED_POLL_S)
            done.append((written, seen))

    thread = threading.Thread(target=run, name="bench-rewriter", daemon=True)
    return thread, done


def _longest_gap_in(times: list[float], window: tuple[float, float]) -> tuple[float, float]:
    """The longest gap between consecutive ``times`` (sorted) that overlaps ``window``, and
    when it began."""
    best, at = 0.0, window[0]
    for a, b in pairwise(times):
        if a < window[1] and window[0] < b and b - a > best:
            best, at = b - a, a
    return best, at


def _median(values: list[Any]) -> float:
    return round(float(statistics.median(values)), 2) if values else 0.0


def _overlaps(start: float, end: float, windows: list[tuple[float, float]]) -> bool:
    return any(start < w_end and w_start < end for w_start, w_end in windows)


def scenario_reload(
    stage: Stage,
    seconds: float,
    webhooks: int = WEBHOOKS,
    rate: float = RATE,
    reloads: int = RELOADS,
) -> dict[str, Any]:
    """``webhooks`` webhooks configured, ``busy`` receiving ``rate`` records/s for ``seconds``
    (after a warm-up), the configuration file rewritten ``reloads`` times, evenly through the
    window, each a real change (:func:`config_variants`)."""
    topic = stage.new_topics()
    hooks = [
        {"id": BUSY, "account": "acct_busy", "url": stage.url("/ok/busy")},
        *idle_hooks(stage, webhooks - 1),
    ]
    with stage.bridge(topic, hooks) as process:
        path = stage.workdir / f"{topic}.yaml"
        url = metrics_url(stage, topic)
        variants = config_variants(path.read_text(), reloads)
        _wait(lambda: _answers(url), 120, "the bridge's /metrics", 0.2, process)
        _wait_assigned(stage, topic)
        offsets = [WARMUP_S + seconds * (k + 0.5) / reloads for k in range(reloads)]
        rewriter, done = rewrite_on_schedule(path, variants, offsets, url)
        rewriter.start()
        stamps, warm = stage.produce_at_rate(topic, rate, seconds, ["acct_busy"], WARMUP_S)
        rewriter.join(APPLIED_TIMEOUT_S * reloads + seconds)
        expected = len(stamps) + warm
        _wait(lambda: stage.received() >= expected, 600, "every busy delivery", 0.2, process)
    arrivals = {e[2]: e[0] for e in stage.dump() if e[3] == 200 and e[1] == "/ok/busy"}
    lives = [
        (ts, arrivals[m])
        for tx, (ts, _account) in stamps.items()
        if (m := message_id(tx, SUCCESS, BUSY)) in arrivals
    ]
    windows = [
        (written, (seen or written + APPLIED_TIMEOUT_S) + RELOAD_TAIL_S) for written, seen in done
    ]
    during = [end - start for start, end in lives if _overlaps(start, end, windows)]
    outside = [end - start for start, end in lives if not _overlaps(start, end, windows)]
    times = sorted(end for _start, end in lives)
    at_reload, elsewhere = longest_gaps(times, windows)
    per_reload = []
    for (written, seen), window in zip(done, windows, strict=True):
        inside = [end - start for start, end in lives if _overlaps(start, end, [window])]
        gap, at = _longest_gap_in(times, window)
        per_reload.append(
            {
                "p99_ms": summary_ms(inside)["p99_ms"],
                "max_gap_ms": round(gap * 1000, 2),
                # when that gap began, in seconds after the write (the load is under way until
                # "applied_s"): tells the bridge's hand-over from the machine's own noise
                "max_gap_at_s": round(at - written, 3),
                "applied_s": None if seen is None else round(seen - written, 3),
            }
        )
    applied = [seen - written for written, seen in done if seen is not None]
    p99_outside = summary_ms(outside)["p99_ms"]
    p99_during = summary_ms(during)["p99_ms"]
    return {
        "webhooks": webhooks,
        "rate_per_s": rate,
        "seconds": seconds,
        "reloads": reloads,
        "applied": len(applied),
        "write_to_applied_s": {
            **_median_max(applied, digits=3),
            "min": round(min(applied, default=0.0), 3),
            "each": [round(a, 3) for a in applied],
        },
        "p99_ms_outside": p99_outside,
        "p99_ms_during": p99_during,
        "p99_ratio": round(p99_during / max(p99_outside, 1.0), 2),
        "max_gap_ms": round(max(at_reload, elsewhere) * 1000, 2),
        "max_gap_during_reload_ms": round(at_reload * 1000, 2),
        "max_gap_outside_ms": round(elsewhere * 1000, 2),
        "per_reload": per_reload,
        "median_reload_p99_ms": _median([r["p99_ms"] for r in per_reload]),
        "median_reload_max_gap_ms": _median([r["max_gap_ms"] for r in per_reload]),
        "end_to_end_outside": summary_ms(outside),
        "end_to_end_during": summary_ms(during),
        "producer_lag_ms": stage.schedule_lag,
    }


def _answers(url: str) -> bool:
    try:
        scrape(url, timeout=60)
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.bench_metrics [--seconds S] [--webhooks N]``, ``reload [...]``, or
    ``scrape URL``."""
    parser = argparse.ArgumentParser(prog="python -m devtools.bench_metrics", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="run the scenario (the default)")
    for sub in (parser, run):
        sub.add_argument("--seconds", type=float, default=30.0, help="measured window")
        sub.add_argument("--webhooks", type=int, default=WEBHOOKS)
        sub.add_argument("--rate", type=float, default=RATE)
        sub.add_argument(
            "--interval", type=float, default=SCRAPE_INTERVAL_S, help="between scrapes; 0: none"
        )
        sub.add_argument(
            "--tracked", type=int, default=0, help="webhook_series, each with traffic first"
        )
    reload = commands.add_parser("reload", help="run the reload scenario")
    reload.add_argument("--seconds", type=float, default=30.0, help="measured window")
    reload.add_argument("--webhooks", type=int, default=WEBHOOKS)
    reload.add_argument("--rate", type=float, default=RATE)
    reload.add_argument("--reloads", type=int, default=RELOADS, help="rewrites in the window")
    reload.add_argument("--rounds", type=int, default=1, help="run the scenario this many times")
    scraper = commands.add_parser("scrape", help="scrape a URL until SIGTERM (internal)")
    scraper.add_argument("url")
    scraper.add_argument("--interval", type=float, default=SCRAPE_INTERVAL_S)
    scraper.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "scrape":
        scrape_loop(args.url, args.interval, args.out)
        return 0
    workdir = CACHE / "bench-metrics"
    workdir.mkdir(parents=True, exist_ok=True)
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    broker = None if external else bench_broker("bench-metrics-broker")
    stage = Stage(external or broker.start(), workdir)  # type: ignore[union-attr]
    try:
        stage.start_receiver(fail_first=0)
        result: Any
        if args.command == "reload":
            result = [
                scenario_reload(stage, args.seconds, args.webhooks, args.rate, args.reloads)
                for _ in range(args.rounds)
            ]
            result = result[0] if len(result) == 1 else result
        else:
            result = scenario_metrics_scrape(
                stage, args.seconds, args.webhooks, args.rate, args.interval, args.tracked
            )
    finally:
        stage.stop_receiver()
        if broker is not None:
            stop_bench_broker(broker)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
