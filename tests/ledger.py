"""A ledger for fault-injection tests: every delivery the bridge owes is known before it starts.

Each produced record and each subscribed (record, webhook) pair is entered in the ledger in
advance; the ``webhook-id`` of a pair is the bridge's own ``message_id(transaction, event,
webhook)``. At the end, every request the receivers saw and the whole dead-letter topic are laid
against the ledger: each pair must have been received with a 2xx or dead-lettered with a reason,
each poison record dead-lettered with its reason, and nothing else may appear. Pairs received more
than once are counted as duplicates (allowed by at-least-once only around a fault).

The random choices of a run (fault times, record contents) come from one seed: the environment
variable ``BRIDGE_FAULT_SEED`` when set, else the clock; it is printed with every summary so a
failing run can be replayed. ``BRIDGE_SOAK=1`` selects the longer variant of every scenario.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from bridge.codec.encoding import encode_plain
from bridge.core.envelope import (
    H_KIND,
    H_MESSAGE_ID,
    H_REASON,
    H_WEBHOOK,
    KIND_DELIVERY,
    KIND_POISON,
    header_map,
)
from bridge.core.mapping import EVENT_FAILED, EVENT_SUCCESS
from bridge.core.signing import message_id
from devtools.devkafka import group_positions
from tests.bridge_harness import SCHEMA
from tests.kafka_helpers import QUIET, unique_name, wait_for
from tests.receiver import Receiver

SOAK = os.environ.get("BRIDGE_SOAK") == "1"
"""The long variant: more records, more faults, more rounds (``BRIDGE_SOAK=1``)."""


def fault_seed() -> int:
    """The seed of this run: ``BRIDGE_FAULT_SEED`` when set, else derived from the clock."""
    configured = os.environ.get("BRIDGE_FAULT_SEED")
    return int(configured) if configured else time.time_ns() % 1_000_000_007


def scenario_rng(seed: int, scenario: str) -> random.Random:
    """A random source for one scenario, reproducible from the run's seed."""
    return random.Random(f"{seed}/{scenario}")


def event_of(record: dict[str, Any]) -> str:
    """The event a record becomes: ``transaction.success`` or ``transaction.failed``."""
    return EVENT_SUCCESS if record["status"] == "SUCCEEDED" else EVENT_FAILED


@dataclass(frozen=True)
class Pair:
    """One delivery the bridge owes: one record's event to one webhook."""

    transaction_id: str
    event: str
    webhook_id: str

    @property
    def message_id(self) -> str:
        """The ``webhook-id`` every request of this pair carries."""
        return message_id(self.transaction_id, self.event, self.webhook_id)


@dataclass(frozen=True)
class Request:
    """One request as a receiver saw it: its ``webhook-id``, the status answered (0 for none)."""

    message_id: str
    status: int
    at: float

    @property
    def received(self) -> bool:
        return 200 <= self.status < 300


def receiver_requests(receiver: Receiver) -> list[Request]:
    """Every request the test receiver recorded, on every path."""
    return [Request(r.message_id, r.status, r.at) for r in list(receiver.requests)]


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic."""

    headers: dict[str, str]
    value: bytes
    partition: int
    offset: int

    @property
    def kind(self) -> str:
        return self.headers.get(H_KIND, "")

    @property
    def reason(self) -> str:
        return self.headers.get(H_REASON, "")

    @property
    def message_id(self) -> str:
        return self.headers.get(H_MESSAGE_ID, "")


@dataclass
class Verdict:
    """The ledger laid against what happened."""

    pairs: int
    records: int
    received: dict[str, int]  # message id -> number of 2xx answers
    requests: Counter[str]  # message id -> number of requests
    dead: dict[str, list[DeadLetter]]  # message id -> its delivery dead letters
    lost: list[Pair]
    strange_requests: list[str]  # webhook-ids no pair owns
    strange_letters: list[DeadLetter]  # dead letters no pair or poison record owns
    poison_found: dict[bytes, DeadLetter]
    poison_lost: list[bytes]
    misfiled: list[str]  # dead letters of the wrong kind, reason or webhook

    @property
    def losses(self) -> int:
        """Pairs neither received nor dead-lettered, and poison records not dead-lettered."""
        return len(self.lost) + len(self.poison_lost)

    @property
    def duplicates(self) -> int:
        """2xx answers beyond the first, over all pairs."""
        return sum(count - 1 for count in self.received.values() if count > 1)

    @property
    def duplicated_pairs(self) -> list[str]:
        return sorted(mid for mid, count in self.received.items() if count > 1)

    @property
    def received_and_dead(self) -> list[str]:
        """Pairs both received and dead-lettered (only a crash can explain that)."""
        return sorted(mid for mid in self.dead if mid in self.received)

    @property
    def dead_letter_duplicates(self) -> int:
        return sum(len(letters) - 1 for letters in self.dead.values())

    @property
    def complete(self) -> bool:
        """Every pair and every poison record has an outcome."""
        return not self.lost and not self.poison_lost

    def problems(self) -> list[str]:
        """What breaks the ledger: losses and anything that is not owed (never duplicates)."""
        found = []
        if self.lost:
            found.append(f"{len(self.lost)} pair(s) lost, e.g. {self.lost[:3]}")
        if self.poison_lost:
            found.append(f"{len(self.poison_lost)} poison record(s) not dead-lettered")
        if self.misfiled:
            found.append(f"{len(self.misfiled)} dead letter(s) misfiled: {self.misfiled[:5]}")
        if self.strange_requests:
            found.append(f"requests nobody owes: {sorted(set(self.strange_requests))[:5]}")
        if self.strange_letters:
            sample = [(d.kind, d.reason, d.message_id) for d in self.strange_letters[:5]]
            found.append(f"dead letters nobody owes: {sample}")
        return found

    def assert_sound(self) -> None:
        """Zero losses and nothing the ledger does not own."""
        problems = self.problems()
        assert not problems, "ledger check failed:\n  " + "\n  ".join(problems)

    def assert_exactly_once(self) -> None:
        """Sound, and with no fault that allows a duplicate: each pair's outcome happened once."""
        self.assert_sound()
        assert self.duplicates == 0, f"duplicates: {self.duplicated_pairs[:5]}"
        assert not self.received_and_dead, f"received and dead: {self.received_and_dead[:5]}"
        assert self.dead_letter_duplicates == 0, "a delivery was dead-lettered twice"

    def summary(self, scenario: str, seed: int, faults: int, rounds: int = 1, **extra: Any) -> str:
        """The one-line report every fault test prints."""
        fields = {
            "seed": seed,
            "scenarios": rounds,
            "faults": faults,
            "records": self.records,
            "pairs": self.pairs,
            "received": len(self.received),
            "dead_lettered": len(self.dead),
            "poison": len(self.poison_found),
            "losses": self.losses,
            "duplicates": self.duplicates,
            **extra,
        }
        return f"[fault-ledger] {scenario}: " + " ".join(f"{k}={v}" for k, v in fields.items())


class Ledger:
    """What the bridge owes, entered before the records are produced."""

    def __init__(self, webhooks: Sequence[dict[str, Any]]) -> None:
        self.webhooks = list(webhooks)
        self.pairs: dict[str, Pair] = {}
        self.records = 0
        self.poison: dict[bytes, str] = {}  # raw value -> the reason it must be dead-lettered with

    def subscribers(self, record: dict[str, Any]) -> list[str]:
        """The ids of the enabled webhooks of the record's account that chose its event."""
        event = event_of(record)
        return [
            hook["id"]
            for hook in self.webhooks
            if hook["account"] == record["accountHolderId"]
            and event in hook["events"]
            and hook.get("enabled", True)
        ]

    def expect(self, records: Iterable[dict[str, Any]]) -> list[Pair]:
        """Enter records; returns the pairs they add."""
        added = []
        for record in records:
            self.records += 1
            for hook_id in self.subscribers(record):
                pair = Pair(record["transactionId"], event_of(record), hook_id)
                assert pair.message_id not in self.pairs, f"transaction ids repeat: {pair}"
                self.pairs[pair.message_id] = pair
                added.append(pair)
        return added

    def produced_at(self, times: Mapping[bytes | None, float]) -> dict[str, float]:
        """When each pair's record was produced, from produce times by record key."""
        return {
            mid: times[pair.transaction_id.encode()]
            for mid, pair in self.pairs.items()
            if pair.transaction_id.encode() in times
        }

    def expect_poison(self, value: bytes, reason: str) -> None:
        """Enter a record the bridge must dead-letter as poison with ``reason``."""
        assert value not in self.poison, "poison values must be unique to be matched"
        self.records += 1
        self.poison[value] = reason

    def verdict(self, requests: Iterable[Request], letters: Iterable[DeadLetter]) -> Verdict:
        """Lay requests and dead letters against the ledger."""
        received: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        strange_requests = []
        for request in requests:
            if request.message_id not in self.pairs:
                strange_requests.append(request.message_id)
                continue
            counts[request.message_id] += 1
            if request.received:
                received[request.message_id] += 1
        dead: dict[str, list[DeadLetter]] = {}
        strange_letters = []
        poison_found: dict[bytes, DeadLetter] = {}
        misfiled = []
        for letter in letters:
            if letter.kind == KIND_POISON or letter.value in self.poison:
                reason = self.poison.get(letter.value)
                if reason is None:
                    strange_letters.append(letter)
                    continue
                if letter.kind != KIND_POISON or letter.reason != reason:
                    misfiled.append(
                        f"{letter.value[:24]!r}: kind={letter.kind} reason={letter.reason}, "
                        f"expected kind=poison reason={reason}"
                    )
                poison_found[letter.value] = letter
            elif letter.message_id in self.pairs:
                hook_id = self.pairs[letter.message_id].webhook_id
                filed = (letter.kind, letter.headers.get(H_WEBHOOK), bool(letter.reason))
                if filed != (KIND_DELIVERY, hook_id, True):
                    misfiled.append(
                        f"{letter.message_id}: kind={letter.kind} reason={letter.reason!r} "
                        f"webhook={letter.headers.get(H_WEBHOOK)}, expected kind=delivery, "
                        f"a reason, webhook={hook_id}"
                    )
                dead.setdefault(letter.message_id, []).append(letter)
            else:
                strange_letters.append(letter)
        lost = [p for mid, p in self.pairs.items() if mid not in received and mid not in dead]
        return Verdict(
            pairs=len(self.pairs),
            records=self.records,
            received=dict(received),
            requests=counts,
            dead=dead,
            lost=lost,
            strange_requests=strange_requests,
            strange_letters=strange_letters,
            poison_found=poison_found,
            poison_lost=[value for value in self.poison if value not in poison_found],
            misfiled=misfiled,
        )


class DeadLetterReader:
    """Reads a dead-letter topic from its start, each call up to the topic's current end."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.letters: list[DeadLetter] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique_name("ledger"),
                "enable.auto.commit": False,
                **QUIET,
            }
        )
        metadata = self._consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        assert partitions, f"topic {topic} has no partitions"
        self._next = dict.fromkeys(partitions, 0)
        self._consumer.assign([TopicPartition(topic, p, 0) for p in partitions])

    def read(self, timeout: float = 30.0) -> list[DeadLetter]:
        """Everything in the topic now (read until each partition's high watermark)."""
        ends = {
            p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
            for p in self._next
        }
        deadline = time.monotonic() + timeout
        while any(self._next[p] < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {self.topic} to its end in {timeout}s")
            msg: Message | None = self._consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            self._next[msg.partition()] = msg.offset() + 1
            self.letters.append(
                DeadLetter(
                    header_map(msg.headers()), msg.value() or b"", msg.partition(), msg.offset()
                )
            )
        return list(self.letters)

    def close(self) -> None:
        self._consumer.close()


def committed_everything(bootstrap: str, group: str, topics: Sequence[str]) -> list[str]:
    """The partitions of ``topics`` whose committed offset for ``group`` is behind the end."""
    return [
        f"{tp}: {committed} < {high}"
        for tp, (committed, high) in group_positions(bootstrap, group, topics).items()
        if committed < high
    ]


def wait_quiescent(bootstrap: str, group: str, topics: Sequence[str], timeout: float) -> None:
    """Wait until the group committed every record of ``topics``: no work is left anywhere."""
    behind: list[str] = []

    def done() -> bool:
        behind[:] = committed_everything(bootstrap, group, topics)
        return not behind

    try:
        wait_for(done, timeout, interval=0.5, message="every offset to be committed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still behind: {behind}") from None


_SETTLING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)
"""Errors of a cluster settling after a broker restart: reading the dead letters is tried again."""


def wait_complete(
    ledger: Ledger,
    requests: Callable[[], list[Request]],
    reader: DeadLetterReader,
    timeout: float,
) -> Verdict:
    """Wait until every pair and poison record has an outcome; returns that verdict."""
    verdicts: list[Verdict] = []

    def complete() -> bool:
        try:
            letters = reader.read()
        except KafkaException as exc:  # a broker just restarted may not lead its partitions yet
            error = exc.args[0]
            if not (error.retriable() or error.code() in _SETTLING):
                raise
            return False  # what was read is kept: the next turn reads on from there
        verdicts[:] = [ledger.verdict(requests(), letters)]
        return verdicts[0].complete

    try:
        wait_for(complete, timeout, interval=0.5, message="every pair to be received or dead")
    except AssertionError as exc:
        detail = ""
        if verdicts:
            missing = Counter(pair.webhook_id for pair in verdicts[0].lost)
            detail = f"; missing pairs by webhook: {dict(missing)}, e.g. {verdicts[0].lost[:3]}"
            detail += f"; poison records missing: {len(verdicts[0].poison_lost)}"
        raise AssertionError(f"{exc}{detail}") from None
    return verdicts[0]


def _received_times(requests: Iterable[Request]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for request in requests:
        if request.received:
            times.setdefault(request.message_id, []).append(request.at)
    return {mid: sorted(seen) for mid, seen in times.items()}


def redo_lags(
    requests: Sequence[Request],
    faults: Sequence[float],
    produced: Mapping[str, float],
    slack: float = 0.5,
    outages: Sequence[tuple[float, float]] = (),
) -> dict[str, float]:
    """For each pair answered 2xx more than once: how long before a fault its work was in flight.

    At-least-once allows another delivery only of work in flight (not yet committed) at a fault,
    so each 2xx after the first must follow a fault that came either shortly after an earlier
    request of the pair (lag: the time between them), or while the pair's record was produced
    but not yet tried (lag 0: consumed, queued or deferred when the fault struck). A pair's lag
    is that of its worst repeat, ``inf`` when no fault explains it. ``produced`` maps a pair's
    ``webhook-id`` to when its record was produced.

    ``outages`` (start, end) are spans without a broker: nothing can be committed then, so they
    do not count in a lag (work tried during a broker outage and redone after the next fault is
    in flight only for the time the broker was back in between).
    """

    def available(start: float, end: float) -> float:
        """The time from ``start`` to ``end`` outside every outage."""
        down = sum(max(0.0, min(end, o_end) - max(start, o_start)) for o_start, o_end in outages)
        return end - start - down

    tried: dict[str, list[float]] = {}
    for request in requests:
        tried.setdefault(request.message_id, []).append(request.at)
    lags = {}
    for mid, received in _received_times(requests).items():
        if len(received) < 2:
            continue
        first_try = min(tried[mid])
        born = produced.get(mid, first_try)

        def lag(
            later: float, mid: str = mid, first_try: float = first_try, born: float = born
        ) -> float:
            after_a_try = [
                available(at, fault) if fault >= at else fault - at
                for at in tried[mid]
                if at < later
                for fault in faults
                if at - slack <= fault <= later + slack
            ]
            before_any_try = [0.0 for fault in faults if born - slack <= fault <= first_try + slack]
            return min(after_a_try + before_any_try, default=float("inf"))

        lags[mid] = max(lag(later) for later in received[1:])
    return lags


def unexplained_duplicates(
    requests: Sequence[Request],
    faults: Sequence[float],
    produced: Mapping[str, float],
    window: float,
    outages: Sequence[tuple[float, float]] = (),
) -> list[str]:
    """Pairs answered 2xx more than once that no fault explains (see :func:`redo_lags`).

    One fault may explain several repeats: the source record and a delay-topic record of the same
    pair, both uncommitted at a crash, are both redone.
    """
    lags = redo_lags(requests, faults, produced, outages=outages)
    return sorted(mid for mid, lag in lags.items() if lag > window)


def longest_redo_lag(
    requests: Sequence[Request],
    faults: Sequence[float],
    produced: Mapping[str, float],
    outages: Sequence[tuple[float, float]] = (),
) -> float:
    """Over explained duplicates: the longest time work was in flight before its fault."""
    every = redo_lags(requests, faults, produced, outages=outages).values()
    lags = [lag for lag in every if lag != float("inf")]
    return max(lags, default=0.0)


def timeline(
    requests: Iterable[Request],
    message_ids: Iterable[str],
    faults: Sequence[float],
    produced: Mapping[str, float],
) -> str:
    """When some pairs were produced and tried, and the faults, in seconds from the first fault."""
    wanted = sorted(set(message_ids))
    start = min(faults, default=0.0)
    lines = [f"faults at {[round(f - start, 2) for f in faults]}"]
    for mid in wanted:
        if mid in produced:
            lines.append(f"{mid} {produced[mid] - start:+.3f}s produced")
        lines += [
            f"{mid} {request.at - start:+.3f}s -> {request.status}"
            for request in sorted(requests, key=lambda r: r.at)
            if request.message_id == mid
        ]
    return "\n".join(lines)


def concurrent_deliveries(requests: Iterable[Request], hold: float) -> list[str]:
    """Pairs with two 2xx requests less than ``hold`` seconds apart: two senders at once.

    ``hold`` is how long the receiver keeps each request it answers 2xx before answering (its
    other answers are immediate, so they cannot overlap a later request).
    """
    return sorted(
        mid
        for mid, seen in _received_times(requests).items()
        if any(later - earlier < hold for earlier, later in itertools.pairwise(seen))
    )


def encoded(records: Iterable[dict[str, Any]]) -> list[tuple[bytes | None, bytes]]:
    """(key, plain Avro value) of each record, keyed by transaction id as the platform does."""
    return [(r["transactionId"].encode(), encode_plain(SCHEMA, r)) for r in records]


@dataclass
class StreamProducer:
    """Produces (key, value) items to a topic from a thread, a batch every ``spacing`` seconds.

    The producer keeps what it cannot send yet (a broker restart) and sends it when it can;
    ``join`` waits until every item is acknowledged and fails on any delivery error.
    """

    bootstrap: str
    topic: str
    items: list[tuple[bytes | None, bytes]]
    duration: float
    spacing: float = 0.5
    errors: list[str] = field(default_factory=list)
    produced: int = 0
    produced_at: dict[bytes | None, float] = field(default_factory=dict)  # key -> when produced

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-producer", daemon=True)

    def start(self) -> StreamProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                **QUIET,
            }
        )

        def on_delivery(err: object, _msg: Message) -> None:
            if err is not None:
                self.errors.append(str(err))

        batches = max(1, round(self.duration / self.spacing))
        size = max(1, -(-len(self.items) // batches))
        for start in range(0, len(self.items), size):
            if start and self._stop.wait(self.spacing):  # paces the stream; stops when hurried
                break
            for key, value in self.items[start : start + size]:
                self._produce(producer, key, value, on_delivery)
            producer.poll(0)
        for key, value in self.items[self.produced :]:
            self._produce(producer, key, value, on_delivery)
        left = producer.flush(120)
        if left:
            self.errors.append(f"{left} record(s) not acknowledged")

    def _produce(
        self,
        producer: Producer,
        key: bytes | None,
        value: bytes,
        on_delivery: Callable[[object, Message], None],
    ) -> None:
        self.produced_at[key] = time.time()
        producer.produce(self.topic, value=value, key=key, on_delivery=on_delivery)
        self.produced += 1

    def hurry(self) -> None:
        """Produce whatever is left at once."""
        self._stop.set()

    def join(self, timeout: float = 150.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream producer did not finish"
        assert not self.errors, f"producing the stream failed: {self.errors[:3]}"


def produce_items(bootstrap: str, topic: str, items: Sequence[tuple[bytes | None, bytes]]) -> None:
    """Produce (key, value) items in order with one producer, waiting for every ack."""
    stream = StreamProducer(bootstrap, topic, list(items), duration=0.0)
    stream.start().join()
