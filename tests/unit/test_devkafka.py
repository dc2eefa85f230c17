"""The local Kafka tooling's pure parts (devtools/devkafka.py)."""

from __future__ import annotations

import base64
from unittest import mock

from devtools.devkafka import kafka_uuid


def test_a_cluster_id_never_starts_with_a_dash_and_is_a_kafka_uuid() -> None:
    """The storage tool takes ``-t -QLT...`` for an option: one cluster start in 64 failed so.
    The draws are forced: the first random id starts with a dash, the next does not."""
    dashed = base64.urlsafe_b64decode("-QLTc0tqRSm6BFFtiDzTmQ==")
    plain = base64.urlsafe_b64decode("AQLTc0tqRSm6BFFtiDzTmQ==")
    draws = iter([mock.Mock(bytes=dashed), mock.Mock(bytes=plain)])
    with mock.patch("devtools.devkafka.uuid.uuid4", lambda: next(draws)):
        assert kafka_uuid() == "AQLTc0tqRSm6BFFtiDzTmQ"
    for _ in range(2_000):
        made = kafka_uuid()
        assert not made.startswith("-")
        assert len(made) == 22 and len(base64.urlsafe_b64decode(made + "==")) == 16
