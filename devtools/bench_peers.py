"""The tools users would pick instead, on the same backlog and receiver (issue 21): ``make
bench-peers`` (= ``python -m devtools bench --only peers``).

**Quix Streams** (:data:`QUIX_VERSION`, PyPI) does the bridge's job as its documentation shows a
processing step (``devtools/peers/quix_peer.py``): Avro values read by its own deserializer, the
same mapping and signing as the bridge, one POST per record with httpx, retries in memory, a
dead-letter topic written by hand. It runs in a virtual environment of its own,
``.cache/peers/quix`` (:func:`ensure_quix`): Quix Streams pins confluent-kafka below 2.13 and the
bridge uses 2.16.

Two backlogs, each read by the bridge and by the peer from the same topic (each its own consumer
group):

- **all 2xx**: one webhook, every record delivered at the first attempt: deliveries/s from the
  process's start to the last 2xx, and CPU seconds per 1,000 deliveries;
- **10 % failing**: every tenth record is for an account whose webhook always answers 500: the
  time until every healthy record is delivered, and whether the failing ones end in the dead
  letters (the bridge: through its retry ladder, shortened here to 3 attempts 200 ms apart so the
  run ends; the peer: 3 attempts in memory, 100 and 200 ms apart, holding its partition meanwhile).

What the peer does not do that the bridge does (said beside the figures): no per-webhook
concurrency (one request at a time per process), no durable retries (a crash loses the retry
state: the record is read again from the last commit), no outbound address policy, no per-webhook
isolation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.bench import (
    REPO,
    SCHEMAS,
    Stage,
    _say,
    _wait,
    peak_rss_mb,
    process_cpu_seconds,
)
from devtools.devkafka import CACHE

QUIX_VERSION = "3.28.1"
QUIX_VENV = CACHE / "peers" / "quix"
QUIX_PEER = REPO / "devtools" / "peers" / "quix_peer.py"
FAIL_EVERY = 10  # one record in ten is for the failing account
EXTRAS = ("fastavro", "httpx", "idna")  # what quix_peer.py and bridge.core import besides
RETRY = {"attempts": 3, "first_delay_ms": 200, "increment_ms": 0}


@dataclass
class PeerSizes:
    """How big the peer scenarios are."""

    backlog: int = 20_000  # all 2xx
    failing_backlog: int = 2_000  # 10 % failing (the peer holds its partition while it retries)


PEERS_QUICK = PeerSizes(backlog=1_000, failing_backlog=200)


def ensure_quix() -> Path:
    """The Python of Quix Streams' own virtual environment, made once (pip from PyPI)."""
    python = QUIX_VENV / "bin" / "python"
    stamp = QUIX_VENV / f".installed-{QUIX_VERSION}"
    if stamp.exists():
        return python
    _say(f"installing Quix Streams {QUIX_VERSION} into {QUIX_VENV}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(QUIX_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}", *EXTRAS],
        check=True,
    )
    stamp.touch()
    return python


def _run_quix(
    stage: Stage, topic: str, records: int, hooks: dict[str, str], timeout: float
) -> tuple[dict[str, Any], float, float]:
    """Run the Quix peer over ``topic`` until it has processed ``records``; returns its summary
    line, its start time and its peak RSS in MB."""
    python = ensure_quix()
    command = [
        str(python),
        str(QUIX_PEER),
        "--bootstrap",
        stage.bootstrap,
        "--topic",
        topic,
        "--dlq",
        f"{topic}.dlq",
        "--group",
        f"quix-{uuid.uuid4().hex[:8]}",
        "--schema",
        str(SCHEMAS / "transaction_outcome.avsc"),
        "--records",
        str(records),
        "--hooks",
        json.dumps(hooks),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    rss = 0.0
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"the Quix peer did not finish {records} records in {timeout} s")
        rss = max(rss, peak_rss_mb(process.pid) if Path(f"/proc/{process.pid}").exists() else 0)
        time.sleep(0.2)
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the Quix peer failed ({process.returncode}): {err.decode()[-2000:]}")
    summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return summary, started, rss


def _count_letters(stage: Stage, topic: str, expected: int, timeout: float) -> int:
    """Read ``topic`` from its start until ``expected`` records (or ``timeout``); how many."""
    consumer = stage.reader("peers-count")
    consumer.subscribe([topic])
    letters = 0
    deadline = time.monotonic() + timeout
    try:
        while letters < expected and time.monotonic() < deadline:
            letters += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
    finally:
        consumer.close()
    return letters


def _accounts(records: int, failing: bool) -> list[str]:
    return [
        "acct_fail" if failing and index % FAIL_EVERY == FAIL_EVERY - 1 else "acct_ok"
        for index in range(records)
    ]


def _healthy_done(log: list[tuple[float, str, str, int]], started: float) -> tuple[int, float]:
    """How many 2xx, and the seconds from ``started`` to the last one."""
    ok = [entry[0] for entry in log if entry[3] == 200]
    return len(ok), (max(ok) - started) if ok else 0.0


def scenario_peers(stage: Stage, sizes: PeerSizes) -> dict[str, Any]:
    """The bridge and the Quix peer on an all-2xx backlog and on a 10 %-failing one."""
    results: dict[str, Any] = {}
    for failing, count in ((False, sizes.backlog), (True, sizes.failing_backlog)):
        results.update(_side_by_side(stage, count, failing))
    return results


def _side_by_side(stage: Stage, count: int, failing: bool) -> dict[str, Any]:
    """One backlog, read by the bridge and then by the Quix peer."""
    name = "failing10" if failing else "all2xx"
    _say(f"peers ({name}): {count} records, the bridge then Quix Streams")
    topic = stage.new_topics(attempts=RETRY["attempts"])
    accounts = _accounts(count, failing)
    stage.produce_records(topic, accounts)
    healthy = sum(1 for a in accounts if a == "acct_ok")
    urls = {"acct_ok": stage.url(f"/ok/{name}"), "acct_fail": stage.url(f"/fail/{name}")}
    stage.dump()  # a clean receiver log

    hooks = [{"id": f"h-{a}", "account": a, "url": url} for a, url in urls.items()]
    started = time.time()
    with stage.bridge(topic, hooks, retry=RETRY) as process:
        _wait(lambda: stage.received() >= healthy, 900, f"{healthy} deliveries", 0.2, process)
        cpu = process_cpu_seconds(process.pid)
        rss = peak_rss_mb(process.pid)
        letters = _count_letters(stage, f"{topic}.dlq", count - healthy, timeout=300)
    delivered, seconds = _healthy_done(stage.dump(), started)
    bridge = {
        "records": count,
        "delivered": delivered,
        "healthy_seconds": round(seconds, 2),
        "deliveries_per_s": round(delivered / max(seconds, 1e-9)),
        "cpu_per_1000_s": round(cpu / max(delivered, 1) * 1000, 3),
        "peak_rss_mb": round(rss, 1),
        "dead_lettered": letters,
    }

    summary, started, rss = _run_quix(stage, topic, count, urls, timeout=900)
    delivered, seconds = _healthy_done(stage.dump(), started)
    quix = {
        "records": count,
        "delivered": delivered,
        "healthy_seconds": round(seconds, 2),
        "deliveries_per_s": round(delivered / max(seconds, 1e-9)),
        "cpu_per_1000_s": round(summary["cpu_s"] / max(delivered, 1) * 1000, 3),
        "peak_rss_mb": round(rss, 1),
        "dead_lettered": summary["dead_lettered"],
        "version": QUIX_VERSION,
    }
    return {f"bridge_{name}": bridge, f"quix_{name}": quix}


PEER_TARGETS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "the bridge delivers all-2xx faster than Quix Streams": lambda r: (
        r["bridge_all2xx"]["deliveries_per_s"] > r["quix_all2xx"]["deliveries_per_s"]
    ),
    "with 10 % failing, the bridge delivers every healthy record sooner than Quix Streams": (
        lambda r: r["bridge_failing10"]["healthy_seconds"] < r["quix_failing10"]["healthy_seconds"]
    ),
}
