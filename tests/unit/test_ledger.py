"""The fault ledger's rule for duplicates (``tests/ledger.py``), on timelines taken from runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from tests.ledger import Request, unexplained_duplicates, wait_complete

WINDOW = 10.0


def test_work_done_during_a_broker_outage_is_in_flight_only_while_the_broker_is_back() -> None:
    """From a failed run: a pair delivered 1 s into a broker outage that lasted 27.6 s (the
    restart was slow), the broker back for 4.2 s, down again for 50 s, and the pair delivered
    again after that. The broker was available for 4.2 s between the first delivery and the
    second fault: explained. Without the outages the lag reads 26.6 s: unexplained."""
    faults = [0.0, 27.56, 31.78, 81.91]
    outages = [(0.0, 27.56), (31.78, 81.91)]
    requests = [Request("msg_a", 200, 0.953), Request("msg_a", 200, 128.586)]
    produced = {"msg_a": 0.927}
    assert unexplained_duplicates(requests, faults, produced, WINDOW) == ["msg_a"]
    assert unexplained_duplicates(requests, faults, produced, WINDOW, outages) == []


def test_a_repeat_long_after_the_broker_came_back_is_still_unexplained() -> None:
    """Delivered while the broker was up, then again with no fault in the window before it and
    the broker up for 60 s in between: a duplicate no outage explains."""
    faults = [100.0, 105.0]
    outages = [(100.0, 105.0)]
    requests = [Request("msg_b", 200, 30.0), Request("msg_b", 200, 110.0)]
    assert unexplained_duplicates(requests, faults, {"msg_b": 29.0}, WINDOW, outages) == ["msg_b"]


class FlakyReader:
    """A dead-letter reader whose first reads fail as a just-restarted broker makes them."""

    def __init__(self, failures: list[KafkaError]) -> None:
        self.failures = failures
        self.reads = 0

    def read(self) -> list[Any]:
        self.reads += 1
        if self.failures:
            raise KafkaException(self.failures.pop(0))
        return []


def test_waiting_for_the_outcomes_reads_on_through_a_settling_cluster() -> None:
    done = SimpleNamespace(verdict=lambda _requests, _letters: SimpleNamespace(complete=True))
    settling = [KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), KafkaError(KafkaError._TRANSPORT)]
    reader = FlakyReader(settling)
    wait_complete(done, list, reader, timeout=10)  # type: ignore[arg-type]
    assert reader.reads == 3
    with pytest.raises(KafkaException):  # anything else is not waited out
        wait_complete(
            done,  # type: ignore[arg-type]
            list,
            FlakyReader([KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)]),  # type: ignore[arg-type]
            timeout=10,
        )
