"""The engine's attempt guard: every attempt ends in an outcome within timeout + grace."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry

from bridge.core.envelope import PendingDelivery, SourceRef
from bridge.core.webhook import Secret, Webhook
from bridge.engine.attempt import (
    ATTEMPT_GRACE_S,
    DEADLINE_EXCEEDED,
    INTERNAL_ERROR,
    Deliverer,
    guarded_attempt,
)
from bridge.engine.budget import UNANSWERED_BURST, Lanes
from bridge.http.sender import DeliveryRequest, Outcome
from bridge.ops.metrics import Metrics

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
    webhook = Webhook("shop", "acct_1", "https://example.com/hook", frozenset(), Secret(b"s3cr3t"))
    delivery = PendingDelivery(
        webhook_id="shop",
        message_id="msg_1",
        event="transaction.failed",
        transaction_id="tx-1",
        body=b"{}",
        attempt=0,
        source=SourceRef("tx", 0, 1, 0),
        key=b"tx-1",
    )

    class Hanging:
        async def send(self, _request: DeliveryRequest, _timeout: float) -> Outcome:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    async def main() -> tuple[int, float, bool, bool]:
        lanes = Lanes(0.001, lambda: False)
        metrics = Metrics(CollectorRegistry())
        deliverer = Deliverer(Hanging(), lanes, None, None, metrics)  # type: ignore[arg-type]
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
