"""The lane's invariants under adversarial timing, on a clock the test moves (the lane's
``time.monotonic`` and the event loop's time are the same fake clock, so the stall watch
follows it): scenarios found by a hostile review, and random operations checked after every
step (``active`` is the attempts under way; nothing starts past the room; nobody waits while
there is room; nobody is parked while the lane neither is stalled nor out of credit; the clock
never stalls a probing lane; every waiter ends)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Secret, Webhook
from bridge.engine import budget
from bridge.engine.budget import TURN_AWAY_BATCH, UNANSWERED_BURST, Lane, Lanes

T = TypeVar("T")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(clock: Clock, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop whose time is ``clock`` (so the stall watch follows it too)."""

    class FakeLoop(asyncio.SelectorEventLoop):
        def time(self) -> float:
            return clock.now

    with asyncio.Runner(loop_factory=FakeLoop) as runner:
        return runner.run(coro)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=c))
    return c


async def settle(n: int = 30) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def answering(lane: Lane) -> Lane:
    assert lane.try_acquire()
    lane.release(answered=True)
    return lane


# the turn-away chain parks a batch after the stall has ended
def test_no_waiter_is_parked_after_the_answer_that_ends_the_stall(clock: Clock) -> None:
    async def scenario() -> tuple[int, int, bool]:
        lane = answering(Lane(2, patience=10))
        assert lane.try_acquire() and lane.try_acquire()  # both slow
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(3 * TURN_AWAY_BATCH)]
        await settle()
        clock.now += 10  # no answer for the patience: the watch stalls, first batch parked
        await settle()
        parked_before = sum(t.done() and not t.result() for t in waiting)
        lane.release(answered=True)  # the webhook answers: the stall is over
        assert not lane.is_stalled
        clock.now += 0.01  # the next turn-away batch is due
        await settle()
        parked_after = sum(t.done() and not t.result() for t in waiting) - parked_before
        for t in waiting:
            t.cancel()
        return parked_before, parked_after, lane.is_stalled

    # it was (25, 25, False): 25 more deliveries parked after the webhook answered
    assert run(clock, scenario()) == (TURN_AWAY_BATCH, 0, False)


# a limit raised during a stall is never admitted when the stall ends
def test_a_limit_raised_during_a_stall_opens_when_it_ends(clock: Clock) -> None:
    async def scenario() -> tuple[int, int, int]:
        lane = answering(Lane(2, patience=10))
        assert lane.try_acquire() and lane.try_acquire()
        waiting = [asyncio.ensure_future(lane.enter()) for _ in range(4 * TURN_AWAY_BATCH)]
        await settle()
        clock.now += 10  # stalled by the watch (answering is still True)
        await settle()
        lane.limit = 10  # a reload raises the limit (what Lanes.reconfigure does)
        lane.admit()  # nothing while stalled: right
        lane.release(answered=True)  # the stall ends: opened is False, so no admit()
        clock.now += 0.01
        await settle()
        live = sum(not t.done() for t in waiting)
        seen = (lane.active, lane.room(), live)
        for t in waiting:
            t.cancel()
        return seen

    active, room, live = run(clock, scenario())
    # it was (2, 10, 49): 49 deliveries waited while 8 of 10 slots were idle
    assert not (live and active < room), (active, room, live)


# a cancelled waiter (revoke) gets a probing lane judged and stalled
@pytest.mark.parametrize("cancel_waiter", [False, True])
def test_a_cancelled_waiter_judges_nothing(clock: Clock, cancel_waiter: bool) -> None:
    async def scenario() -> tuple[bool, int]:
        lane = Lane(4, patience=10)
        assert await lane.enter()  # the probe of a new webhook
        waiter = asyncio.ensure_future(lane.enter())
        await settle()
        if cancel_waiter:
            waiter.cancel()  # partitions revoked: nobody waits any more
            await settle()
        clock.now += 11
        lane.release(answered=False)  # the probe ends unanswered after the patience
        await settle()
        if not waiter.done():
            waiter.cancel()
        return lane.is_stalled, lane.room(came_back=True)

    stalled, room = run(clock, scenario())
    if cancel_waiter:  # it was (True, 4): stalled by a delivery that no longer existed
        assert (stalled, room) == (False, 1)
    else:
        assert (stalled, room) == (True, 4)


# a vacated (cancelled) probe's time is held against the next probe
def test_a_vacated_probe_is_not_held_against_the_next(clock: Clock) -> None:
    async def scenario() -> bool:
        lane = Lane(4, patience=10)
        assert await lane.enter()  # the probe, slow
        first = asyncio.ensure_future(lane.enter())
        second = asyncio.ensure_future(lane.enter())
        await settle()
        clock.now += 11
        lane.vacate()  # revoked: judges nothing, its slot goes to ``first``
        assert await first
        clock.now += 0.01
        lane.release(answered=False)  # first's own attempt: a reset after 10 ms
        await settle()
        second.cancel()
        return lane.is_stalled

    # it was True: stalled (and `second` parked) on the strength of the vacated attempt's 11 s
    assert run(clock, scenario()) is False


# random operations, invariants checked after each step
def explore(seed: int, clock: Clock) -> list[str]:
    rng = random.Random(seed)
    patience = rng.choice([3600.0, 0.05, 0.5])
    violations: list[str] = []

    async def scenario() -> None:
        lane = Lane(rng.randint(1, 5), patience=patience, account=budget.AccountCredit())
        under_way: list[object] = []
        pending: list[asyncio.Task[bool]] = []
        refused_at_entry: set[asyncio.Task[bool]] = set()  # the lane refused newcomers then
        came_back: set[asyncio.Task[bool]] = set()  # from the parking topic or a retry rung

        def collect(step: int, op: str) -> None:
            started = 0
            started_back = False
            for task in [t for t in pending if t.done()]:
                pending.remove(task)
                if task.cancelled():
                    continue
                if task.result():
                    under_way.append(task)
                    started += 1
                    started_back = started_back or task in came_back
                elif not (
                    op == "shed"
                    or task in refused_at_entry
                    or lane.is_stalled
                    or lane.out_of_credit()
                ):
                    violations.append(f"{step} {op}: parked while not stalled, credit ok")
            room = lane.room(came_back=started_back)
            if started and lane.active > room:
                violations.append(f"{step} {op}: started past room {lane.active}>{room}")
            if lane.active != len(under_way):
                violations.append(f"{step} {op}: active {lane.active} != {len(under_way)}")
            live = [t for t in pending if not t.done()]
            refusing = lane.is_stalled or lane.out_of_credit()
            if live and not refusing and lane.active < lane.room():
                violations.append(f"{step} {op}: waits with room {lane.active}<{lane.room()}")

        for step in range(250):
            roll = rng.random()
            probing_before, stalled_before = lane.probing(), lane.is_stalled
            live_before = any(not t.done() for t in pending)
            op = "tick"
            if roll < 0.35:
                op = "enter"
                back = rng.random() < 0.3
                refused = lane.refusing(back)
                pending.append(asyncio.ensure_future(lane.enter(back)))
                if refused:
                    refused_at_entry.add(pending[-1])
                if back:
                    came_back.add(pending[-1])
            elif roll < 0.6 and under_way:
                op = "release"
                under_way.pop(rng.randrange(len(under_way)))
                answered = rng.random() < 0.5
                op += "+" if answered else "-"
                lane.release(answered=answered)
            elif roll < 0.65 and under_way:
                op = "vacate"
                under_way.pop(rng.randrange(len(under_way)))
                lane.vacate()
            elif roll < 0.72 and pending:
                op = "cancel"
                pending[rng.randrange(len(pending))].cancel()
            elif roll < 0.77:
                op = "limit"
                lane.limit = rng.randint(1, 6)
                lane.admit()
            elif roll < 0.8:
                op = "shed"
                lane.shed()
            elif roll < 0.82:
                op = "hurry"
                flag = rng.random() < 0.5
                lane.hurry = lambda flag=flag: flag  # type: ignore[misc]
            elif roll < 0.83:
                op = "acct0"  # another webhook of the account spent the shared credit
                assert lane.account is not None
                lane.account.credit = 0.0
            else:
                clock.now += rng.choice([0.001, 0.01, 0.03, patience * 1.2])
            await settle()
            if op == "tick" and probing_before and not stalled_before and lane.is_stalled:
                violations.append(f"{step} tick: a probing lane stalled by the clock")
            if lane.is_stalled and not stalled_before and not live_before and op != "enter":
                violations.append(f"{step} {op}: stalled with no live waiter")
            collect(step, op)
        # liveness: end everything under way, let time pass; every waiter must end
        for _ in range(400):
            if not pending:
                break
            while under_way:
                under_way.pop()
                lane.release(answered=rng.random() < 0.5)
                await settle()
                collect(-1, "drain")
            clock.now += patience * 1.2 if patience < 10 else 0.2
            await settle()
            collect(-1, "drain")
        if pending:
            violations.append(f"end: {len(pending)} waiters never ended")
            for t in pending:
                t.cancel()

    run(clock, scenario())
    return violations


@pytest.mark.parametrize("seed", range(60))
def test_random_operations_keep_every_invariant(
    seed: int, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(-seed)
    monkeypatch.setattr(budget, "UNANSWERED_BURST", rng.choice([10_000.0, 4.0]))
    found = explore(seed, clock)
    assert not found, found[:5]


def test_a_webhook_id_given_to_another_account_starts_with_a_lane_of_its_own(
    clock: Clock,
) -> None:
    """Lanes are kept by webhook id. A reload that gives the id to another account holder's
    webhook let the new webhook inherit the old one's spent credit, stall and slots, and the old
    one's failures still in flight spent the new holder's account budget (its deliveries were
    parked without a request). The old lane is let go: what is in flight ends in it, charged to
    the account it was made for; the new webhook's lane starts fresh. The accounts kept are
    those of the lanes kept, whatever the reload changed (they grew with every account an id
    ever moved to)."""

    def hook(account: str) -> Webhook:
        return Webhook(
            id="w1",
            account=account,
            url="https://x.example/hook",
            events=frozenset({"transaction.success"}),
            secret=Secret(b"s" * 32),
            concurrency=2,
        )

    async def scenario() -> None:
        lanes = Lanes(0.5, hurry=lambda: False)
        old = lanes.of(hook("acct_x"))
        for _ in range(30):  # thirty attempts that end without an answer
            assert old.try_acquire()
            old.release(answered=False)
        assert old.try_acquire()  # one more in flight across the reload
        spent = lanes.accounts["acct_x"]
        assert old.snapshot()["credit"] < UNANSWERED_BURST
        assert lanes.reconfigure(Subscriptions([hook("acct_y")])) == ["w1"]
        new = lanes.of(hook("acct_y"))
        assert new is not old and new.account is lanes.accounts["acct_y"]
        assert set(lanes.accounts) == {"acct_y"}
        assert new.snapshot()["credit"] == new.snapshot()["account_credit"] == UNANSWERED_BURST
        old.release(answered=False)  # the old webhook's attempt ends in its own lane
        assert new.snapshot()["account_credit"] == UNANSWERED_BURST
        assert spent.peek() < UNANSWERED_BURST
        assert lanes.reconfigure(Subscriptions([hook("acct_y")])) == []
        for account in range(20):  # the id moves on, reload after reload
            lanes.reconfigure(Subscriptions([hook(f"acct_{account}")]))
            lanes.of(hook(f"acct_{account}"))
        assert set(lanes.accounts) == {"acct_19"}

    run(clock, scenario())
