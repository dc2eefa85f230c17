"""The engine's attempt guard: every attempt ends in an outcome within timeout + grace."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry

from bridge.core.envelope import PendingDelivery, SourceRef
from bridge.core.retry import RetryPolicy
from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Secret, Webhook
from bridge.engine.attempt import (
    ATTEMPT_GRACE_S,
    DEADLINE_EXCEEDED,
    DEADLINE_TICK_S,
    INTERNAL_ERROR,
    Deadlines,
    Deliverer,
    Send,
    _expire,
    guarded_attempt,
)
from bridge.engine.budget import UNANSWERED_BURST, Lanes
from bridge.http.sender import DeliveryRequest, Outcome
from bridge.ops.metrics import Metrics

WEBHOOK = Webhook(
    "shop",
    "acct_1",
    "https://example.com/hook",
    frozenset({"transaction.failed"}),
    Secret(b"s3cr3t"),
)
IN_FORCE = Subscriptions([WEBHOOK])
DELIVERY = PendingDelivery(
    webhook_id="shop",
    message_id="msg_1",
    event="transaction.failed",
    transaction_id="tx-1",
    body=b"{}",
    attempt=0,
    source=SourceRef("tx", 0, 1, 0),
    key=b"tx-1",
)
REQUEST = DeliveryRequest("https://example.com/hook", {"x-service-secret": "s3cr3t-value"}, b"{}")


def run(send, build=lambda: REQUEST, timeout: float = 0.2) -> tuple[Outcome, list[str], float]:
    errors: list[str] = []

    async def main() -> Outcome:
        return await guarded_attempt(send, build, timeout, errors.append)

    started = time.monotonic()
    outcome = asyncio.run(main())
    return outcome, errors, time.monotonic() - started


async def answers_204(_request: DeliveryRequest, _timeout: float) -> Outcome:
    return Outcome(204, "", 0.001)


async def never_answers(_request: DeliveryRequest, _timeout: float) -> Outcome:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def ignores_cancellation(_request: DeliveryRequest, _timeout: float) -> Outcome:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    return Outcome(200, "", 0.0)


def test_an_answer_passes_through_untouched() -> None:
    outcome, errors, _ = run(answers_204)
    assert outcome == Outcome(204, "", 0.001)
    assert errors == []


def test_a_send_that_never_returns_ends_at_the_outer_deadline() -> None:
    outcome, errors, took = run(never_answers, timeout=0.1)
    assert outcome.status is None and not outcome.received
    assert outcome.error == DEADLINE_EXCEEDED
    assert errors == [DEADLINE_EXCEEDED]
    assert 0.1 + ATTEMPT_GRACE_S - 0.05 <= took < 0.1 + ATTEMPT_GRACE_S + 0.5


def test_a_send_that_swallows_its_cancellation_still_gives_its_own_outcome() -> None:
    # asyncio.timeout cannot end a coroutine that refuses to be cancelled; the outcome it returns
    # is taken as it is (it did end), and the guard reports nothing.
    outcome, errors, _ = run(ignores_cancellation, timeout=0.05)
    assert outcome.status == 200
    assert errors == []


@pytest.mark.parametrize(
    "exc",
    [
        UnicodeError("label too long: a" * 10),
        KeyError("x-service-secret"),
        ValueError("s3cr3t-value"),
        RuntimeError(),
        TimeoutError("raised by the client itself"),
        OSError(24, "Too many open files"),
    ],
)
def test_any_exception_from_sending_becomes_a_not_received_outcome(exc: Exception) -> None:
    async def raises(_request: DeliveryRequest, _timeout: float) -> Outcome:
        raise exc

    outcome, errors, took = run(raises)
    assert outcome.status is None and outcome.error == INTERNAL_ERROR
    assert outcome.detail.startswith(type(exc).__name__ + " at test_attempt.py:")
    assert "s3cr3t" not in outcome.describe(), "the exception's message is never repeated"
    assert errors == [INTERNAL_ERROR]
    assert took < 0.2


def test_an_exception_building_the_request_becomes_a_not_received_outcome() -> None:
    def build() -> DeliveryRequest:
        raise UnicodeEncodeError("ascii", "ß", 0, 1, "s3cr3t-value")

    outcome, errors, _ = run(answers_204, build=build)
    assert (outcome.status, outcome.error, errors) == (None, INTERNAL_ERROR, [INTERNAL_ERROR])
    assert "s3cr3t" not in outcome.describe()


def test_cancellation_is_not_swallowed() -> None:
    async def main() -> None:
        task = asyncio.ensure_future(guarded_attempt(never_answers, lambda: REQUEST, 5.0, print))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_cancelled_delivery_frees_its_slot_without_judging_the_webhook() -> None:
    """A delivery cancelled mid-attempt (partitions revoked) frees its lane slot and spends none
    of the webhook's unanswered credit: cancelling says nothing about the receiver."""
    webhook, delivery = WEBHOOK, DELIVERY

    class Hanging:
        async def send(self, _request: DeliveryRequest, _timeout: float) -> Outcome:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    async def main() -> tuple[int, float, bool, bool]:
        lanes = Lanes(0.001, lambda: False)
        metrics = Metrics(CollectorRegistry())
        deliverer = Deliverer(Hanging(), lanes, None, None, metrics, lambda: IN_FORCE)  # type: ignore[arg-type]
        task = asyncio.ensure_future(deliverer.attempt(delivery, webhook))
        await asyncio.sleep(0.05)  # under way, well past the patience
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        lane = lanes["shop"]
        return lane.active, lane.credit, lane.is_stalled, lane.probing()

    active, credit, stalled, probing = asyncio.run(main())
    assert (active, stalled, probing) == (0, False, True)
    assert credit == UNANSWERED_BURST, "no credit spent on a cancelled attempt"


# ---- the outer deadlines: one timer per tick for every attempt ------------------------------


def test_each_attempt_ends_within_a_tick_of_its_own_limit_and_the_others_are_untouched() -> None:
    """Attempts of several timeouts, started at different moments on one Deadlines: each one that
    never answers ends between its limit and a tick after; one answering just before its limit
    keeps its outcome; tasks that go on after an answered attempt are never cancelled."""

    async def answers_after(delay: float) -> Send:
        async def send(_request: DeliveryRequest, _timeout: float) -> Outcome:
            await asyncio.sleep(delay)
            return Outcome(204, "", delay)

        return send

    async def main() -> list[tuple[str, float, float, bool]]:
        deadlines = Deadlines()
        loop = asyncio.get_running_loop()

        async def one(send: Send, timeout: float, after: float) -> tuple[str, float, float, bool]:
            await asyncio.sleep(after)
            started = loop.time()
            outcome = await guarded_attempt(send, lambda: REQUEST, timeout, print, dict, deadlines)
            took = loop.time() - started
            try:  # the task goes on: a watch that was stopped never cancels it
                await asyncio.sleep(timeout + ATTEMPT_GRACE_S + 2 * DEADLINE_TICK_S)
                cancelled_later = False
            except asyncio.CancelledError:
                cancelled_later = True
            return outcome.error or str(outcome.status), took, timeout, cancelled_later

        jobs = [
            one(never_answers, t, after) for t, after in ((0.05, 0.0), (0.3, 0.07), (0.6, 0.13))
        ]
        jobs += [one(await answers_after(0.2), 0.05, 0.01)]  # answers past its timeout, in limit
        jobs += [one(await answers_after(0.01), 0.05, 0.02)]
        return list(await asyncio.gather(*jobs))

    results = asyncio.run(main())
    for error, took, timeout, cancelled_later in results:
        assert not cancelled_later
        if error == DEADLINE_EXCEEDED:
            limit = timeout + ATTEMPT_GRACE_S
            assert limit - 0.01 <= took <= limit + DEADLINE_TICK_S + 0.2, (took, timeout)
        else:
            assert error == "204"
    assert [r[0] for r in results] == [DEADLINE_EXCEEDED] * 3 + ["204", "204"]


def test_a_cancellation_from_elsewhere_is_not_taken_for_the_deadline() -> None:
    """A task cancelled by someone else (partitions revoked) while its deadline also fires is
    cancelled: the CancelledError goes on to the caller, never becomes a deadline outcome."""

    async def main() -> bool:
        deadlines = Deadlines()
        errors: list[str] = []

        async def attempt() -> Outcome:
            return await guarded_attempt(
                never_answers, lambda: REQUEST, 0.0, errors.append, dict, deadlines
            )

        task = asyncio.ensure_future(attempt())
        await asyncio.sleep(0)
        buckets = deadlines._loops[task.get_loop()]
        (tick,) = buckets
        _expire(buckets, tick)  # the deadline fires...
        task.cancel()  # ...and the partition is revoked at the same moment
        try:
            await task
        except asyncio.CancelledError:
            return not errors
        return False

    assert asyncio.run(main())


def test_one_deadlines_serves_two_live_loops_without_losing_a_watch() -> None:
    """One Deadlines (as the module's default is) used at once by a loop in another thread: the
    first loop's attempt that never answers still ends at its deadline, and the other loop's
    attempts end with their own outcomes."""
    deadlines = Deadlines()

    def other_loop() -> list[str]:
        async def attempts() -> list[str]:
            done = []
            for _ in range(3):
                outcome = await guarded_attempt(
                    answers_204, lambda: REQUEST, 0.1, print, dict, deadlines
                )
                done.append(str(outcome.status))
            return done

        return asyncio.run(attempts())

    async def main() -> tuple[str, list[str]]:
        hanging = asyncio.ensure_future(
            guarded_attempt(never_answers, lambda: REQUEST, 0.0, print, dict, deadlines)
        )
        await asyncio.sleep(0.05)
        others = await asyncio.to_thread(other_loop)
        outcome = await asyncio.wait_for(hanging, ATTEMPT_GRACE_S + 2.0)
        return outcome.error, others

    assert asyncio.run(main()) == (DEADLINE_EXCEEDED, ["204", "204", "204"])


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 1e308])
def test_a_limit_that_is_no_number_still_gives_an_outcome(timeout: float) -> None:
    outcome, errors, _ = run(answers_204, timeout=timeout)
    assert outcome.status == 204 and errors == []


def test_a_deadline_that_send_turns_into_another_exception_is_still_the_deadline() -> None:
    async def converts(_request: DeliveryRequest, _timeout: float) -> Outcome:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise TimeoutError("the client's own words") from None
        raise AssertionError("unreachable")

    outcome, errors, took = run(converts, timeout=0.0)
    assert (outcome.error, errors) == (DEADLINE_EXCEEDED, [DEADLINE_EXCEEDED])
    assert took < ATTEMPT_GRACE_S + DEADLINE_TICK_S + 0.5


class _Work:
    def __init__(self) -> None:
        self.done_calls = 0

    def done(self) -> None:
        self.done_calls += 1


class _Recovery:
    """Records what the deliverer writes; ``refuse`` names the writes that raise."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.dead_letters: list[tuple[str, str, int | None]] = []

    async def delay(self, _delivery: PendingDelivery, _topic: str) -> None:
        if "delay" in self.refuse:
            raise RuntimeError("delay topic refused")

    async def dead_letter(
        self, delivery: PendingDelivery, reason: str, attempts: int | None = None
    ) -> None:
        if "dead_letter" in self.refuse:
            raise RuntimeError("dead-letter topic refused")
        self.dead_letters.append((delivery.message_id, reason, attempts))


class _BrokenLadder:
    """A retry policy that fails as the ladder did for a forged negative attempt."""

    def after_failure(self, failed_attempt: int, now_ms: int) -> object:
        raise IndexError("tuple index out of range")


@pytest.mark.parametrize(
    ("ladder", "refuse", "settled"),
    [
        ("broken", set(), True),  # the ladder raises: dead-lettered, internal_error
        ("working", {"delay"}, True),  # the rung refuses: dead-lettered
        ("working", {"delay", "dead_letter"}, False),  # nothing writable: left unfinished
    ],
)
def test_a_delivery_whose_ladder_fails_is_dead_lettered_so_its_commit_moves(
    ladder: str, refuse: set[str], settled: bool
) -> None:
    """An attempt answered 500 whose next step fails unexpectedly (the ladder raising, or its
    rung refusing) is dead-lettered as ``internal_error`` and its record finished; only when
    even the dead letter cannot be written is it left unfinished (delivered again later)."""
    webhook, delivery = WEBHOOK, DELIVERY

    class Answers500:
        async def send(self, _request: DeliveryRequest, _timeout: float) -> Outcome:
            return Outcome(500, "", 0.001)

    policy = _BrokenLadder() if ladder == "broken" else RetryPolicy(("tx.retry.1",), 10, 10)
    recovery = _Recovery(refuse)
    work = _Work()

    async def main() -> None:
        lanes = Lanes(0.001, lambda: False)
        metrics = Metrics(CollectorRegistry())
        deliverer = Deliverer(Answers500(), lanes, recovery, policy, metrics, lambda: IN_FORCE)  # type: ignore[arg-type]
        await deliverer.deliver(delivery, webhook, work)  # type: ignore[arg-type]

    asyncio.run(main())
    assert work.done_calls == (1 if settled else 0)
    expected = [("msg_1", INTERNAL_ERROR, 1)] if settled else []
    assert recovery.dead_letters == expected
