"""The harness end to end: topic, produce, consume through a group, commit, read the offset."""

from __future__ import annotations

import pytest

from tests.kafka_helpers import committed_offsets, consume, create_topics, produce, unique_name

pytestmark = pytest.mark.integration


def test_produce_consume_commit_roundtrip(kafka_bootstrap: str, group_id: str) -> None:
    topic = unique_name("smoke")
    create_topics(kafka_bootstrap, [topic])
    values = [f"record-{i}".encode() for i in range(10)]

    landed = produce(kafka_bootstrap, topic, values)
    received = consume(kafka_bootstrap, topic, len(values), group=group_id, commit=True)

    assert [msg.value() for msg in received] == values
    assert [p.offset for p in landed] == list(range(10))
    assert committed_offsets(kafka_bootstrap, group_id, topic) == [10]
