"""Per-webhook lanes: the concurrency limit of each webhook, telling a busy webhook from a
stalled one (whose deliveries are then parked instead of holding the in-flight budget), and the
budget of attempts a webhook may spend without an answer.

The unanswered budget bounds what one webhook that answers nothing can cost everyone else. An
attempt that ends without any HTTP status (refused, reset, timed out, malformed or unsolicited
bytes, TLS garbage) costs a connection and often a handshake, on the bridge and on the machine;
at 500 records/s a neighbour with nine such webhooks asked for thousands of them a second, and
the healthy webhooks' latency went from 24 ms to 12 s (docs/PERFORMANCE.md). Each lane therefore
holds ``UNANSWERED_BURST`` credits, refilled at ``UNANSWERED_PER_S`` a second; an unanswered
attempt spends one; an answer (any status, 2xx or not) spends nothing, so a webhook that
answers again flows at once as soon as it has one credit, while one that alternates answers with
silence cannot refill itself. With no credit left a delivery is parked like a stalled webhook's
(no request made, no attempt used) until credit returns. A webhook with ordinary failures never
meets the bound: the whole ladder of a burst of records fits in the credit.

The same budget is held once more per account (:class:`AccountCredit`), spent by every
unanswered attempt of any of its webhooks: an account cannot multiply what it may cost the others
by configuring more webhooks that answer nothing (nine silent webhooks of one account, each with
a budget of its own, made nine times the failed connections, delay-topic writes and parks, and
held up the other accounts' deliveries for seconds: docs/PERFORMANCE.md). A webhook whose last
attempt was answered is never refused for its account's credit, so an account's working webhooks
keep flowing beside its silent ones; a webhook not yet answering needs both credits.

A webhook not answering (new, or whose last attempt got no HTTP status) also has room for one
attempt at a time, a probe, until it answers; then its whole limit opens at once. Without it a
neighbour's new or failing webhooks each started up to their limit of attempts at the same
moment, before any had failed (32 connections apiece at the default), and the healthy webhooks'
slowest deliveries all fell in that onset (docs/PERFORMANCE.md). A webhook that answers pays one
round trip of slow start; one that does not costs one connection at a time. Judged stalled, it
keeps one probe at a time for new deliveries, but a delivery that comes back (from the parking
topic or a retry rung) is tried whenever one of its whole limit of slots is free, so every
delivery still gets the attempts account holders are promised (see :meth:`Lane.room`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Webhook

TURN_AWAY_BATCH = 25
UNANSWERED_PER_S = 10.0
UNANSWERED_BURST = 100.0


TURN_AWAY_INTERVAL_S = 0.01


def refilled(credit: float, since: float, now: float) -> float:
    """A credit of ``credit`` at ``since``, refilled at ``UNANSWERED_PER_S`` up to the burst."""
    if credit >= UNANSWERED_BURST:
        return credit
    return min(UNANSWERED_BURST, credit + (now - since) * UNANSWERED_PER_S)


class AccountCredit:
    """The unanswered budget an account's webhooks spend together (see the module's text)."""

    __slots__ = ("credit", "credit_at")

    def __init__(self) -> None:
        self.credit = UNANSWERED_BURST
        self.credit_at = time.monotonic()

    def level(self) -> float:
        """The credit now, brought up to date."""
        now = time.monotonic()
        self.credit = refilled(self.credit, self.credit_at, now)
        self.credit_at = now
        return self.credit

    def spend(self) -> None:
        """One unanswered attempt (attempts under way when it ran out may take it below zero)."""
        self.credit = max(-UNANSWERED_BURST, self.level() - 1.0)

    def peek(self) -> float:
        """The credit now, changing nothing (for the ``/status`` view)."""
        return refilled(self.credit, self.credit_at, time.monotonic())


class Lane:
    """A per-webhook concurrency limit that tells a busy webhook from a stalled one.

    Deliveries wait in FIFO order for a slot while the webhook keeps answering. When it has
    answered nothing (no HTTP status at all: a timeout frees a slot without being an answer) for
    ``patience`` seconds with every slot taken, the lane is stalled: waiters give up and new
    deliveries do not wait, so a stalled webhook cannot hold the process-wide in-flight budget
    that healthy webhooks need. It stays stalled until it answers again: meanwhile a delivery
    only starts when a slot is free and never waits. One timer per lane watches for a stall,
    however many deliveries wait.

    The lane's room (:meth:`room`) is its limit while the webhook's last attempt was answered; a
    new lane, and one whose last attempt got no HTTP status, has room for one attempt at a time
    (a probe, whose end judges the lane) until an answer opens the whole limit to its waiters.
    Stalled, it has its limit again for deliveries that come back from the parking topic or a
    retry rung (see the module's text).

    Waiting is also refused when the webhook's unanswered credit is spent (the waiters are turned
    away as the credit runs out), and, while the in-flight limit holds everyone up, to a delivery
    that has already waited ``patience`` seconds (:meth:`shed`): a webhook that answers, but too
    slowly for its traffic, parks its excess instead of filling the limit.
    """

    __slots__ = (
        "account",
        "active",
        "answering",
        "credit",
        "credit_at",
        "hurry",
        "is_stalled",
        "last_answer",
        "limit",
        "patience",
        "queued",
        "waiters",
        "watch",
    )

    def __init__(
        self,
        limit: int,
        patience: float,
        hurry: Callable[[], bool] = lambda: False,
        account: AccountCredit | None = None,
        queued: dict[Lane, None] | None = None,
    ) -> None:
        self.limit = limit
        self.queued = queued  # the lanes that may have waiters (Lanes.shed_waiters visits them)
        self.patience = patience
        self.hurry = hurry  # true while waiters hold up others (the in-flight limit is reached)
        self.account = account  # the budget shared with the account's other webhooks
        self.answering = False  # the last attempt got an answer: the account's credit is moot
        self.active = 0
        self.credit = UNANSWERED_BURST  # unanswered attempts this webhook may still spend
        self.credit_at = time.monotonic()  # when ``credit`` was last brought up to date
        self.is_stalled = False
        self.last_answer = time.monotonic()
        self.waiters: deque[tuple[asyncio.Future[bool], float]] = deque()  # and when it came
        self.watch: asyncio.TimerHandle | None = None

    def probing(self) -> bool:
        """Whether the webhook is not answering (new, or its last attempt got no HTTP status) and
        not judged stalled yet: it has room for one attempt, whose end decides (see
        :meth:`_check`)."""
        return not (self.answering or self.is_stalled)

    def room(self, came_back: bool = False) -> int:
        """How many attempts may be under way at once: the webhook's limit while its last attempt
        was answered, one (a probe) while it is not answering (new, or silent since its last
        attempt). A stalled lane (nobody waits for it) has its limit again for a delivery that
        ``came_back`` from the parking topic or a retry rung: each is tried if a slot is free,
        within the unanswered credit, so every delivery still gets the attempts account holders
        are promised (one probe at a time for them too re-parked all but one every park delay,
        and a dead webhook's deliveries were dead-lettered after their parks, never tried; a
        stalled lane's whole limit for new deliveries too let a hung neighbour hold 32
        connections at a time, and the healthy webhooks' p99 beside it was 2-3 times higher:
        docs/PERFORMANCE.md). What they cost is spread by the park delay and bounded by the
        credit."""
        if self.answering or (came_back and self.is_stalled):
            return self.limit
        return 1

    def refusing(self, came_back: bool = False) -> bool:
        """Whether a delivery would be parked without a request: the webhook is out of credit, or
        stalled with no slot free for it (:meth:`room`), or its probe has gone unanswered for the
        patience (see :meth:`stalled`)."""
        if self.out_of_credit():
            return True
        if self.active < self.room(came_back):
            return False
        return self.is_stalled or (self.probing() and self._silent_for_patience())

    def _silent_for_patience(self) -> bool:
        return time.monotonic() - self.last_answer >= self.patience

    def out_of_credit(self) -> bool:
        """Whether the webhook has spent its unanswered budget, or is not answering and its
        account has spent the budget its webhooks share: its deliveries are parked."""
        if self._refill() < 1.0:
            return True
        account = self.account
        return account is not None and self.refused_by_account(account.level())

    def refused_by_account(self, account_credit: float) -> bool:
        """Whether an account credit of ``account_credit`` refuses this webhook: it is spent and
        the webhook's last attempt was not answered."""
        return not self.answering and account_credit < 1.0

    def _refill(self) -> float:
        now = time.monotonic()
        self.credit = refilled(self.credit, self.credit_at, now)
        self.credit_at = now
        return self.credit

    async def enter(self, came_back: bool = False) -> bool:
        """Take a slot for one attempt, waiting while the webhook keeps answering; False when the
        delivery is to be parked instead: the webhook is stalled or out of unanswered credit
        (also when the credit ran out while it waited). ``came_back``: see :meth:`room`."""
        if self.out_of_credit():
            return False
        if not self.try_acquire(came_back) and (self.stalled() or not await self.acquire()):
            return False
        if self.out_of_credit():
            self._free_slot()
            return False
        return True

    def try_acquire(self, came_back: bool = False) -> bool:
        """Take a slot at once if one is free and nobody is waiting."""
        if self.active < self.room(came_back) and not self.waiters:
            if self.active == 0 and not self.is_stalled:
                self.last_answer = time.monotonic()  # an idle lane is not a stalled one
            self.active += 1
            return True
        return False

    def stalled(self) -> bool:
        """Whether a delivery that finds no slot free must not wait: the lane is stalled (before,
        and not answered since; or every slot taken and no answer for ``patience`` seconds).
        While it probes, a newcomer does not wait for a probe that has gone unanswered for the
        patience either (without it a hung webhook's deliveries piled up for its whole timeout,
        holding the in-flight budget, where the watch used to turn them away after half of it),
        but the lane is not judged on the clock: the probe's end decides (:meth:`_check`), for
        the deliveries already waiting too."""
        if self.is_stalled or self.active < self.room():
            return self.is_stalled
        if self.probing():
            return self._silent_for_patience()
        self.is_stalled = self._silent_for_patience()
        return self.is_stalled

    async def acquire(self) -> bool:
        """Wait for a slot while the webhook keeps answering; False once it is stalled."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiters.append((waiter, time.monotonic()))
        if self.queued is not None:
            self.queued[self] = None
        self._watch_waiters()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self._free_slot()  # handed over as we were cancelled: passed on, nothing judged
            raise

    def _waiting(self) -> bool:
        """Whether a live delivery waits (cancelled waiters at the head are dropped)."""
        while self.waiters and self.waiters[0][0].done():
            self.waiters.popleft()
        return bool(self.waiters)

    def _watch_waiters(self) -> None:
        """Arm the stall watch if deliveries wait and nothing watches them yet, while the lane is
        judged on the clock: answering and not stalled (a probing lane is judged by its probe's
        end, a stalled one has nobody waiting)."""
        if self.waiters and self.watch is None and self.answering and not self.is_stalled:
            self._watch(asyncio.get_running_loop())

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch for a stall: :meth:`_check` when the lane would count as stalled unless the
        webhook answers."""
        stall_at = loop.time() + max(0.0, self.last_answer + self.patience - time.monotonic())
        self.watch = loop.call_at(stall_at, self._check)

    def _check(self) -> None:
        """The stall watch. A lane is not judged while it probes (new, or narrowed to one attempt
        after one went unanswered): the probe's end decides (a slow webhook's answer may take
        longer than the patience, and judged on the clock it was parked for being slow, once
        after each reset; every attempt ends within its timeout), and :meth:`release` judges."""
        self.watch = None
        if not self._waiting() or self.probing():
            return
        if self._silent_for_patience():
            self.is_stalled = True
            self._turn_away()
            return
        self._watch(asyncio.get_running_loop())

    def _turn_away(self) -> None:
        """Tell the waiters of a stalled lane not to wait, a batch every ``TURN_AWAY_INTERVAL_S``
        (at most 2,500 a second): parking the thousand or more deliveries that piled up during
        the patience all at once saturated two cores (the bridge, and the broker writing them)
        and held up the other webhooks' deliveries by up to 100 ms (docs/PERFORMANCE.md). While
        ``hurry()`` (the waiters fill the in-flight limit, so nothing else moves) a batch every
        turn of the event loop. Each batch asks again: once the webhook answered (or its credit
        came back) between two batches, the rest wait, watched again, and none more is parked."""
        if not (self.is_stalled or self.out_of_credit()):
            self._watch_waiters()
            return
        for _ in range(TURN_AWAY_BATCH):
            if not self.waiters:
                return
            waiter, _came = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
        if self.waiters:
            loop = asyncio.get_running_loop()
            if self.hurry():
                loop.call_soon(self._turn_away)
            else:
                loop.call_later(TURN_AWAY_INTERVAL_S, self._turn_away)

    def release(self, answered: bool) -> None:
        """Free a slot (to the first live waiter, if any); ``answered`` if an HTTP status came.
        The first answer after silence opens the whole limit to the waiters. A probe that ends
        unanswered after the patience stalls the lane at once, as the watch would have if it had
        judged it (:meth:`_check`): its waiters are turned away and none takes the slot."""
        opened = answered and not (self.answering and not self.is_stalled)
        probed = self.probing()
        if answered:
            self.last_answer = time.monotonic()
            self.is_stalled = False
            self.answering = True
        else:  # attempts already under way when the credit ran out may take it below zero
            had_credit = not self.out_of_credit()
            self.credit = max(-UNANSWERED_BURST, self.credit - 1.0)
            self.answering = False
            if self.account is not None:
                self.account.spend()
            if probed and self._waiting() and self._silent_for_patience():
                self.is_stalled = True
                self.active -= 1
                asyncio.get_running_loop().call_soon(self._turn_away)
                return
            if had_credit and self.out_of_credit() and self.waiters:  # spent: nobody waits
                asyncio.get_running_loop().call_soon(self._turn_away)
        self._free_slot()
        if opened:
            self.admit()
        self._watch_waiters()

    def vacate(self) -> None:
        """Free the slot of an attempt that was cancelled (partitions revoked, shutdown) before
        it ended: passed on to the first live waiter, nothing judged, no credit spent (the
        webhook did nothing wrong). A probe's time is not held against the next one: the
        patience starts again for the attempt that takes its slot."""
        if self.probing():
            self.last_answer = time.monotonic()
        self._free_slot()

    def shed(self) -> int:
        """Turn away the waiters that have waited ``patience`` seconds or more (they are parked):
        called while the in-flight limit holds everyone up, so a webhook that answers, but too
        slowly for its traffic, cannot fill the limit with deliveries waiting for its slots.
        Returns how many were turned away."""
        since = time.monotonic() - self.patience
        shed = 0
        while self.waiters and self.waiters[0][1] <= since:
            waiter, _came = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
                shed += 1
        return shed

    def _free_slot(self) -> None:
        """End one attempt's hold on a slot: hand it to the first live waiter, unless the lane
        holds more than its room (its webhook stopped answering, or its limit was lowered)."""
        if self.active <= self.room():
            while self.waiters:
                waiter, _came = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(True)
                    return
        self.active -= 1

    def admit(self) -> None:
        """Give the free slots to waiters, first come first served: after the room grew (the
        webhook answered a probe, or its limit was raised). None while the lane is stalled: its
        waiters are being turned away."""
        while self.waiters and self.active < self.room() and not self.is_stalled:
            waiter, _came = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                self.active += 1

    def snapshot(self) -> dict[str, int | float | bool]:
        """The lane's state now, for the operator's ``/status`` view; changes nothing (the credit
        is brought up to date in the copy only)."""
        credit = refilled(self.credit, self.credit_at, time.monotonic())
        account = self.account.peek() if self.account is not None else UNANSWERED_BURST
        return {
            "active": self.active,
            "limit": self.limit,
            "probing": self.probing(),
            "waiting": sum(1 for waiter, _came in self.waiters if not waiter.done()),
            "stalled": self.is_stalled,
            "credit": round(credit, 1),
            "account_credit": round(account, 1),
            "out_of_credit": credit < 1.0 or self.refused_by_account(account),
        }


class Lanes(dict[str, Lane]):
    """The lane of each webhook that has had a delivery, by webhook id, made on first use.

    A lane counts as stalled after a full lane has gone without an answer for its patience: half
    the webhook's timeout (a slow but healthy webhook answers well within it), at least
    ``stall_patience`` (the first rung's delay). ``hurry`` is given to every lane (see
    :meth:`Lane._turn_away`)."""

    def __init__(self, stall_patience: float, hurry: Callable[[], bool]) -> None:
        super().__init__()
        self.stall_patience = stall_patience
        self.hurry = hurry
        self.accounts: dict[str, AccountCredit] = {}  # of the accounts that have had a lane
        self.queued: dict[Lane, None] = {}  # lanes that had a waiter since the last shed

    def of(self, webhook: Webhook) -> Lane:
        """The webhook's lane, made now if it has none yet."""
        lane = self.get(webhook.id)
        if lane is None:
            lane = self[webhook.id] = Lane(
                webhook.concurrency,
                self.patience(webhook),
                hurry=self.hurry,
                account=self.account(webhook.account),
                queued=self.queued,
            )
        return lane

    def account(self, account: str) -> AccountCredit:
        """The unanswered budget of ``account``'s webhooks, made now if it has none yet."""
        credit = self.accounts.get(account)
        if credit is None:
            credit = self.accounts[account] = AccountCredit()
        return credit

    def patience(self, webhook: Webhook) -> float:
        """How long a full lane of ``webhook`` may go without an answer before it is stalled."""
        return max(self.stall_patience, webhook.timeout_seconds / 2)

    def refusing(self, webhook_id: str, came_back: bool = False) -> bool:
        """Whether a delivery to the webhook would be parked now (:meth:`Lane.refusing`)."""
        lane = self.get(webhook_id)
        return lane is not None and lane.refusing(came_back)

    def reconfigure(self, subscriptions: Subscriptions) -> list[str]:
        """Give the existing lanes the limit and patience of their webhook's new settings
        (only the lanes that exist are visited: cheap at 10,000 webhooks), and drop the lanes
        of webhooks no longer configured once nothing is in them, with the accounts left
        without a lane (else every webhook ever configured kept a lane, reload after reload).

        A lane whose webhook id now names another account holder's webhook is let go at once:
        its deliveries in flight end in it, charging the account they were made for, and its
        waiters are judged again when they enter (:meth:`Subscriptions.judge`); the new
        webhook starts with a lane of its own. (Kept by id, the new holder's webhook inherited
        the old one's stall, credit and slots, and the old holder's failures spent the new
        holder's account budget.) Returns the ids of those webhooks."""
        gone: list[str] = []
        moved: list[str] = []
        for webhook_id, lane in self.items():
            webhook = subscriptions.get(webhook_id)
            if webhook is None:
                if not lane.active and not lane.waiters:
                    gone.append(webhook_id)
                continue
            if lane.account is not self.accounts.get(webhook.account):
                moved.append(webhook_id)
                continue
            lane.limit = webhook.concurrency
            lane.patience = self.patience(webhook)
            lane.admit()  # a raised limit lets waiters in now
        for webhook_id in gone:
            self.queued.pop(self.pop(webhook_id), None)
        for webhook_id in moved:  # (still queued, if it has waiters: they may be shed)
            del self[webhook_id]
        held = {id(lane.account) for lane in self.values()}
        for account in [a for a, credit in self.accounts.items() if id(credit) not in held]:
            del self.accounts[account]
        return moved

    def shed_waiters(self) -> None:
        """At the in-flight limit: park the deliveries that waited a lane's patience or more for
        one of its slots (a webhook too slow for its traffic), so they do not hold up the
        others' records."""
        for lane in list(self.queued):
            if lane.waiters:
                lane.shed()
            if not lane.waiters:
                del self.queued[lane]

    def needing_attention(self, failing: Mapping[str, float]) -> list[dict[str, Any]]:
        """A row for each webhook failing now (``failing``: since when), stalled, out of
        unanswered credit, or with deliveries active or waiting for a slot; never the idle ones
        (ids only: never a URL or a secret)."""
        rows: list[dict[str, Any]] = []
        for webhook_id, lane in self.items():
            if webhook_id not in failing and not (
                lane.active
                or lane.waiters
                or lane.is_stalled
                or lane.credit < 1.0
                or (lane.account is not None and lane.refused_by_account(lane.account.credit))
            ):
                continue  # idle, at a glance (the snapshot below decides for the others)
            state = lane.snapshot()
            if webhook_id in failing or any(
                state[key] for key in ("active", "waiting", "stalled", "out_of_credit")
            ):
                rows.append({"id": webhook_id, "failing_since": failing.get(webhook_id), **state})
        for webhook_id in failing.keys() - self.keys():  # failing, no lane: no detail
            rows.append({"id": webhook_id, "failing_since": failing[webhook_id]})
        return rows
