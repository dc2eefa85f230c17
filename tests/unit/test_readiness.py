"""Readiness's broker check after librdkafka's errors: one broker lost of several is not "no
broker reachable"; all lost, or the only one, is."""

from confluent_kafka import KafkaError

from bridge.app import brokers_after_error


def test_all_brokers_down_leaves_none_whatever_was_counted() -> None:
    for counted in (0, 1, 3, 12):
        assert brokers_after_error(KafkaError._ALL_BROKERS_DOWN, counted) == 0


def test_a_lost_connection_leaves_none_only_when_it_was_the_only_broker_up() -> None:
    assert brokers_after_error(KafkaError._TRANSPORT, 1) == 0
    assert brokers_after_error(KafkaError._TRANSPORT, 0) == 0
    assert brokers_after_error(KafkaError._TRANSPORT, 2) == 2
    assert brokers_after_error(KafkaError._TRANSPORT, 3) == 3


def test_repeated_reconnect_failures_to_one_broker_of_three_never_reach_none() -> None:
    """librdkafka reports each failed reconnect to a dead node ("Disconnected", then "Connection
    refused" at each backoff); between two statistics they must not count the others down."""
    up = 3
    for _ in range(50):
        up = brokers_after_error(KafkaError._TRANSPORT, up)
    assert up == 3


def test_other_errors_leave_the_count_alone() -> None:
    for code in (KafkaError._TIMED_OUT, KafkaError._RESOLVE, KafkaError.UNKNOWN_TOPIC_OR_PART):
        assert brokers_after_error(code, 2) == 2
        assert brokers_after_error(code, 0) == 0
