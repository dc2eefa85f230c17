"""The benchmark's pure helpers: summaries of repeated rounds, the table, the targets."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devtools import bench
from devtools.bench import (
    NEIGHBOUR_KEYS,
    QUICK,
    TARGETS,
    THROUGHPUT_KEYS,
    Sizes,
    Stage,
    _median_of,
    after_onset,
    cpu_seconds,
    interleave,
    render,
    scenario_isolation,
)
from devtools.bench_hostile import HOSTILE_PATHS


def _round(p99: float, neighbour: str = "hung") -> dict[str, object]:
    return {
        "neighbour": neighbour,
        "count": 100,
        "p50_ms": 1.0,
        "p95_ms": 2.0,
        "p99_ms": p99,
        "max_ms": p99 * 3,
    }


def test_rounds_are_summarised_by_their_median_and_kept() -> None:
    rounds = [_round(9.0), _round(4.0), _round(30.0)]
    summary = _median_of(rounds)
    assert summary["p99_ms"] == 9.0
    assert summary["max_ms"] == 27.0
    assert summary["neighbour"] == "hung"
    assert summary["rounds"] == rounds


def test_an_even_number_of_rounds_takes_the_middle_two() -> None:
    assert _median_of([_round(4.0), _round(8.0)])["p99_ms"] == 6.0


def test_the_table_shows_each_rounds_p99_on_one_line() -> None:
    results = {
        "machine": {"cpus": 2},
        "isolation_hung": _median_of([_round(9.0), _round(4.0), _round(30.0)]),
        "targets": {"healthy p99 with a hung webhook <= 2x alone": False},
    }
    table = render(results)
    line = next(line for line in table.splitlines() if line.startswith("isolation_hung"))
    assert '"round_p99_ms": [9.0, 4.0, 30.0]' in line
    assert '"p99_ms": 9.0' in line
    assert "[MISSED] healthy p99 with a hung webhook <= 2x alone" in table


def test_throughput_rounds_keep_their_settings_and_show_each_rate() -> None:
    rounds = [
        {
            "records": 10,
            "metrics": True,
            "seconds": 2.0,
            "deliveries_per_s": 5,
            "cpu_per_1000_s": 0.3,
            "peak_rss_mb": 90.0,
            "cores_busy": 1.5,
        },
        {
            "records": 10,
            "metrics": True,
            "seconds": 1.0,
            "deliveries_per_s": 10,
            "cpu_per_1000_s": 0.2,
            "peak_rss_mb": 99.0,
            "cores_busy": 1.7,
        },
    ]
    summary = _median_of(rounds, THROUGHPUT_KEYS)
    assert summary["deliveries_per_s"] == 7.5 and summary["cpu_per_1000_s"] == 0.25
    assert summary["metrics"] is True and summary["records"] == 10
    table = render({"machine": {}, "throughput": summary})
    assert '"round_deliveries_per_s": [5, 10]' in table


def test_after_onset_keeps_the_records_a_second_or_more_after_the_first() -> None:
    # (append time, latency), not in time order: delivery reports come as they come
    timed = [(100.4, 0.030), (100.0, 0.020), (101.0, 0.002), (100.999, 0.040), (102.5, 0.003)]
    assert after_onset(timed) == [0.002, 0.003]
    assert after_onset(timed, onset_s=0.4) == [0.030, 0.002, 0.040, 0.003]
    assert after_onset(timed, onset_s=0.0) == [lat for _, lat in timed]
    assert after_onset([]) == []


def test_interleave_spreads_the_smaller_account_evenly() -> None:
    assert interleave({"a": 4, "b": 1}) == ["a", "a", "b", "a", "a"]
    assert interleave({"a": 2, "b": 2}) == ["a", "b", "a", "b"]
    mixed = interleave({"ok": 1000, "hostile": 250})
    assert Counter(mixed) == {"ok": 1000, "hostile": 250}
    # every stretch of 25 records holds 5 of the neighbour's: never one set after the other
    for start in range(0, len(mixed), 25):
        assert mixed[start : start + 25].count("hostile") == 5
    assert interleave({"ok": 3, "none": 0}) == ["ok", "ok", "ok"]
    assert interleave({}) == []


def test_cpu_seconds_reads_user_and_system_time_past_the_command_name() -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    # a command name with spaces and a parenthesis must not shift the fields
    fields = ["S", *["0"] * 10, str(3 * ticks), str(ticks), *["0"] * 30]
    stat = "1234 (python -m (x) y) " + " ".join(fields)
    assert cpu_seconds(stat) == 4.0
    with open("/proc/self/stat") as own:
        assert cpu_seconds(own.read()) > 0


def _latency(p99: float) -> dict[str, Any]:
    return {"p99_ms": p99}


def _targets(results: dict[str, Any]) -> dict[str, bool]:
    """What ``run`` does with TARGETS: a target whose scenario did not run is left out."""
    verdicts = {}
    for name, check in TARGETS.items():
        try:
            verdicts[name] = bool(check(results))
        except KeyError:
            continue
    return verdicts


P99_HOSTILE = "healthy p99 beside a hostile neighbour <= 1.5x alone"
RATE_HOSTILE = "healthy throughput beside a hostile neighbour >= alone / 1.5"


@pytest.mark.parametrize(
    ("alone", "hostile", "met"),
    [(4.0, 6.0, True), (4.0, 6.1, False), (0.2, 1.5, True), (0.2, 1.6, False)],
)
def test_hostile_latency_target_is_one_and_a_half_times_alone(
    alone: float, hostile: float, met: bool
) -> None:
    results = {"isolation_alone": _latency(alone), "isolation_hostile": _latency(hostile)}
    assert _targets(results) == {P99_HOSTILE: met}  # an alone p99 under 1 ms counts as 1 ms


@pytest.mark.parametrize(
    ("alone", "hostile", "met"), [(15_000, 10_000, True), (15_000, 9_999, False)]
)
def test_hostile_throughput_target_is_alone_over_one_and_a_half(
    alone: int, hostile: int, met: bool
) -> None:
    results = {
        "neighbour_alone": {"deliveries_per_s": alone},
        "neighbour_hostile": {"deliveries_per_s": hostile},
    }
    assert _targets(results) == {RATE_HOSTILE: met}


LATENCY_EVERY_ROUND = "p99 end-to-end at 1,000/s < 10 ms in every round"


@pytest.mark.parametrize(("p99s", "met"), [((6.1, 9.9, 4.0), True), ((6.1, 10.0, 4.0), False)])
def test_the_latency_target_is_judged_on_the_slowest_round_not_the_median(
    monkeypatch: pytest.MonkeyPatch, p99s: tuple[float, ...], met: bool
) -> None:
    """Issue 21: p99 under 10 ms in every round, not only the best one (nor the median)."""
    rounds = iter(p99s)
    monkeypatch.setattr(bench, "_say", lambda what: None)
    monkeypatch.setattr(
        bench,
        "scenario_latency",
        lambda stage, rate, seconds: {
            "rate_per_s": rate,
            **dict.fromkeys(("count", "p50_ms", "p95_ms", "max_ms"), 1.0),
            **_latency(next(rounds)),
        },
    )
    latency = bench.scenario_latency_rounds(None, 1000, 30.0, len(p99s))  # type: ignore[arg-type]
    assert [r["p99_ms"] for r in latency["rounds"]] == list(p99s)
    assert latency["p99_ms"] == 6.1 and latency["p99_ms_worst"] == max(p99s)
    verdicts = _targets({"latency": latency, "split_latency": latency})
    assert verdicts[LATENCY_EVERY_ROUND] is met
    assert verdicts[f"split placement: {LATENCY_EVERY_ROUND}"] is met
    assert verdicts["p99 end-to-end at 1,000/s < 25 ms"] is True  # (the median: the old target)


def test_hostile_targets_are_left_out_when_their_scenario_did_not_run() -> None:
    only_hung = {"isolation_alone": _latency(4.0), "isolation_hung": _latency(5.0)}
    assert set(_targets(only_hung)) == {"healthy p99 with a hung webhook <= 2x alone"}


def test_neighbour_rounds_and_new_rows_show_in_the_table() -> None:
    def rate_round(rate: int, neighbour: str) -> dict[str, Any]:
        return {
            "records": 1000,
            "neighbour": neighbour,
            "seconds": 1000 / rate,
            "deliveries_per_s": rate,
            "cpu_seconds": 2.0,
        }

    alone = _median_of([rate_round(900, "none"), rate_round(1100, "none")], NEIGHBOUR_KEYS)
    hostile = _median_of([rate_round(500, "hostile"), rate_round(700, "hostile")], NEIGHBOUR_KEYS)
    assert alone["deliveries_per_s"] == 1000 and hostile["deliveries_per_s"] == 600
    results = {
        "machine": {},
        "isolation_alone": _median_of([_round(4.0, "none")]),
        "isolation_hostile": _median_of([_round(9.0, "hostile")]),
        "neighbour_alone": alone,
        "neighbour_hostile": hostile,
    }
    results["targets"] = _targets(results)
    table = render(results)
    rows = {line.split()[0]: line for line in table.splitlines() if line[:1].isalpha()}
    assert '"round_p99_ms": [9.0]' in rows["isolation_hostile"]
    assert '"neighbour": "hostile"' in rows["isolation_hostile"]
    assert '"round_deliveries_per_s": [500, 700]' in rows["neighbour_hostile"]
    assert "[MISSED] " + P99_HOSTILE in table
    assert "[MISSED] " + RATE_HOSTILE in table


def test_the_hostile_neighbour_has_one_webhook_per_path_with_a_short_timeout(
    tmp_path: Any,
) -> None:
    stage = Stage("127.0.0.1:9", tmp_path)
    hooks = stage.hostile_hooks()
    assert [h["url"].rsplit("/", 1)[1] for h in hooks] == [p.strip("/") for p in HOSTILE_PATHS]
    assert {h["account"] for h in hooks} == {"acct_hostile"}
    assert {h["timeout_seconds"] for h in hooks} == {1.0}
    assert len({h["id"] for h in hooks}) == len(HOSTILE_PATHS)
    early = stage.hostile_url("/early")
    assert early == f"http://127.0.0.1:{stage.hostile_early_port}/early"
    assert stage.hostile_url("/double").startswith(f"http://127.0.0.1:{stage.hostile_port}/")


def test_an_unknown_neighbour_is_refused_before_anything_starts(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="neighbour"):
        scenario_isolation(Stage("127.0.0.1:9", tmp_path), 1, 1, "noisy")


def test_quick_sizes_shrink_the_neighbour_backlog() -> None:
    assert Sizes().neighbour_backlog == 20_000 and QUICK.neighbour_backlog == 1_000


# ---- HTTPS (devtools.bench_https) ------------------------------------------------------------


@pytest.mark.parametrize("use_openssl", [False, True])
def test_the_run_certificate_is_trusted_through_its_ca_file_and_close_paths_close(
    tmp_path: Any, use_openssl: bool
) -> None:
    """The run's private CA (cryptography, or the openssl command) makes a certificate the
    receiver serves over TLS, which the bridge's client trusts through the CA file alone;
    ``/ok`` keeps the connection, ``/close`` answers Connection: close."""
    import asyncio
    import shutil

    from aiohttp import web

    from bridge.core.destinations import DestinationPolicy
    from bridge.core.webhook import TlsSettings
    from bridge.http.client import HttpClient, HttpError
    from bridge.http.resolver import SafeResolver
    from bridge.http.tls import make_context
    from devtools.bench_https import make_certificates
    from devtools.bench_receiver import BenchReceiver, make_app, server_context

    if use_openssl and shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    certs = make_certificates(tmp_path, use_openssl=use_openssl)
    assert certs.made_with == ("openssl" if use_openssl else "cryptography")
    receiver = BenchReceiver(0, str(tmp_path / "log.jsonl"))

    async def scenario() -> None:
        runner = web.AppRunner(make_app(receiver))
        await runner.setup()
        tls = server_context(str(certs.server_file))
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
        base = f"https://127.0.0.1:{runner.addresses[0][1]}"
        http = HttpClient(SafeResolver(DestinationPolicy(allow_private=True)))
        trusting = make_context(TlsSettings(ca_file=str(certs.ca_file)))
        try:
            assert await http.post(f"{base}/ok/a", {}, b"{}", 5, trusting) == 200
            assert http.idle_connections == 1  # kept alive
            assert await http.post(f"{base}/close/a", {}, b"{}", 5, trusting) == 200
            assert http.idle_connections == 0  # that connection was closed after the answer
            with pytest.raises(HttpError) as caught:  # the system store alone does not trust it
                await http.post(f"{base}/ok/a", {}, b"{}", 5)
            assert caught.value.kind == "tls_error"
        finally:
            await http.close()
            await runner.cleanup()

    asyncio.run(scenario())
    assert receiver.received == 2
    assert [entry[1] for entry in receiver.log] == ["/ok/a", "/close/a"]


def test_https_webhooks_trust_the_run_ca_by_configuration(tmp_path: Any) -> None:
    from devtools.bench_https import Certificates, TlsReceiver, connection_path

    certs = Certificates(tmp_path / "ca.pem", tmp_path / "server.pem", "cryptography")
    receiver = TlsReceiver(Stage("127.0.0.1:9", tmp_path), certs)
    hook = receiver.hook("h", connection_path(True, "x"))
    assert hook["url"] == f"https://127.0.0.1:{receiver.port}/close/x"
    assert hook["tls_ca_file"] == str(tmp_path / "ca.pem")
    assert connection_path(False, "x") == "/ok/x"
    assert receiver.port != receiver.stage.receiver_port


@pytest.mark.parametrize("close", [False, True])
def test_the_raw_https_loops_run_on_both_tls_layers_against_a_real_receiver(
    tmp_path: Any, close: bool
) -> None:
    """The raw ceiling is measured for the bridge's client on uvloop's TLS transport and on
    asyncio's (the layers the bridge could use): each loop really runs on its loop and every one
    of its requests reaches the benchmark's TLS receiver."""
    from bridge.core.mapping import to_notification
    from devtools.bench_https import LOOPS, TlsReceiver, make_certificates, scenario_raw_https
    from devtools.samples import make_record

    stage = Stage("127.0.0.1:9", tmp_path)
    receiver = TlsReceiver(stage, make_certificates(tmp_path / "tls"))
    receiver.start(0)
    body = to_notification(make_record("tx-raw", "acct")).body
    try:
        for loop in LOOPS:
            result = scenario_raw_https(receiver, 40, body, close, "bridge", loop)
            assert (result["loop"], result["requests"]) == (loop, 40)
            assert result["requests_per_s"] > 0 and result["cpu_per_1000_s"] > 0
            # the scenario ends with the receiver's dump: its log holds this run's requests
            log = (tmp_path / "receiver.jsonl").read_text().splitlines()
            answered = [json.loads(line) for line in log]
            assert len(answered) == 40 and {entry[3] for entry in answered} == {200}
    finally:
        stage.stop_receiver()


def test_https_rounds_keep_their_median_spread_and_rounds() -> None:
    from devtools.bench_https import with_spread

    rounds = [{"connection": "close", "deliveries_per_s": rate} for rate in (300, 500, 400)]
    summary = with_spread(rounds, ("deliveries_per_s",))
    assert summary["deliveries_per_s"] == 400
    assert summary["spread"] == {"deliveries_per_s": [300, 500]}
    assert summary["connection"] == "close" and summary["rounds"] == rounds
    assert '"round_deliveries_per_s": [300, 500, 400]' in render({"machine": {}, "x": summary})


def test_https_targets() -> None:
    from devtools.bench_https import HTTPS_QUICK, HTTPS_TARGETS, HttpsSizes

    results: dict[str, dict[str, float]] = {
        "raw_https_keepalive": {"requests_per_s": 10_000},
        "https_keepalive": {"deliveries_per_s": 8_000},
        "raw_https_close": {"requests_per_s": 1_000},
        "https_close": {"deliveries_per_s": 799},
        "https_churn": {"peak_rss_mb": 149.9},
    }
    verdicts = {name: check(results) for name, check in HTTPS_TARGETS.items()}
    assert list(verdicts.values()) == [True, False, True]
    results["https_churn"]["peak_rss_mb"] = 150.0
    assert not HTTPS_TARGETS["peak RSS under TLS connection churn < 150 MB"](results)
    assert HttpsSizes().churn_records == 100_000 and HttpsSizes().rounds == 3
    assert HTTPS_QUICK.churn_records < HttpsSizes().churn_records


def test_peer_backlogs_fail_one_record_in_ten_and_count_the_healthy_ones() -> None:
    from devtools.bench_peers import FAIL_EVERY, _accounts, _healthy_done

    accounts = _accounts(200, failing=True)
    assert accounts.count("acct_fail") == 200 // FAIL_EVERY
    assert set(_accounts(50, failing=False)) == {"acct_ok"}
    log = [(10.0, "/ok/x", "m1", 200), (12.5, "/fail/x", "m2", 500), (11.0, "/ok/x", "m3", 200)]
    assert _healthy_done(log, started=9.0) == (2, 2.0)
    assert _healthy_done([], started=9.0) == (0, 0.0)


def test_the_benchmarks_broker_keeps_its_state_in_memory_when_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = tmp_path / "shm"
    memory.mkdir()
    monkeypatch.setattr(bench, "SHARED_MEMORY", memory)
    broker = bench.bench_broker("bench-broker")
    assert broker.home == memory / "bridge-bench-broker"
    assert bench.broker_state(broker) == "memory"
    (broker.home / "data").mkdir(parents=True)
    monkeypatch.setattr(type(broker), "stop", lambda self: None)  # (never started)
    bench.stop_bench_broker(broker)
    assert not broker.home.exists(), "a broker kept in memory gives the memory back"
    monkeypatch.setattr(bench, "BROKER_MEMORY_BYTES", shutil.disk_usage(memory).free + (1 << 40))
    on_disk = bench.bench_broker("bench-broker")
    assert on_disk.home == bench.CACHE / "bench-broker"
    assert bench.broker_state(on_disk) == "disk"
    monkeypatch.setattr(bench, "BROKER_MEMORY_BYTES", 0)
    monkeypatch.setattr(bench, "SHARED_MEMORY", tmp_path / "missing")  # (no /dev/shm at all)
    assert bench.broker_state(bench.bench_broker("bench-broker")) == "disk"
