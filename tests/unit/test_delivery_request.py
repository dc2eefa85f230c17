"""Requests are built apart from sending (pinned byte for byte); outcomes and lanes are pure."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from types import SimpleNamespace

import pytest

from bridge import __version__
from bridge.core.webhook import Secret, Webhook
from bridge.engine import budget
from bridge.engine.budget import (
    TURN_AWAY_BATCH,
    TURN_AWAY_INTERVAL_S,
    UNANSWERED_BURST,
    UNANSWERED_PER_S,
    AccountCredit,
    Lane,
    Lanes,
)
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


def answering(lane: Lane) -> Lane:
    """``lane`` after one attempt that was answered: its whole limit is open."""
    assert lane.try_acquire()
    lane.release(answered=True)
    assert lane.answering and lane.room() == lane.limit
    return lane


def test_a_moving_lane_keeps_waiters_past_its_patience() -> None:
    async def scenario() -> tuple[bool, bool, float]:
        lane = answering(Lane(2, patience=0.05))
        assert lane.try_acquire()  # hangs for the whole test
        assert lane.try_acquire()  # answers after 0.03 s
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
        lane = answering(Lane(1, patience=0.05))
        lane.try_acquire()  # a request that never answers
        waited = await lane.acquire()
        stalled = lane.stalled()
        lane.release(answered=True)
        return waited, stalled, lane.stalled()

    assert asyncio.run(scenario()) == (False, True, False)


def test_a_stalled_lane_stays_stalled_until_the_webhook_answers() -> None:
    async def scenario() -> list[object]:
        lane = answering(Lane(1, patience=0.05))
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
    lane = answering(Lane(1, patience=0.02, hurry=lambda: hurry))
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


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _unanswered_attempts(lane: Lane, count: int) -> list[bool]:
    """Make ``count`` attempts that end without an answer: whether each was let in."""

    async def attempts() -> list[bool]:
        let_in = []
        for _ in range(count):
            entered = await lane.enter()
            let_in.append(entered)
            if entered:
                lane.release(answered=False)
        return let_in

    return asyncio.run(attempts())


def test_a_webhook_that_answers_nothing_spends_its_credit_then_is_parked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))  # budget's clock only
    lane = Lane(4, patience=5)
    burst = int(UNANSWERED_BURST)
    let_in = _unanswered_attempts(lane, burst + 50)
    assert let_in == [True] * burst + [False] * 50
    assert lane.active == 0, "a parked delivery holds no slot"
    clock.now += 1.0  # a second refills UNANSWERED_PER_S credits, no more
    let_in = _unanswered_attempts(lane, 3 * int(UNANSWERED_PER_S))
    assert sum(let_in) == int(UNANSWERED_PER_S)
    clock.now += 3600.0  # the credit never grows past the burst
    assert sum(_unanswered_attempts(lane, 2 * burst)) == burst


def test_answers_spend_no_credit_and_cannot_refill_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))  # budget's clock only

    async def answered(lane: Lane, count: int) -> int:
        let_in = 0
        for _ in range(count):
            if await lane.enter():
                let_in += 1
                lane.release(answered=True)  # a status, 2xx or not
        return let_in

    lane = Lane(1, patience=5)
    assert asyncio.run(answered(lane, 1000)) == 1000  # answers cost nothing
    _unanswered_attempts(lane, int(UNANSWERED_BURST))
    assert lane.out_of_credit()
    clock.now += 1 / UNANSWERED_PER_S  # one credit back: the webhook answers again, all flow
    assert asyncio.run(answered(lane, 1000)) == 1000
    # Alternating an answer with silence does not refill: one silence per credit.
    let_in = 0
    for _ in range(50):
        let_in += asyncio.run(answered(lane, 1))
        let_in += sum(_unanswered_attempts(lane, 1))
    assert let_in == 2  # the answer and the silence that spent the last credit


def test_an_account_cannot_multiply_its_budget_with_more_silent_webhooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However many webhooks of one account answer nothing, together they spend one burst and
    one refill; another account's budget is untouched."""
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))  # budget's clock only
    lanes = Lanes(0.5, hurry=lambda: False)
    silent = [lanes.of(_webhook(f"silent-{n}", "acct_many")) for n in range(9)]
    burst = int(UNANSWERED_BURST)
    let_in = [sum(_unanswered_attempts(lane, burst)) for lane in silent]
    assert sum(let_in) == burst and let_in[0] == burst  # the first spent it all
    clock.now += 1.0
    let_in = [sum(_unanswered_attempts(lane, burst)) for lane in silent]
    assert sum(let_in) == int(UNANSWERED_PER_S)
    other = lanes.of(_webhook("other", "acct_other"))
    assert sum(_unanswered_attempts(other, burst)) == burst


def test_an_answering_webhook_is_not_refused_for_its_accounts_spent_credit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a webhook answers, its account's credit no longer applies to it (its own still
    does); a webhook that has not answered yet needs the account's credit too."""
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))  # budget's clock only
    account = AccountCredit()
    working, silent, fresh = (Lane(4, 5, account=account) for _ in range(3))

    async def answer_once(lane: Lane) -> bool:
        if not await lane.enter():
            return False
        lane.release(answered=True)
        return True

    assert asyncio.run(answer_once(working))
    _unanswered_attempts(silent, int(UNANSWERED_BURST))
    assert account.level() < 1.0 and silent.out_of_credit()
    assert not working.out_of_credit() and asyncio.run(answer_once(working))
    assert fresh.out_of_credit(), "not answering yet: the account's spent credit refuses it"
    assert working.snapshot()["account_credit"] < 1.0 and not working.snapshot()["out_of_credit"]
    assert fresh.snapshot()["out_of_credit"]
    _unanswered_attempts(working, 1)  # silent now: the account's credit applies again
    assert working.out_of_credit()
    clock.now += 2 / UNANSWERED_PER_S  # the account's debt of one, then a credit
    assert not fresh.out_of_credit()


def test_a_webhook_moved_to_another_account_spends_that_accounts_credit() -> None:
    """Its lane is a new one, on the new account's budget; the old lane (what was in flight
    ends in it) stays on the old account's (see test_lane_invariants for the whole story)."""
    lanes = Lanes(0.5, hurry=lambda: False)
    lane = lanes.of(_webhook("moving", "acct_a"))
    old_account = lanes.account("acct_a")
    assert lane.account is old_account
    moved = _webhook("moving", "acct_b")
    lanes.reconfigure(SimpleNamespace(get={"moving": moved}.get))  # type: ignore[arg-type]
    assert lanes.of(moved) is not lane
    assert lanes.of(moved).account is lanes.account("acct_b")
    assert lane.account is old_account


def test_lanes_of_removed_webhooks_go_once_nothing_is_in_them() -> None:
    """Reload after reload, a lane is kept only for a configured webhook, or while an attempt
    of a removed one is still in its lane; an account without a lane goes with it."""

    async def scenario() -> tuple[set[str], set[str], set[str], set[str]]:
        lanes = Lanes(0.5, hurry=lambda: False)
        kept, busy = _webhook("kept", "acct_a"), _webhook("busy", "acct_b")
        lanes.of(_webhook("idle", "acct_c"))
        lanes.of(kept)
        assert await lanes.of(busy).enter()  # an attempt in flight
        lanes.reconfigure(SimpleNamespace(get={"kept": kept}.get))  # type: ignore[arg-type]
        first = (set(lanes), set(lanes.accounts))
        lanes["busy"].release(answered=True)
        lanes.reconfigure(SimpleNamespace(get={"kept": kept}.get))  # type: ignore[arg-type]
        return (*first, set(lanes), set(lanes.accounts))

    lanes_then, accounts_then, lanes_now, accounts_now = asyncio.run(scenario())
    assert lanes_then == {"kept", "busy"} and accounts_then == {"acct_a", "acct_b"}
    assert lanes_now == {"kept"} and accounts_now == {"acct_a"}


def _webhook(webhook_id: str, account: str) -> Webhook:
    return Webhook(
        id=webhook_id,
        account=account,
        url="https://example.com/hooks",
        events=frozenset({"transaction.success"}),
        secret=Secret(b"s3cret"),
        concurrency=4,
    )


def test_attempts_under_way_when_credit_runs_out_leave_a_bounded_debt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))  # budget's clock only
    lane = answering(Lane(10_000, patience=5))
    entered = [asyncio.run(lane.enter()) for _ in range(3 * int(UNANSWERED_BURST))]
    assert all(entered)  # all started while credit was left
    for _ in entered:
        lane.release(answered=False)
    assert lane.credit == -UNANSWERED_BURST
    clock.now += (UNANSWERED_BURST + 1) / UNANSWERED_PER_S - 0.01  # back up to one credit
    assert lane.out_of_credit()
    clock.now += 0.02
    assert not lane.out_of_credit()


def test_a_waiter_whose_credit_ran_out_is_parked_and_passes_its_slot_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))  # budget's clock only

    async def scenario() -> tuple[bool, bool, int]:
        lane = Lane(1, patience=5)
        lane.credit = 1.0
        assert await lane.enter()  # the only slot
        waiter = asyncio.ensure_future(lane.enter())
        await asyncio.sleep(0)
        lane.release(answered=False)  # the slot goes to the waiter, the credit is gone
        parked = not await waiter
        return parked, lane.out_of_credit(), lane.active

    assert asyncio.run(scenario()) == (True, True, 0)


def test_waiters_are_turned_away_as_the_credit_runs_out() -> None:
    async def scenario() -> tuple[list[bool], int]:
        lane = Lane(1, patience=60)
        lane.credit = 1.0
        assert await lane.enter()  # the only slot; this attempt will end unanswered
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(3 * TURN_AWAY_BATCH)]
        await asyncio.sleep(0)
        lane.release(answered=False)  # the last credit: nobody may wait for a slot now
        results = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        return results, lane.active

    results, active = asyncio.run(scenario())
    assert results == [False] * (3 * TURN_AWAY_BATCH)
    assert active == 0


def test_shed_parks_only_the_waiters_that_waited_their_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))  # budget's clock only

    async def scenario() -> tuple[int, int, list[bool], int]:
        lane = Lane(1, patience=2.0)
        assert await lane.enter()  # a slow answer holds the only slot
        old = [asyncio.ensure_future(lane.enter()) for _ in range(3)]
        await asyncio.sleep(0)
        clock.now += 1.5
        young = [asyncio.ensure_future(lane.enter()) for _ in range(2)]
        await asyncio.sleep(0)
        early = lane.shed()  # nobody has waited 2 s yet
        clock.now += 0.5
        lane.last_answer = clock.now  # the webhook answers (slowly): it is not stalled
        shed = lane.shed()  # the three old ones have waited 2 s
        parked = [not r for r in await asyncio.gather(*old)]
        lane.release(answered=True)  # the slot goes to the first young waiter
        for _ in range(5):  # (no timers: the clock is the test's)
            await asyncio.sleep(0)
        entered = sum(task.done() and task.result() for task in young)
        for task in young:
            task.cancel()
        return early, shed, parked, entered

    assert asyncio.run(scenario()) == (0, 3, [True, True, True], 1)


def test_a_stalled_lane_refuses_new_work_only_while_every_slot_is_taken() -> None:
    async def scenario() -> list[bool]:
        lane = answering(Lane(1, patience=0.02))
        assert await lane.enter()  # hangs
        assert not await lane.enter()  # waits past the patience: stalled, turned away
        seen = [lane.refusing()]  # stalled, its only slot taken: park without a request
        lane.release(answered=False)  # the timeout frees the slot
        seen.append(lane.refusing())  # still stalled, but the free slot takes a probe
        lane.credit = 0.0
        seen.append(lane.refusing())  # out of credit: parked whatever the slots
        return seen

    assert asyncio.run(scenario()) == [True, False, True]


def test_a_lane_not_answering_yet_runs_one_attempt_then_opens_its_limit_on_an_answer() -> None:
    async def scenario() -> list[object]:
        lane = Lane(4, patience=60)
        assert lane.room() == 1 and lane.snapshot()["probing"]
        assert lane.try_acquire()  # the probe
        assert not lane.try_acquire(), "a new webhook: one attempt until it answers"
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(6)]
        await asyncio.sleep(0)
        seen: list[object] = [sum(task.done() for task in waiting)]
        lane.release(answered=True)  # the probe's answer opens the limit: four go at once
        await asyncio.sleep(0)
        seen += [sum(task.done() for task in waiting), lane.active, lane.snapshot()["probing"]]
        for task in waiting:
            task.cancel()
        return seen

    assert asyncio.run(scenario()) == [0, 4, 4, False]


def test_a_lane_whose_attempt_goes_unanswered_narrows_to_one_probe_until_an_answer() -> None:
    async def scenario() -> list[object]:
        lane = answering(Lane(4, patience=60))
        for _ in range(4):
            assert lane.try_acquire()
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(6)]
        await asyncio.sleep(0)

        def started() -> int:
            return sum(task.done() for task in waiting)

        seen: list[object] = []
        lane.release(answered=False)  # silent: the three under way finish, nobody starts
        lane.release(answered=False)
        lane.release(answered=False)
        await asyncio.sleep(0)
        seen += [started(), lane.active]
        lane.release(answered=False)  # the last one ends: its slot is the probe
        await asyncio.sleep(0)
        seen += [started(), lane.active]
        lane.release(answered=True)  # the probe is answered: the whole limit again
        await asyncio.sleep(0)
        seen += [started(), lane.active]
        for task in waiting:
            task.cancel()
        return seen

    assert asyncio.run(scenario()) == [0, 1, 1, 1, 5, 4]


@pytest.mark.parametrize("seed", range(40))
def test_a_lane_never_exceeds_its_room_and_never_leaves_a_slot_idle(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random entries, answered and unanswered ends, and cancelled waiters: whenever an attempt
    starts while the webhook is not answering it is the only one under way; the lane never
    holds more than its limit; its count is the attempts under way; and nobody waits while
    there is room (no slot is lost)."""
    import random

    rng = random.Random(seed)

    async def scenario() -> None:
        lane = Lane(rng.randint(1, 6), patience=3600)
        under_way: list[object] = []
        pending: list[asyncio.Task[bool]] = []

        async def settle() -> None:
            for _ in range(3):
                await asyncio.sleep(0)

        for _ in range(300):
            roll = rng.random()
            if roll < 0.45:
                pending.append(asyncio.ensure_future(lane.enter()))
            elif roll < 0.9 and under_way:
                under_way.pop(rng.randrange(len(under_way)))
                lane.release(answered=rng.random() < 0.5)
            elif pending:
                pending.pop(rng.randrange(len(pending))).cancel()
            elif roll < 0.95:
                lane.limit = rng.randint(1, 6)  # a reload
                lane.admit()
            await settle()
            started = [task for task in pending if task.done() and not task.cancelled()]
            for task in started:
                pending.remove(task)
                assert task.result(), "credit is never short here: nobody is parked"
                under_way.append(task)
            if started:  # one at a time while not answering; never past a lowered limit
                assert lane.active <= lane.room(), (lane.active, lane.room())
            assert lane.active == len(under_way), "every slot held by an attempt under way"
            live = [task for task in pending if not task.done()]
            if live:
                assert lane.active >= lane.room(), "a delivery waits while a slot is free"
        for task in pending:
            task.cancel()
        await settle()

    monkeypatch.setattr(budget, "UNANSWERED_BURST", 10_000.0)  # not what this test is about
    asyncio.run(scenario())


def test_a_new_lane_waits_for_its_first_attempts_end_past_the_patience() -> None:
    """A new webhook's first answer may take longer than the patience: its waiters wait for
    that attempt's end (a newcomer past the patience is parked instead of joining them, but the
    lane is not judged). Answered, the limit opens; unanswered, the lane is judged at once (no
    answer for the patience: stalled, every waiter turned away, none of them tried)."""

    async def first_attempt(answered: bool) -> list[object]:
        lane = Lane(4, patience=0.02)
        assert await lane.enter()  # the first attempt: slower than the patience
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(3)]
        await asyncio.sleep(0.1)  # five times the patience
        seen: list[object] = [sum(task.done() for task in waiting), lane.is_stalled]
        seen += [lane.refusing(), await lane.enter()]  # a newcomer: parked, not waiting
        lane.release(answered=answered)
        results = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        return [*seen, results, lane.is_stalled, lane.refusing()]

    assert asyncio.run(first_attempt(True)) == [0, False, True, False, [True] * 3, False, False]
    assert asyncio.run(first_attempt(False)) == [0, False, True, False, [False] * 3, True, False]


def test_a_raised_limit_admits_no_waiter_to_a_stalled_lane() -> None:
    async def scenario() -> tuple[int, int]:
        lane = answering(Lane(2, patience=0.02))
        assert lane.try_acquire() and lane.try_acquire()  # both hang
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(3 * TURN_AWAY_BATCH)]
        while not lane.is_stalled:
            await asyncio.sleep(0.005)
        lane.limit = 10  # a reload mid turn-away
        lane.admit()
        started = sum(task.done() and task.result() for task in waiting)
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        return started, lane.active

    assert asyncio.run(scenario()) == (0, 2)


def test_a_stalled_lane_tries_each_delivery_back_from_the_park_while_a_slot_is_free() -> None:
    """Once stalled nothing waits for a webhook. A new delivery still gets one probe at a time;
    one that comes back (parking topic, retry rung) takes any free slot, up to the limit, so
    each delivery gets its attempts; the next is refused at once, never waiting; an answer ends
    the stall."""

    async def scenario() -> list[object]:
        lane = Lane(4, patience=0.01)
        assert await lane.enter()  # the first attempt hangs past the patience
        waiter = asyncio.ensure_future(lane.enter())
        await asyncio.sleep(0.02)
        lane.release(answered=False)  # unanswered: stalled at once, the waiter is parked
        await asyncio.wait_for(waiter, 1.0)
        seen: list[object] = [waiter.result(), lane.is_stalled, lane.active]
        new = [lane.try_acquire() for _ in range(2)]  # new deliveries: one probe
        back = [lane.try_acquire(came_back=True) for _ in range(4)]  # back from the park
        seen += [new, back, lane.refusing(), lane.refusing(came_back=True), lane.stalled()]
        lane.release(answered=True)  # one of them is answered: the stall ends
        seen += [lane.is_stalled, lane.room()]
        return seen

    assert asyncio.run(scenario()) == [
        False, True, 0, [True, False], [True, True, True, False], True, True, True, False, 4
    ]  # fmt: skip


def test_a_narrowed_lane_is_judged_by_its_probes_end_not_the_clock() -> None:
    """A slow but healthy webhook (answers take longer than the patience) whose one attempt went
    unanswered (a reset) probes with one attempt; its waiters wait for the probe's end, however
    long, instead of being parked on the clock: answered, the whole limit opens to them;
    unanswered after the patience, they are turned away and the lane is stalled."""

    async def probe(answered: bool) -> list[object]:
        lane = answering(Lane(4, patience=0.02))
        assert await lane.enter() and await lane.enter()
        lane.release(answered=False)  # a reset: narrowed to one attempt, the other one is it
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(3)]
        await asyncio.sleep(0.1)  # the probe takes five times the patience
        seen: list[object] = [sum(task.done() for task in waiting), lane.is_stalled]
        lane.release(answered=answered)
        results = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        return [*seen, results, lane.is_stalled, lane.active]

    assert asyncio.run(probe(True)) == [0, False, [True, True, True], False, 3]
    assert asyncio.run(probe(False)) == [0, False, [False, False, False], True, 0]


def test_a_cancelled_attempt_passes_its_slot_on_and_judges_nothing() -> None:
    """An attempt cancelled before it ended (partitions revoked, shutdown) says nothing about
    the webhook: its slot goes to the next waiter, no unanswered credit is spent, and a new lane
    stays new (its next attempt's end decides), with no stall."""

    async def scenario() -> list[object]:
        lane = Lane(4, patience=0.01)
        assert await lane.enter()  # the first attempt, cancelled later
        waiter = asyncio.ensure_future(lane.enter())
        await asyncio.sleep(0.05)  # past the patience
        credit = lane.credit
        lane.vacate()
        entered = await asyncio.wait_for(waiter, 1.0)
        return [entered, lane.active, lane.credit == credit, lane.is_stalled, lane.probing()]

    assert asyncio.run(scenario()) == [True, 1, True, False, True]


def test_shedding_visits_only_the_lanes_that_had_waiters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the in-flight limit the consume loop sheds every turn: among 20,000 lanes, only the
    ones a delivery waited in are visited (visiting every lane cost 3.6 ms a turn at 100,000
    webhooks), and a lane whose waiters are gone is visited no more."""
    clock = FakeClock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))

    async def scenario() -> tuple[list[str], list[str], list[bool], list[str]]:
        lanes = Lanes(2.0, hurry=lambda: False)
        for n in range(20_000):
            lanes.of(_webhook(f"w{n}", f"acct-{n % 7000}"))
        busy = [lanes.of(_webhook(f"w{n}", f"acct-{n % 7000}")) for n in (17, 19_999)]
        for lane in busy:  # one attempt at a time until a webhook answers: this one holds it
            assert await asyncio.wait_for(lane.enter(), 5)
        waiting = [asyncio.ensure_future(lane.enter()) for lane in busy]
        await asyncio.sleep(0)
        queued = sorted(id_of(lanes, lane) for lane in lanes.queued)
        clock.now += max(lane.patience for lane in busy)
        for lane in busy:
            lane.last_answer = clock.now  # answering, slowly: shed, not stalled
        lanes.shed_waiters()
        parked = [not result for result in await asyncio.wait_for(asyncio.gather(*waiting), 5)]
        before = sorted(id_of(lanes, lane) for lane in lanes.queued)
        lanes.shed_waiters()
        return queued, before, parked, sorted(id_of(lanes, lane) for lane in lanes.queued)

    def id_of(lanes: Lanes, lane: Lane) -> str:
        return next(key for key, each in lanes.items() if each is lane)

    queued, after_first, parked, after_second = asyncio.run(scenario())
    assert queued == ["w17", "w19999"]
    assert parked == [True, True]
    assert after_first == [] and after_second == []
