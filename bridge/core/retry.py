"""Retry policy: after a failed attempt, which delay topic and due time come next, or a dead letter.

Attempt 0 is the first delivery. After non-receipt, up to ``attempts`` more follow; retry ``n``
(1-based) waits ``first_delay_ms + (n - 1) * increment_ms`` and travels through rung ``n``'s delay
topic. With the defaults the ladder is 0.5 s, 1.0 s, 1.5 s, 2.0 s, 2.5 s: at most 6 requests.

A delivery to a stalled webhook (one that answers nothing) is parked instead: it waits
``park_delay_ms`` in the parking topic without using an attempt, at most ``max_parks`` times; then
it is dead-lettered (reason ``webhook_stalled``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.core.settings import Config


@dataclass(frozen=True, slots=True)
class Retry:
    """Send the delivery to ``topic``; attempt number ``attempt`` is due at ``due_ms``."""

    topic: str
    attempt: int
    due_ms: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No attempts are left: the delivery goes to the dead-letter topic."""

    attempts_made: int


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The retry ladder: one delay topic per rung, then the dead-letter topic."""

    delay_topics: tuple[str, ...]
    first_delay_ms: int
    increment_ms: int
    parked_topic: str = "parked"
    park_delay_ms: int = 30_000
    max_parks: int = 20

    @classmethod
    def from_config(cls, config: Config) -> RetryPolicy:
        """The ladder of a configuration: its delay and parking topics and its ``retry`` section."""
        retry = config.retry
        return cls(
            config.delay_topics,
            retry.first_delay_ms,
            retry.increment_ms,
            config.parked_topic,
            retry.park_delay_ms,
            retry.max_parks,
        )

    @property
    def attempts(self) -> int:
        """How many retries follow the first delivery."""
        return len(self.delay_topics)

    def delay_ms(self, attempt: int) -> int:
        """How long retry number ``attempt`` (1-based) waits after the previous failure."""
        return self.first_delay_ms + (attempt - 1) * self.increment_ms

    def after_failure(self, failed_attempt: int, now_ms: int) -> Retry | GiveUp:
        """What follows the failure of attempt ``failed_attempt`` (0 is the first delivery)."""
        if failed_attempt >= self.attempts:
            return GiveUp(attempts_made=failed_attempt + 1)
        attempt = failed_attempt + 1
        return Retry(self.delay_topics[attempt - 1], attempt, now_ms + self.delay_ms(attempt))

    def defer(self, attempt: int, parks: int, now_ms: int) -> Retry | GiveUp:
        """Park a delivery whose webhook is stalled, without using an attempt: it waits the park
        delay in the parking topic, so a stalled webhook costs one pass per park delay and never
        blocks records behind it. After ``max_parks`` parks it gives up (dead letter)."""
        if parks >= self.max_parks:
            return GiveUp(attempts_made=attempt)
        return Retry(self.parked_topic, attempt, now_ms + self.park_delay_ms)

    @property
    def longest_wait_ms(self) -> int:
        """The longest any delay-topic or parking record waits after it is written: how far
        ahead of its writer's clock a due time the bridge wrote can be."""
        rungs = (self.delay_ms(n) for n in range(1, self.attempts + 1))
        return max(self.park_delay_ms, *rungs)

    def span_ms(self) -> int:
        """The ladder's total waiting time from the first failure to the last attempt."""
        return sum(self.delay_ms(n) for n in range(1, self.attempts + 1))
