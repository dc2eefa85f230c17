"""The dashboard's and the alerts' queries against a real Prometheus scraping a real bridge.

A bridge delivers to one healthy webhook and one that always answers 503 (so deliveries fail, go
through the retry ladder and end as dead letters); a Prometheus process scrapes it every second and
evaluates ``deploy/prometheus/alerts.yaml``. Every panel, variable and alert query must evaluate
without error, and the key panels must show the traffic: which webhook fails and since when, by
webhook for the tracked webhooks (both here) beside the ``(other)`` series of the rest.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from bridge.ops.metrics import OTHER
from devtools.samples import make_record
from tests.bridge_harness import BridgeProcess, BridgeSetup, webhook
from tests.kafka_helpers import wait_for
from tests.prometheus_server import JOB, Prometheus
from tests.receiver import Receiver, always
from tests.unit.test_prometheus_rules import (
    dashboard_panels,
    dashboard_variables,
    label_values_as_promql,
    load_alert_rules,
    variable_query,
)

pytestmark = pytest.mark.integration

RANGE = "30s"  # stands for Grafana's $__rate_interval, $__interval and $__range
WHOLE_TEST = "10m"  # a range covering all the traffic of the test, for checking values
RECORDS = 4
# Panels that must show data once deliveries have succeeded, failed, retried and dead-lettered.
KEY_PANELS = {
    "Delivery rate by outcome",
    "Retries scheduled by rung",
    "Dead-letter rate by reason",
    "Request duration (p50, p95, p99)",
    "Consumer lag by partition",
    "Failing webhooks (failing for)",
    "Webhooks failing",
}


def grafana_to_promql(expr: str, window: str = RANGE) -> str:
    """A dashboard query as Grafana sends it with every selector on "All"."""
    query = re.sub(
        r"\$\{?(\w+)\}?", lambda m: window if m.group(1).startswith("__") else ".*", expr
    )
    assert "$" not in query, f"unsubstituted variable in {query!r}"
    return query


def labels_of(result: list[dict[str, Any]], label: str) -> set[str]:
    """The values of ``label`` across the series of a query result."""
    return {series["metric"].get(label, "") for series in result}


def check_health_endpoints(bridge: BridgeProcess) -> None:
    """``/healthz`` and ``/readyz`` answer 200 with their documented JSON bodies."""
    status, body = bridge.http("/healthz")
    assert status == 200, body
    health = json.loads(body)
    assert health["status"] == "ok"
    assert isinstance(health["loop_age_seconds"], int | float)
    wait_for(lambda: bridge.http("/readyz")[0] == 200, 30, message="/readyz to answer 200")
    ready = json.loads(bridge.http("/readyz")[1])
    assert ready["ready"] is True
    assert ready["checks"] and all(ready["checks"].values()), ready
    assert {"config_loaded", "broker_reachable", "consuming"} <= set(ready["checks"])


def test_dashboard_and_alert_queries_on_a_real_prometheus(
    receiver: Receiver,
    bridge_setup: Callable[..., BridgeSetup],
    prometheus: Callable[[BridgeProcess], Prometheus],
) -> None:
    receiver.behaviours["/down"] = always(503)
    setup = bridge_setup(
        [
            webhook("healthy", "acct_1", receiver.url("/healthy")),
            webhook("down", "acct_1", receiver.url("/down")),
        ],
        retry={"attempts": 2, "first_delay_ms": 200, "increment_ms": 100},
    )
    bridge = setup.start_bridge()
    check_health_endpoints(bridge)

    server = prometheus(bridge)
    wait_for(
        lambda: [s["value"][1] for s in server.query(f'up{{job="{JOB}"}}')] == ["1"],
        30,
        interval=0.5,
        message="Prometheus to scrape the bridge (up == 1)",
    )

    def deliver_wave(wave: int) -> None:
        setup.produce_records([make_record(f"tx-obs-{wave}-{i}", "acct_1") for i in range(RECORDS)])
        wait_for(
            lambda: len(receiver.received_ids("/healthy")) == wave * RECORDS,
            30,
            message=f"wave {wave} of deliveries to the healthy webhook",
        )
        wait_for(
            lambda: server.query(
                f'sum(bridge_dead_letters_total{{job="{JOB}"}}) >= {wave * RECORDS}'
            ),
            60,
            interval=0.5,
            message=f"Prometheus to scrape wave {wave} of dead letters of the failing webhook",
        )

    # The bridge's labelled series appear with the first wave; Prometheus sees the second as
    # increases (rate() of a series first scraped at its final value is 0).
    deliver_wave(1)
    deliver_wave(2)

    panels = {panel["title"]: panel for panel in dashboard_panels()}
    assert set(panels) >= KEY_PANELS

    def key_panels_have_data() -> bool:
        lag = server.query(
            grafana_to_promql(panels["Consumer lag by partition"]["targets"][0]["expr"])
        )
        return setup.source in labels_of(lag, "topic") and all(
            server.query(grafana_to_promql(target["expr"]))
            for title in KEY_PANELS
            for target in panels[title]["targets"]
        )

    wait_for(
        key_panels_have_data,
        60,
        interval=0.5,
        message=f"data in the key panels {sorted(KEY_PANELS)}",
    )

    results = {
        (title, target["refId"]): server.query(grafana_to_promql(target["expr"]))
        for title, panel in panels.items()
        for target in panel["targets"]
    }
    by_outcome = results[("Delivery rate by outcome", "A")]
    assert labels_of(by_outcome, "outcome") == {"received", "failed"}
    assert {"2xx", "5xx"} <= labels_of(by_outcome, "status_class")
    assert labels_of(results[("Retries scheduled by rung", "A")], "rung") == {"1", "2"}
    assert labels_of(results[("Dead-letter rate by reason", "A")], "reason") == {
        "retries_exhausted"
    }
    for ref in "ABC":
        durations = results[("Request duration (p50, p95, p99)", ref)]
        assert labels_of(durations, "webhook") == {"healthy", "down", OTHER}
    # Which webhooks fail and since when: the failing one only, failing since its first attempt.
    failing = results[("Failing webhooks (failing for)", "A")]
    assert labels_of(failing, "webhook") == {"down"}
    assert 0 < float(failing[0]["value"][1]) < 600
    assert [s["value"][1] for s in results[("Webhooks failing", "A")]] == ["1"]
    assert [s["value"][1] for s in results[("Webhooks failing", "B")]] == ["1"]
    assert setup.source in labels_of(results[("Consumer lag by partition", "A")], "topic")
    ratios = {
        series["metric"]["webhook"]: float(series["value"][1])
        for series in server.query(
            grafana_to_promql(panels["Success ratio per webhook"]["targets"][0]["expr"], WHOLE_TEST)
        )
        if not math.isnan(float(series["value"][1]))  # (other) had no traffic: 0 / 0
    }
    assert ratios == {"healthy": 1.0, "down": 0.0}, "a webhook that never receives shows 0%"

    for variable in dashboard_variables():
        if variable["type"] == "query":
            query, label = label_values_as_promql(grafana_to_promql(variable_query(variable)))
            values = labels_of(server.query(query), label)
            assert values, f"variable {variable['name']} has no values"
            if label == "webhook":
                assert values == {"healthy", "down", OTHER}

    for rule in load_alert_rules():
        server.query(rule["expr"])  # fails on any evaluation error

    def rules_evaluated() -> list[dict[str, Any]]:
        groups = server.api("rules")["groups"]
        rules: list[dict[str, Any]] = [rule for group in groups for rule in group["rules"]]
        return rules if all(rule["health"] != "unknown" for rule in rules) else []

    rules = wait_for(
        rules_evaluated, 30, interval=0.5, message="Prometheus to evaluate every alert rule"
    )
    assert {rule["name"] for rule in rules} == {rule["alert"] for rule in load_alert_rules()}
    assert all(rule["health"] == "ok" for rule in rules), [
        (rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"
    ]

    firing = wait_for(
        lambda: server.alerts("BridgeDeadLetters", "firing"),
        30,
        interval=0.5,
        message="BridgeDeadLetters to fire",
    )
    assert {alert["labels"]["reason"] for alert in firing} == {"retries_exhausted"}
    assert firing[0]["annotations"]["runbook_url"].endswith("#bridgedeadletters")
