"""What the engine holds for each partition assigned to it, in one object per partition.

A :class:`PartitionState` is made when the group assigns the partition and dropped whole when
the partition is revoked or lost: its deliveries in flight, its committable offset (the end of
the contiguous prefix of finished records), the retry records kept in hand while its head is not
due, its pause and hold, and how often the schema registry failed it. Nothing of a partition
outlives its assignment, and work started under an old assignment can only ever touch the state
it started with. No Kafka calls here: the pipeline makes them from what these objects say.

:class:`Partitions` holds the states by partition, and notes which of them have something for the
consume loop to do (an offset to store, a hold, a pause, kept records), so that each turn of the
loop looks at those only, not at every partition assigned.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from bridge.core.offsets import OffsetTracker
from bridge.kafka.consumer import TP

WAITING_LIMIT = 500  # retry records kept in hand per held partition


class PartitionState:
    """One assigned partition: its work in flight, offsets, hold, pause and kept records.

    A hold, a pause, kept records and a moved offset are set through :meth:`hold`,
    :meth:`pause`, :meth:`keep` and :meth:`finished`, which note the state in ``noticed`` (its
    :class:`Partitions`' set of states needing the consume loop's attention)."""

    __slots__ = (
        "_noticed",
        "dirty",
        "hold_until",
        "next_offset",
        "paused",
        "registry_failures",
        "tasks",
        "tp",
        "tracker",
        "waiting",
    )

    def __init__(self, tp: TP, noticed: dict[PartitionState, None] | None = None) -> None:
        self.tp = tp
        self.tracker = OffsetTracker()
        self.dirty = False  # the committable offset moved since it was last stored
        self.next_offset: int | None = None  # the next record to take; a resume seeks there
        self.hold_until: float | None = None  # monotonic time when a held partition may resume
        self.paused = False
        self.waiting: deque[Message] | None = None  # held retry records already in hand
        self.tasks: set[asyncio.Task[None]] = set()
        self.registry_failures = 0  # in a row, for the back-off of a held source partition
        self._noticed: dict[PartitionState, None] = {} if noticed is None else noticed

    @property
    def committable(self) -> int | None:
        """The offset to commit: every record before it is finished (None: nothing yet)."""
        return self.tracker.committable

    @property
    def settled(self) -> bool:
        """Nothing for the consume loop to do: no offset to store, no hold, pause or kept record."""
        return not (self.dirty or self.paused) and self.hold_until is None and self.waiting is None

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task of this partition (waited for on revoke, cancelled after)."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def started(self, offset: int) -> None:
        """The record at ``offset`` was taken (offsets are taken in increasing order)."""
        self.tracker.started(offset)

    def finished(self, offset: int) -> None:
        """The record at ``offset`` is finished: its offset counts towards the commit."""
        if self.tracker.finished(offset):
            self.dirty = True
            self._noticed[self] = None

    def hold(self, until: float) -> None:
        """Hold the partition until ``until`` (monotonic time): it is paused until then."""
        self.hold_until = until
        self._noticed[self] = None

    def keep(self, msg: Message) -> None:
        """Keep a retry record that is not due yet, and those that follow it, in hand."""
        self.waiting = deque([msg])
        self._noticed[self] = None

    def pause(self) -> None:
        """The consumer was told to pause the partition."""
        self.paused = True
        self._noticed[self] = None

    def detach(self) -> None:
        """The partition left this instance: whatever of its work still ends is noted by nobody
        (a late delivery of a revoked assignment never reaches the fresh state or its commit)."""
        self._noticed = {}

    def admits(self, msg: Message) -> bool:
        """Whether a fetched record is to be taken now. One that is not is either kept (it
        follows the kept records of a held partition, up to :data:`WAITING_LIMIT`) or left to
        be fetched again once the partition resumes."""
        offset = msg.offset()
        expected = self.next_offset
        if expected is not None and offset < expected:
            return False  # fetched before a seek back: a newer fetch brings it again
        waiting = self.waiting
        if waiting is not None:
            if offset == expected and len(waiting) < WAITING_LIMIT:
                waiting.append(msg)  # behind a head not yet due: kept, taken when due
                self.next_offset = offset + 1
            return False  # beyond what is kept: fetched again after the resume
        if self.hold_until is not None or self.paused:
            if expected is None:
                self.next_offset = offset
            return False  # fetched before the pause took effect: fetched again after resume
        return True


@dataclass(slots=True)
class RecordWork:
    """A consumed record and how many of its deliveries are not yet finished."""

    partition: PartitionState
    offset: int
    remaining: int

    def done(self) -> None:
        """One delivery of the record is finished; the last one finishes the record."""
        self.remaining -= 1
        if self.remaining == 0:
            self.partition.finished(self.offset)


class Partitions:
    """The states of the partitions assigned here, by (topic, partition)."""

    __slots__ = ("_noticed", "_states")

    def __init__(self) -> None:
        self._states: dict[TP, PartitionState] = {}
        self._noticed: dict[PartitionState, None] = {}  # (ordered) states needing attention

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[PartitionState]:
        return iter(list(self._states.values()))

    def get(self, tp: TP) -> PartitionState | None:
        """The state of ``tp``; None when it is not assigned here."""
        return self._states.get(tp)

    def assign(self, tps: Iterable[TP]) -> None:
        """Make a fresh state for each partition assigned."""
        for tp in tps:
            self._states[tp] = PartitionState(tp, self._noticed)

    def drop(self, tps: Iterable[TP]) -> list[PartitionState]:
        """Drop the states of partitions revoked or lost, whole; returns those that were held."""
        dropped = [state for tp in tps if (state := self._states.pop(tp, None)) is not None]
        for state in dropped:
            self._noticed.pop(state, None)
            state.detach()
        return dropped

    def select(self, tps: Iterable[TP]) -> list[PartitionState]:
        """The states of those of ``tps`` that are assigned here."""
        return [state for tp in tps if (state := self._states.get(tp)) is not None]

    def commit_ages(self) -> list[tuple[str, int, float]]:
        """(topic, partition, seconds) for each partition: how long its commit has been held
        back by unfinished records (:meth:`OffsetTracker.commit_age`)."""
        now = time.monotonic()
        return [(*state.tp, state.tracker.commit_age(now)) for state in self._states.values()]

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every task of every partition."""
        return [task for state in self._states.values() for task in state.tasks]

    def paused_count(self) -> int:
        """How many partitions are paused."""
        return sum(state.paused for state in self._noticed)

    def earliest_hold(self) -> float | None:
        """The monotonic time the first hold expires; None when nothing is held."""
        return min((s.hold_until for s in self._noticed if s.hold_until is not None), default=None)

    def to_store(self) -> list[tuple[TP, int]]:
        """The committable offsets that moved since the last call (once a turn: it also forgets
        the states that need nothing any more)."""
        moved = []
        for state in list(self._noticed):
            if state.dirty:
                state.dirty = False
                moved.append(state)
            if state.settled:
                del self._noticed[state]
        return committable(moved)

    def to_pause(self, everything: bool) -> list[PartitionState]:
        """The partitions to pause now: every held one (at shutdown, ``everything``), even one
        whose hold has just expired: records behind its head were skipped, and only a pause and
        a resume with a seek fetches them again."""
        states = self._states.values() if everything else self._noticed
        return [s for s in states if not s.paused and (everything or s.hold_until is not None)]

    def expire_holds(self, monotonic: float) -> None:
        """Let go of the holds that expired by ``monotonic``."""
        for state in self._noticed:
            if state.hold_until is not None and state.hold_until <= monotonic:
                state.hold_until = None

    def keeping(self) -> list[PartitionState]:
        """The partitions no longer held that still have kept records to take."""
        return [s for s in self._noticed if s.waiting is not None and s.hold_until is None]

    def to_resume(self) -> list[PartitionState]:
        """The paused partitions no longer held. One with kept records still in hand (no room
        for them yet) stays paused: what lies beyond them is fetched again, after a seek, only
        once they were all taken."""
        return [s for s in self._noticed if s.paused and s.hold_until is None and s.waiting is None]


def committable(states: Iterable[PartitionState]) -> list[tuple[TP, int]]:
    """The committable offset of each of ``states`` that has one."""
    return [(s.tp, s.committable) for s in states if s.committable is not None]
