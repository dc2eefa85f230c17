"""The consumer group's lag, read from the cluster: for every partition of the bridge's topics,
how many records lie between the group's committed offset and the partition's end.

librdkafka's statistics give the lag of the partitions assigned to this instance only, and only
once it knows both offsets. While the group rebalances (after a lost group coordinator, for as
long as the group waits for its members to join again) no instance holds a partition, and the lag
vanished from every instance's metrics exactly while it grew. The group's committed offsets are
kept by the cluster whether or not anyone holds the partition, so this figure stays through
rebalances, crashes and restarts; it is what the lag alerts rest on.

The reader is a consumer of its own that never joins the group and never commits (its
``group.id`` only names whose offsets to read), driven from a thread of its own, never the
delivery consumer's thread or the event loop. A round is one metadata request per topic, one
offset-fetch, and one list-offsets request per partition leader (two when a partition was never
committed); each request may wait :data:`TIMEOUT_S`, and the next round starts
:data:`INTERVAL_S` after one ends. Not the admin client: under librdkafka 2.16 its requests
timing out while a broker was down aborted the whole process (an assertion in
``rd_kafka_enq_once_del_source_return``, three bridges of three in the cluster scenario).

The committed offsets come from the group's coordinator, a broker like any other: while it is
down (a coordinator killed takes the cluster about ten seconds to replace) they cannot be read,
and nobody can commit either. So the offsets last read of each partition stand in for up to
:data:`COMMITTED_KEPT_S`: the lag keeps counting the records that arrive meanwhile (the ends
come from the partitions' leaders) and the commit age keeps growing, exactly while the lag
alerts need them; a figure is never older than that (the cluster scenario lost every figure for
13 s when the node killed was both the controller and the coordinator).

The figure counts offsets: on a transactional or compacted topic, markers and removed records
count too (as in librdkafka's own ``consumer_lag``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

log = logging.getLogger("bridge.kafka")
TP = tuple[str, int]
INTERVAL_S = 5.0
"""How often the lag is read (librdkafka's statistics come as often)."""
TIMEOUT_S = 4.0
"""How long one request may take; a round that fails leaves no figure rather than a stale one
(a committed offset that cannot be read now excepted, within :data:`COMMITTED_KEPT_S`)."""
COMMITTED_KEPT_S = 60.0
"""How long a partition's committed offset, once read, stands in while it cannot be read again."""
READER_SETTINGS = {"enable.auto.commit": False, "enable.auto.offset.store": False}
FROM_END = frozenset({"latest", "largest", "end"})
"""``auto.offset.reset`` values that start a never-committed partition at its end."""


def group_lag(
    ends: Mapping[TP, int], committed: Mapping[TP, int], starts: Mapping[TP, int] | None
) -> dict[TP, int]:
    """Records between the group's committed offset and the end of each partition. A partition
    the group never committed (a negative offset) is read from its start (in ``starts``; left
    out when its start is unknown) or, with ``starts`` None (``auto.offset.reset`` latest), from
    its end."""
    lag = {}
    for partition, end in ends.items():
        done = committed.get(partition, -1)
        if done < 0:
            if starts is not None and partition not in starts:
                continue
            done = end if starts is None else starts[partition]
        lag[partition] = max(0, end - done)
    return lag


@dataclass(frozen=True)
class Reading:
    """One reading of the group: each partition's lag, and for how long its committed offset has
    not moved while it is behind (0 when it is not behind; counted from the first reading that
    saw it behind at that offset, so up to one interval short)."""

    lag: dict[TP, int] = field(default_factory=dict)
    commit_age: dict[TP, float] = field(default_factory=dict)


class GroupLag:
    """Reads the lag of ``group`` on ``topics`` every :data:`INTERVAL_S` seconds, on a daemon
    thread of its own, and hands each reading to ``on_lag`` (called on that thread); a reading
    that failed is handed over as ``None``."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        group: str,
        topics: Iterable[str],
        on_lag: Callable[[Reading | None], None],
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topics = list(topics)
        self.on_lag = on_lag
        self.interval = interval
        self._from_start = str(settings.get("auto.offset.reset", "earliest")) not in FROM_END
        self._consumer = Consumer({**settings, **READER_SETTINGS, "group.id": group})
        self._clock = clock
        self._since: dict[TP, tuple[int, float]] = {}  # committed offset, first seen at
        self._read: dict[TP, tuple[int, float]] = {}  # committed offset, last read at
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-lag", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop reading. Nothing waits for the thread: a request in flight while the brokers are
        unreachable must not hold up the shutdown (the thread closes its reader when it ends)."""
        self._stopped.set()

    def _run(self) -> None:
        failing = False
        try:
            while not self._stopped.is_set():
                try:
                    reading: Reading | None = self.read()
                except Exception as exc:  # any: the thread must outlive every reading
                    if not failing:  # once per outage, not every round
                        log.info("kafka.group_lag_unread", extra={"fields": {"error": str(exc)}})
                    failing, reading = True, None
                else:
                    failing = False
                if not self._stopped.is_set():
                    self.on_lag(reading)
                self._stopped.wait(self.interval)
        finally:
            self._consumer.close()

    def read(self) -> Reading:
        """One reading (blocking): the lag of every partition of the topics whose committed
        offset and end could be read (a partition whose leader is down is left out until it
        has a leader again, a topic missing or refused likewise); raises when none could."""
        leaders: dict[int, list[TP]] = {}
        for name in self.topics:  # one topic a request: never the whole cluster's metadata
            topic = self._consumer.list_topics(name, timeout=TIMEOUT_S).topics.get(name)
            if topic is None or topic.error is not None:
                continue  # a topic missing or refused is left out, like a partition led by none
            for partition in topic.partitions.values():
                leaders.setdefault(partition.leader, []).append((name, partition.id))
        if not leaders:
            raise KafkaException(f"none of the topics known: {', '.join(self.topics)}")
        asked = [TopicPartition(*tp) for led in leaders.values() for tp in led]
        committed = self._committed(asked)
        if not committed:
            raise KafkaException("the group's committed offsets could not be read")
        led_here = [[tp for tp in led if tp in committed] for led in leaders.values()]
        ends = self._offsets(led_here, OFFSET_END)
        if not ends:
            raise KafkaException("no partition's end could be read")
        if self._from_start:
            never = [[tp for tp in led if tp in ends and committed[tp] < 0] for led in led_here]
            lag = group_lag(ends, committed, self._offsets(never, OFFSET_BEGINNING))
        else:
            lag = group_lag(ends, committed, None)
        return Reading(lag, self._commit_ages(lag, committed))

    def _committed(self, asked: list[TopicPartition]) -> dict[TP, int]:
        """The group's committed offset of each partition ``asked``: as read now, or, for a
        partition whose offset cannot be read now (the coordinator down), as last read up to
        :data:`COMMITTED_KEPT_S` ago (see the module's text)."""
        try:
            found = self._consumer.committed(asked, timeout=TIMEOUT_S)
        except KafkaException:
            found = []
        now = self._clock()
        for each in found:
            if each.error is None:
                self._read[(each.topic, each.partition)] = (each.offset, now)
        committed = {}
        for partition in asked:
            tp = (partition.topic, partition.partition)
            known = self._read.get(tp)
            if known is not None and now - known[1] <= COMMITTED_KEPT_S:
                committed[tp] = known[0]
        return committed

    def _commit_ages(self, lag: Mapping[TP, int], committed: Mapping[TP, int]) -> dict[TP, float]:
        """How long each partition's committed offset has stood while it is behind: since the
        first reading that saw it behind at that offset (a partition idle for an hour that
        gets a record is behind from then, not for an hour)."""
        now = self._clock()
        ages = {}
        for partition, behind in lag.items():
            if not behind:
                self._since.pop(partition, None)
                ages[partition] = 0.0
                continue
            offset = committed[partition]
            seen = self._since.get(partition)
            if seen is None or seen[0] != offset:
                seen = self._since[partition] = (offset, now)
            ages[partition] = round(now - seen[1], 3)
        return ages

    def _offsets(self, leaders: list[list[TP]], which: int) -> dict[TP, int]:
        """The end (``OFFSET_END``) or start (``OFFSET_BEGINNING``) of each partition, asked of
        each leader on its own, so that one leader down costs only its own partitions."""
        offsets: dict[TP, int] = {}
        for led in leaders:
            if not led:
                continue
            asked = [TopicPartition(topic, partition, which) for topic, partition in led]
            try:
                found = self._consumer.offsets_for_times(asked, timeout=TIMEOUT_S)
            except KafkaException:
                continue
            offsets.update(
                ((p.topic, p.partition), p.offset)
                for p in found
                if p.error is None and p.offset >= 0
            )
        return offsets
