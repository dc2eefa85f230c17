"""The retry ladder: delays, topics, exhaustion and deferral."""

from __future__ import annotations

import pytest

from bridge.core.retry import GiveUp, Retry, RetryPolicy

TOPICS = tuple(f"tx.retry.{n}" for n in range(1, 6))


def test_default_ladder_is_half_second_steps() -> None:
    policy = RetryPolicy(TOPICS, first_delay_ms=500, increment_ms=500)
    assert [policy.delay_ms(n) for n in range(1, 6)] == [500, 1000, 1500, 2000, 2500]
    assert policy.span_ms() == 7500


@pytest.mark.parametrize("failed", range(5))
def test_each_failure_moves_one_rung_up(failed: int) -> None:
    policy = RetryPolicy(TOPICS, first_delay_ms=500, increment_ms=500)
    step = policy.after_failure(failed, now_ms=1_000_000)
    assert step == Retry(TOPICS[failed], failed + 1, 1_000_000 + 500 * (failed + 1))


def test_sixth_failure_gives_up_after_six_requests() -> None:
    policy = RetryPolicy(TOPICS, first_delay_ms=500, increment_ms=500)
    assert policy.after_failure(5, now_ms=0) == GiveUp(attempts_made=6)


def test_no_retries_configured_gives_up_at_once() -> None:
    assert RetryPolicy((), 500, 500).after_failure(0, 0) == GiveUp(attempts_made=1)


def test_parking_keeps_the_attempt_waits_the_park_delay_and_ends() -> None:
    policy = RetryPolicy(TOPICS, 200, 100, "tx.parked", park_delay_ms=30_000, max_parks=3)
    assert policy.defer(attempt=2, parks=0, now_ms=10) == Retry("tx.parked", 2, 10 + 30_000)
    assert policy.defer(attempt=2, parks=2, now_ms=10) == Retry("tx.parked", 2, 10 + 30_000)
    assert policy.defer(attempt=2, parks=3, now_ms=10) == GiveUp(attempts_made=2)
