"""The delivery engine against the real broker and a real HTTP receiver."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme
from confluent_kafka import Producer

from bridge.core.envelope import header_map
from bridge.core.mapping import EVENTS
from bridge.core.signing import message_id
from bridge.engine.budget import UNANSWERED_BURST, UNANSWERED_PER_S
from devtools.samples import encode_records, make_record
from tests.bridge_harness import SCHEMA, BridgeSetup, secret_of, webhook
from tests.kafka_helpers import QUIET, committed_offsets, consume, wait_for
from tests.ledger import DeadLetterReader
from tests.receiver import Answer, Receiver, always, fail_first

pytestmark = pytest.mark.integration

Setup = Callable[..., BridgeSetup]


def test_delivers_signed_notifications_only_for_chosen_events(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    setup = bridge_setup(
        [
            webhook("all", "acct_1", receiver.url("/all")),
            webhook(
                "failed-only", "acct_1", receiver.url("/failed"), events=["transaction.failed"]
            ),
            webhook("other", "acct_2", receiver.url("/other")),
        ]
    )
    bridge = setup.start_bridge()
    setup.produce_records(
        [
            make_record("tx-ok", "acct_1", success=True),
            make_record("tx-ko", "acct_1", success=False),
        ]
    )

    wait_for(
        lambda: len(receiver.on("/all")) == 2 and len(receiver.on("/failed")) == 1,
        30,
        message="deliveries to /all and /failed",
    )
    failed_only = receiver.on("/failed")[0]
    assert json.loads(failed_only.body)["event"] == "transaction.failed"
    assert receiver.on("/other") == []
    for request in receiver.on("/all"):
        secret = secret_of("all").encode()
        expected = hmac.new(secret, request.body, hashlib.sha256).hexdigest()
        assert request.headers["x-service-secret"] == expected
        assert request.headers["content-type"] == "application/json"
        assert request.headers["user-agent"].startswith("transaction-webhook-bridge/")
        assert request.headers["webhook-id"].startswith("msg_")
        assert request.headers["webhook-signature"].startswith("v1,")
    assert bridge.terminate() == 0


@pytest.mark.parametrize("status", [500, 404, 302, 301])
def test_non_2xx_is_retried_until_received(
    receiver: Receiver, bridge_setup: Setup, status: int
) -> None:
    receiver.behaviours["/flaky"] = lambda seen: (
        Answer(status, headers={"Location": receiver.url("/elsewhere")})
        if seen < 2
        else Answer(200)
    )
    setup = bridge_setup([webhook("flaky", "acct_1", receiver.url("/flaky"))])
    setup.start_bridge()
    setup.produce_records([make_record("tx-1", "acct_1")])

    wait_for(lambda: receiver.received_ids("/flaky"), 30, message="the third attempt")
    attempts = receiver.on("/flaky")
    assert [r.status for r in attempts] == [status, status, 200]
    assert len({r.message_id for r in attempts}) == 1, "webhook-id is stable across retries"
    assert receiver.on("/elsewhere") == [], "redirects are never followed"
    gaps = [b.at - a.at for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0, f"retries sent before due: {gaps}"
    assert gaps[0] < 2.5 and gaps[1] < 3.0, f"retries much later than due: {gaps}"


def test_exhausted_ladder_dead_letters_with_headers(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    receiver.behaviours["/down"] = always(503)
    setup = bridge_setup(
        [webhook("down", "acct_1", receiver.url("/down"))],
        retry={"attempts": 3, "first_delay_ms": 200, "increment_ms": 100},
    )
    setup.start_bridge()
    setup.produce_records([make_record("tx-dead", "acct_1")])

    letters = setup.dead_letters(1, timeout=30)
    headers = header_map(letters[0].headers())
    assert len(receiver.on("/down")) == 4  # attempt 0 and three retries
    assert headers["bridge-reason"] == "retries_exhausted"
    assert headers["bridge-webhook"] == "down"
    assert headers["bridge-attempts"] == "4"
    assert headers["bridge-last-status"] == "503"
    assert headers["bridge-source-topic"] == setup.source
    assert headers["bridge-source-offset"] == "0"
    assert json.loads(letters[0].value())["transactionId"] == "tx-dead"
    assert "secret" not in json.dumps(headers)


def test_fan_out_retries_independently(receiver: Receiver, bridge_setup: Setup) -> None:
    receiver.behaviours["/flaky"] = fail_first(1)
    setup = bridge_setup(
        [
            webhook("healthy", "acct_1", receiver.url("/healthy")),
            webhook("flaky", "acct_1", receiver.url("/flaky")),
        ]
    )
    setup.start_bridge()
    setup.produce_records([make_record("tx-fan", "acct_1")])

    wait_for(lambda: receiver.received_ids("/flaky"), 30, message="the flaky webhook's retry")
    assert len(receiver.on("/healthy")) == 1, "the healthy webhook is not called again"
    assert len(receiver.on("/flaky")) == 2
    assert receiver.on("/healthy")[0].message_id != receiver.on("/flaky")[0].message_id


def test_poison_records_are_dead_lettered_between_good_ones(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    setup = bridge_setup([webhook("hook", "acct_1", receiver.url("/hook"))], partitions=1)
    bridge = setup.start_bridge()
    setup.produce_records([make_record("tx-before", "acct_1")])
    setup.produce_raw([b"\x02garbage", b""])
    setup.produce_records([make_record("tx-after", "acct_1")])

    letters = setup.dead_letters(2)
    wait_for(lambda: len(receiver.on("/hook")) == 2, 30, message="both good records")
    by_value = {m.value() or b"": header_map(m.headers()) for m in letters}
    assert set(by_value) == {b"\x02garbage", b""}
    assert all(h["bridge-kind"] == "poison" for h in by_value.values())
    assert by_value[b""]["bridge-reason"] == "truncated"
    assert by_value[b"\x02garbage"]["bridge-reason"] in {"truncated", "corrupt", "trailing_bytes"}
    assert by_value[b"\x02garbage"]["bridge-detail"]
    assert bridge.process is not None and bridge.process.poll() is None, "the bridge never crashes"


def test_records_too_large_for_the_bridge_topics_are_dead_lettered_without_their_value(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    """An upstream may write records the bridge's own producer cannot (over its 1,000,000-byte
    ``message.max.bytes``, under the broker's 1 MiB and the bridge's ``max_record_bytes``).
    Such a write was tried again for ever: the record never finished and its partition's commit
    stood still for good. Now a delivery too large to wait on a rung is dead-lettered at once
    (``too_large``) and a dead letter too large to keep its value is written without it; the
    record after them is delivered and the commit reaches the end."""
    receiver.behaviours["/hook"] = fail_first(1)
    setup = bridge_setup([webhook("hook", "acct_1", receiver.url("/hook"))], partitions=1)
    bridge = setup.start_bridge()
    large = make_record("tx-large", "acct_1", label="x" * 1_005_000)
    poison = b"\x02" + b"\xff" * 1_005_000
    upstream = Producer(
        {"bootstrap.servers": setup.bootstrap, "message.max.bytes": 2_000_000, **QUIET}
    )
    for value in [*encode_records(SCHEMA, [large]), poison]:
        upstream.produce(setup.source, value=value)
    assert upstream.flush(30) == 0
    setup.produce_records([make_record("tx-after", "acct_1")])

    letters = {header_map(m.headers())["bridge-source-offset"]: m for m in setup.dead_letters(2)}
    wait_for(lambda: receiver.received_ids("/hook"), 30, message="the record after them")
    assert sorted(letters) == ["0", "1"]
    delivery, record = (header_map(letters[offset].headers()) for offset in ("0", "1"))
    assert (delivery["bridge-kind"], delivery["bridge-reason"]) == ("delivery", "too_large")
    assert int(delivery["bridge-value-dropped-bytes"]) > 1_005_000
    assert record["bridge-kind"] == "poison"
    assert record["bridge-value-dropped-bytes"] == str(len(poison))
    assert all(letter.value() is None for letter in letters.values())
    large_ids = {message_id("tx-large", event, "hook") for event in EVENTS}
    tried = [r.status for r in receiver.on("/hook") if r.message_id in large_ids]
    assert tried == [500], "the large one: one attempt, not retried"
    wait_for(
        lambda: committed_offsets(setup.bootstrap, setup.group, setup.source) == [3],
        30,
        message="the commit past both",
    )
    assert bridge.process is not None and bridge.process.poll() is None


def test_hung_endpoint_does_not_delay_a_healthy_one(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    receiver.behaviours["/hung"] = lambda _seen: Answer(hang=True)
    setup = bridge_setup(
        [
            webhook("hung", "acct_hung", receiver.url("/hung"), concurrency=2),
            webhook("healthy", "acct_ok", receiver.url("/healthy")),
        ],
        delivery={"timeout_seconds": 5.0},
    )
    setup.start_bridge()
    setup.produce_records([make_record(f"tx-h{i}", "acct_hung") for i in range(10)])
    setup.produce_records([make_record(f"tx-ok{i}", "acct_ok") for i in range(10)])

    wait_for(
        lambda: len(receiver.received_ids("/healthy")) == 10,
        4.0,
        message="all healthy deliveries while the other endpoint hangs",
    )


def _most_at_once(arrivals: list[float], hold: float) -> int:
    """The most requests that arrived within ``hold`` seconds of one another."""
    return max(sum(1 for other in arrivals if at - hold < other <= at) for at in arrivals)


def test_a_webhook_that_does_not_answer_gets_one_attempt_until_it_is_judged_stalled(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    """A new webhook that never answers (each request hangs until the 1 s timeout) with a
    concurrency of 8 is sent one request, not 8, before its first attempt ends; judged stalled
    then, its deliveries back from the parking topic are each tried while a slot is free (so
    each gets its attempts), never more than its concurrency at once. A slow webhook that
    answers runs at its whole concurrency of 4 once its first answer came."""
    timeout, hold = 1.0, 0.3
    receiver.behaviours["/silent"] = lambda _seen: Answer(hang=True)
    receiver.behaviours["/slow"] = lambda _seen: Answer(200, delay=hold)
    setup = bridge_setup(
        [
            webhook("silent", "acct_silent", receiver.url("/silent"), concurrency=8),
            webhook("slow", "acct_slow", receiver.url("/slow"), concurrency=4),
        ],
        retry={"first_delay_ms": 200, "increment_ms": 100, "park_delay_ms": 500},
        delivery={"timeout_seconds": timeout},
    )
    setup.start_bridge()
    setup.produce_records([make_record(f"tx-q{i}", "acct_silent") for i in range(16)])
    setup.produce_records([make_record(f"tx-w{i}", "acct_slow") for i in range(16)])

    wait_for(
        lambda: len(receiver.received_ids("/slow")) == 16 and len(receiver.on("/silent")) >= 9,
        40,
        message="every slow delivery, and the silent webhook's probe and parked deliveries",
    )
    silent = sorted(r.at for r in receiver.on("/silent"))
    slow = sorted(r.at for r in receiver.on("/slow"))
    onset = [round(at - silent[0], 3) for at in silent if at < silent[0] + 0.8 * timeout]
    assert onset == [0.0], "a new webhook gets one attempt until its first one ends"
    assert _most_at_once(silent, 0.8 * timeout) <= 8, "never past the webhook's concurrency"
    assert _most_at_once(silent, 0.8 * timeout) > 1, "stalled: the parked deliveries are tried"
    assert _most_at_once(slow, 0.8 * hold) == 4, "the answering webhook used its whole limit"


def test_sigterm_drains_and_commits(receiver: Receiver, bridge_setup: Setup) -> None:
    receiver.behaviours["/slow"] = lambda _seen: Answer(200, delay=1.0)
    setup = bridge_setup([webhook("slow", "acct_1", receiver.url("/slow"))], partitions=1)
    bridge = setup.start_bridge()
    setup.produce_records([make_record(f"tx-{i}", "acct_1") for i in range(5)])
    wait_for(lambda: len(receiver.on("/slow")) == 5, 20, message="all five requests in flight")

    assert bridge.terminate() == 0
    assert len(receiver.received_ids("/slow")) == 5
    from tests.kafka_helpers import committed_offsets

    assert committed_offsets(setup.bootstrap, setup.group, setup.source) == [5]


def test_a_stalled_webhook_is_parked_without_attempts_and_delivered_once_it_answers(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    hanging = {"on": True}
    receiver.behaviours["/stall"] = lambda _seen: Answer(hang=hanging["on"])
    setup = bridge_setup(
        [webhook("stall", "acct_s", receiver.url("/stall"), concurrency=1)],
        retry={"first_delay_ms": 200, "increment_ms": 100, "park_delay_ms": 1000},
        delivery={"timeout_seconds": 2.0},
    )
    bridge = setup.start_bridge()
    setup.produce_records([make_record(f"tx-s{i}", "acct_s") for i in range(5)])
    # One request hangs in the only slot; after 1 s without an answer the other four are parked.
    wait_for(
        lambda: bridge.gauge("bridge_deferrals_total", '{webhook="stall"}') >= 4,
        10,
        message="the waiting deliveries parked",
    )
    hanging["on"] = False
    wait_for(
        lambda: len(receiver.received_ids("/stall")) == 5,
        30,
        message="every delivery once the webhook answers again",
    )
    requests = [r.message_id for r in receiver.on("/stall")]
    once = [m for m in set(requests) if requests.count(m) == 1]
    assert len(once) >= 4, "parked deliveries were sent once each: parking used no attempt"
    parked = consume(setup.bootstrap, f"{setup.source}.parked", 4, timeout=10)
    parks = sorted(int(header_map(m.headers())["bridge-deferrals"]) for m in parked)
    assert parks[0] == 1, parks  # parked again while the hung request still held the slot


def test_a_delivery_parked_too_often_is_dead_lettered_as_stalled(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    receiver.behaviours["/gone"] = lambda _seen: Answer(hang=True)
    setup = bridge_setup(
        [webhook("gone", "acct_g", receiver.url("/gone"), concurrency=1)],
        retry={"attempts": 1, "first_delay_ms": 200, "park_delay_ms": 300, "max_parks": 2},
        delivery={"timeout_seconds": 2.0},
    )
    setup.start_bridge()
    setup.produce_records([make_record(f"tx-g{i}", "acct_g") for i in range(3)])

    letters = [header_map(m.headers()) for m in setup.dead_letters(3, timeout=40)]
    stalled = [h for h in letters if h["bridge-reason"] == "webhook_stalled"]
    assert stalled, [h["bridge-reason"] for h in letters]
    assert all(h["bridge-deferrals"] == "2" and h["bridge-attempts"] == "0" for h in stalled)
    assert {h["bridge-reason"] for h in letters} <= {"webhook_stalled", "retries_exhausted"}


def test_in_flight_limit_holds_with_fan_out(receiver: Receiver, bridge_setup: Setup) -> None:
    """Ten webhooks per record, slow receivers, max_in_flight 40: the in-flight gauge and the
    requests the receivers hold at once never exceed 40, and every pair is delivered."""
    limit, fanout, records, hold = 40, 10, 24, 0.4
    hooks = []
    for n in range(fanout):
        receiver.behaviours[f"/fan/{n}"] = lambda _seen: Answer(200, delay=hold)
        hooks.append(webhook(f"fan-{n}", "acct_fan", receiver.url(f"/fan/{n}")))
    setup = bridge_setup(hooks, delivery={"max_in_flight": limit})
    bridge = setup.start_bridge()
    setup.produce_records([make_record(f"tx-fan-{i}", "acct_fan") for i in range(records)])
    gauge_peak = 0.0

    def all_delivered() -> bool:
        nonlocal gauge_peak
        gauge_peak = max(gauge_peak, bridge.gauge("bridge_deliveries_in_flight"))
        return sum(len(receiver.received_ids(f"/fan/{n}")) for n in range(fanout)) == (
            records * fanout
        )

    wait_for(all_delivered, 60, interval=0.02, message="every pair of every record")
    arrivals = sorted(r.at for r in receiver.requests if r.path.startswith("/fan/"))
    held_at_once = max(
        sum(1 for other in arrivals if arrival - hold < other <= arrival) for arrival in arrivals
    )
    assert gauge_peak > limit / 2, "the limit was never approached: the test proves nothing"
    assert gauge_peak <= limit, f"bridge_deliveries_in_flight reached {gauge_peak}"
    assert held_at_once <= limit, f"the receivers held {held_at_once} requests at once"
    assert len(arrivals) == records * fanout  # every pair once, none twice
    # Deliveries held 0.4 s outlive young collections; the collector's work is exported
    # (bridge.ops.collector): every generation has its series, the young one ran.
    exposition = bridge.metrics()
    for generation in "012":
        assert f'bridge_gc_seconds_total{{generation="{generation}"}}' in exposition
    assert bridge.gauge("bridge_gc_collections_total", '{generation="0"}') > 0
    assert bridge.gauge("bridge_gc_seconds_total", '{generation="0"}') > 0


def test_a_webhook_that_answers_nothing_is_parked_once_its_credit_is_spent(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    """Every attempt to the three silent webhooks ends in a reset (no answer). Beyond
    UNANSWERED_BURST such attempts (refilled UNANSWERED_PER_S a second) per webhook, and as many
    for the three together (one account), their deliveries are parked, not attempted, those of
    one record together; the healthy webhook of the same account on the same records gets
    everything; every silent pair ends in the dead letters with its own webhook-id."""
    records = int(UNANSWERED_BURST) * 3
    silent = ["silent-a", "silent-b", "silent-c"]
    for w in silent:
        receiver.behaviours[f"/silent/{w}"] = lambda _seen: Answer(reset=True)
    setup = bridge_setup(
        [
            *(webhook(w, "acct_n", receiver.url(f"/silent/{w}"), concurrency=4) for w in silent),
            webhook("fine", "acct_n", receiver.url("/fine")),
        ],
        retry={"attempts": 2, "first_delay_ms": 100, "park_delay_ms": 300, "max_parks": 1},
    )
    started = time.monotonic()
    setup.start_bridge()
    produced = [make_record(f"tx-n{i}", "acct_n") for i in range(records)]
    setup.produce_records(produced)

    pairs = len(silent) * records
    letters = [header_map(m.headers()) for m in setup.dead_letters(pairs, timeout=90)]
    elapsed = time.monotonic() - started
    # One letter per silent pair, each with that pair's own webhook-id (a record parked for
    # several webhooks at once is expanded again into one delivery each).
    expected = {
        message_id(str(r["transactionId"]), "transaction.success", w): w
        for r in produced
        for w in silent
    }
    assert {h["bridge-message-id"]: h["bridge-webhook"] for h in letters} == expected
    assert len(letters) == pairs
    reasons = {h["bridge-reason"] for h in letters}
    assert "webhook_stalled" in reasons and reasons <= {"webhook_stalled", "retries_exhausted"}
    wait_for(lambda: len(receiver.received_ids("/fine")) == records, 30, message="every fine one")
    # Without the budget: three attempts per pair. With it, per webhook: the burst, the refill,
    # and what was already under way when the credit ran out.
    # and the three together, the account's budget: its burst, its refill, and what was under
    # way (four slots each) when it ran out.
    each = {w: len(receiver.on(f"/silent/{w}")) for w in silent}
    for w, attempts in each.items():
        assert attempts <= UNANSWERED_BURST + UNANSWERED_PER_S * elapsed + 4, (w, attempts)
    assert sum(each.values()) <= UNANSWERED_BURST + UNANSWERED_PER_S * elapsed + 12, each
    # Parked together: fewer parking records than parked pairs (read the whole parking topic:
    # the first records parked may be for one webhook, parked before the others ran out).
    reader = DeadLetterReader(setup.bootstrap, f"{setup.source}.parked")
    try:
        parked = reader.read()
    finally:
        reader.close()
    also = [
        p.headers["bridge-also-webhooks"] for p in parked if "bridge-also-webhooks" in p.headers
    ]
    assert also, f"none of {len(parked)} parking records holds several webhooks of one record"


def test_https_receivers_behind_a_private_ca_and_requiring_a_client_certificate(
    bridge_setup: Setup, tmp_path: Path
) -> None:
    """Through the bridge process: a receiver whose certificate comes from a private CA, and one
    that also requires a client certificate. Trusting the CA (added to the system store) and
    presenting the certificate deliver; without them every attempt is a tls_error, retried and
    dead-lettered like any other."""
    ca = trustme.CA()
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "client", "client_key")}
    ca.cert_pem.write_to_path(paths["ca"])
    client = ca.issue_cert("bridge-client.example")
    client.cert_chain_pems[0].write_to_path(paths["client"])
    client.private_key_pem.write_to_path(paths["client_key"])

    def serving(require_client: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(context)
        if require_client:
            context.verify_mode = ssl.CERT_REQUIRED
            ca.configure_trust(context)
        return context

    plain_tls, mutual_tls = Receiver(serving(False)).start(), Receiver(serving(True)).start()
    try:
        trust = {"tls_ca_file": str(paths["ca"])}
        certificate = {
            "tls_client_cert_file": str(paths["client"]),
            "tls_client_key_file": str(paths["client_key"]),
        }
        hooks = [
            webhook("private-ca", "acct_t", plain_tls.url("/a"), **trust),
            webhook("unknown-ca", "acct_t", plain_tls.url("/b")),
            webhook("mutual", "acct_t", mutual_tls.url("/c"), **trust, **certificate),
            webhook("no-client-cert", "acct_t", mutual_tls.url("/d"), **trust),
        ]
        setup = bridge_setup(hooks, retry={"attempts": 1, "first_delay_ms": 100})
        bridge = setup.start_bridge()
        setup.produce_records([make_record(f"tx-t{i}", "acct_t") for i in range(3)])

        letters = [header_map(m.headers()) for m in setup.dead_letters(6, timeout=60)]
        assert (
            sorted(h["bridge-webhook"] for h in letters)
            == ["no-client-cert"] * 3 + ["unknown-ca"] * 3
        )
        for letter in letters:
            assert letter["bridge-reason"] == "retries_exhausted"
            assert letter["bridge-attempts"] == "2", "the first attempt and one retry"
            assert letter["bridge-last-error"].startswith("tls_error"), letter
        wait_for(
            lambda: (
                len(plain_tls.received_ids("/a")) == 3 and len(mutual_tls.received_ids("/c")) == 3
            ),
            30,
            message="the trusted and the mutual-TLS deliveries",
        )
        assert plain_tls.on("/b") == [] and mutual_tls.on("/d") == [], "no request reached them"
        failed = '{outcome="failed",status_class="tls_error",webhook="unknown-ca"}'
        assert bridge.gauge("bridge_deliveries_total", failed) == 6  # 3 records, 2 attempts
        assert bridge.terminate() == 0
    finally:
        plain_tls.stop()
        mutual_tls.stop()
