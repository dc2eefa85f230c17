"""``python -m devtools.soak``: the soak (``make soak``, not part of ``make test``).

The bridge runs for ``--minutes`` (30) at a steady ``--rate`` (200 records/s) beside a mix of
webhooks, with configuration reloads every few minutes and one broker restart around the middle,
and the promise is checked at the end with a ledger: every (record, webhook) pair ends received
(a 2xx at the receiver) or dead-lettered, nothing lost.

The pieces are the benchmark's (``devtools.bench``): the real broker (started in
``.cache/soak-broker`` unless ``KAFKA_BOOTSTRAP_SERVERS`` is set; an external broker is not
restarted), the benchmark's receiver (``devtools.bench_receiver``) in its own process and
``bridge run`` in its own process with a generated configuration. The webhooks, one account each:

* ``healthy`` (``/ok``) answers 200 at once;
* ``flaky`` (``/retry``) answers 500 to the first two requests of each delivery, then 200;
* ``slow`` (``/slow``) answers 200 after 1 s;
* ``dead`` (``/fail``) always answers 500: its deliveries climb the retry ladder and are
  dead-lettered;
* ``hung`` (``/hang``) never answers: its requests time out, the webhook stalls, its deliveries
  are parked and then dead-lettered (short parking settings for the soak, so that they end).

A sixth webhook, ``extra`` (``/ok/extra``, on ``healthy``'s account), is switched on and off by
the reloads; it is not in the ledger (whether a record meets it depends on when the reload lands).

Every ``--sample-seconds`` (10) the soak records the bridge's RSS and open file descriptors, the
deliveries so far and the p99 end-to-end latency of ``healthy``'s deliveries in that interval
(from the record's append time at the broker, the source topic using ``LogAppendTime``, to its
2xx at the receiver). At the end it stops producing, waits until the bridge's group has committed
everything (``--settle-seconds`` at most), reads the dead-letter topic and reports: deliveries,
dead letters, losses, duplicates, RSS and descriptor slopes (least squares, per hour, after the
warm-up), p99 per ``--bucket-minutes`` (5) bucket, consumer lag at the end and how long the broker
restart took. The summary is printed and the whole result written as JSON (``--out``, default
``bench-results/soak.json``).

Exit code 0 when nothing was lost and both slopes are flat (:data:`RSS_SLOPE_LIMIT_MB_PER_H`,
:data:`FD_SLOPE_LIMIT_PER_H`), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import platform
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from bridge.core.envelope import H_KIND, H_MESSAGE_ID, H_WEBHOOK, header_map
from bridge.core.signing import message_id
from devtools.bench import (
    QUIET,
    SUCCESS,
    Stage,
    _wait,
    _wait_assigned,
    interleave,
    percentile,
    process_cpu_seconds,
)
from devtools.bench_metrics import _answers, applied_reloads, metrics_url, write_atomically
from devtools.devkafka import CACHE, Broker, BrokerError, group_positions

REPO = Path(__file__).resolve().parents[1]
RSS_SLOPE_LIMIT_MB_PER_H = 10.0
"""Flat memory: the bridge's RSS grows by less than this many MB per hour after the warm-up."""
FD_SLOPE_LIMIT_PER_H = 50.0
"""Flat descriptors: the bridge's open file descriptors grow by fewer than this many per hour."""
MIN_SLOPE_SAMPLES = 3
SOAK_BROKER_HEAP = ("-Xms512m", "-Xmx1g")
ATTEMPTS = 5
RETRY = {
    "attempts": ATTEMPTS,
    "first_delay_ms": 500,
    "increment_ms": 500,
    # A stalled webhook's deliveries wait 5 s at a time, 3 times, then are dead-lettered: with the
    # defaults (30 s, 20 times) the hung webhook's last deliveries would end 10 minutes late.
    "park_delay_ms": 5000,
    "max_parks": 3,
}
EXTRA = "extra"
APPLIED_TIMEOUT_S = 60.0
RESTART_SETTLE_S = 30.0
"""Samples from the broker's stop until this long after it is back are left out of the slopes."""


@dataclass(frozen=True)
class Hook:
    """One webhook of the soak: its behaviour at the receiver and its share of the records."""

    id: str
    account: str
    path: str
    share: int  # records in every 100
    expected: str  # "received" or "dead": how its pairs should end
    settings: tuple[tuple[str, Any], ...] = ()

    def config(self, receiver: Stage) -> dict[str, Any]:
        return {"id": self.id, "account": self.account, "url": receiver.url(self.path)} | dict(
            self.settings
        )


HOOKS = (
    Hook("healthy", "acct_healthy", "/ok/healthy", 55, "received"),
    Hook("flaky", "acct_flaky", "/retry/flaky", 15, "received"),
    Hook(
        "slow",
        "acct_slow",
        "/slow/slow",
        15,
        "received",
        (("timeout_seconds", 5.0), ("concurrency", 128)),
    ),
    Hook("dead", "acct_dead", "/fail/dead", 10, "dead"),
    Hook(
        "hung", "acct_hung", "/hang/hung", 5, "dead", (("timeout_seconds", 2.0), ("concurrency", 4))
    ),
)
FLAKY_FAILURES = 2  # the receiver's --fail-first: /retry answers 500 twice per delivery
LATENCY_HOOKS = ("healthy", "flaky", "slow")


def mix_pattern(hooks: Sequence[Hook] = HOOKS) -> list[Hook]:
    """One cycle of records: each hook's account ``share`` times in 100, spread evenly."""
    by_id = {hook.id: hook for hook in hooks}
    return [by_id[hook_id] for hook_id in interleave({hook.id: hook.share for hook in hooks})]


# ---- pure helpers ------------------------------------------------------------------------------


def pooled_slope_per_hour(segments: Sequence[Sequence[tuple[float, float]]]) -> float | None:
    """The least-squares slope of (seconds, value) points, in value per hour, common to every
    segment while each keeps its own level: a step between segments (the broker restart) is not
    a trend. None with fewer than :data:`MIN_SLOPE_SAMPLES` points (in segments of two or more) or
    no time between them."""
    usable = [segment for segment in segments if len(segment) >= 2]
    if sum(len(segment) for segment in usable) < MIN_SLOPE_SAMPLES:
        return None
    covariance = spread = 0.0
    for segment in usable:
        mean_t = sum(t for t, _ in segment) / len(segment)
        mean_v = sum(v for _, v in segment) / len(segment)
        covariance += sum((t - mean_t) * (v - mean_v) for t, v in segment)
        spread += sum((t - mean_t) ** 2 for t, _ in segment)
    if spread == 0:
        return None
    return covariance / spread * 3600


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, value) points, in value per hour (one segment)."""
    return pooled_slope_per_hour([points])


def steady_segments(
    samples: Sequence[dict[str, Any]],
    key: str,
    warmup_s: float,
    restart: tuple[float, float] | None,
) -> list[list[tuple[float, float]]]:
    """The (seconds, ``key``) points the slopes are measured on: after the warm-up, and without
    the ``restart`` window (from the broker's stop until it has settled), split there."""
    points = [(float(s["t_s"]), float(s[key])) for s in samples if s["t_s"] >= warmup_s]
    if restart is None:
        return [points]
    return [
        [p for p in points if p[0] < restart[0]],
        [p for p in points if p[0] > restart[1]],
    ]


def level_step(segments: Sequence[Sequence[tuple[float, float]]], around: int = 3) -> float | None:
    """How far the value moved across the restart: the mean of the first ``around`` points after
    it minus that of the last ``around`` before; None without both."""
    if len(segments) != 2 or not segments[0] or not segments[1]:
        return None
    before = [v for _, v in segments[0][-around:]]
    after = [v for _, v in segments[1][:around]]
    return sum(after) / len(after) - sum(before) / len(before)


def parse_proc_net_tcp(text: str) -> dict[str, tuple[int, int, str]]:
    """``/proc/PID/net/tcp`` (or ``tcp6``) as socket inode -> (local port, remote port, state in
    hex: ``0A`` listening, ``01`` established)."""
    sockets = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        sockets[inode] = (
            int(local.rsplit(":", 1)[1], 16),
            int(remote.rsplit(":", 1)[1], 16),
            state,
        )
    return sockets


def classify_fds(
    targets: Iterable[str], sockets: dict[str, tuple[int, int, str]], ports: dict[int, str]
) -> dict[str, int]:
    """Open descriptors (their ``/proc/PID/fd`` link targets) by kind: TCP sockets by the port
    named in ``ports`` that they talk to or listen on (``tcp-listen``, ``tcp-other`` else),
    other sockets, pipes, anonymous inodes by name, files."""
    kinds: Counter[str] = Counter()
    for target in targets:
        if target.startswith("socket:["):
            entry = sockets.get(target[len("socket:[") : -1])
            if entry is None:
                kinds["socket-other"] += 1
            else:
                local, remote, state = entry
                name = ports.get(remote) or ports.get(local)
                kinds[
                    f"tcp-{name}" if name else "tcp-listen" if state == "0A" else "tcp-other"
                ] += 1
        elif target.startswith("pipe:"):
            kinds["pipe"] += 1
        elif target.startswith("anon_inode:"):
            kinds[target[len("anon_inode:") :].strip("[]")] += 1
        else:
            kinds["file"] += 1
    return dict(sorted(kinds.items()))


def effective_warmup(duration_s: float, warmup_s: float) -> float:
    """The warm-up excluded from the slopes: ``warmup_s``, but at most 30 % of a short run."""
    return min(warmup_s, 0.3 * duration_s)


def p99_ms(values_s: Sequence[float]) -> float | None:
    """The p99 of durations in seconds, in milliseconds; None when there are none."""
    return round(percentile(list(values_s), 0.99) * 1000, 1) if values_s else None


def p99_buckets(
    deliveries: Iterable[tuple[float, str, float]], bucket_s: float, kinds: Sequence[str]
) -> list[dict[str, Any]]:
    """(seconds since the start, webhook, latency in seconds) grouped by arrival into buckets of
    ``bucket_s``: each bucket's count and p99 per webhook of ``kinds``."""
    grouped: dict[int, dict[str, list[float]]] = {}
    for at, kind, latency in deliveries:
        if kind in kinds:
            bucket = grouped.setdefault(max(0, int(at // bucket_s)), {k: [] for k in kinds})
            bucket[kind].append(latency)
    return [
        {
            "from_min": round(index * bucket_s / 60, 2),
            "to_min": round((index + 1) * bucket_s / 60, 2),
            **{
                kind: {"count": len(values), "p99_ms": p99_ms(values)}
                for kind, values in grouped[index].items()
            },
        }
        for index in sorted(grouped)
    ]


def judge(
    losses: int,
    rss_slope: float | None,
    fd_slope: float | None,
    rss_limit: float = RSS_SLOPE_LIMIT_MB_PER_H,
    fd_limit: float = FD_SLOPE_LIMIT_PER_H,
    bridge_exit: int | None = None,
) -> list[str]:
    """What fails the soak (empty: it passed): losses, a slope at or above its limit or unknown
    (too few samples after the warm-up), the bridge exiting on its own."""
    failures = []
    if bridge_exit is not None:
        failures.append(f"the bridge exited with {bridge_exit} during the soak")
    if losses:
        failures.append(f"{losses} pair(s) lost")
    if rss_slope is None:
        failures.append("RSS slope unknown: too few samples after the warm-up")
    elif rss_slope >= rss_limit:
        failures.append(f"RSS grows {rss_slope:.1f} MB/h (limit {rss_limit:g})")
    if fd_slope is None:
        failures.append("file-descriptor slope unknown: too few samples after the warm-up")
    elif fd_slope >= fd_limit:
        failures.append(f"file descriptors grow {fd_slope:.1f}/h (limit {fd_limit:g})")
    return failures


def reload_variant(document: dict[str, Any], number: int) -> dict[str, Any]:
    """The configuration of reload ``number`` (1-based), each a real change: ``extra`` switched on
    (odd reloads) or off (even ones), ``slow``'s timeout 4 s or 5 s in turn."""
    hooks = []
    for hook in document["webhooks"]:
        if hook["id"] == EXTRA:
            hook = {**hook, "enabled": number % 2 == 1}
        elif hook["id"] == "slow":
            hook = {**hook, "timeout_seconds": 4.0 if number % 2 == 1 else 5.0}
        hooks.append(hook)
    return {**document, "webhooks": hooks}


def schedule(duration_s: float, sample_s: float, reload_s: float, restart: bool) -> list[Any]:
    """The soak's events as (seconds after the start, what): a sample every ``sample_s``, reloads
    every ``reload_s`` (half an interval in), the broker restart at the middle."""
    events: list[tuple[float, str]] = []
    t = sample_s
    while t <= duration_s + 1e-9:
        events.append((t, "sample"))
        t += sample_s
    t = reload_s / 2
    while t < duration_s - 5:
        events.append((t, "reload"))
        t += reload_s
    if restart:
        events.append((duration_s / 2, "restart"))
    return sorted(events)


# ---- the ledger --------------------------------------------------------------------------------


@dataclass
class SoakLedger:
    """Every pair owed, entered as its record is produced, laid against the receiver's log and the
    dead letters. Fed from the producer thread and the main thread (each a dict or counter update,
    safe under the GIL)."""

    hooks: Sequence[Hook] = HOOKS
    owed: dict[str, tuple[int, str]] = field(default_factory=dict)  # message id -> (record, hook)
    appended: dict[int, float] = field(default_factory=dict)  # record -> append time (s)
    produce_failed: set[int] = field(default_factory=set)
    received: Counter[str] = field(default_factory=Counter)  # message id -> 2xx answers
    requests: Counter[str] = field(default_factory=Counter)  # hook -> requests, every status
    dead: Counter[str] = field(default_factory=Counter)  # message id -> dead letters
    ignored_requests: int = 0  # the extra webhook's
    ignored_letters: int = 0
    strange_requests: int = 0
    strange_letters: list[str] = field(default_factory=list)

    def expect(self, record: int, transaction_id: str, hook: Hook) -> str:
        """Enter one record of ``hook``'s account (it has one pair: ``extra`` is not owed)."""
        mid = message_id(transaction_id, SUCCESS, hook.id)
        self.owed[mid] = (record, hook.id)
        return mid

    def take_requests(
        self, entries: Iterable[Sequence[Any]], start: float
    ) -> list[tuple[float, str, float]]:
        """Receiver log entries (arrival, path, webhook-id, status) into the ledger; returns the
        first 2xx of each pair as (seconds since ``start``, hook, latency in seconds) where the
        record's append time is known."""
        firsts = []
        for at, path, mid, status in entries:
            owner = self.owed.get(mid)
            if owner is None:
                if str(path).startswith(f"/ok/{EXTRA}"):
                    self.ignored_requests += 1
                else:
                    self.strange_requests += 1
                continue
            record, hook = owner
            self.requests[hook] += 1
            if 200 <= status < 300:
                self.received[mid] += 1
                if self.received[mid] == 1 and record in self.appended:
                    firsts.append((at - start, hook, at - self.appended[record]))
        return firsts

    def take_letters(self, letters: Iterable[tuple[str, str, str]]) -> None:
        """Dead letters (message id, webhook, kind) into the ledger."""
        for mid, webhook, kind in letters:
            if webhook == EXTRA:
                self.ignored_letters += 1
            elif mid in self.owed:
                self.dead[mid] += 1
            else:
                self.strange_letters.append(f"{kind}:{webhook}:{mid}")

    def lost(self) -> list[str]:
        """Pairs neither received nor dead-lettered (records whose produce failed excluded)."""
        return [
            mid
            for mid, (record, _) in self.owed.items()
            if mid not in self.received
            and mid not in self.dead
            and record not in self.produce_failed
        ]

    def outcome(self) -> dict[str, Any]:
        """The ledger's figures, in total and per webhook."""
        expected = {hook.id: hook.expected for hook in self.hooks}
        per: dict[str, Counter[str]] = {hook.id: Counter() for hook in self.hooks}
        for mid, (record, hook) in self.owed.items():
            row = per[hook]
            row["pairs"] += 1
            if mid in self.received:
                row["received"] += 1
                row["duplicates"] += self.received[mid] - 1
            if mid in self.dead:
                row["dead_lettered"] += 1
            if mid in self.received and mid in self.dead:
                row["received_and_dead"] += 1
            if mid not in self.received and mid not in self.dead:
                row["unsure" if record in self.produce_failed else "lost"] += 1
            ended = "received" if mid in self.received else "dead" if mid in self.dead else None
            if ended is not None and ended != expected[hook]:
                row["unexpected"] += 1
        by_webhook = {
            hook: {
                key: row[key]
                for key in (
                    "pairs",
                    "received",
                    "dead_lettered",
                    "lost",
                    "duplicates",
                    "received_and_dead",
                    "unexpected",
                )
            }
            | {"requests": self.requests[hook]}
            for hook, row in per.items()
        }
        total = Counter[str]()
        for row in per.values():
            total.update(row)
        return {
            "records": len({record for record, _ in self.owed.values()}),
            "pairs": total["pairs"],
            "received": total["received"],
            "deliveries": sum(self.received.values()),
            "dead_lettered": total["dead_lettered"],
            "dead_letters": sum(self.dead.values()),
            "losses": total["lost"],
            "unsure": total["unsure"],
            "duplicates": total["duplicates"],
            "received_and_dead": total["received_and_dead"],
            "unexpected_outcomes": total["unexpected"],
            "strange_requests": self.strange_requests,
            "strange_letters": len(self.strange_letters),
            "extra_requests_ignored": self.ignored_requests,
            "extra_letters_ignored": self.ignored_letters,
            "by_webhook": by_webhook,
        }


# ---- Kafka and processes -----------------------------------------------------------------------


class SteadyProducer(threading.Thread):
    """Produces ``rate`` records a second for ``seconds`` (or until stopped), keyed by
    transactionId, the accounts in :func:`mix_pattern`'s cycle; enters each in the ledger.

    Idempotent with ``acks=all``: across the broker restart the producer keeps what it cannot
    send and sends it once the broker is back, without duplicating it."""

    def __init__(
        self, stage: Stage, topic: str, rate: float, seconds: float, ledger: SoakLedger
    ) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.stage, self.topic, self.rate, self.seconds = stage, topic, rate, seconds
        self.ledger = ledger
        self.run_id = uuid.uuid4().hex[:6]
        self.produced = 0
        self.errors: list[str] = []
        self.behind_max_s = 0.0
        self.unflushed = 0
        self.halt = threading.Event()

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.stage.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                **QUIET,
            }
        )
        producer.list_topics(self.topic, timeout=30)
        pattern = mix_pattern(self.ledger.hooks)
        from devtools.samples import make_record

        template = make_record("x", "acct")
        ledger = self.ledger

        def delivered(err: Any, msg: Any) -> None:
            record = int(msg.key().decode().rsplit("-", 1)[1])
            if err is not None:
                ledger.produce_failed.add(record)
                self.errors.append(str(err))
            else:
                ledger.appended[record] = msg.timestamp()[1] / 1000

        total = int(self.rate * self.seconds)
        started = time.perf_counter()
        for n in range(total):
            pause = started + n / self.rate - time.perf_counter()
            if pause > 0:
                if self.halt.wait(pause):
                    break
            else:
                self.behind_max_s = max(self.behind_max_s, -pause)
            hook = pattern[n % len(pattern)]
            transaction_id = f"soak-{self.run_id}-{n:09d}"
            ledger.expect(n, transaction_id, hook)
            record = {**template, "transactionId": transaction_id, "accountHolderId": hook.account}
            value = self.stage.encode(record)
            while True:
                try:
                    producer.produce(
                        self.topic, value=value, key=transaction_id.encode(), on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            self.produced = n + 1
        self.unflushed = producer.flush(120)


def consumed_topics(source: str) -> list[str]:
    """What the bridge's group consumes and commits: the source, each delay rung, the parking."""
    return [source, *(f"{source}.retry.{n}" for n in range(1, ATTEMPTS + 1)), f"{source}.parked"]


def consumer_lag(bootstrap: str, group: str, topics: Sequence[str]) -> dict[str, int]:
    """Per partition of ``topics``: the high watermark minus ``group``'s committed offset (the
    low watermark where nothing is committed)."""
    positions = group_positions(bootstrap, group, topics)
    return {tp: max(0, high - committed) for tp, (committed, high) in positions.items()}


def read_dead_letters(
    bootstrap: str, topic: str, timeout: float = 120.0
) -> list[tuple[str, str, str]]:
    """The whole dead-letter topic as (message id, webhook, kind), read to the high watermarks."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"soak-dlq-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        position = dict.fromkeys(partitions, 0)
        letters: list[tuple[str, str, str]] = []
        deadline = time.monotonic() + timeout
        while any(position[p] < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end in {timeout:.0f}s")
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
                position[msg.partition()] = msg.offset() + 1
                headers = header_map(msg.headers())
                letters.append(
                    (
                        headers.get(H_MESSAGE_ID, ""),
                        headers.get(H_WEBHOOK, ""),
                        headers.get(H_KIND, ""),
                    )
                )
        return letters
    finally:
        consumer.close()


def drain(stage: Stage) -> list[list[Any]]:
    """The receiver's log since the last drain (its counts and /retry state kept)."""
    request = urllib.request.Request(stage.url("/__drain"), method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        entries: list[list[Any]] = json.loads(response.read())
    return entries


def rss_mb(pid: int) -> float:
    """The process's resident set size (VmRSS) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    """How many file descriptors the process has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid: int, ports: dict[int, str]) -> dict[str, int]:
    """The process's open descriptors by kind (:func:`classify_fds`)."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    sockets: dict[str, tuple[int, int, str]] = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            sockets.update(parse_proc_net_tcp(Path(f"/proc/{pid}/net/{table}").read_text()))
    return classify_fds(targets, sockets, ports)


def _say(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] soak: {what}", file=sys.stderr, flush=True)


# ---- the run -----------------------------------------------------------------------------------


@dataclass
class Options:
    minutes: float = 30.0
    rate: float = 200.0
    warmup_minutes: float = 3.0
    sample_seconds: float = 10.0
    bucket_minutes: float = 5.0
    reload_minutes: float = 5.0
    settle_seconds: float = 300.0
    restart: bool = True


class Soak:
    """One soak run: its processes, its ledger and what it observed."""

    def __init__(self, stage: Stage, broker: Broker | None, options: Options) -> None:
        self.stage, self.broker, self.options = stage, broker, options
        self.ledger = SoakLedger()
        self.samples: list[dict[str, Any]] = []
        self.firsts: list[tuple[float, str, float]] = []
        self.healthy_arrivals: list[float] = []
        self.reloads: list[dict[str, Any]] = []
        self.restart: dict[str, Any] | None = None
        self.start = 0.0
        self._interval: list[float] = []
        self._cpu = (0.0, 0.0)
        self._threads: list[threading.Thread] = []
        self.ports: dict[int, str] = {
            int(stage.bootstrap.rsplit(":", 1)[1]): "broker",
            stage.receiver_port: "receiver",
        }

    def take(self) -> None:
        """Drain the receiver into the ledger."""
        firsts = self.ledger.take_requests(drain(self.stage), self.start)
        self.firsts += firsts
        for at, hook, latency in firsts:
            if hook == "healthy":
                self._interval.append(latency)
                self.healthy_arrivals.append(at)

    def sample(self, pid: int, producer: SteadyProducer) -> dict[str, Any]:
        self.take()
        now = time.time()
        cpu = process_cpu_seconds(pid)
        cpu_pct = 100 * (cpu - self._cpu[0]) / max(1e-9, now - self._cpu[1])
        self._cpu = (cpu, now)
        stats = self.stage._get("/__stats") or {}
        row = {
            "t_s": round(now - self.start, 1),
            "rss_mb": round(rss_mb(pid), 1),
            "fds": open_fds(pid),
            "fd_kinds": fd_kinds(pid, self.ports),
            "cpu_pct": round(cpu_pct, 1),
            "produced": producer.produced,
            "received_pairs": len(self.ledger.received),
            "receiver_2xx": stats.get("received"),
            "healthy_count": len(self._interval),
            "healthy_p99_ms": p99_ms(self._interval),
        }
        self._interval = []
        self.samples.append(row)
        # The ledger grows by hundreds of thousands of objects, all kept to the end: moved out of
        # the collector's sight, a full collection does not pause the producer's schedule.
        gc.freeze()
        return row

    def do_reload(self, path: Path, url: str, number: int) -> None:
        document = yaml.safe_load(path.read_text())
        before = applied_reloads(url)
        written = write_atomically(path, yaml.safe_dump(reload_variant(document, number)).encode())
        entry: dict[str, Any] = {"number": number, "at_s": round(written - self.start, 1)}
        self.reloads.append(entry)

        def confirm() -> None:
            deadline = time.monotonic() + APPLIED_TIMEOUT_S
            while time.monotonic() < deadline:
                count = applied_reloads(url)
                if count is not None and before is not None and count > before:
                    entry["applied_after_s"] = round(time.time() - written, 2)
                    return
                time.sleep(0.1)
            entry["applied_after_s"] = None

        thread = threading.Thread(target=confirm, name="soak-reload", daemon=True)
        thread.start()
        self._threads.append(thread)

    def do_restart(self) -> None:
        broker = self.broker
        assert broker is not None
        entry: dict[str, Any] = {"at_s": round(time.time() - self.start, 1)}
        self.restart = entry

        def run() -> None:
            began = time.monotonic()
            try:
                broker.stop()
                entry["stop_s"] = round(time.monotonic() - began, 2)
                entry["down_at_s"] = round(time.time() - self.start, 1)
                broker.start(fresh=False)
                entry["up_at_s"] = round(time.time() - self.start, 1)
                entry["restart_s"] = round(time.monotonic() - began, 2)
            except BrokerError as exc:
                entry["error"] = str(exc)[:2000]

        thread = threading.Thread(target=run, name="soak-restart", daemon=True)
        thread.start()
        self._threads.append(thread)

    def run(self) -> dict[str, Any]:
        options = self.options
        stage = self.stage
        duration = options.minutes * 60
        topic = stage.new_topics(attempts=ATTEMPTS)
        group = f"{topic}-bridge"
        stage.start_receiver(fail_first=FLAKY_FAILURES)
        hooks = [hook.config(stage) for hook in HOOKS]
        hooks.append(
            {
                "id": EXTRA,
                "account": "acct_healthy",
                "url": stage.url(f"/ok/{EXTRA}"),
                "enabled": False,
            }
        )
        path = stage.workdir / f"{topic}.yaml"
        bridge_exit: int | None = None
        with stage.bridge(topic, hooks, retry=RETRY, timeout=5.0) as process:
            url = metrics_url(stage, topic)
            self.ports[int(url.split(":")[2].split("/")[0])] = "metrics"
            _wait(lambda: _answers(url), 120, "the bridge's /metrics", 0.2, process)
            _wait_assigned(stage, topic)
            _say(
                f"{options.minutes:g} min at {options.rate:g} records/s on {topic}; "
                f"bridge pid {process.pid}"
            )
            producer = SteadyProducer(stage, topic, options.rate, duration, self.ledger)
            reload_s = min(options.reload_minutes * 60, duration / 4)
            events = schedule(
                duration,
                options.sample_seconds,
                reload_s,
                options.restart and self.broker is not None,
            )
            self.start = time.time()
            self._cpu = (process_cpu_seconds(process.pid), self.start)
            producer.start()
            reloads = 0
            for offset, what in events:
                time.sleep(max(0.0, self.start + offset - time.time()))
                if process.poll() is not None:
                    bridge_exit = process.returncode
                    _say(f"the bridge exited with {bridge_exit}")
                    break
                if what == "sample":
                    row = self.sample(process.pid, producer)
                    if len(self.samples) % max(1, round(60 / options.sample_seconds)) == 0:
                        _say(
                            f"{row['t_s'] / 60:.1f} min: produced {row['produced']}, received "
                            f"{row['received_pairs']} pairs, RSS {row['rss_mb']} MB, "
                            f"{row['fds']} fds, healthy p99 {row['healthy_p99_ms']} ms"
                        )
                elif what == "reload":
                    reloads += 1
                    self.do_reload(path, url, reloads)
                    _say(f"reload {reloads} written")
                elif what == "restart":
                    _say("restarting the broker")
                    self.do_restart()
            if bridge_exit is not None:
                producer.halt.set()
            producer.join(duration + 180)  # the rest of its schedule, then its flush
            producer.halt.set()
            production_ended = time.time()
            _say(f"produced {producer.produced} records; settling")
            for thread in self._threads:
                thread.join(APPLIED_TIMEOUT_S + 120)
            settled_s, lag = self.settle(topic, group, process)
            if bridge_exit is None and process.poll() is not None:
                bridge_exit = process.returncode
            final_rss, final_fds = (
                (rss_mb(process.pid), open_fds(process.pid)) if process.poll() is None else (0, 0)
            )
        stage.stop_receiver()
        return self.report(
            topic, producer, production_ended, settled_s, lag, bridge_exit, final_rss, final_fds
        )

    def settle(self, topic: str, group: str, process: Any) -> tuple[float | None, dict[str, int]]:
        """Wait until the group committed everything and every pair has an outcome (or the
        deadline); returns how long that took (None: not within the deadline) and the final lag."""
        stage = self.stage
        topics = consumed_topics(topic)
        began = time.monotonic()
        deadline = began + self.options.settle_seconds
        quiet_since: float | None = None
        lag: dict[str, int] = {}
        while time.monotonic() < deadline and process.poll() is None:
            self.take()
            try:
                lag = consumer_lag(stage.bootstrap, group, topics)
            except KafkaException:
                time.sleep(1)
                continue
            if sum(lag.values()) == 0:
                quiet_since = quiet_since or time.monotonic()
                self.read_letters(topic)
                if not self.ledger.lost():
                    return round(time.monotonic() - began, 1), lag
                if time.monotonic() - quiet_since > 15:  # committed everything, still missing
                    break
            else:
                quiet_since = None
            time.sleep(2)
        self.take()
        self.read_letters(topic)
        with contextlib.suppress(KafkaException):
            lag = consumer_lag(stage.bootstrap, group, topics)
        return None, lag

    def read_letters(self, topic: str) -> None:
        """The whole dead-letter topic into the ledger (in place of what it held before)."""
        self.ledger.dead.clear()
        self.ledger.strange_letters.clear()
        self.ledger.ignored_letters = 0
        self.ledger.take_letters(read_dead_letters(self.stage.bootstrap, f"{topic}.dlq"))

    def longest_healthy_gap(self) -> dict[str, Any] | None:
        """The longest time between two healthy deliveries around the broker restart."""
        if self.restart is None or "up_at_s" not in self.restart:
            return None
        window = (self.restart["at_s"] - 5, self.restart["up_at_s"] + 120)
        times = sorted(t for t in self.healthy_arrivals if window[0] <= t <= window[1])
        gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
        if not gaps:
            return None
        gap, at = max(gaps)
        return {"seconds": round(gap, 2), "from_s": round(at, 1)}

    def report(
        self,
        topic: str,
        producer: SteadyProducer,
        production_ended: float,
        settled_s: float | None,
        lag: dict[str, int],
        bridge_exit: int | None,
        final_rss: float,
        final_fds: int,
    ) -> dict[str, Any]:
        options = self.options
        duration = options.minutes * 60
        warmup = effective_warmup(duration, options.warmup_minutes * 60)
        steady = [s for s in self.samples if s["t_s"] >= warmup]
        window = None
        if self.restart is not None:
            up = self.restart.get("up_at_s", self.restart["at_s"])
            window = (self.restart["at_s"], up + RESTART_SETTLE_S)
        rss_segments = steady_segments(self.samples, "rss_mb", warmup, window)
        fd_segments = steady_segments(self.samples, "fds", warmup, window)
        rss_slope = pooled_slope_per_hour(rss_segments)
        fd_slope = pooled_slope_per_hour(fd_segments)
        rss_naive = slope_per_hour([(s["t_s"], s["rss_mb"]) for s in steady])
        fd_naive = slope_per_hour([(s["t_s"], s["fds"]) for s in steady])
        ledger = self.ledger.outcome()
        failures = judge(ledger["losses"], rss_slope, fd_slope, bridge_exit=bridge_exit)
        if self.restart is not None:
            self.restart["longest_healthy_gap"] = self.longest_healthy_gap()

        def series(key: str) -> dict[str, Any]:
            values = [s[key] for s in self.samples]
            peak = max(self.samples, key=lambda s: s[key], default=None)
            return {
                "max_at_s": None if peak is None else peak["t_s"],
                "first": values[0] if values else None,
                "after_warmup": steady[0][key] if steady else None,
                "last": values[-1] if values else None,
                "max": max(values, default=None),
            }

        return {
            "settings": {
                "minutes": options.minutes,
                "rate_per_s": options.rate,
                "warmup_s": round(warmup, 1),
                "sample_s": options.sample_seconds,
                "bucket_min": options.bucket_minutes,
                "mix_per_100": {hook.id: hook.share for hook in HOOKS},
                "retry": RETRY,
                "flat_limits": {
                    "rss_mb_per_h": RSS_SLOPE_LIMIT_MB_PER_H,
                    "fds_per_h": FD_SLOPE_LIMIT_PER_H,
                },
                "topic": topic,
                "broker": "external" if self.broker is None else "own",
            },
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "produced": producer.produced,
            "produce_errors": len(producer.errors),
            "producer_behind_max_ms": round(producer.behind_max_s * 1000, 1),
            "ledger": ledger,
            "settled_after_s": settled_s,
            "rss_mb": {
                **series("rss_mb"),
                "slope_per_h": _round(rss_slope, 2),
                "slope_per_h_across_restart": _round(rss_naive, 2),
                "step_at_restart": _round(level_step(rss_segments), 1),
                "end": round(final_rss, 1),
            },
            "fds": {
                **series("fds"),
                "slope_per_h": _round(fd_slope, 2),
                "slope_per_h_across_restart": _round(fd_naive, 2),
                "step_at_restart": _round(level_step(fd_segments), 1),
                "end": final_fds,
                "kinds_at_max": max(self.samples, key=lambda s: s["fds"])["fd_kinds"]
                if self.samples
                else None,
                "kinds_last": self.samples[-1]["fd_kinds"] if self.samples else None,
            },
            "p99_buckets": p99_buckets(self.firsts, options.bucket_minutes * 60, LATENCY_HOOKS),
            "consumer_lag_end": {
                "total": sum(lag.values()),
                "behind": {tp: n for tp, n in lag.items() if n},
                "partitions": len(lag),
            },
            "broker_restart": self.restart,
            "reloads": self.reloads,
            "bridge_exit": bridge_exit,
            "samples": self.samples,
            "verdict": {"passed": not failures, "failures": failures},
            "production_ended_s": round(production_ended - self.start, 1),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def render(results: dict[str, Any]) -> str:
    """The readable summary of a soak's results."""
    settings, ledger = results["settings"], results["ledger"]
    lines = [
        f"soak: {settings['minutes']:g} min at {settings['rate_per_s']:g} records/s, "
        f"mix {settings['mix_per_100']}, broker {settings['broker']}",
        f"  produced {results['produced']} records ({results['produce_errors']} produce errors, "
        f"producer at most {results['producer_behind_max_ms']} ms behind schedule)",
        f"  pairs {ledger['pairs']}: received {ledger['received']} "
        f"({ledger['deliveries']} 2xx deliveries), dead-lettered {ledger['dead_lettered']} "
        f"({ledger['dead_letters']} dead letters), LOSSES {ledger['losses']}, "
        f"duplicates {ledger['duplicates']}, received and dead {ledger['received_and_dead']}",
        f"  unexpected outcomes {ledger['unexpected_outcomes']}, requests nobody owes "
        f"{ledger['strange_requests']}, dead letters nobody owes {ledger['strange_letters']}; "
        f"extra webhook (not owed): {ledger['extra_requests_ignored']} requests, "
        f"{ledger['extra_letters_ignored']} dead letters",
    ]
    for hook, row in ledger["by_webhook"].items():
        lines.append(f"    {hook:8s} " + " ".join(f"{k}={v}" for k, v in row.items()))
    settled = results["settled_after_s"]
    lines.append(
        "  settled "
        + (f"{settled} s after production ended" if settled is not None else "NOT within deadline")
    )
    for name, unit in (("rss_mb", "MB"), ("fds", "fds")):
        series = results[name]
        slope = series["slope_per_h"]
        lines.append(
            f"  {name:6s} first {series['first']} after warm-up {series['after_warmup']} "
            f"last {series['last']} max {series['max']} (at {series.get('max_at_s')} s) {unit}; "
            "slope "
            + ("unknown" if slope is None else f"{slope:+.2f} {unit}/h")
            + f" after {settings['warmup_s']:g} s warm-up"
        )
        if series.get("step_at_restart") is not None:
            lines.append(
                f"         step at the broker restart {series['step_at_restart']:+g} {unit} "
                "(not a trend: the slope gives each side its own level); slope across it "
                f"{series['slope_per_h_across_restart']:+.2f} {unit}/h"
            )
        if series.get("kinds_at_max"):
            lines.append(
                f"         by kind at the max {series['kinds_at_max']}, at the end "
                f"{series['kinds_last']}"
            )
    lines.append(f"  p99 end-to-end (ms) per {settings['bucket_min']:g} min:")
    for bucket in results["p99_buckets"]:
        cells = [
            f"{hook} {bucket[hook]['p99_ms']} (n={bucket[hook]['count']})"
            for hook in LATENCY_HOOKS
            if hook in bucket
        ]
        lines.append(f"    {bucket['from_min']:>6g}-{bucket['to_min']:<6g} " + ", ".join(cells))
    lag = results["consumer_lag_end"]
    lines.append(
        f"  consumer lag at the end: {lag['total']} over {lag['partitions']} partitions"
        + (f" {lag['behind']}" if lag["behind"] else "")
    )
    restart = results["broker_restart"]
    if restart is None:
        lines.append("  broker restart: none")
    else:
        lines.append(f"  broker restart: {json.dumps(restart)}")
    reloads = [(r["at_s"], r.get("applied_after_s")) for r in results["reloads"]]
    lines.append(f"  reloads (at s, applied after s): {reloads}")
    if results["bridge_exit"] is not None:
        lines.append(f"  the bridge EXITED with {results['bridge_exit']}")
    verdict = results["verdict"]
    lines.append(
        "verdict: PASSED (no losses, RSS and fds flat)"
        if verdict["passed"]
        else "verdict: FAILED: " + "; ".join(verdict["failures"])
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m devtools.soak``."""
    parser = argparse.ArgumentParser(
        prog="python -m devtools.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = Options()
    parser.add_argument("--minutes", type=float, default=defaults.minutes)
    parser.add_argument("--rate", type=float, default=defaults.rate, help="records per second")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "soak.json")
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        default=defaults.warmup_minutes,
        help="excluded from the slopes (at most 30%% of the run)",
    )
    parser.add_argument("--sample-seconds", type=float, default=defaults.sample_seconds)
    parser.add_argument("--bucket-minutes", type=float, default=defaults.bucket_minutes)
    parser.add_argument(
        "--reload-minutes",
        type=float,
        default=defaults.reload_minutes,
        help="a configuration reload this often (at least 4 in a run)",
    )
    parser.add_argument("--settle-seconds", type=float, default=defaults.settle_seconds)
    parser.add_argument("--no-restart", action="store_true", help="do not restart the broker")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.sample_seconds <= 0:
        parser.error("--minutes, --rate and --sample-seconds must be positive")
    options = Options(
        minutes=args.minutes,
        rate=args.rate,
        warmup_minutes=args.warmup_minutes,
        sample_seconds=args.sample_seconds,
        bucket_minutes=args.bucket_minutes,
        reload_minutes=args.reload_minutes,
        settle_seconds=args.settle_seconds,
        restart=not args.no_restart,
    )
    workdir = CACHE / "soak"
    workdir.mkdir(parents=True, exist_ok=True)
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    broker = None if external else Broker(CACHE / "soak-broker", heap=SOAK_BROKER_HEAP)
    if broker is None:
        _say("KAFKA_BOOTSTRAP_SERVERS is set: using that broker, which is not restarted")
    try:
        bootstrap = external or broker.start()  # type: ignore[union-attr]
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stage = Stage(bootstrap, workdir)
    try:
        results = Soak(stage, broker, options).run()
    finally:
        stage.stop_receiver()
        if broker is not None:
            broker.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(render(results))
    print(f"results written to {args.out}")
    return 0 if results["verdict"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
