"""Crash recovery, dead-letter replay, test deliveries and config changes, end to end."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from bridge.config.loader import load_config
from bridge.core.envelope import header_map
from devtools.devkafka import Broker, free_port
from devtools.samples import encode_records, make_record
from tests.bridge_harness import REPO, SCHEMA, BridgeProcess, BridgeSetup, secret_of, webhook
from tests.kafka_helpers import QUIET, committed_offsets, create_topics, produce, wait_for
from tests.receiver import Answer, Receiver, always, fail_first, warmed_then

pytestmark = pytest.mark.integration

Setup = Callable[..., BridgeSetup]


def bridge_cli(setup: BridgeSetup, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m bridge ARGS -c <the set-up's config>``."""
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args, "-c", str(setup.config_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_sigkill_mid_stream_loses_nothing(receiver: Receiver, bridge_setup: Setup) -> None:
    receiver.behaviours["/slow"] = lambda seen: Answer(200, delay=0.05) if seen else Answer(500)
    setup = bridge_setup([webhook("slow", "acct_1", receiver.url("/slow"), concurrency=4)])
    first = setup.start_bridge()
    records = [make_record(f"tx-{i}", "acct_1") for i in range(60)]
    setup.produce_records(records)
    wait_for(lambda: len(receiver.received_ids("/slow")) >= 10, 30, message="some deliveries")

    first.kill()
    setup.start_bridge()

    expected = {r.message_id for r in receiver.on("/slow")}
    wait_for(lambda: len(receiver.received_ids("/slow")) == 60, 60, message="all 60 received")
    assert expected <= receiver.received_ids("/slow")


def test_dead_letters_are_listed_and_replayed(receiver: Receiver, bridge_setup: Setup) -> None:
    receiver.behaviours["/down"] = always(500)
    setup = bridge_setup(
        [webhook("down", "acct_1", receiver.url("/down"))],
        retry={"attempts": 1, "first_delay_ms": 100, "increment_ms": 100},
    )
    setup.start_bridge()
    setup.produce_records([make_record("tx-a", "acct_1"), make_record("tx-b", "acct_1")])
    setup.dead_letters(2)

    listing = bridge_cli(setup, "dlq", "list", "--webhook", "down")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.count("retries_exhausted") == 2
    assert "2 dead letter(s)" in listing.stdout

    receiver.behaviours["/down"] = always(200)
    replay = bridge_cli(setup, "dlq", "replay", "--reason", "retries_exhausted")
    assert replay.returncode == 0, replay.stderr
    assert "replayed 2 of 2" in replay.stdout
    wait_for(lambda: len(receiver.received_ids("/down")) == 2, 30, message="replayed deliveries")
    ids = {r.message_id for r in receiver.on("/down")}
    assert len(ids) == 2, "a replay keeps the webhook-id of the original delivery"


def test_replay_without_selection_is_refused(bridge_setup: Setup, receiver: Receiver) -> None:
    setup = bridge_setup([webhook("any", "acct_1", receiver.url("/any"))])
    result = bridge_cli(setup, "dlq", "replay")
    assert result.returncode == 2
    assert "--all" in result.stderr


def test_test_webhook_reports_received_and_not_received(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    receiver.behaviours["/bad"] = always(404)
    setup = bridge_setup(
        [
            webhook("good", "acct_1", receiver.url("/good")),
            webhook("bad", "acct_1", receiver.url("/bad")),
        ]
    )
    good = bridge_cli(setup, "test-webhook", "good")
    bad = bridge_cli(setup, "test-webhook", "bad")
    unknown = bridge_cli(setup, "test-webhook", "nope")

    assert good.returncode == 0 and "HTTP 200" in good.stdout and "received" in good.stdout
    assert bad.returncode == 1 and "HTTP 404" in bad.stdout and "NOT received" in bad.stdout
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    body = json.loads(receiver.on("/good")[0].body)
    assert body["event"] == "webhook.test"
    assert receiver.on("/good")[0].headers["x-service-secret"]


def test_retry_for_removed_webhook_is_dead_lettered(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    receiver.behaviours["/gone"] = always(500)
    setup = bridge_setup(
        [
            webhook("gone", "acct_1", receiver.url("/gone")),
            webhook("kept", "acct_2", receiver.url("/kept")),
        ],
        retry={"attempts": 2, "first_delay_ms": 3000, "increment_ms": 100},
    )
    bridge = setup.start_bridge()
    setup.produce_records([make_record("tx-gone", "acct_1")])
    wait_for(lambda: len(receiver.on("/gone")) == 1, 30, message="the first attempt")

    setup.write_config([webhook("kept", "acct_2", receiver.url("/kept"))])
    bridge.own_config.write_text(
        setup.config_path.read_text().replace("port: 0", f"port: {bridge.port}")
    )
    letters = setup.dead_letters(1, timeout=30)
    headers = header_map(letters[0].headers())
    assert headers["bridge-reason"] == "webhook_removed"
    assert headers["bridge-webhook"] == "gone"
    assert len(receiver.on("/gone")) == 1
    assert bridge.gauge("bridge_config_reloads_total", 'result="applied"') == 1


def test_invalid_config_reload_keeps_the_old_one(receiver: Receiver, bridge_setup: Setup) -> None:
    setup = bridge_setup([webhook("hook", "acct_1", receiver.url("/hook"))])
    bridge = setup.start_bridge()
    bridge.own_config.write_text(
        bridge.own_config.read_text().replace("acct_1", "") + "\nbogus: 1\n"
    )
    wait_for(
        lambda: bridge.gauge("bridge_config_reloads_total", 'result="rejected"') == 1,
        15,
        message="the rejected reload to be counted",
    )
    setup.produce_records([make_record("tx-after-bad-reload", "acct_1")])
    wait_for(lambda: receiver.received_ids("/hook"), 30, message="delivery under the old config")


HOSTILE_FIELDS = {  # a webhook field written as an attacker (or a typo) would
    "tagged secret": ("secret", "!!int hunter2-not-a-number"),
    "timestamp secret": ("secret", "!!timestamp hunter2-nope"),
    "unknown tag": ("secret", "!!python/object/apply:os.system [hunter2]"),
    "malformed IPv6 URL": ("url", "'http://[::1/x'"),
    "empty host label": ("url", "'https://a..example.com/hook'"),
    "userinfo": ("url", "'https://alice:hunter2-pw@a.example/h'"),
}


def hostile_webhook(field: str, value: str) -> str:
    """A webhook entry (in the harness's block style) with ``field`` written as ``value``."""
    fields = {"url": "https://b.example/h", "secret": "s3cret-of-hostile", field: value}
    lines = [f"  {key}: {text}" for key, text in fields.items()]
    return "- id: hostile\n  account: acct_2\n  events: [transaction.success]\n" + "\n".join(lines)


def test_hostile_config_files_never_stop_reloads(receiver: Receiver, bridge_setup: Setup) -> None:
    """Each hostile file is rejected and reported (metric, /readyz) without its secret; the
    bridge keeps delivering with the old webhooks, and a good file applies after all of them."""
    setup = bridge_setup([webhook("hook", "acct_1", receiver.url("/old"))])
    bridge = setup.start_bridge()
    good = bridge.own_config.read_text()
    assert good.rstrip().endswith(f"secret: {secret_of('hook')}"), "webhooks come last"
    for number, (name, (field, value)) in enumerate(HOSTILE_FIELDS.items(), start=1):
        bridge.own_config.write_text(good + hostile_webhook(field, value) + "\n")
        wait_for(
            lambda n=number: bridge.gauge("bridge_config_reloads_total", 'result="rejected"') == n,
            15,
            message=f"the {name} file to be rejected",
        )
        body = bridge.http("/readyz")[1]  # ready or not is the broker's business here
        state = json.loads(body)["config"]
        assert state["in_force"] is False, (name, body)
        assert any(f"webhook 'hostile': field '{field}'" in p for p in state["rejected"]), body
        assert "hunter2" not in body
        assert bridge.gauge("bridge_config_last_reload_successful") == 0
    assert "hunter2" not in bridge.log_tail(400)
    assert "Traceback" not in bridge.log_tail(400)
    setup.produce_records([make_record("tx-under-old", "acct_1")])
    wait_for(lambda: receiver.received_ids("/old"), 30, message="delivery under the old config")
    bridge.own_config.write_text(good.replace(receiver.url("/old"), receiver.url("/new")))
    wait_for(
        lambda: bridge.gauge("bridge_config_reloads_total", 'result="applied"') == 1,
        15,
        message="the good file to apply",
    )
    assert json.loads(bridge.http("/readyz")[1])["config"] == {
        "path": str(bridge.own_config),
        "in_force": True,
        "rejected": [],
    }
    assert bridge.gauge("bridge_config_last_reload_successful") == 1
    setup.produce_records([make_record("tx-under-new", "acct_1")])
    wait_for(lambda: receiver.received_ids("/new"), 30, message="delivery under the new config")


def test_broker_unreachable_at_start_keeps_readiness_false(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    setup = bridge_setup([webhook("hook", "acct_1", receiver.url("/hook"))])
    closed_port = free_port()
    setup.kafka = {"bootstrap_servers": f"127.0.0.1:{closed_port}"}
    setup.write_config()
    bridge = setup.start_bridge(wait_assigned=False)

    wait_for(lambda: bridge.http("/healthz")[0] == 200, 30, message="the health endpoint")
    status, body = bridge.http("/readyz")
    assert status == 503
    assert json.loads(body)["checks"]["broker_reachable"] is False
    wait_for(
        lambda: any("kafka.error" in line for line in bridge.log_lines()),
        30,
        message="a log line about the unreachable broker",
    )
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 6, 10, message="six seconds of a broker away")
    assert bridge.terminate() == 0
    assert_every_line_is_json(bridge.log_lines(), most=30)


def assert_every_line_is_json(lines: list[str], most: int) -> None:
    """Every line the bridge wrote to stdout and stderr is one JSON object, librdkafka's too,
    and repeated failures are summarised: at most ``most`` lines in all."""
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a line that is not JSON: {line!r}") from None
    assert all(isinstance(event, dict) and "event" in event for event in events)
    assert len(events) <= most, f"{len(events)} lines: {[e['event'] for e in events]}"


def test_failed_write_to_a_delay_topic_keeps_the_source_offset(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    receiver.behaviours["/down"] = fail_first(1)
    setup = bridge_setup([webhook("down", "acct_1", receiver.url("/down"))], partitions=1)
    admin = AdminClient({"bootstrap.servers": setup.bootstrap, **QUIET})
    for future in admin.delete_topics([setup.delay_topic(1)], operation_timeout=30).values():
        future.result(30)
    setup.start_bridge()
    setup.produce_records([make_record("tx-kept", "acct_1")])
    wait_for(lambda: len(receiver.on("/down")) == 1, 30, message="the first attempt")

    deadline_check = committed_offsets(setup.bootstrap, setup.group, setup.source)
    wait_for(
        lambda: setup.processes[0].gauge("bridge_produce_failures_total") >= 1,
        60,
        message="the failed write to the missing delay topic",
    )
    assert committed_offsets(setup.bootstrap, setup.group, setup.source) == deadline_check
    assert deadline_check[0] < 1, "the record is not committed while its retry is not durable"

    create_topics(setup.bootstrap, [setup.delay_topic(1)], partitions=1)
    wait_for(
        lambda: committed_offsets(setup.bootstrap, setup.group, setup.source) == [1],
        30,
        message="the offset committed once the retry is written",
    )


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_shutdown_ends_within_the_grace_period_whatever_the_broker_does(
    receiver: Receiver, tmp_path: Path, fault: str
) -> None:
    """With deliveries in flight and the broker stopped (or frozen by SIGSTOP), SIGTERM still
    ends the bridge within shutdown_grace_seconds: what could not be settled is left for
    redelivery, bridge.stopped says so, and the exit code is 0."""
    grace = 3.0
    broker = Broker(tmp_path / "own-broker")
    bootstrap = broker.start()
    pid = broker.pid()
    assert pid is not None
    try:
        receiver.behaviours["/slow"] = warmed_then(Answer(200, delay=30))
        setup = BridgeSetup(
            bootstrap,
            tmp_path,
            [webhook("slow", "acct_1", receiver.url("/slow"))],
            delivery={"timeout_seconds": 20.0, "shutdown_grace_seconds": grace},
        )
        setup.create_topics()
        bridge = setup.start_bridge()
        setup.produce_records([make_record("tx-grace-warm", "acct_1")])  # answered: 3 at once next
        wait_for(lambda: len(receiver.on("/slow")) == 1, 30, message="the warm-up delivery")
        setup.produce_records([make_record(f"tx-grace-{i}", "acct_1") for i in range(3)])
        wait_for(lambda: len(receiver.on("/slow")) == 4, 30, message="deliveries in flight")
        if fault == "stopped":
            broker.kill()
        else:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        code = bridge.terminate(timeout=grace + 15)
        took = time.monotonic() - started
        stopped = [json.loads(line) for line in bridge.log_lines() if '"bridge.stopped"' in line]
        assert code == 0, bridge.log_tail()
        assert took < grace + 2.0, f"the bridge took {took:.1f}s to stop (grace {grace}s)"
        assert len(stopped) == 1, bridge.log_tail()
        assert stopped[0]["deliveries_left_for_redelivery"] == 3
        assert_every_line_is_json(bridge.log_lines(), most=60)
    finally:
        if fault == "frozen":
            os.kill(pid, signal.SIGCONT)
        broker.stop()


def test_port_zero_is_reported_as_the_port_actually_bound(
    receiver: Receiver, bridge_setup: Setup, tmp_path: Path
) -> None:
    setup = bridge_setup([webhook("hook", "acct_1", receiver.url("/hook"))])
    document = yaml.safe_load(setup.config_path.read_text())
    document["metrics"]["port"] = 0
    config = tmp_path / "port-zero.yaml"
    config.write_text(yaml.safe_dump(document))
    log = (tmp_path / "port-zero.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "bridge", "run", "-c", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    try:

        def started() -> dict[str, object] | None:
            for line in (tmp_path / "port-zero.log").read_text().splitlines():
                if '"bridge.started"' in line:
                    event: dict[str, object] = json.loads(line)
                    return event
            return None

        wait_for(lambda: started() is not None, 30, message="bridge.started")
        event = started()
        assert event is not None
        port = event["metrics_port"]
        assert isinstance(port, int) and port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        log.close()


def test_the_open_file_limit_is_raised_at_start_and_a_low_hard_limit_reported(
    receiver: Receiver, bridge_setup: Setup, tmp_path: Path
) -> None:
    """Started with a soft limit of 256 under a hard one of 1,024 (below what the delivery
    settings may hold open), the bridge raises its soft limit to the hard one, says so in
    ``bridge.started``, warns ``open_files.limit_low``, and delivers."""
    setup = bridge_setup([webhook("hook", "acct_1", receiver.url("/hook"))])
    setup.delivery.update(max_in_flight=300, max_idle_connections=700)
    config = setup.write_config()
    log_path = tmp_path / "files.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "bridge", "run", "-c", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024)),
    )
    try:

        def event(name: str) -> dict[str, Any] | None:
            for line in log_path.read_text().splitlines():
                if f'"{name}"' in line:
                    found: dict[str, Any] = json.loads(line)
                    return found
            return None

        wait_for(lambda: event("bridge.started") is not None, 30, message="bridge.started")
        started, low = event("bridge.started"), event("open_files.limit_low")
        assert started is not None and started["open_files_limit"] == 1024
        assert low is not None, log_path.read_text()
        assert (low["soft"], low["hard"], low["wanted"]) == (1024, 1024, 300 + 700 + 512)
        limits = Path(f"/proc/{process.pid}/limits").read_text().splitlines()
        assert [line.split()[3:5] for line in limits if line.startswith("Max open files")] == [
            ["1024", "1024"]
        ]
        produce(
            setup.bootstrap, setup.source, encode_records(SCHEMA, [make_record("tx-f", "acct_1")])
        )
        wait_for(lambda: len(receiver.on("/hook")) == 1, 60, message="the delivery")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        log.close()


def test_status_shows_a_failing_webhook_and_bridge_status_prints_it(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    """``/status`` lists the failing webhook (by id: no URL, no secret) and not the healthy idle
    one, with the totals and the configuration in force; ``bridge status`` prints the same."""
    receiver.behaviours["/down"] = always(503)
    setup = bridge_setup(
        [
            webhook("down", "acct_1", receiver.url("/down")),
            webhook("fine", "acct_2", receiver.url("/fine")),
        ]
    )
    bridge = setup.start_bridge()
    setup.produce_records([make_record("tx-down", "acct_1"), make_record("tx-fine", "acct_2")])
    wait_for(lambda: receiver.received_ids("/fine"), 30, message="the healthy delivery")

    def listed() -> list[dict[str, object]]:
        status, body = bridge.http("/status")
        rows: list[dict[str, object]] = json.loads(body)["webhooks"] if status == 200 else []
        return rows

    wait_for(
        lambda: [row["id"] for row in listed() if row["failing_since"]] == ["down"],
        30,
        message="the failing webhook in /status",
    )
    code, body = bridge.http("/status")
    view = json.loads(body)
    assert code == 200 and [row["id"] for row in view["webhooks"]] == ["down"], body
    assert view["left_out"] == 0 and view["totals"]["webhooks_failing"] == 1
    assert view["totals"]["webhooks_configured"] == 2
    assert view["config"]["in_force"] is True and view["config"]["generation"] == 1
    assert view["config"]["path"] == str(bridge.own_config)
    assert "127.0.0.1:" not in body and "secret-of" not in body

    printed = subprocess.run(
        [sys.executable, "-m", "bridge", "status", "--url", f"http://127.0.0.1:{bridge.port}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    rows = [line.split() for line in printed.stdout.splitlines()]
    assert any(row[:2] == ["down", "failing"] for row in rows), printed.stdout
    assert not any(row and row[0] == "fine" for row in rows), printed.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "bridge", "status", "--json", "--url", f"127.0.0.1:{bridge.port}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["webhooks"][0]["id"] == "down"


def test_a_config_directory_gets_a_webhook_through_a_kubelet_swap_and_delivers_to_it(
    receiver: Receiver, bridge_setup: Setup, tmp_path: Path
) -> None:
    """``bridge run -c DIR`` on a volume written as kubelet writes a projected ConfigMap volume:
    a second ConfigMap's file appears through a ``..data`` swap, the running bridge reloads it
    (in its child process) and delivers to the new webhook, still delivering to the first."""
    from tests.bridge_harness import BridgeProcess
    from tests.kubelet_volume import AtomicWriter

    setup = bridge_setup([webhook("first", "acct_1", receiver.url("/first"))])
    document = yaml.safe_load(setup.config_path.read_text())
    first_hooks = {"webhooks": document.pop("webhooks")}
    bridge = BridgeProcess(tmp_path / "etc-bridge", tmp_path / "bridge-directory.log")
    document["metrics"]["port"] = bridge.port
    base = yaml.safe_dump(document, sort_keys=False)
    writer = AtomicWriter(bridge.config_path)
    writer.write({"bridge.yaml": base, "webhooks-a.yaml": yaml.safe_dump(first_hooks)})
    with bridge.log_path.open("ab") as log:
        bridge.process = subprocess.Popen(
            [sys.executable, "-m", "bridge", "run", "-c", str(bridge.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    setup.processes.append(bridge)  # stopped at the end of the test
    wait_for(lambda: bridge.gauge("bridge_assigned_partitions") > 0, 60, message="assignment")
    setup.produce_records([make_record("tx-dir-first", "acct_1")])
    wait_for(lambda: receiver.received_ids("/first"), 30, message="delivery to the first file's")

    second_hooks = {"webhooks": [webhook("second", "acct_2", receiver.url("/second"))]}
    writer.write(
        {
            "bridge.yaml": base,
            "webhooks-a.yaml": yaml.safe_dump(first_hooks),
            "webhooks-b.yaml": yaml.safe_dump(second_hooks),
        }
    )
    wait_for(
        lambda: bridge.gauge("bridge_config_reloads_total", 'result="applied"') == 1,
        30,
        message="the swapped volume to apply",
    )
    setup.produce_records(
        [make_record("tx-dir-second", "acct_2"), make_record("tx-dir-first-again", "acct_1")]
    )
    wait_for(lambda: receiver.received_ids("/second"), 30, message="delivery to the new webhook")
    wait_for(lambda: len(receiver.received_ids("/first")) == 2, 30, message="the first still")
    state = json.loads(bridge.http("/readyz")[1])["config"]
    assert state == {"path": str(bridge.config_path), "in_force": True, "rejected": []}
    assert bridge.gauge("bridge_config_reloads_total", 'result="rejected"') == 0
    assert bridge.terminate() == 0


def group_lags(bridge: BridgeProcess, topic: str) -> dict[int, float]:
    """``bridge_group_lag`` of each partition of ``topic`` in the bridge's /metrics."""
    found = re.findall(
        rf'^bridge_group_lag\{{partition="(\d+)",topic="{re.escape(topic)}"\}} (\S+)$',
        bridge.metrics(),
        re.M,
    )
    return {int(partition): float(value) for partition, value in found}


def test_group_lag_shows_partitions_no_replica_of_the_bridge_holds(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    """The group's lag comes from the cluster, not from what this instance holds: a member of
    the group that takes partitions and never finishes them (a stuck replica, a rebalance) leaves
    their lag in every replica's metrics, exact, and it falls to 0 once the bridge has them."""
    setup = bridge_setup([webhook("wh_1", "acct_1", receiver.url("/hook"))])
    config = load_config(setup.config_path)
    every_topic = [setup.source, *config.delay_topics, config.parked_topic]
    bridge = setup.start_bridge()
    wait_for(
        lambda: all(group_lags(bridge, topic) == {0: 0, 1: 0, 2: 0} for topic in every_topic),
        30,
        message="every partition of every bridge topic at lag 0",
    )
    stuck = Consumer(
        {
            "bootstrap.servers": setup.bootstrap,
            "group.id": setup.group,
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    held: list[int] = []

    def took(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        held.extend(p.partition for p in partitions if p.topic == setup.source)

    stuck.subscribe([setup.source], on_assign=took)
    try:
        wait_for(lambda: stuck.poll(0.2) is None and bool(held), 60, message="a stuck member")
        for partition in held:
            records = [make_record(f"tx-lag-{partition}-{i}", "acct_1") for i in range(5)]
            produce(
                setup.bootstrap, setup.source, encode_records(SCHEMA, records), partition=partition
            )
        expected = {p: (5.0 if p in held else 0.0) for p in range(3)}
        wait_for(
            lambda: group_lags(bridge, setup.source) == expected,
            30,
            message=f"the stuck member's partitions {held} 5 behind, in the bridge's metrics",
        )
        held_here = [
            line
            for line in bridge.metrics().splitlines()
            if line.startswith("bridge_consumer_lag{")
            and f'topic="{setup.source}"' in line
            and any(f'partition="{p}"' in line for p in held)
        ]
        assert held_here == [], "librdkafka's lag covers the partitions held here only"
    finally:
        stuck.close()
    wait_for(
        lambda: len(receiver.received_ids("/hook")) == 5 * len(held),
        60,
        message="the stuck member's records delivered by the bridge",
    )
    wait_for(
        lambda: group_lags(bridge, setup.source) == {0: 0, 1: 0, 2: 0},
        30,
        message="the group's lag back to 0 once the bridge has every partition",
    )


def test_group_lag_of_the_source_stays_when_another_bridge_topic_is_missing(
    receiver: Receiver, bridge_setup: Setup
) -> None:
    """``bridge run`` does not create topics: a parking topic deleted (or never created) leaves
    the other topics' lag, and the alerts on the source's, in place."""
    setup = bridge_setup([webhook("wh_1", "acct_1", receiver.url("/hook"))])
    parked = load_config(setup.config_path).parked_topic
    admin = AdminClient({"bootstrap.servers": setup.bootstrap, **QUIET})
    admin.delete_topics([parked])[parked].result()
    wait_for(lambda: parked not in admin.list_topics(timeout=5).topics, 30, message="topic gone")
    bridge = setup.start_bridge()
    wait_for(
        lambda: group_lags(bridge, setup.source) == {0: 0, 1: 0, 2: 0},
        30,
        message="the source's group lag while the parking topic is missing",
    )
    assert group_lags(bridge, parked) == {}
