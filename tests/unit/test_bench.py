"""The benchmark's pure helpers: summaries of repeated rounds and the table."""

from __future__ import annotations

from bridge.bench import THROUGHPUT_KEYS, _median_of, render


def _round(p99: float, hung: bool = True) -> dict[str, object]:
    return {
        "hung_beside": hung,
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
    assert summary["hung_beside"] is True
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
            "peak_rss_mb": 90.0,
        },
        {
            "records": 10,
            "metrics": True,
            "seconds": 1.0,
            "deliveries_per_s": 10,
            "peak_rss_mb": 99.0,
        },
    ]
    summary = _median_of(rounds, THROUGHPUT_KEYS)
    assert summary["deliveries_per_s"] == 7.5
    assert summary["metrics"] is True and summary["records"] == 10
    table = render({"machine": {}, "throughput": summary})
    assert '"round_deliveries_per_s": [5, 10]' in table
