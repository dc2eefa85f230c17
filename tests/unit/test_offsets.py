"""The committable offset is the end of the contiguous prefix of finished records."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.offsets import OffsetTracker


def test_out_of_order_completion_waits_for_the_oldest() -> None:
    tracker = OffsetTracker()
    for offset in (10, 11, 12):
        tracker.started(offset)
    assert tracker.finished(12) is False and tracker.committable is None
    assert tracker.finished(11) is False and tracker.committable is None
    assert tracker.finished(10) is True and tracker.committable == 13
    assert len(tracker) == 0


def test_gaps_in_offsets_are_allowed() -> None:
    tracker = OffsetTracker()
    tracker.started(5)
    tracker.started(9)  # 6..8 are transaction markers or compacted away
    assert tracker.finished(5) and tracker.committable == 9
    assert tracker.finished(9) and tracker.committable == 10


def test_unknown_offsets_are_ignored() -> None:
    tracker = OffsetTracker()
    tracker.started(3)
    assert tracker.finished(1) is False
    assert tracker.committable is None


def test_commit_age_counts_while_records_hold_the_commit_and_restarts_when_it_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    tracker = OffsetTracker()
    assert tracker.commit_age(now[0]) == 0.0, "nothing taken: nothing held"
    tracker.started(0)
    tracker.started(1)
    now[0] = 130.0
    tracker.finished(1)  # out of order: the commit does not move
    assert tracker.commit_age(now[0]) == 30.0
    tracker.finished(0)  # both done: nothing held any more
    assert tracker.commit_age(now[0]) == 0.0
    now[0] = 200.0
    tracker.started(2)  # work begins to wait now, not when the commit last moved (at 130)
    tracker.started(3)
    now[0] = 205.0
    tracker.finished(2)  # the commit moves, 3 still holds it from here
    now[0] = 212.0
    assert tracker.commit_age(now[0]) == 7.0


@given(st.permutations(list(range(30))))
def test_commit_never_passes_an_unfinished_record(order: list[int]) -> None:
    tracker = OffsetTracker()
    for offset in range(30):
        tracker.started(offset)
    finished: set[int] = set()
    for offset in order:
        tracker.finished(offset)
        finished.add(offset)
        if tracker.committable is not None:
            assert set(range(tracker.committable)) <= finished
            assert tracker.committable == 30 or tracker.committable not in finished
    assert tracker.committable == 30
