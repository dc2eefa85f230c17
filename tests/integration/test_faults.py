"""Fault injection against the real bridge, broker and receivers, checked against a ledger.

Every record and every (record, webhook) pair the bridge owes is known before the records are
produced (``tests/ledger.py``). Each scenario injects one kind of fault while traffic flows, waits
until every pair is received or dead-lettered and every offset is committed, then checks the ledger:
zero losses, nothing delivered or dead-lettered that is not owed, duplicates only around a fault.
Each test prints one summary line (seed, faults, records, pairs, losses, duplicates).

Environment:

- ``BRIDGE_FAULT_SEED=<int>`` replays a run (the seed is printed in every summary line); without
  it the seed comes from the clock.
- ``BRIDGE_SOAK=1`` runs the long variant: six times the records and crashes, more broker
  outages and rebalance rounds (about twelve minutes on two cores instead of about four).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import shutil
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from bridge.codec.decoding import Decoder
from bridge.codec.encoding import encode_plain, encode_single_object
from bridge.core.envelope import PendingDelivery, SourceRef, delay_headers
from bridge.core.errors import RecordError
from bridge.core.mapping import to_notification
from devtools.devkafka import Broker, free_port
from devtools.samples import make_record, random_record
from tests.bridge_harness import REPO, SCHEMA, BridgeProcess, BridgeSetup, webhook
from tests.kafka_helpers import QUIET, produce, wait_for
from tests.ledger import (
    SOAK,
    DeadLetterReader,
    Ledger,
    Pair,
    Request,
    StreamProducer,
    Verdict,
    committed_everything,
    concurrent_deliveries,
    encoded,
    fault_seed,
    longest_redo_lag,
    produce_items,
    receiver_requests,
    scenario_rng,
    timeline,
    unexplained_duplicates,
    wait_complete,
    wait_quiescent,
)
from tests.prometheus_server import JOB, QUICK, Prometheus, quick_copy
from tests.receiver import Answer, Receiver, always, fail_first
from tests.unit.test_prometheus_rules import ALERTS

pytestmark = pytest.mark.integration

Setup = Callable[..., BridgeSetup]

FAST_FAILOVER = {"properties": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}}
"""A dead member's partitions move after 6 s (the broker's minimum) instead of 45 s."""
QUICK_LADDER = {"attempts": 5, "first_delay_ms": 200, "increment_ms": 200}
TIGHT_FLOW = {"max_in_flight": 8}
"""Few deliveries in flight: partitions pause and resume (with seeks) all the time."""
COMMIT_WINDOW_S = 10.0
"""How long before a fault a delivery may have been received and still not committed."""
SCALE = 6 if SOAK else 1


@pytest.fixture(scope="module")
def seed() -> int:
    """The seed of this run's random choices (``BRIDGE_FAULT_SEED`` or the clock)."""
    return fault_seed()


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    """Print a summary line on the terminal, past pytest's capture."""
    with capsys.disabled():
        print(f"\n{line}", flush=True)


def stream_records(rng: random.Random, count: int, accounts: list[str]) -> list[dict[str, Any]]:
    """``count`` random records spread over ``accounts``, with unique transaction ids."""
    return [random_record(rng, f"tx-{i:05d}", rng.choice(accounts)) for i in range(count)]


def consumed_topics(setup: BridgeSetup) -> list[str]:
    """The source topic, every delay rung and the parking topic: what the bridge's group commits."""
    rungs = setup.retry.get("attempts", 5)
    delay = [setup.delay_topic(rung) for rung in range(1, rungs + 1)]
    return [setup.source, *delay, f"{setup.source}.parked"]


def settle(
    setup: BridgeSetup,
    ledger: Ledger,
    requests: Callable[[], list[Request]],
    timeout: float = 120.0,
) -> Verdict:
    """Wait until every pair has an outcome and no work is left, then read the final verdict."""
    reader = DeadLetterReader(setup.bootstrap, setup.dead_letter_topic)
    try:
        wait_complete(ledger, requests, reader, timeout)
        wait_quiescent(setup.bootstrap, setup.group, consumed_topics(setup), timeout)
        return ledger.verdict(requests(), reader.read())
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{bridge_state(setup)}") from None
    finally:
        reader.close()


def bridge_state(setup: BridgeSetup) -> str:
    """What the running bridges and the group's offsets say, to explain a wait that timed out."""
    lines = []
    for bridge in setup.processes:
        if alive(bridge):
            gauges = {
                name: bridge.gauge(f"bridge_{name}")
                for name in ("deliveries_in_flight", "paused_partitions", "assigned_partitions")
            }
            deferrals = bridge.gauge("bridge_deferrals_total")
            lines.append(f"{bridge.log_path.name}: {gauges}, deferrals {deferrals}")
    behind = committed_everything(setup.bootstrap, setup.group, consumed_topics(setup))
    if behind:
        lines.append(f"partitions not committed to their end: {behind}")
    else:
        lines.append("every offset is committed: whatever is missing will never be delivered")
    return "\n".join(lines)


def alive(bridge: BridgeProcess) -> bool:
    return bridge.process is not None and bridge.process.poll() is None


def assert_no_traceback(bridge: BridgeProcess) -> None:
    tracebacks = [line for line in bridge.log_lines() if "Traceback" in line]
    assert not tracebacks, f"the bridge logged a traceback:\n{bridge.log_tail(60)}"


# ---- 1. crashes -----------------------------------------------------------------------------


def test_sigkill_at_random_moments_loses_nothing(
    receiver: Receiver, bridge_setup: Setup, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = scenario_rng(seed, "crash")
    kills = 5 * SCALE
    receiver.behaviours["/steady"] = lambda _seen: Answer(200, delay=0.02)
    receiver.behaviours["/flaky"] = fail_first(1, 503)
    hooks = [
        webhook("steady", "acct_a", receiver.url("/steady"), concurrency=4),
        webhook("flaky", "acct_a", receiver.url("/flaky"), concurrency=4),
        webhook("failures", "acct_b", receiver.url("/flaky"), events=["transaction.failed"]),
    ]
    setup = bridge_setup(hooks, retry=QUICK_LADDER, delivery=TIGHT_FLOW, kafka=FAST_FAILOVER)
    records = stream_records(rng, 240 * SCALE, ["acct_a", "acct_b", "acct_nobody"])
    ledger = Ledger(hooks)
    ledger.expect(records)

    bridge = setup.start_bridge()
    stream = StreamProducer(setup.bootstrap, setup.source, encoded(records), 6.0 * kills)
    stream.start()
    kill_times = []
    for _ in range(kills):
        time.sleep(rng.uniform(0.2, 3.0))  # spaces the injected faults
        bridge.kill()
        kill_times.append(time.time())
        bridge = setup.start_bridge()
    stream.hurry()
    stream.join()

    verdict = settle(setup, ledger, lambda: receiver_requests(receiver))
    requests = receiver_requests(receiver)
    produced = ledger.produced_at(stream.produced_at)
    unexplained = unexplained_duplicates(requests, kill_times, produced, COMMIT_WINDOW_S)
    lag = longest_redo_lag(requests, kill_times, produced)
    report(
        capsys,
        verdict.summary(
            "crash", seed, faults=kills, unexplained=len(unexplained), redo_lag_s=round(lag, 2)
        ),
    )
    verdict.assert_sound()
    assert not verdict.dead, "every webhook answers 200 on its second try: nothing is dead"
    assert unexplained == [], "duplicates not explained by a crash:\n" + timeline(
        requests, unexplained[:5], kill_times, produced
    )
    assert alive(bridge)


# ---- 2. broker restart ----------------------------------------------------------------------


def readiness_drops(bridge: BridgeProcess, until: float) -> bool:
    """Whether ``/readyz`` answers 503 before ``until`` (monotonic), polling once a second."""
    while time.monotonic() < until:
        if bridge.http("/readyz")[0] == 503:
            return True
        time.sleep(min(1.0, max(0.0, until - time.monotonic())))
    return False


UNREACHABLE = "BridgeKafkaUnreachable"


def unreachable_alert(server: Prometheus, until: float) -> dict[str, str]:
    """BridgeKafkaUnreachable's states in Prometheus (``quick`` copy and ``real`` rule) once the
    quick copy fires, or as they are at ``until`` (monotonic)."""
    states: dict[str, str] = {}
    while time.monotonic() < until:
        states = {
            alert["labels"].get("copy", "real"): alert["state"]
            for alert in server.alerts(UNREACHABLE)
        }
        if states.get(QUICK) == "firing":
            break
        time.sleep(0.5)
    return states


def test_broker_restart_mid_stream_without_bridge_restart(
    receiver: Receiver,
    bridge_setup: Setup,
    broker: Broker | None,
    seed: int,
    capsys: pytest.CaptureFixture[str],
    prometheus: Callable[..., Prometheus],
    tmp_path: Path,
) -> None:
    """... and the broker loss in Prometheus: BridgeKafkaUnreachable's expression is true in the
    real Prometheus scraping this bridge (a copy of the rule with ``for: 5s`` fires, the real
    one is pending) while the broker is down for over 30 s, and neither is active after."""
    assert broker is not None, (
        "this scenario stops and restarts the broker, so it needs the broker the test session "
        "starts itself: unset KAFKA_BOOTSTRAP_SERVERS to run it"
    )
    rng = scenario_rng(seed, "broker")
    # Seconds the broker stays down: briefly, then past the bridge producer's 30 s delivery timeout.
    outages = [rng.uniform(1.0, 4.0), rng.uniform(32.0, 36.0)]
    if SOAK:
        outages += [rng.uniform(1.0, 10.0) for _ in range(4)]
    receiver.behaviours["/flaky"] = fail_first(1, 503)
    hooks = [
        webhook("steady", "acct_a", receiver.url("/steady")),
        webhook("flaky", "acct_a", receiver.url("/flaky")),
    ]
    setup = bridge_setup(hooks, retry=QUICK_LADDER)
    records = stream_records(rng, 150 * SCALE, ["acct_a", "acct_nobody"])
    ledger = Ledger(hooks)
    ledger.expect(records)

    bridge = setup.start_bridge()
    server = prometheus(bridge, (ALERTS, quick_copy(tmp_path, UNREACHABLE, "5s")))
    wait_for(lambda: server.query(f'up{{job="{JOB}"}} == 1'), 30, message="Prometheus to scrape")
    duration = sum(outages) + 10.0 * len(outages)
    stream = StreamProducer(setup.bootstrap, setup.source, encoded(records), duration)
    stream.start()
    faults = []
    unready_seen = []  # per long outage: did /readyz ever answer 503 while the broker was down?
    reachable_when_unready = []  # bridge_kafka_brokers_reachable just after /readyz said 503
    alerted = []  # per long outage: BridgeKafkaUnreachable's states in Prometheus
    for outage in outages:
        time.sleep(rng.uniform(2.0, 5.0))  # spaces the injected faults
        faults.append(time.time())
        broker.stop()
        try:
            back = time.monotonic() + outage
            if outage > 20:
                unready_seen.append(readiness_drops(bridge, back - 2.0))
                reachable_when_unready.append(bridge.gauge("bridge_kafka_brokers_reachable"))
                alerted.append(unreachable_alert(server, back - 0.5))
            time.sleep(max(0.0, back - time.monotonic()))  # the rest of the outage
        finally:
            broker.start(fresh=False)
        faults.append(time.time())
    stream.join()

    verdict = settle(setup, ledger, lambda: receiver_requests(receiver), timeout=180)
    requests = receiver_requests(receiver)
    produced = ledger.produced_at(stream.produced_at)
    # The broker down from each stop to its start: a restart may take far longer than the
    # outage asked for (27 s in one run), and nothing can be committed meanwhile.
    down = list(zip(faults[::2], faults[1::2], strict=True))
    unexplained = unexplained_duplicates(requests, faults, produced, COMMIT_WINDOW_S, down)
    lag = longest_redo_lag(requests, faults, produced, down)
    report(
        capsys,
        verdict.summary(
            "broker-restart",
            seed,
            faults=len(outages),
            rounds=len(outages),
            down_s="/".join(f"{outage:.0f}" for outage in outages),
            unready_seen=sum(unready_seen),
            unexplained=len(unexplained),
            redo_lag_s=round(lag, 2),
        ),
    )
    verdict.assert_sound()
    assert not verdict.dead
    assert unexplained == [], "duplicates not explained by the restart:\n" + timeline(
        requests, unexplained[:5], faults, produced
    )
    assert alive(bridge), "the bridge survives a broker restart without being restarted"
    assert setup.processes == [bridge]
    starts = [line for line in bridge.log_lines() if '"bridge.started"' in line]
    assert len(starts) == 1, "the bridge process was started once and never restarted"
    wait_for(lambda: bridge.http("/readyz")[0] == 200, 30, message="the bridge to be ready again")
    assert all(unready_seen), (
        "/readyz kept answering 200 through a broker outage of over 30 s "
        f"(SPEC 6: ready means the broker is reachable): {bridge.http('/readyz')}"
    )
    # The metric behind BridgeKafkaUnreachable says the same as /readyz, and recovers with it.
    assert reachable_when_unready and set(reachable_when_unready) == {0.0}, reachable_when_unready
    wait_for(
        lambda: bridge.gauge("bridge_kafka_brokers_reachable") >= 1,
        30,
        message="bridge_kafka_brokers_reachable back to 1",
    )
    # ... and so does the alert in the real Prometheus: it fired during the outage, resolved after.
    assert alerted and all(states == {QUICK: "firing", "real": "pending"} for states in alerted), (
        f"{UNREACHABLE} during the outages of over 30 s: {alerted}"
    )
    wait_for(
        lambda: server.alerts(UNREACHABLE) == [],
        60,
        interval=0.5,
        message=f"{UNREACHABLE} to resolve once the broker is back",
    )


# ---- 3. rebalances --------------------------------------------------------------------------

HOLD_S = 0.25
"""How long the receiver holds each request it answers 2xx in the rebalance scenario."""


def test_members_join_and_crash_without_loss_or_concurrent_delivery(
    receiver: Receiver, bridge_setup: Setup, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = scenario_rng(seed, "rebalance")
    rounds = 3 if SOAK else 1
    receiver.behaviours["/slow"] = lambda _seen: Answer(200, delay=HOLD_S)
    receiver.behaviours["/flaky"] = lambda seen: (
        Answer(503) if seen == 0 else Answer(200, delay=HOLD_S)
    )
    hooks = [
        webhook("slow", "acct_a", receiver.url("/slow"), concurrency=8),
        webhook("flaky", "acct_a", receiver.url("/flaky"), concurrency=8),
        webhook("other", "acct_b", receiver.url("/slow"), concurrency=8),
    ]
    setup = bridge_setup(
        hooks, partitions=6, retry=QUICK_LADDER, delivery=TIGHT_FLOW, kafka=FAST_FAILOVER
    )
    partitions = setup.partitions * len(consumed_topics(setup))
    records = stream_records(rng, 300 * SCALE, ["acct_a", "acct_b"])
    ledger = Ledger(hooks)
    ledger.expect(records)

    members = [setup.start_bridge(), setup.start_bridge()]
    stream = StreamProducer(setup.bootstrap, setup.source, encoded(records), 20.0 * rounds)
    stream.start()
    faults = []
    for _ in range(rounds):
        time.sleep(rng.uniform(1.0, 4.0))  # spaces the injected faults
        faults.append(time.time())
        members.append(setup.start_bridge())
        time.sleep(rng.uniform(1.0, 4.0))
        victim = members.pop(rng.randrange(len(members)))
        victim.kill()
        faults.append(time.time())
        wait_for(
            lambda: sum(m.gauge("bridge_assigned_partitions") for m in members) == partitions,
            60,
            message="the surviving members to own every partition",
        )
    stream.join()

    verdict = settle(setup, ledger, lambda: receiver_requests(receiver))
    requests = receiver_requests(receiver)
    concurrent = concurrent_deliveries(requests, HOLD_S)
    produced = ledger.produced_at(stream.produced_at)
    unexplained = unexplained_duplicates(requests, faults, produced, COMMIT_WINDOW_S)
    report(
        capsys,
        verdict.summary(
            "rebalance",
            seed,
            faults=2 * rounds,
            rounds=rounds,
            members=len(setup.processes),
            concurrent=len(concurrent),
            unexplained=len(unexplained),
            redo_lag_s=round(longest_redo_lag(requests, faults, produced), 2),
        ),
    )
    verdict.assert_sound()
    assert not verdict.dead
    assert concurrent == [], f"pairs delivered by two members at once: {concurrent[:5]}"
    assert unexplained == [], "duplicates not explained by a rebalance:\n" + timeline(
        requests, unexplained[:5], faults, produced
    )
    assert all(alive(m) for m in members)


# ---- 4. receiver chaos ----------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """A chaos webhook: how its receiver answers and what must become of each of its pairs."""

    behaviour: Callable[[int], Answer] | None  # None: a port nobody listens on
    received: bool
    requests: int | None  # requests per pair (None: not observable)
    last_status: str = ""
    last_error: str = ""  # expected prefix of bridge-last-error


def chaos_endpoints(rng: random.Random) -> dict[str, Endpoint]:
    """Every kind of bad answer, each on its own webhook (ladder: 2 retries, timeout 1 s)."""
    failures = [Answer(502), Answer(429), Answer(302), Answer(reset=True), Answer(hang=True)]
    first, second = rng.sample(failures, 2)
    return {
        "ok": Endpoint(always(200), True, 1),
        "slow": Endpoint(lambda _seen: Answer(200, delay=0.5), True, 1),
        "flaky": Endpoint(fail_first(1, 503), True, 2),
        "hang-once": Endpoint(lambda s: Answer(hang=True) if s == 0 else Answer(200), True, 2),
        "mixed": Endpoint(lambda s: (first, second)[s] if s < 2 else Answer(200), True, 3),
        "redirect": Endpoint(
            lambda _seen: Answer(302, headers={"Location": "/followed"}),
            False,
            3,
            "302",
            "HTTP 302",
        ),
        "down": Endpoint(always(500), False, 3, "500", "HTTP 500"),
        "throttled": Endpoint(
            lambda _seen: Answer(429, headers={"Retry-After": "1"}), False, 3, "429", "HTTP 429"
        ),
        "hang": Endpoint(lambda _seen: Answer(hang=True), False, 3, "", "timeout"),
        "reset": Endpoint(lambda _seen: Answer(reset=True), False, 3, "", "connection_error"),
        "refused": Endpoint(None, False, None, "", "connection_error"),
    }


def test_receiver_chaos_ends_received_or_dead_lettered(
    receiver: Receiver, bridge_setup: Setup, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = scenario_rng(seed, "chaos")
    endpoints = chaos_endpoints(rng)
    hooks = []
    for name, endpoint in endpoints.items():
        if endpoint.behaviour is None:
            url = f"http://127.0.0.1:{free_port()}/"  # nobody listens there
        else:
            receiver.behaviours[f"/{name}"] = endpoint.behaviour
            url = receiver.url(f"/{name}")
        hooks.append(webhook(name, "acct_chaos", url))
    setup = bridge_setup(
        hooks,
        retry={"attempts": 2, "first_delay_ms": 100, "increment_ms": 100},
        delivery={"timeout_seconds": 1.0, "connect_timeout_seconds": 1.0},
    )
    records = stream_records(rng, 12 * SCALE, ["acct_chaos"])
    ledger = Ledger(hooks)
    pairs = ledger.expect(records)

    bridge = setup.start_bridge()
    produce_items(setup.bootstrap, setup.source, encoded(records))
    verdict = settle(setup, ledger, lambda: receiver_requests(receiver))

    requests = receiver_requests(receiver)
    refused = sum(1 for pair in pairs if pair.webhook_id == "refused")
    faults = sum(1 for r in requests if not r.received) + refused * 3
    report(capsys, verdict.summary("receiver-chaos", seed, faults=faults))
    verdict.assert_exactly_once()
    wrong = []
    for pair in pairs:
        endpoint = endpoints[pair.webhook_id]
        made = verdict.requests[pair.message_id]
        if endpoint.requests is not None and made != endpoint.requests:
            wrong.append(f"{pair.webhook_id}: {made} request(s), expected {endpoint.requests}")
        if endpoint.received:
            if pair.message_id not in verdict.received:
                wrong.append(f"{pair.webhook_id}: not received")
            continue
        letters = verdict.dead.get(pair.message_id)
        if not letters:
            wrong.append(f"{pair.webhook_id}: not dead-lettered")
            continue
        headers = letters[0].headers
        seen = (
            headers.get("bridge-reason"),
            headers.get("bridge-webhook"),
            headers.get("bridge-attempts"),
            headers.get("bridge-last-status"),
        )
        if seen != ("retries_exhausted", pair.webhook_id, "3", endpoint.last_status):
            wrong.append(f"{pair.webhook_id}: dead letter headers {seen}")
        if not headers.get("bridge-last-error", "").startswith(endpoint.last_error):
            wrong.append(f"{pair.webhook_id}: last error {headers.get('bridge-last-error')!r}")
    assert wrong == [], "\n".join(sorted(set(wrong)))
    assert receiver.on("/followed") == [], "redirects are never followed"
    assert alive(bridge)


def test_busy_webhook_backlog_is_delivered_not_dead_lettered(
    receiver: Receiver, bridge_setup: Setup, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A healthy webhook that answers every request within its timeout, only not at once.

    Two slots, 0.5 s per answer (timeout 2 s), a backlog of 24 records: the webhook is busy, not
    stalled. Every delivery must reach it and be received; none may be dead-lettered without a
    single request.
    """
    rng = scenario_rng(seed, "backlog")
    receiver.behaviours["/busy"] = lambda _seen: Answer(200, delay=0.5)
    hooks = [webhook("busy", "acct_busy", receiver.url("/busy"), concurrency=2)]
    setup = bridge_setup(hooks, retry=QUICK_LADDER, delivery={"timeout_seconds": 2.0})
    records = stream_records(rng, 24, ["acct_busy"])
    ledger = Ledger(hooks)
    ledger.expect(records)

    setup.start_bridge()
    produce_items(setup.bootstrap, setup.source, encoded(records))
    verdict = settle(setup, ledger, lambda: receiver_requests(receiver))

    untried = [mid for mid in verdict.dead if verdict.requests[mid] == 0]
    report(capsys, verdict.summary("busy-backlog", seed, faults=0, untried=len(untried)))
    verdict.assert_exactly_once()
    reasons = {letters[0].headers.get("bridge-last-error") for letters in verdict.dead.values()}
    dead = len(verdict.dead)
    assert dead == 0, (
        f"{dead} deliveries to a webhook that answers every request in 0.5 s were dead-lettered "
        f"({len(untried)} without a single request; last errors {reasons})"
    )


def test_retries_falling_due_one_after_another_are_all_tried(
    receiver: Receiver, bridge_setup: Setup, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Retries in one delay-topic partition fall due one a millisecond for seconds on end, while
    the topic's other partitions keep bringing retries that are due already.

    Each fetch of the first partition finds some retries due and the next one due a millisecond
    later: the partition is held for that millisecond, and the records fetched behind the held one
    must be fetched again, even when starting the other partitions' retries fetched with them
    takes longer than the hold. More retries arrive in the first partition afterwards: committing
    them must not commit past retries never tried. (Two rounds: a hold outlived by the rest of its
    fetch is a matter of timing, seen in about three rounds out of four.)
    """
    rng = scenario_rng(seed, "due-in-a-row")
    hooks = [webhook("hook", "acct_r", receiver.url("/hook"), concurrency=64)]
    setup = bridge_setup(
        hooks,
        partitions=6,
        retry={"attempts": 1, "first_delay_ms": 100, "increment_ms": 0},
        delivery={"max_in_flight": 100_000},
    )
    rounds, in_a_row, overdue, window_s = 2, 4000, 6000, 4.0
    records = stream_records(rng, rounds * (in_a_row + overdue) + 50, ["acct_r"])
    ledger = Ledger(hooks)
    pairs = ledger.expect(records)
    retries = [(p, to_notification(r).body) for r, p in zip(records, pairs, strict=True)]
    topic = setup.delay_topic(1)

    setup.start_bridge()
    for _ in range(rounds):
        first_due = int(time.time() * 1000) + 2000
        due_in_a_row = [
            retry_of(p, b, setup.source, first_due + i)
            for i, (p, b) in enumerate(retries[:in_a_row])
        ]
        produce_retries(setup.bootstrap, topic, 0, due_in_a_row)
        del retries[:in_a_row]
        behind = [retry_of(p, b, setup.source, 0) for p, b in retries[:overdue]]
        del retries[:overdue]
        time.sleep(max(0.0, first_due / 1000 - time.time() - 0.2))  # until the first falls due
        others = itertools.cycle(range(1, setup.partitions))
        while behind and time.time() < first_due / 1000 + window_s:
            produce_retries(setup.bootstrap, topic, next(others), behind[:40])
            del behind[:40]
        produce_retries(setup.bootstrap, topic, next(others), behind)
        time.sleep(max(0.0, first_due / 1000 + window_s + 0.5 - time.time()))  # all fell due
    produce_retries(
        setup.bootstrap, topic, 0, [retry_of(p, b, setup.source, 0) for p, b in retries]
    )
    verdict = settle(setup, ledger, lambda: receiver_requests(receiver), timeout=30)

    report(capsys, verdict.summary("due-in-a-row", seed, faults=0, rounds=rounds))
    verdict.assert_exactly_once()
    assert not verdict.dead


def retry_of(
    pair: Pair, body: bytes, source: str, due_ms: int
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of the delay-topic record retrying ``pair`` at ``due_ms``."""
    delivery = PendingDelivery(
        webhook_id=pair.webhook_id,
        message_id=pair.message_id,
        event=pair.event,
        transaction_id=pair.transaction_id,
        body=body,
        attempt=1,
        source=SourceRef(source, 0, 0, due_ms),
        key=pair.transaction_id.encode(),
        due_ms=due_ms,
    )
    return pair.transaction_id.encode(), body, delay_headers(delivery)


def produce_retries(
    bootstrap: str,
    topic: str,
    partition: int,
    items: list[tuple[bytes, bytes, list[tuple[str, bytes]]]],
) -> None:
    """Produce (key, value, headers) records in order to one partition; wait for every ack."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1, **QUIET})
    for key, value, headers in items:
        producer.produce(topic, value=value, key=key, headers=headers, partition=partition)
        producer.poll(0)
    assert producer.flush(30) == 0, "the retries were not all acknowledged"


# ---- 5. poison input ------------------------------------------------------------------------

REFUND_SCHEMA = {
    "type": "record",
    "name": "RefundOutcome",
    "namespace": "payments.refunds",
    "fields": [{"name": "refundId", "type": "string"}, {"name": "amount", "type": "long"}],
}
MAX_RECORD_BYTES = 2048
POISON_REASONS = {
    "truncated": {"truncated"},
    "corrupt": {"corrupt"},
    "trailing": {"trailing_bytes"},
    "wrong-schema": {"truncated", "corrupt", "trailing_bytes"},
    "wrong-schema-known": {"schema_mismatch"},
    "wrong-schema-unknown": {"unknown_fingerprint"},
    "oversized": {"oversized"},
    "unmappable": {"negative_amount", "invalid_state_data", "missing_failure_code"},
}


def poison_value(rng: random.Random, kind: str, index: int) -> bytes:
    """One bad record value of ``kind``, unique by ``index``."""
    tx = f"bad-{kind}-{index:04d}"
    good = encode_plain(SCHEMA, make_record(tx, "acct_p"))
    if kind == "truncated":
        return good[: rng.randrange(len(tx) + 1, len(good) - 1)] if index else b""
    if kind == "corrupt":  # the transaction id's first bytes are not UTF-8
        return good.replace(b"bad-", b"\xff\xfe\xfd\xfc", 1)
    if kind == "trailing":
        return good + bytes([rng.randrange(256)])
    refund = {"refundId": tx, "amount": rng.randrange(10**6)}
    if kind == "wrong-schema":
        return encode_plain(REFUND_SCHEMA, refund)
    if kind == "wrong-schema-known":
        return encode_single_object(REFUND_SCHEMA, refund)
    if kind == "wrong-schema-unknown":
        other = {**REFUND_SCHEMA, "name": "ChargebackOutcome"}
        return encode_single_object(other, refund)
    if kind == "oversized":
        return encode_plain(SCHEMA, make_record(tx, "acct_p", label="x" * MAX_RECORD_BYTES))
    assert kind == "unmappable"
    broken: dict[str, Any] = rng.choice(
        [
            {"amount": "-1.00"},
            {"state_data": "[1, 2]"},
            {"success": False, "failure_code": ""},
        ]
    )
    return encode_plain(SCHEMA, make_record(tx, "acct_p", **broken))


def rejection(decoder: Decoder, value: bytes) -> str | None:
    """The reason the bridge's decoder and mapping give for ``value``; None if it is good."""
    try:
        to_notification(decoder.decode(value), value)
    except RecordError as exc:
        return exc.reason
    return None


def test_poison_records_are_dead_lettered_between_good_ones(
    receiver: Receiver,
    bridge_setup: Setup,
    tmp_path: Path,
    seed: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = scenario_rng(seed, "poison")
    schemas = tmp_path / "schemas"  # the shipped schemas and a writer schema that cannot resolve
    schemas.mkdir()
    for path in (REPO / "schemas").glob("*.avsc"):
        shutil.copy(path, schemas)
    (schemas / "refund_outcome.avsc").write_text(json.dumps(REFUND_SCHEMA))
    decoder = Decoder.from_schema_dir(schemas, max_record_bytes=MAX_RECORD_BYTES)

    hooks = [webhook("hook", "acct_p", receiver.url("/hook"))]
    setup = bridge_setup(
        hooks,
        partitions=1,
        schemas={"directory": str(schemas), "max_record_bytes": MAX_RECORD_BYTES},
    )
    ledger = Ledger(hooks)
    good = stream_records(rng, 60 * SCALE, ["acct_p"])
    ledger.expect(good)
    items = encoded(good)
    for kind, reasons in POISON_REASONS.items():
        for index in range(3 * SCALE):
            value = poison_value(rng, kind, index)
            reason = rejection(decoder, value)
            assert reason in reasons, f"{kind} #{index}: the decoder says {reason}"
            ledger.expect_poison(value, reason)
            items.insert(rng.randrange(len(items) + 1), (None, value))

    malformed_retries = [  # records in a delay topic that the bridge did not write
        (b"retry without headers", None),
        (b"retry with a bad attempt", [("bridge-webhook", b"hook"), ("bridge-attempt", b"two")]),
    ]
    for value, _headers in malformed_retries:
        ledger.expect_poison(value, "malformed_retry_record")

    bridge = setup.start_bridge()
    produce_items(setup.bootstrap, setup.source, items)
    for value, headers in malformed_retries:
        produce(setup.bootstrap, setup.delay_topic(1), [value], headers=headers)
    verdict = settle(setup, ledger, lambda: receiver_requests(receiver))

    report(capsys, verdict.summary("poison", seed, faults=len(ledger.poison)))
    verdict.assert_exactly_once()
    assert len(verdict.poison_found) == len(ledger.poison)
    for letter in verdict.poison_found.values():
        assert letter.headers["bridge-source-topic"] in {setup.source, setup.delay_topic(1)}
        assert letter.headers["bridge-detail"], "a poison dead letter says what is wrong"
    assert alive(bridge), "the bridge never crashes on bad input"
    assert_no_traceback(bridge)


# ---- 6. configuration reloads under load ----------------------------------------------------


def invalid_variant(document: dict[str, Any], rng: random.Random, index: int, never: str) -> str:
    """An invalid configuration that, were it applied, would send deliveries to ``never``."""
    broken = json.loads(json.dumps(document))
    broken["webhooks"][0]["url"] = never
    kind = rng.choice(["unknown_key", "no_events", "duplicate_id", "bad_url", "yaml"])
    if kind == "unknown_key":
        broken[f"bogus_{index}"] = 1
    elif kind == "no_events":
        broken["webhooks"].append({**broken["webhooks"][0], "id": f"empty-{index}", "events": []})
    elif kind == "duplicate_id":
        broken["webhooks"].append({**broken["webhooks"][0], "account": f"acct_dup_{index}"})
    elif kind == "bad_url":
        broken["webhooks"].append({**broken["webhooks"][0], "id": f"x-{index}", "url": "ftp://x"})
    else:
        return yaml.safe_dump(broken, sort_keys=False) + f"\nwebhooks: [unclosed-{index}\n"
    return yaml.safe_dump(broken, sort_keys=False)


def rewrite(bridge: BridgeProcess, text: str) -> None:
    """Replace the running bridge's configuration file atomically (as a ConfigMap update does)."""
    temporary = bridge.own_config.with_suffix(".next")
    temporary.write_text(text)
    temporary.replace(bridge.own_config)


def reload(bridge: BridgeProcess, text: str, result: str, which: str) -> None:
    """Rewrite the configuration and wait until the bridge counts the reload as ``result``."""
    sample = f'result="{result}"'
    before = bridge.gauge("bridge_config_reloads_total", sample)
    rewrite(bridge, text)
    wait_for(
        lambda: bridge.gauge("bridge_config_reloads_total", sample) == before + 1,
        15,
        message=f"{which} to be counted as {result}",
    )


def probe(
    setup: BridgeSetup,
    receiver: Receiver,
    sent: tuple[dict[str, Any], Pair],
    path: str,
    after: str,
) -> None:
    """Produce a record with a single pair and wait until its delivery reaches ``path``."""
    record, pair = sent
    produce_items(setup.bootstrap, setup.source, encoded([record]))
    wait_for(
        lambda: any(r.message_id == pair.message_id for r in receiver.on(path)),
        15,
        message=f"a record produced after {after} to be delivered to {path}",
    )


def test_config_reloads_under_load_lose_nothing(
    receiver: Receiver, bridge_setup: Setup, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = scenario_rng(seed, "config")
    reloads = 3 * SCALE  # valid ones; as many invalid ones, alternating
    for path in ("/a", "/b"):
        receiver.behaviours[path] = fail_first(1, 503)
    hook = webhook("hook", "acct_1", receiver.url("/a"), concurrency=4)
    hooks = [hook, webhook("idle", "acct_idle", receiver.url("/idle"))]
    setup = bridge_setup(hooks, retry=QUICK_LADDER)
    records = stream_records(rng, 160 * SCALE, ["acct_1"])
    ledger = Ledger(hooks)
    ledger.expect(records)
    probe_records = [make_record(f"probe-{i}", "acct_1") for i in range(2 * reloads)]
    probes = list(zip(probe_records, ledger.expect(probe_records), strict=True))

    bridge = setup.start_bridge()
    stream = StreamProducer(setup.bootstrap, setup.source, encoded(records), 6.0 * reloads)
    stream.start()
    document = yaml.safe_load(bridge.own_config.read_text())
    current = "/a"
    for index in range(reloads):
        time.sleep(rng.uniform(0.5, 2.0))  # spaces the injected faults
        bad = invalid_variant(document, rng, index, receiver.url("/never"))
        reload(bridge, bad, "rejected", f"invalid reload {index}")
        probe(setup, receiver, probes[2 * index], current, f"invalid reload {index}")
        time.sleep(rng.uniform(0.5, 2.0))
        current = "/b" if current == "/a" else "/a"
        document["webhooks"][0].update(url=receiver.url(current), concurrency=rng.randint(1, 8))
        document["webhooks"][1:] = [
            webhook(f"idle-{i}", "acct_idle", receiver.url("/idle"))
            for i in range(rng.randint(0, 3))
        ]
        reload(bridge, yaml.safe_dump(document, sort_keys=False), "applied", f"reload {index}")
        probe(setup, receiver, probes[2 * index + 1], current, f"valid reload {index}")
    stream.hurry()
    stream.join()

    verdict = settle(setup, ledger, lambda: receiver_requests(receiver))
    report(capsys, verdict.summary("config-reload", seed, faults=2 * reloads))
    verdict.assert_exactly_once()
    assert receiver.on("/never") == [], "an invalid configuration never took effect"
    assert bridge.gauge("bridge_config_reloads_total", 'result="rejected"') == reloads
    assert alive(bridge)


# ---- 7. hostile receivers -------------------------------------------------------------------


@dataclass
class Exchange:
    """One request to the hostile server and how it went."""

    path: str
    message_id: str
    status: int
    opened: float
    closed: float = 0.0
    body_bytes_sent: int = 0


class HostileServer:
    """A raw HTTP/1.1 server on loopback whose answers try to exhaust or mislead the client.

    ``/huge``: 200 with a 50 MB body streamed as fast as the client reads (the status stands once
    the body passes the client's cap). ``/trickle``: 200, then a chunked body of one byte every
    50 ms that never ends (never a complete answer). ``/redirect-private``: 302 to the cloud
    metadata address. ``/redirect-here``: 302 to ``/stolen`` on this server. ``/huge-headers``:
    a 200 whose header line is 256 KB. ``/slow-headers``: a status line, then a header one byte
    every 50 ms, never finished. ``/not-http``: another protocol's greeting. ``/double``: two
    complete responses in one segment. ``/byte-by-byte``: a 200 written one byte at a time.
    ``/reset-mid-body``: a head promising 100 bytes, 10 of them, then a TCP reset.
    ``/bad-chunked``: a chunked 200 whose first chunk size is not hexadecimal.
    ``/framing-flood``: a chunked 200 whose first chunk's extension never ends, sent as fast as
    the client reads (bytes that are neither head nor body). A fourth port (:meth:`tickets_url`)
    is a TLS receiver with a certificate the webhook trusts (:attr:`ca_file`) that sends
    :attr:`TICKETS` session tickets after each handshake, then answers 204. A second port
    (:meth:`tls_url`) answers a TLS client hello with garbage. A third port (:meth:`stage_url`)
    answers every request with a 204 and keep-alive and, whenever a connection has been idle for
    20 ms, stages an unsolicited 204 on it: the client must close such a connection rather than
    take the staged bytes as the next answer (a request already on its way when the bytes are
    staged is the race no HTTP/1.1 client can close: the unit tests pin the client's check
    deterministically). It has a port of its own so that its keep-alive connections are not
    reused for the other paths. Each exchange records when the client let go.
    """

    HUGE = 50 * 1024 * 1024
    STAGED = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
    TICKETS = 2_000  # about 500 KB of records without data: twice the client's allowance

    def __init__(self) -> None:
        self.port = free_port()
        self.tls_port = free_port()
        self.stage_port = free_port()
        self.tickets_port = free_port()
        self.garbage_sent = 0
        self.ticket_handshakes = 0  # TLS connections that got their tickets
        import tempfile

        import trustme

        ca = trustme.CA()
        self.ca_file = str(Path(tempfile.mkdtemp(prefix="hostile-ca-")) / "ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        self._tickets_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(self._tickets_tls)
        self._tickets_tls.num_tickets = self.TICKETS
        self.exchanges: list[Exchange] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name="hostile-server", daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}/tls-garbage"

    def stage_url(self) -> str:
        return f"http://127.0.0.1:{self.stage_port}/stage"

    def tickets_url(self) -> str:
        return f"https://127.0.0.1:{self.tickets_port}/ticket-flood"

    def start(self) -> HostileServer:
        self._thread.start()
        assert self._ready.wait(10), "the hostile server did not start"
        return self

    def stop(self) -> None:
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    def _serve(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        garbage = await asyncio.start_server(self._tls_garbage, "127.0.0.1", self.tls_port)
        stage = await asyncio.start_server(self._stage, "127.0.0.1", self.stage_port)
        tickets = await asyncio.start_server(
            self._ticket_flood, "127.0.0.1", self.tickets_port, ssl=self._tickets_tls
        )
        self._ready.set()
        await self._stopping.wait()
        for each in (server, garbage, stage, tickets):
            each.close()

    async def _ticket_flood(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """The handshake sent :attr:`TICKETS` tickets; read the request, answer 204. The answer
        is no status the client may take: the tickets before it are past its allowance."""
        self.ticket_handshakes += 1
        exchange = None
        try:
            path, headers = await self._head(reader)
            exchange = Exchange(path, headers.get("webhook-id", ""), 0, time.time())
            self.exchanges.append(exchange)
            writer.write(self.STAGED)
            await writer.drain()
            await asyncio.wait_for(_until_closed(reader), 10)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, IndexError, ssl.SSLError):
            pass
        finally:
            if exchange is not None:
                exchange.closed = exchange.closed or time.time()
            writer.close()

    async def _tls_garbage(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read the client hello, answer with bytes that are no TLS record, then close."""
        try:
            await reader.read(4096)
            writer.write(b"\x17\x03\x03\xff\xff" + bytes(range(256)) * 8)
            await writer.drain()
            self.garbage_sent += 1
            await asyncio.wait_for(_until_closed(reader), 10)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _head(self, reader: asyncio.StreamReader) -> tuple[str, dict[str, str]]:
        """Read one request (head and body): its path and headers."""
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        lines = head.split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:] if line)
        }
        await reader.readexactly(int(headers.get("content-length", "0")))
        return path, headers

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened = time.time()
        try:
            path, headers = await self._head(reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, IndexError):
            writer.close()
            return
        exchange = Exchange(path, headers.get("webhook-id", ""), 200, opened)
        self.exchanges.append(exchange)
        let_go = asyncio.ensure_future(_until_closed(reader))
        try:
            if path == "/double":
                exchange.status = 0  # no answer the client may take
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
                    b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
                )
                await writer.drain()
            elif path == "/byte-by-byte":
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok":
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.005)
                exchange.closed = time.time()  # answered; the client may keep the connection
            elif path == "/reset-mid-body":
                exchange.status = 0
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
                await writer.drain()
                await asyncio.sleep(0.05)
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            elif path == "/bad-chunked":
                exchange.status = 0
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
                await writer.drain()
            elif path == "/huge":
                await self._huge(writer, let_go, exchange)
            elif path == "/trickle":
                exchange.status = 0  # a body that never ends: no complete answer to take
                await self._trickle(writer, let_go)
            elif path == "/framing-flood":
                exchange.status = 0  # never a body byte: no answer the client may take
                await self._framing_flood(writer, let_go, exchange)
            elif path.startswith("/redirect"):
                exchange.status = 302
                location = "http://169.254.169.254/latest/meta-data/"
                if path == "/redirect-here":
                    location = self.url("/stolen")
                writer.write(
                    b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n" % location.encode()
                )
                await writer.drain()
            elif path == "/huge-headers":
                exchange.status = 0  # no answer the client can read
                writer.write(b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * 262_144 + b"\r\n")
                writer.write(b"Content-Length: 0\r\n\r\n")
                await writer.drain()
            elif path == "/slow-headers":
                exchange.status = 0
                writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not let_go.done():
                    writer.write(b"a")
                    await writer.drain()
                    await asyncio.wait([let_go], timeout=0.05)
            elif path == "/not-http":
                exchange.status = 0
                writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
                await writer.drain()
            else:
                exchange.status = 404
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await asyncio.wait_for(let_go, 60)
        except (OSError, TimeoutError):
            pass
        finally:
            exchange.closed = exchange.closed or time.time()
            let_go.cancel()
            writer.close()

    async def _huge(
        self, writer: asyncio.StreamWriter, let_go: asyncio.Future[None], exchange: Exchange
    ) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.HUGE)
        await self._stream(writer, let_go, exchange, b"\0" * 65_536)

    async def _framing_flood(
        self, writer: asyncio.StreamWriter, let_go: asyncio.Future[None], exchange: Exchange
    ) -> None:
        """A chunked 200 whose chunk extension never ends, as fast as the client takes it."""
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5")
        await self._stream(writer, let_go, exchange, b";x" * 32_768)

    async def _stream(
        self,
        writer: asyncio.StreamWriter,
        let_go: asyncio.Future[None],
        exchange: Exchange,
        chunk: bytes,
    ) -> None:
        """Write ``chunk`` again and again as fast as the client reads, up to :attr:`HUGE`
        bytes, until it lets go."""
        while exchange.body_bytes_sent < self.HUGE and not let_go.done():
            writer.write(chunk)
            drained = asyncio.ensure_future(writer.drain())
            await asyncio.wait([drained, let_go], return_when=asyncio.FIRST_COMPLETED)
            if not drained.done():
                drained.cancel()
                return
            if drained.exception() is not None:
                return
            exchange.body_bytes_sent += len(chunk)

    async def _trickle(self, writer: asyncio.StreamWriter, let_go: asyncio.Future[None]) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not let_go.done():
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.wait([let_go], timeout=0.05)

    async def _stage(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A 204 with keep-alive to every request; an unsolicited 204 on an idle connection."""
        staged = False
        try:
            while True:
                try:
                    path, headers = await asyncio.wait_for(self._head(reader), 0.02)
                except TimeoutError:
                    if not staged:
                        writer.write(self.STAGED)  # nobody asked for this one
                        await writer.drain()
                        staged = True
                    continue
                exchange = Exchange(path, headers.get("webhook-id", ""), 204, time.time())
                self.exchanges.append(exchange)
                writer.write(self.STAGED)
                await writer.drain()
                exchange.closed = time.time()
                staged = False
        except (OSError, asyncio.IncompleteReadError, IndexError):
            pass
        finally:
            writer.close()

    def requests(self) -> list[Request]:
        return [Request(e.message_id, e.status, e.opened) for e in list(self.exchanges)]


async def _until_closed(reader: asyncio.StreamReader) -> None:
    """Return when the client closes its side of the connection."""
    try:
        while await reader.read(65_536):
            pass
    except OSError:
        pass


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    server = HostileServer().start()
    try:
        yield server
    finally:
        server.stop()


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_hostile_receivers_cost_bounded_memory_and_time(
    hostile: HostileServer,
    receiver: Receiver,
    bridge_setup: Setup,
    seed: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every hostile answer ends its attempt in time and as what it is; healthy webhooks of the
    same account (so on the same records and partitions) and of another account get everything
    at once; every pair ends received or dead-lettered and every offset is committed."""
    rng = scenario_rng(seed, "hostile")
    timeout = 1.0
    outcomes = {  # path -> (received, last status, accepted last error prefixes)
        "/huge": (True, "", ()),
        "/byte-by-byte": (True, "", ()),
        "/stage": (True, "", ()),
        "/trickle": (False, "", ("timeout",)),
        "/redirect-private": (False, "302", ("HTTP 302",)),
        "/redirect-here": (False, "302", ("HTTP 302",)),
        "/huge-headers": (False, "", ("invalid_response",)),
        "/slow-headers": (False, "", ("timeout",)),
        "/not-http": (False, "", ("invalid_response",)),
        "/double": (False, "", ("invalid_response",)),
        "/reset-mid-body": (False, "", ("connection_error", "invalid_response")),
        "/bad-chunked": (False, "", ("invalid_response",)),
        "/framing-flood": (False, "", ("invalid_response",)),
        "/tls-garbage": (False, "", ("tls_error", "connection_error")),
        "/ticket-flood": (False, "", ("tls_error",)),
    }
    urls = {path: hostile.url(path) for path in outcomes} | {
        "/tls-garbage": hostile.tls_url(),
        "/stage": hostile.stage_url(),
        "/ticket-flood": hostile.tickets_url(),
    }
    trusting = {"/ticket-flood": {"tls_ca_file": hostile.ca_file}}
    hooks = [
        webhook(path.strip("/"), "acct_h", url, **trusting.get(path, {}))
        for path, url in urls.items()
    ]
    healthy = [
        webhook("healthy-same-account", "acct_h", receiver.url("/same")),
        webhook("healthy-other-account", "acct_ok", receiver.url("/other")),
    ]
    setup = bridge_setup(
        hooks + healthy,
        retry={"attempts": 1, "first_delay_ms": 100, "increment_ms": 100},
        delivery={"timeout_seconds": timeout},
    )
    records = stream_records(rng, 12 * SCALE, ["acct_h", "acct_ok"])
    ledger = Ledger(hooks + healthy)
    pairs = ledger.expect(records)

    bridge = setup.start_bridge()
    assert bridge.process is not None
    produced = time.time()
    produce_items(setup.bootstrap, setup.source, encoded(records))
    verdict = settle(setup, ledger, lambda: hostile.requests() + receiver_requests(receiver))

    peak = peak_rss_mb(bridge.process.pid)
    exchanges = list(hostile.exchanges)
    slowest = max(e.closed - e.opened for e in exchanges)
    most_read = max(e.body_bytes_sent for e in exchanges)
    healthy_lag = max(r.at for r in receiver.requests) - produced
    report(
        capsys,
        verdict.summary(
            "hostile",
            seed,
            faults=len(exchanges) + hostile.garbage_sent,
            peak_rss_mb=round(peak),
            slowest_s=round(slowest, 2),
            max_body_sent_mb=round(most_read / 2**20, 1),
            healthy_last_s=round(healthy_lag, 2),
        ),
    )
    owners = {pair.message_id: pair.webhook_id for pair in pairs}
    # The one duplicate allowed: a request that reaches /stage just as it stages its unsolicited
    # 204 gets its real answer in the same segment, so the client refuses that exchange and
    # tries again (same webhook-id): the race no HTTP/1.1 client can close (see the class).
    assert {owners[m] for m in verdict.duplicated_pairs} <= {"stage"}, verdict.duplicated_pairs
    verdict.assert_sound()
    wrong = []
    for pair in pairs:
        if pair.webhook_id.startswith("healthy"):
            if pair.message_id not in verdict.received:
                wrong.append(f"{pair.webhook_id}: not received")
            continue
        received, status, errors = outcomes["/" + pair.webhook_id]
        if received != (pair.message_id in verdict.received):
            wrong.append(f"{pair.webhook_id}: received={not received}")
        if not received:
            headers = verdict.dead[pair.message_id][0].headers
            if headers["bridge-last-status"] != status or not headers[
                "bridge-last-error"
            ].startswith(errors):
                wrong.append(
                    f"{pair.webhook_id}: {headers['bridge-last-status']!r} "
                    f"{headers['bridge-last-error']!r}"
                )
    assert wrong == [], "\n".join(sorted(set(wrong)))
    assert not [e for e in exchanges if e.path == "/stolen"], "a redirect was followed"
    assert hostile.garbage_sent > 0, "the TLS receiver was never reached"
    assert hostile.ticket_handshakes > 0, "the ticket-flooding receiver was never reached"
    assert slowest <= timeout + 1.0, f"a request held the bridge {slowest:.1f}s"
    assert healthy_lag < 5.0, f"healthy webhooks waited {healthy_lag:.1f}s behind hostile ones"
    assert most_read < HostileServer.HUGE / 4, f"{most_read} bytes of a huge body were read"
    assert peak < 200, f"the bridge's peak memory was {peak:.0f} MB"
    assert bridge.gauge("bridge_delivery_errors_total") == 0, "the engine's guard had to step in"
    assert_no_traceback(bridge)
    assert alive(bridge)
