"""Kafka's reachability for the gauge and ``/readyz``: one broker lost of several is not "no
broker"; librdkafka's all-down report (which it also gives when its one open connection went) is
not the cluster lost before the grace has passed; a cluster silent for the grace is."""

from __future__ import annotations

from confluent_kafka import KafkaError

from bridge.app import Reachability

GRACE = Reachability.SILENCE_S
NEVER = float("-inf")  # no record fetched yet


def counted(brokers: int, at: float = 0.0) -> Reachability:
    kafka = Reachability()
    kafka.counted(brokers, at)
    return kafka


def test_all_brokers_down_counts_none_whatever_was_counted() -> None:
    for brokers in (0, 1, 3, 12):
        kafka = counted(brokers)
        kafka.failed(KafkaError._ALL_BROKERS_DOWN)
        assert kafka.brokers_up == 0


def test_a_lost_connection_counts_none_only_when_it_was_the_only_broker_up() -> None:
    for brokers, left in ((0, 0), (1, 0), (2, 2), (3, 3)):
        kafka = counted(brokers)
        assert kafka.failed(KafkaError._TRANSPORT) == (left != brokers)
        assert kafka.brokers_up == left


def test_repeated_reconnect_failures_to_one_broker_of_three_never_count_none() -> None:
    """librdkafka reports each failed reconnect to a dead node ("Disconnected", then "Connection
    refused" at each backoff); between two statistics they must not count the others down."""
    kafka = counted(3)
    for _ in range(50):
        kafka.failed(KafkaError._TRANSPORT)
    assert kafka.brokers_up == 3


def test_other_errors_leave_the_count_alone() -> None:
    for code in (KafkaError._TIMED_OUT, KafkaError._RESOLVE, KafkaError.UNKNOWN_TOPIC_OR_PART):
        kafka = counted(2)
        assert not kafka.failed(code)
        assert kafka.brokers_up == 2


def test_an_all_down_report_within_the_grace_keeps_the_bridge_ready() -> None:
    """The cluster scenario's flap: "0/5 brokers are down" right after a node died, statistics
    counting none for a moment, then a broker again."""
    kafka = counted(1, at=100.0)
    kafka.failed(KafkaError._ALL_BROKERS_DOWN)
    kafka.counted(0, 104.0)
    assert kafka.reachable(100.0 + GRACE - 0.1, NEVER)
    kafka.counted(2, 105.0)
    assert kafka.reachable(105.0 + GRACE - 0.1, NEVER)


def test_a_cluster_silent_for_the_grace_is_unreachable_until_counted_again() -> None:
    kafka = counted(3, at=100.0)
    for at in (105.0, 110.0, 115.0):
        kafka.counted(0, at)
    assert not kafka.reachable(100.0 + GRACE, NEVER)
    assert kafka.reachable(100.0 + GRACE, last_record=100.0 + GRACE - 1.0), "records arriving"
    kafka.counted(1, 120.0)
    assert kafka.reachable(120.0, NEVER)


def test_nothing_counted_yet_is_unreachable() -> None:
    assert not Reachability().reachable(1_000.0, NEVER)
