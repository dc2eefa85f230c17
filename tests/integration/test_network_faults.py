"""Network faults between the bridge and the broker, and on the path to the receivers.

Everything runs in a network namespace this module creates (``tests/netns.py``): its own broker,
the bridge processes, the receivers and the test's own Kafka clients, all on the namespace's
loopback. The faults are nftables rules in that namespace: a silent cut of the broker port (every
segment dropped both ways, no reset: a partition as both ends see it), random loss on a receiver's
port, and a proxy adding latency in front of a receiver (this kernel has no ``sch_netem``).

- Shutdown while the broker is cut off (issue 22): SIGTERM ends the bridge within the grace
  period, with ``bridge.stopped`` saying what is left for redelivery, every log line JSON.
- A cut longer than the group's session timeout, then restored (issue 20), while records flow to
  a healthy and a failing-then-succeeding webhook (retries through the delay topics).
- Latency and loss on the receiver path (issue 20), with retries checked against the ladder at
  the proxy: no retry is ever sent before its delay has passed.

The last two lay what the receivers saw and the dead-letter topic against a ledger
(``tests/ledger.py``) and print a ``[fault-ledger]`` line. ``BRIDGE_FAULT_SEED`` replays a run.
Needs root and nftables; ``deploy/kafka/ensure-net-tools.sh`` installs the tools, and the tests
fail (never skip) when they cannot be had.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bridge.app import Reachability
from bridge.ops.metrics import RX_IDLE_LIMIT_US
from devtools.devkafka import Broker
from devtools.samples import make_record
from tests.bridge_harness import BridgeSetup, setups, webhook
from tests.integration.test_faults import (
    COMMIT_WINDOW_S,
    FAST_FAILOVER,
    alive,
    assert_no_traceback,
    report,
    settle,
    stream_records,
)
from tests.integration.test_operations import assert_every_line_is_json
from tests.kafka_helpers import wait_for
from tests.ledger import (
    Ledger,
    StreamProducer,
    encoded,
    fault_seed,
    longest_redo_lag,
    produce_items,
    receiver_requests,
    scenario_rng,
    timeline,
    unexplained_duplicates,
)
from tests.netns import DelayProxy, Namespace, network_namespace
from tests.receiver import Answer, Receiver, fail_first, warmed_then

pytestmark = pytest.mark.integration

Setup = Callable[..., BridgeSetup]
SESSION_TIMEOUT_S = FAST_FAILOVER["properties"]["session.timeout.ms"] / 1000
"""The bridge's ``session.timeout.ms`` here: 6 s, the broker's minimum (the default is 45 s)."""


@pytest.fixture(scope="module")
def seed() -> int:
    """The seed of this run's random choices (``BRIDGE_FAULT_SEED`` or the clock)."""
    return fault_seed()


@pytest.fixture(scope="module")
def net() -> Iterator[Namespace]:
    """This module's network namespace, deleted at the end whatever happens."""
    with network_namespace() as namespace:
        yield namespace


@pytest.fixture(scope="module")
def broker_in_net(net: Namespace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of this module's own inside the namespace; its bootstrap address there."""
    broker = Broker(tmp_path_factory.mktemp("netns-broker"))
    try:
        with net.entered():  # its JVM, ports and readiness check: all inside
            bootstrap = broker.start()
        yield bootstrap
    finally:
        broker.stop()  # signals only: no need to be inside


@pytest.fixture
def inside(net: Namespace, broker_in_net: str) -> Iterator[Namespace]:
    """The test runs inside the namespace: what it creates (sockets, receivers, Kafka clients,
    bridge processes) lives there. The other fixtures here depend on it: it is left last."""
    with net.entered():
        yield net


@pytest.fixture
def receiver(inside: Namespace) -> Iterator[Receiver]:
    """A webhook receiver on the namespace's 127.0.0.1."""
    server = Receiver().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bridge_setup(inside: Namespace, broker_in_net: str, tmp_path: Path) -> Iterator[Setup]:
    """Make a set-up (own topics, group, config) on the namespace's broker; its bridges are
    stopped at the end."""
    yield from setups(broker_in_net, tmp_path)


BOILERPLATE = ("ts", "level", "logger", "event")
"""Fields of every log line."""


def broker_port(setup: BridgeSetup) -> int:
    return int(setup.bootstrap.rsplit(":", 1)[1])


def assert_silently_cut(port: int) -> None:
    """A new connection to ``port`` gets no answer at all (no refusal, no reset)."""
    with pytest.raises(TimeoutError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()


# ---- 1. shutdown while cut off (issue 22) ---------------------------------------------------


def test_shutdown_ends_within_the_grace_period_while_the_broker_is_cut_off(
    inside: Namespace,
    receiver: Receiver,
    bridge_setup: Setup,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With deliveries in flight to a slow receiver and every segment to and from the broker
    dropped, SIGTERM still ends the bridge within shutdown_grace_seconds: what could not be
    settled is left for redelivery, bridge.stopped says so, the exit code is 0 and every line
    the bridge wrote is JSON (the existing stopped/frozen test, with a network cut)."""
    grace = 3.0
    receiver.behaviours["/slow"] = warmed_then(Answer(200, delay=30))
    setup = bridge_setup(
        [webhook("slow", "acct_1", receiver.url("/slow"))],
        delivery={"timeout_seconds": 20.0, "shutdown_grace_seconds": grace},
    )
    bridge = setup.start_bridge()
    setup.produce_records([make_record("tx-cut-warm", "acct_1")])  # answered: 3 at once next
    wait_for(lambda: len(receiver.on("/slow")) == 1, 30, message="the warm-up delivery")
    setup.produce_records([make_record(f"tx-cut-{i}", "acct_1") for i in range(3)])
    wait_for(lambda: len(receiver.on("/slow")) == 4, 30, message="deliveries in flight")

    with inside.cut(broker_port(setup)) as cut:
        # Only the bridge talks to the broker now: what the rules drop is its traffic.
        wait_for(lambda: cut.dropped() > 0, 10, message="the bridge's traffic to be dropped")
        assert_silently_cut(broker_port(setup))
        started = time.monotonic()
        code = bridge.terminate(timeout=grace + 15)
        took = time.monotonic() - started
        dropped = cut.dropped()
    stopped = [json.loads(line) for line in bridge.log_lines() if '"bridge.stopped"' in line]
    fields = {key: value for key, value in (stopped or [{}])[0].items() if key not in BOILERPLATE}
    report(
        capsys,
        f"[network-fault] shutdown-cut-off: grace_s={grace} stopped_in_s={took:.2f} "
        f"dropped={dropped} " + " ".join(f"{key}={value}" for key, value in fields.items()),
    )
    assert code == 0, bridge.log_tail()
    assert took < grace + 2.0, f"the bridge took {took:.1f}s to stop (grace {grace}s)"
    assert len(stopped) == 1, bridge.log_tail()
    assert stopped[0]["deliveries_left_for_redelivery"] == 3
    assert stopped[0]["left_group"] is False, "nobody could have heard it leave"
    assert_every_line_is_json(bridge.log_lines(), most=60)


# ---- 2. a cut longer than the session timeout (issue 20) ------------------------------------


def test_cut_longer_than_the_session_timeout_then_restored_loses_nothing(
    inside: Namespace,
    receiver: Receiver,
    bridge_setup: Setup,
    seed: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Records flow to a healthy webhook and to one that fails each first request (retried
    through the delay topics) while the bridge is cut from the broker for longer than its
    session timeout: the group drops it and it drops its partitions. Once the network is back it
    rejoins, and every pair ends received or dead-lettered, duplicates only of work in flight at
    the cut (same webhook-id), nothing lost, without restarting the bridge."""
    rng = scenario_rng(seed, "network-cut")
    cut_for = rng.uniform(SESSION_TIMEOUT_S + 3.0, SESSION_TIMEOUT_S + 8.0)
    receiver.behaviours["/steady"] = lambda _seen: Answer(200, delay=0.02)
    receiver.behaviours["/flaky"] = fail_first(1, 503)
    hooks = [
        webhook("steady", "acct_a", receiver.url("/steady"), concurrency=4),
        webhook("flaky", "acct_a", receiver.url("/flaky"), concurrency=4),
        webhook("failures", "acct_b", receiver.url("/flaky"), events=["transaction.failed"]),
    ]
    setup = bridge_setup(
        hooks,
        retry={"attempts": 5, "first_delay_ms": 200, "increment_ms": 200},
        kafka=FAST_FAILOVER,
    )
    records = stream_records(rng, 200, ["acct_a", "acct_b", "acct_nobody"])
    ledger = Ledger(hooks)
    ledger.expect(records)
    port = broker_port(setup)

    bridge = setup.start_bridge()
    stream = StreamProducer(setup.bootstrap, setup.source, encoded(records), cut_for + 16.0)
    stream.start()
    wait_for(lambda: len(receiver.on("/steady")) >= 20, 30, message="records to be flowing")
    before = len(bridge.log_lines())

    with inside.cut(port) as cut:
        assert_silently_cut(port)
        cut_at = time.monotonic()
        wait_for(
            lambda: any('"partitions.lost"' in line for line in bridge.log_lines()[before:]),
            SESSION_TIMEOUT_S + 15.0,
            message="the bridge to drop its partitions (session timeout)",
        )
        lost_after = time.monotonic() - cut_at
        unready = []

        def cut_long_enough() -> bool:
            """Samples /readyz; the cut lasts ``cut_for``, and until readiness has said it."""
            unready.append(bridge.http("/readyz")[0] == 503)
            return time.monotonic() - cut_at >= cut_for and any(unready)

        # A silent cut shows in readiness once no broker has been heard from for
        # RX_IDLE_LIMIT_US, read from statistics every 5 s, and then for readiness's grace.
        unready_within = RX_IDLE_LIMIT_US / 1e6 + 5.0 + Reachability.SILENCE_S + 5.0
        wait_for(
            cut_long_enough,
            max(cut_for, unready_within) + 5.0,
            interval=0.5,
            message="the end of the cut, /readyz 503 during it",
        )
        cut_for = time.monotonic() - cut_at
    restored_at = time.monotonic()
    faults = [cut.applied_at or 0.0, cut.removed_at or 0.0]
    wait_for(
        lambda: bridge.gauge("bridge_assigned_partitions") > 0,
        90,
        message="the bridge to rejoin the group after the cut",
    )
    recovered_after = time.monotonic() - restored_at
    stream.join()

    verdict = settle(setup, ledger, lambda: receiver_requests(receiver), timeout=150)
    requests = receiver_requests(receiver)
    produced = ledger.produced_at(stream.produced_at)
    # Work in flight at the cut may be redone after it: what was received and not yet
    # committed before the cut, and what was received during it (nothing commits then).
    window = COMMIT_WINDOW_S + cut_for
    unexplained = unexplained_duplicates(requests, faults, produced, window)
    report(
        capsys,
        verdict.summary(
            "network-cut",
            seed,
            faults=1,
            cut_s=round(cut_for, 1),
            session_timeout_s=SESSION_TIMEOUT_S,
            lost_after_s=round(lost_after, 1),
            rejoined_after_s=round(recovered_after, 1),
            unready_after_s=round(unready.index(True) * 0.5, 1),
            dropped=cut.dropped(),
            unexplained=len(unexplained),
            redo_lag_s=round(longest_redo_lag(requests, faults, produced), 2),
        ),
    )
    verdict.assert_sound()
    assert not verdict.dead, "every webhook answers 200 by its second try: nothing is dead"
    assert unexplained == [], "duplicates not explained by the cut:\n" + timeline(
        requests, unexplained[:5], faults, produced
    )
    assert alive(bridge), "the bridge survives the cut without being restarted"
    assert_no_traceback(bridge)
    assert_every_line_is_json(bridge.log_lines(), most=400)


# ---- 3. latency and loss on the receiver path (issue 20) ------------------------------------

DELAY_S = 0.2
"""The proxy holds every chunk this long in each direction."""
LOSS_PERCENT = 20
"""Segments dropped at random on the receiver's port, each direction."""
LADDER = {"attempts": 5, "first_delay_ms": 1000, "increment_ms": 500, "park_delay_ms": 2000}
EARLY_SLACK_S = 0.05
"""How much earlier than its ladder delay a retry may be seen at the proxy (clock and loop)."""


class SentRequests:
    """Each request as the bridge sent it: its webhook-id and when its head reached the proxy
    (the bridge-to-proxy hop has neither loss nor delay, so that is when it was sent)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []
        self._buffers: dict[int, bytes] = {}

    def feed(self, connection: int, data: bytes, at: float) -> None:
        """The proxy's observer: parse the requests of each connection as bytes arrive."""
        buffer = self._buffers.get(connection, b"") + data
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            headers = {}
            for line in buffer[:end].decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            if len(buffer) < end + 4 + length:
                break
            self.sent.append((headers.get("webhook-id", ""), at))
            buffer = buffer[end + 4 + length :]
        self._buffers[connection] = buffer

    def early_retries(self, first_delay_ms: int, increment_ms: int) -> list[str]:
        """Retries sent before the ladder allowed: request ``n + 1`` of a pair came less than
        ``first_delay_ms + n * increment_ms`` after request ``n`` (each retry waits that long
        after the previous attempt failed, so after it was sent; a park adds to the wait without
        using an attempt, so requests and attempts stay one for one)."""
        times: dict[str, list[float]] = {}
        for message_id, at in list(self.sent):
            times.setdefault(message_id, []).append(at)
        early = []
        for message_id, seen in times.items():
            for n, (earlier, later) in enumerate(itertools.pairwise(sorted(seen))):
                due = (first_delay_ms + n * increment_ms) / 1000
                if later - earlier < due - EARLY_SLACK_S:
                    early.append(f"{message_id}: retry {n + 1} after {later - earlier:.3f}s")
        return early


def test_latency_and_loss_on_the_receiver_path_lose_nothing(
    inside: Namespace,
    receiver: Receiver,
    bridge_setup: Setup,
    seed: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The receivers sit behind a proxy adding 200 ms each way, and a fifth of the segments on
    the receiver's port are dropped: attempts are slow, some time out and are retried (a 2xx
    whose answer came too late is delivered again, with the same webhook-id). Every pair ends
    received or dead-lettered, and no retry is ever sent before its ladder delay."""
    rng = scenario_rng(seed, "receiver-path")
    receiver.behaviours["/flaky"] = fail_first(1, 503)
    sent = SentRequests()
    with DelayProxy(receiver.port, DELAY_S, observe=sent.feed) as proxy:
        hooks = [
            webhook("steady", "acct_a", f"http://127.0.0.1:{proxy.port}/steady", concurrency=8),
            webhook("flaky", "acct_a", f"http://127.0.0.1:{proxy.port}/flaky", concurrency=8),
        ]
        setup = bridge_setup(hooks, retry=LADDER)
        records = stream_records(rng, 60, ["acct_a"])
        ledger = Ledger(hooks)
        ledger.expect(records)
        with inside.loss(receiver.port, LOSS_PERCENT) as loss:
            bridge = setup.start_bridge()
            started = time.monotonic()
            produce_items(setup.bootstrap, setup.source, encoded(records))
            verdict = settle(setup, ledger, lambda: receiver_requests(receiver), timeout=150)
            took = time.monotonic() - started
            dropped = loss.dropped()
        connections = proxy.connections
    early = sent.early_retries(LADDER["first_delay_ms"], LADDER["increment_ms"])
    requests = receiver_requests(receiver)
    report(
        capsys,
        verdict.summary(
            "receiver-path",
            seed,
            faults=dropped,
            delay_ms=round(DELAY_S * 1000),
            loss_pct=LOSS_PERCENT,
            sent=len(sent.sent),
            seen_by_receiver=len(requests),
            connections=connections,
            early_retries=len(early),
            settled_s=round(took, 1),
        ),
    )
    verdict.assert_sound()
    assert dropped > 0, "the loss rule dropped nothing"
    assert len(sent.sent) >= len(requests), "the receiver saw requests the proxy did not"
    assert early == [], f"retries sent before their delay: {early[:5]}"
    assert alive(bridge)
    assert_no_traceback(bridge)
