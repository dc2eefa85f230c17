"""Requests are built apart from sending (pinned byte for byte); outcomes and lanes are pure."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time

from bridge import __version__
from bridge.core.webhook import Secret, Webhook
from bridge.engine.budget import TURN_AWAY_BATCH, TURN_AWAY_INTERVAL_S, Lane
from bridge.http.sender import DeliveryRequest, Outcome, build_request

HOOK = Webhook(
    id="shop",
    account="acct_1",
    url="https://example.com/hooks",
    events=frozenset({"transaction.success"}),
    secret=Secret(b"s3cret"),
)
BODY = b'{"transactionId":"tx-1","event":"transaction.success"}'


def test_request_is_pinned_byte_for_byte() -> None:
    service = hmac.new(b"s3cret", BODY, hashlib.sha256).hexdigest()
    standard = base64.b64encode(
        hmac.new(b"s3cret", b"msg_1.1700000000." + BODY, hashlib.sha256).digest()
    ).decode()
    assert build_request(HOOK, "msg_1", BODY, 1_700_000_000) == DeliveryRequest(
        url="https://example.com/hooks",
        headers={
            "Content-Type": "application/json",
            "User-Agent": f"transaction-webhook-bridge/{__version__}",
            "x-service-secret": service,
            "webhook-id": "msg_1",
            "webhook-timestamp": "1700000000",
            "webhook-signature": f"v1,{standard}",
        },
        body=BODY,
    )


def test_only_2xx_counts_as_received() -> None:
    assert Outcome(200, "", 0.1).received and Outcome(299, "", 0.1).received
    for status in (199, 301, 302, 304, 404, 429, 500):
        assert not Outcome(status, "", 0.1).received
    assert not Outcome(None, "timeout", 2.0).received
    assert Outcome(503, "", 0.1).describe() == "HTTP 503"
    assert (
        Outcome(None, "timeout", 2.0, "no answer in 2.0s").describe()
        == "timeout: no answer in 2.0s"
    )


def test_a_moving_lane_keeps_waiters_past_its_patience() -> None:
    async def scenario() -> tuple[bool, bool, float]:
        lane = Lane(2, patience=0.05)
        lane.try_acquire()  # hangs for the whole test
        lane.try_acquire()  # answers after 0.03 s
        started = time.monotonic()
        first = asyncio.ensure_future(lane.acquire())
        second = asyncio.ensure_future(lane.acquire())
        await asyncio.sleep(0.03)
        lane.release(answered=True)  # -> first
        await asyncio.sleep(0.04)
        lane.release(answered=True)  # first answers -> second, 0.07 s after it began to wait
        results = await asyncio.gather(first, second)
        return results[0], results[1], time.monotonic() - started

    first, second, waited = asyncio.run(scenario())
    assert first and second
    assert waited > 0.05


def test_a_stalled_lane_turns_waiters_and_newcomers_away() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        lane = Lane(1, patience=0.05)
        lane.try_acquire()  # a request that never answers
        waited = await lane.acquire()
        stalled = lane.stalled()
        lane.release(answered=True)
        return waited, stalled, lane.stalled()

    assert asyncio.run(scenario()) == (False, True, False)


def test_a_stalled_lane_stays_stalled_until_the_webhook_answers() -> None:
    async def scenario() -> list[object]:
        lane = Lane(1, patience=0.05)
        lane.try_acquire()  # a request that hangs until its timeout
        seen: list[object] = [await lane.acquire(), lane.stalled()]
        lane.release(answered=False)  # the timeout frees the slot: not an answer
        seen += [lane.stalled(), lane.try_acquire()]  # still stalled; the free slot is a probe
        seen.append(lane.stalled())  # the probe hangs too: newcomers are turned away at once
        lane.release(answered=True)  # the probe got a status: the webhook answers again
        seen += [lane.stalled(), lane.try_acquire()]
        return seen

    assert asyncio.run(scenario()) == [False, True, True, True, True, False, True]


def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    async def scenario() -> int:
        lane = Lane(1, patience=5)
        lane.try_acquire()
        waiter = asyncio.ensure_future(lane.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        lane.release(answered=True)
        return lane.active

    assert asyncio.run(scenario()) == 0


async def _turned_away_times(waiters: int, hurry: bool) -> list[float]:
    """When each of ``waiters`` deliveries, waiting on a lane that stalls, is turned away."""
    lane = Lane(1, patience=0.02, hurry=lambda: hurry)
    lane.try_acquire()  # a request that never answers
    times: list[float] = []

    async def wait() -> None:
        assert await lane.acquire() is False
        times.append(time.monotonic())

    await asyncio.gather(*(wait() for _ in range(waiters)))
    return times


def test_a_stalled_lane_turns_its_waiters_away_a_batch_at_a_time() -> None:
    times = asyncio.run(_turned_away_times(3 * TURN_AWAY_BATCH, hurry=False))
    assert len(times) == 3 * TURN_AWAY_BATCH
    # Three batches, the later two each at least one interval after the one before.
    assert times[-1] - times[0] >= 2 * TURN_AWAY_INTERVAL_S * 0.9
    first_batch = [t for t in times if t - times[0] < TURN_AWAY_INTERVAL_S / 2]
    assert len(first_batch) == TURN_AWAY_BATCH


def test_a_stalled_lane_in_a_hurry_turns_every_waiter_away_at_once() -> None:
    times = asyncio.run(_turned_away_times(3 * TURN_AWAY_BATCH, hurry=True))
    assert len(times) == 3 * TURN_AWAY_BATCH
    assert times[-1] - times[0] < TURN_AWAY_INTERVAL_S
