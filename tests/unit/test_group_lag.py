"""The group's lag from its committed offsets and the partitions' ends (bridge/kafka/lag.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from bridge.kafka.lag import COMMITTED_KEPT_S, GroupLag, Reading, group_lag

PARTITIONS = [("tx", 0), ("tx", 1), ("tx.retry.1", 0)]
TX0 = ("tx", 0)


def test_lag_is_end_minus_committed_and_a_never_committed_partition_counts_from_its_start() -> None:
    ends = {("tx", 0): 100, ("tx", 1): 50, ("tx.retry.1", 0): 9}
    committed = {("tx", 0): 90, ("tx", 1): -1001}  # -1001: librdkafka's "no committed offset"
    starts = {("tx", 1): 20, ("tx.retry.1", 0): 4}  # retention removed what came before
    # ("tx.retry.1", 0) is not in ``committed``: never committed too.
    assert group_lag(ends, committed, starts) == {
        ("tx", 0): 10,
        ("tx", 1): 30,
        ("tx.retry.1", 0): 5,
    }


def test_a_never_committed_partition_whose_start_is_unknown_is_left_out() -> None:
    ends = {("tx", 0): 100, ("tx", 1): 50}
    assert group_lag(ends, {("tx", 1): -1001}, {}) == {}  # not 100 and 50: unknown, not behind


def test_with_auto_offset_reset_latest_a_never_committed_partition_is_not_behind() -> None:
    ends = {("tx", 0): 100, ("tx", 1): 50}
    assert group_lag(ends, {("tx", 0): 60}, None) == {("tx", 0): 40, ("tx", 1): 0}


offsets = st.integers(min_value=-1001, max_value=10_000)


@given(
    st.fixed_dictionaries({tp: st.integers(0, 10_000) for tp in PARTITIONS}),
    st.dictionaries(st.sampled_from(PARTITIONS), offsets),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(PARTITIONS), st.integers(0, 10_000))),
)
def test_every_partition_with_a_known_start_has_a_lag_never_negative_never_past_its_end(
    ends: dict[tuple[str, int], int],
    committed: dict[tuple[str, int], int],
    starts: dict[tuple[str, int], int] | None,
) -> None:
    lag = group_lag(ends, committed, starts)
    known = {tp for tp in ends if committed.get(tp, -1) >= 0 or starts is None or tp in starts}
    assert set(lag) == known
    for partition, behind in lag.items():
        assert 0 <= behind <= ends[partition]
        if committed.get(partition, -1) >= 0:
            assert behind == max(0, ends[partition] - committed[partition])


def test_the_reader_outlives_any_failed_reading_and_hands_over_none_for_it() -> None:
    readings: list[Reading | None] = []
    done = threading.Event()

    def on_lag(reading: Reading | None) -> None:
        readings.append(reading)
        if len(readings) == 4:
            done.set()

    reader = GroupLag(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}, "g", ["tx"], on_lag, interval=0.01
    )
    outcomes: list[object] = [RuntimeError("a bug"), KafkaException("timed out"), Reading({TX0: 3})]

    def read() -> Reading:
        outcome = outcomes.pop(0) if outcomes else Reading({TX0: 0})
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, Reading)
        return outcome

    reader.read = read  # type: ignore[method-assign]
    reader.start()
    try:
        assert done.wait(10), readings
    finally:
        reader.stop()
    assert readings[:4] == [None, None, Reading({TX0: 3}), Reading({TX0: 0})]


class FakeReader:
    """The calls ``GroupLag.read`` makes on its consumer, answered from tables."""

    def __init__(self, topics: dict[str, int], committed: int, end: int) -> None:
        self.topics, self.committed_at, self.end = topics, committed, end  # every partition

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        found = {}
        if topic in self.topics:
            partitions = {p: SimpleNamespace(id=p, leader=1) for p in range(self.topics[topic])}
            found[topic] = SimpleNamespace(error=None, partitions=partitions)
        return SimpleNamespace(topics=found)

    coordinator_down = False  # committed() raises, as librdkafka does when it times out
    failing: frozenset[tuple[str, int]] = frozenset()  # partitions answered with an error

    def committed(self, asked: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.coordinator_down:
            raise KafkaException("committed offsets: timed out")
        answered = []
        for p in asked:
            found = TopicPartition(p.topic, p.partition, self.committed_at)
            if (p.topic, p.partition) in self.failing:
                found = SimpleNamespace(
                    topic=p.topic,
                    partition=p.partition,
                    offset=-1001,
                    error="COORDINATOR_NOT_AVAILABLE",
                )
            answered.append(found)
        return answered

    def offsets_for_times(
        self, asked: list[TopicPartition], timeout: float
    ) -> list[TopicPartition]:
        return [TopicPartition(p.topic, p.partition, self.end) for p in asked]

    def close(self) -> None:
        pass


def test_a_topic_the_cluster_does_not_know_leaves_the_others_figures() -> None:
    """A parking topic never created (``bridge run`` does not create topics) must not take the
    source's lag, and the alerts on it, away; with no topic known the reading fails."""
    reader = faked(["tx", "tx.parked"], FakeReader({"tx": 2}, committed=7, end=10))
    assert reader.read().lag == {("tx", 0): 3, ("tx", 1): 3}
    reader._consumer = FakeReader({}, committed=7, end=10)  # type: ignore[assignment]
    with pytest.raises(KafkaException, match="none of the topics known"):
        reader.read()


def faked(topics: list[str], consumer: FakeReader, clock: Any = None) -> GroupLag:
    """A reader whose consumer calls are answered by ``consumer``."""
    options = {} if clock is None else {"clock": clock}
    reader = GroupLag(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}, "g", topics, print, **options
    )
    reader._consumer.close()
    reader._consumer = consumer  # type: ignore[assignment]
    return reader


def test_commit_age_counts_while_the_committed_offset_stands_behind_the_end() -> None:
    now = [100.0]
    table = FakeReader({"tx": 1}, committed=7, end=10)
    reader = faked(["tx"], table, clock=lambda: now[0])
    assert reader.read().commit_age == {TX0: 0.0}  # first seen now
    now[0] = 112.5
    assert reader.read().commit_age == {TX0: 12.5}  # stood still, 3 behind
    table.committed_at, now[0] = 8, 120.0
    assert reader.read().commit_age == {TX0: 0.0}  # moved: counts again from here
    table.committed_at, now[0] = 10, 130.0
    assert reader.read().commit_age == {TX0: 0.0}  # caught up
    now[0] = 4000.0
    assert reader.read().commit_age == {TX0: 0.0}  # idle, nothing behind: not stuck
    table.end, now[0] = 11, 4002.0  # a record after an hour idle: behind from now, not an hour
    assert reader.read().commit_age == {TX0: 0.0}
    now[0] = 4007.0
    assert reader.read().commit_age == {TX0: 5.0}


def test_while_the_coordinator_is_down_the_offsets_last_read_stand_in_for_a_minute() -> None:
    """Nobody can commit without the group's coordinator, so what was last read is the group's
    offset: the lag keeps counting arrivals and the commit age keeps growing through the loss
    (the cluster scenario lost every figure for 13 s when the coordinator was killed)."""
    now = [100.0]
    table = FakeReader({"tx": 2}, committed=7, end=10)
    reader = faked(["tx"], table, clock=lambda: now[0])
    assert reader.read().lag == {("tx", 0): 3, ("tx", 1): 3}
    table.coordinator_down, table.end, now[0] = True, 15, 130.0
    reading = reader.read()
    assert reading.lag == {("tx", 0): 8, ("tx", 1): 8}, "the ends read now, the offsets last read"
    assert reading.commit_age == {("tx", 0): 30.0, ("tx", 1): 30.0}
    now[0] = 100.0 + COMMITTED_KEPT_S + 0.001  # never older than that: no figure rather than stale
    with pytest.raises(KafkaException, match="committed offsets could not be read"):
        reader.read()
    table.coordinator_down = False  # back: read again, and kept from the new reading
    assert reader.read().lag == {("tx", 0): 8, ("tx", 1): 8}


def test_a_partition_whose_offset_errs_uses_its_last_one_and_the_others_are_read_now() -> None:
    now = [0.0]
    table = FakeReader({"tx": 2}, committed=7, end=10)
    reader = faked(["tx"], table, clock=lambda: now[0])
    reader.read()
    table.committed_at, table.failing, now[0] = 9, frozenset({("tx", 1)}), 5.0
    assert reader.read().lag == {("tx", 0): 1, ("tx", 1): 3}


def test_offsets_never_read_give_no_figure() -> None:
    table = FakeReader({"tx": 1}, committed=7, end=10)
    table.coordinator_down = True
    with pytest.raises(KafkaException, match="committed offsets could not be read"):
        faked(["tx"], table).read()
