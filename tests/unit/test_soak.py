"""The soak's pure parts: slopes, p99 buckets, the verdict, the schedule, the ledger."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bridge.core.mapping import EVENT_SUCCESS as SUCCESS
from bridge.core.signing import message_id
from devtools.soak import (
    EXTRA,
    HOOKS,
    SoakLedger,
    classify_fds,
    effective_warmup,
    judge,
    level_step,
    mix_pattern,
    p99_buckets,
    parse_proc_net_tcp,
    pooled_slope_per_hour,
    reload_variant,
    render,
    schedule,
    slope_per_hour,
    steady_segments,
)


def test_slope_is_per_hour_and_least_squares() -> None:
    # +1 MB a minute is +60 MB an hour, whatever the noise around the line.
    points = [(60.0 * m, 100.0 + m + (0.5 if m % 2 else -0.5)) for m in range(11)]
    assert slope_per_hour(points) == pytest.approx(60.0, abs=3.0)
    assert slope_per_hour([(t, 42.0) for t in range(0, 600, 10)]) == 0.0
    assert slope_per_hour([(0.0, 1.0), (10.0, 2.0)]) is None  # too few samples
    assert slope_per_hour([(5.0, 1.0)] * 5) is None  # no time between them


def test_a_step_at_the_restart_is_not_a_trend() -> None:
    samples = [{"t_s": t, "rss_mb": 100.0 + (6.0 if t > 900 else 0.0)} for t in range(0, 1800, 10)]
    naive = slope_per_hour([(s["t_s"], s["rss_mb"]) for s in samples if s["t_s"] >= 180])
    assert naive is not None and naive > 10  # the step alone would fail the limit
    segments = steady_segments(samples, "rss_mb", 180, (900.0, 960.0))
    assert segments[0][0] == (180.0, 100.0) and segments[0][-1] == (890.0, 100.0)
    assert segments[1][0] == (970.0, 106.0)
    assert pooled_slope_per_hour(segments) == 0.0
    assert level_step(segments) == 6.0
    # a real trend on both sides is still found, whatever the step
    growing = [
        [(t, t / 360 + shift) for t in range(start, start + 600, 10)]
        for start, shift in ((0, 0.0), (900, 50.0))
    ]
    assert pooled_slope_per_hour(growing) == pytest.approx(10.0)
    assert steady_segments(samples, "rss_mb", 1700, None) == [
        [(float(t), 106.0) for t in range(1700, 1800, 10)]
    ]
    assert level_step([[(0.0, 1.0)]]) is None


def test_descriptors_are_told_apart_by_kind() -> None:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt uid ..."
    rows = [  # (local, remote, state, inode) with the other fields shortened
        ("0100007F:1F90", "00000000:0000", "0A", "111"),  # listening on 8080
        ("0100007F:C350", "0100007F:2384", "01", "222"),  # 50000 -> 9092
        ("0100007F:C351", "0100007F:0050", "01", "333"),  # 50001 -> 80
        ("0100007F:1F90", "0100007F:D000", "01", "444"),  # 8080 <- 53248
    ]
    table = "\n".join(
        [header]
        + [
            f"{n}: {lo} {re} {st} 0:0 0:0 0 1000 0 {inode} 1"
            for n, (lo, re, st, inode) in enumerate(rows)
        ]
    )
    sockets = parse_proc_net_tcp(table)
    assert sockets["111"] == (8080, 0, "0A") and sockets["222"] == (50000, 9092, "01")
    targets = [f"socket:[{inode}]" for inode in ("111", "222", "333", "444", "999")]
    targets += ["pipe:[5]", "pipe:[6]", "anon_inode:[eventfd]", "/dev/null"]
    kinds = classify_fds(targets, sockets, {9092: "broker", 8080: "metrics"})
    assert kinds == {
        "eventfd": 1,
        "file": 1,
        "pipe": 2,
        "socket-other": 1,
        "tcp-broker": 1,
        "tcp-metrics": 2,  # the listening socket and a scrape's connection
        "tcp-other": 1,
    }


def test_warmup_is_at_most_thirty_percent_of_a_short_run() -> None:
    assert effective_warmup(1800, 180) == 180
    assert effective_warmup(180, 180) == pytest.approx(54)


def test_p99_buckets_group_by_arrival_per_webhook() -> None:
    deliveries = [(float(at), "healthy", 0.010) for at in range(0, 300)]
    deliveries += [(299.0, "healthy", 0.500)]  # 1 in 301: above the p99 rank
    deliveries += [(310.0, "healthy", 0.020), (320.0, "slow", 1.0), (400.0, "dead", 9.0)]
    buckets = p99_buckets(deliveries, 300, ("healthy", "slow"))
    assert [(b["from_min"], b["to_min"]) for b in buckets] == [(0, 5), (5, 10)]
    assert buckets[0]["healthy"] == {"count": 301, "p99_ms": 10.0}
    assert buckets[0]["slow"] == {"count": 0, "p99_ms": None}
    assert buckets[1]["healthy"] == {"count": 1, "p99_ms": 20.0}
    assert buckets[1]["slow"] == {"count": 1, "p99_ms": 1000.0}
    assert "dead" not in buckets[1]


def test_verdict_needs_no_losses_and_flat_slopes() -> None:
    assert judge(0, 2.0, 10.0) == []
    assert judge(0, -30.0, -100.0) == []  # shrinking is flat enough
    failures = judge(3, 12.0, 50.0)
    assert failures == [
        "3 pair(s) lost",
        "RSS grows 12.0 MB/h (limit 10)",
        "file descriptors grow 50.0/h (limit 50)",
    ]
    assert len(judge(0, None, None)) == 2  # unknown is not flat
    assert judge(0, 1.0, 1.0, bridge_exit=1) == ["the bridge exited with 1 during the soak"]


def test_schedule_keeps_reloads_away_from_the_restart() -> None:
    events = schedule(1800, 10, 300, restart=True)
    assert sum(1 for _, what in events if what == "sample") == 180
    assert [t for t, what in events if what == "reload"] == [150, 450, 750, 1050, 1350, 1650]
    assert [t for t, what in events if what == "restart"] == [900]
    assert events == sorted(events)
    assert not any(what == "restart" for _, what in schedule(180, 10, 45, restart=False))


def test_mix_covers_each_account_its_share() -> None:
    pattern = mix_pattern()
    assert len(pattern) == 100
    assert Counter(hook.id for hook in pattern) == {hook.id: hook.share for hook in HOOKS}
    assert {hook.id for hook in pattern[:20]} == {hook.id for hook in HOOKS}  # spread out


def test_reloads_toggle_extra_and_change_a_timeout() -> None:
    document: dict[str, Any] = {
        "retry": {"attempts": 5},
        "webhooks": [
            {"id": "slow", "timeout_seconds": 5.0},
            {"id": EXTRA, "enabled": False},
            {"id": "healthy"},
        ],
    }
    first, second = reload_variant(document, 1), reload_variant(document, 2)
    assert first["webhooks"] == [
        {"id": "slow", "timeout_seconds": 4.0},
        {"id": EXTRA, "enabled": True},
        {"id": "healthy"},
    ]
    assert second["webhooks"][:2] == [
        {"id": "slow", "timeout_seconds": 5.0},
        {"id": EXTRA, "enabled": False},
    ]
    assert document["webhooks"][1] == {"id": EXTRA, "enabled": False}  # not changed in place


def _ledger() -> tuple[SoakLedger, dict[str, str]]:
    ledger = SoakLedger()
    by_id = {hook.id: hook for hook in HOOKS}
    mids = {}
    for n, name in enumerate(("healthy", "flaky", "dead", "hung", "slow")):
        mids[name] = ledger.expect(n, f"tx-{n}", by_id[name])
        ledger.appended[n] = 100.0
    return ledger, mids


def test_ledger_counts_receipts_dead_letters_losses_and_duplicates() -> None:
    ledger, mids = _ledger()
    assert mids["healthy"] == message_id("tx-0", SUCCESS, "healthy")
    firsts = ledger.take_requests(
        [
            (100.01, "/ok/healthy", mids["healthy"], 200),
            (100.02, "/retry/flaky", mids["flaky"], 500),
            (101.00, "/retry/flaky", mids["flaky"], 200),
            (101.50, "/ok/healthy", mids["healthy"], 200),  # a duplicate
            (100.10, "/fail/dead", mids["dead"], 500),
            (100.20, "/hang/hung", mids["hung"], 0),
            (100.30, "/ok/extra", message_id("tx-0", SUCCESS, EXTRA), 200),
            (100.40, "/ok/nobody", "msg_unknown", 200),
        ],
        start=90.0,
    )
    assert [(round(at, 2), hook, round(lat, 2)) for at, hook, lat in firsts] == [
        (10.01, "healthy", 0.01),
        (11.0, "flaky", 1.0),
    ]
    ledger.take_letters(
        [
            (mids["dead"], "dead", "delivery"),
            (mids["hung"], "hung", "delivery"),
            ("msg_x", EXTRA, "delivery"),
            ("msg_y", "healthy", "delivery"),
        ]
    )
    assert ledger.lost() == [mids["slow"]]
    outcome = ledger.outcome()
    assert outcome["pairs"] == 5 and outcome["records"] == 5
    assert outcome["received"] == 2 and outcome["deliveries"] == 3
    assert outcome["dead_lettered"] == 2 and outcome["losses"] == 1
    assert outcome["duplicates"] == 1 and outcome["unexpected_outcomes"] == 0
    assert outcome["extra_requests_ignored"] == 1 and outcome["extra_letters_ignored"] == 1
    assert outcome["strange_requests"] == 1 and outcome["strange_letters"] == 1
    assert outcome["by_webhook"]["flaky"]["requests"] == 2
    assert outcome["by_webhook"]["slow"]["lost"] == 1

    ledger.produce_failed.add(4)  # the slow record's produce failed: not counted as lost
    assert ledger.lost() == []
    assert ledger.outcome()["unsure"] == 1


def test_ledger_flags_an_outcome_its_webhook_cannot_give() -> None:
    ledger, mids = _ledger()
    ledger.take_letters([(mids["healthy"], "healthy", "delivery")])
    assert ledger.outcome()["by_webhook"]["healthy"]["unexpected"] == 1


def test_render_says_the_verdict() -> None:
    ledger, _ = _ledger()
    results = {
        "settings": {
            "minutes": 3,
            "rate_per_s": 100,
            "mix_per_100": {},
            "broker": "own",
            "warmup_s": 54,
            "bucket_min": 5,
        },
        "produced": 5,
        "produce_errors": 0,
        "producer_behind_max_ms": 1.0,
        "ledger": ledger.outcome(),
        "settled_after_s": 12.5,
        "rss_mb": {"first": 80, "after_warmup": 82, "last": 82, "max": 83, "slope_per_h": 1.5},
        "fds": {
            "first": 30,
            "after_warmup": 31,
            "last": 31,
            "max": 33,
            "slope_per_h": None,
            "step_at_restart": 2.0,
            "slope_per_h_across_restart": 40.0,
            "kinds_at_max": {"pipe": 3},
            "kinds_last": {"pipe": 2},
        },
        "p99_buckets": p99_buckets([(1.0, "healthy", 0.01)], 300, ("healthy",)),
        "consumer_lag_end": {"total": 0, "behind": {}, "partitions": 42},
        "broker_restart": {"at_s": 90, "restart_s": 20.5},
        "reloads": [{"at_s": 22.5, "applied_after_s": 0.4}],
        "bridge_exit": None,
        "verdict": {"passed": False, "failures": ["5 pair(s) lost"]},
    }
    text = render(results)
    assert "LOSSES 5" in text
    assert "+1.50 MB/h" in text and "slope unknown" in text
    assert "step at the broker restart +2 fds" in text and "{'pipe': 3}" in text
    assert "healthy 10.0 (n=1)" in text
    assert text.endswith("verdict: FAILED: 5 pair(s) lost")
