"""The alert rules, their promtool unit tests, the runbook and the Grafana dashboard in ``deploy/``.

Offline checks: promtool validates and unit-tests the rules, the PrometheusRule carries the same
groups as the plain rules file, every alert links to its runbook section, and every query of the
dashboard and of the alerts names only metrics the bridge exports. The integration test
``tests/integration/test_observability.py`` runs the same queries against a real Prometheus.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry

from bridge.ops.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yaml"
ALERT_TESTS = PROMETHEUS_DIR / "alerts.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "bridge-dashboard.json"
RUNBOOK = REPO / "docs" / "RUNBOOK.md"
DATASOURCE = "${datasource}"

# Series Prometheus makes itself rather than scraping them from the bridge.
PROMETHEUS_SERIES = {"up"}
# Metrics the dashboard must chart (issue 6: the panels an operator needs).
CHARTED = {
    "bridge_deliveries_total",
    "bridge_request_duration_seconds_bucket",
    "bridge_end_to_end_latency_seconds_bucket",
    "bridge_retries_scheduled_total",
    "bridge_dead_letters_total",
    "bridge_group_lag",
    "bridge_deliveries_in_flight",
    "bridge_paused_partitions",
    "bridge_config_reloads_total",
    "bridge_build_info",
    "bridge_retry_lateness_seconds_bucket",
    "bridge_record_failures_total",
    "bridge_webhooks_failing",  # which webhooks fail and since when (issue 23)
    "bridge_webhook_failing_since_timestamp_seconds",
    "up",
}
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
}
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


# ---- helpers shared with the integration test ---------------------------------------------------


def load_alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of ``alerts.yaml``."""
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def load_dashboard() -> dict[str, Any]:
    """The Grafana dashboard as JSON."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def dashboard_panels() -> list[dict[str, Any]]:
    """The dashboard's panels that query data (rows excluded, nested row panels included)."""
    panels: list[dict[str, Any]] = []
    for panel in load_dashboard()["panels"]:
        if panel["type"] == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def dashboard_variables() -> list[dict[str, Any]]:
    """The dashboard's template variables."""
    variables: list[dict[str, Any]] = load_dashboard()["templating"]["list"]
    return variables


def variable_query(variable: dict[str, Any]) -> str:
    """The query text of a query variable (Grafana stores it as a string or an object)."""
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def label_values_as_promql(query: str) -> tuple[str, str]:
    """``label_values(selector, label)`` as an equivalent PromQL query, and the label."""
    match = LABEL_VALUES.match(query.strip())
    assert match, f"variable query {query!r} is not label_values(selector, label)"
    return f"group by ({match['label']}) ({match['selector']})", match["label"]


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (Grafana variables allowed in matchers and ranges)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.$])[A-Za-z_:][\w:]*", text):
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if match.group().lower() not in PROMQL_KEYWORDS:
            names.add(match.group())
    return names


def exported_metric_names() -> set[str]:
    """Every sample name the bridge can export, from its metrics on a fresh registry."""
    registry = CollectorRegistry()
    Metrics(registry)
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum"),
        "summary": ("", "_count", "_sum"),
        "info": ("_info",),
    }
    return {
        family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]
    }


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub generates for the headings of a Markdown document."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def prometheus_tool(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; fails (never skips) with how to install it when
    it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: run `sh deploy/prometheus/ensure-prometheus.sh` "
            "(installs Debian's prometheus package, which provides promtool and prometheus)",
            pytrace=False,
        )
    return path


def promtool() -> str:
    """Path of promtool (see :func:`prometheus_tool`)."""
    return prometheus_tool("promtool")


# ---- the rules --------------------------------------------------------------------------------


def run_promtool(*args: str) -> None:
    """Run promtool from the repository's top folder; fail with its output if it fails."""
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, cwd=REPO, timeout=120, check=False
    )
    assert result.returncode == 0, (
        f"promtool {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
    )


def test_alert_rules_are_valid_for_promtool() -> None:
    run_promtool("check", "rules", str(ALERTS.relative_to(REPO)))


def test_alert_rules_pass_their_promtool_unit_tests() -> None:
    run_promtool("test", "rules", str(ALERT_TESTS.relative_to(REPO)))


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = [
        case
        for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for rule in load_alert_rules():
        own = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in own), f"{rule['alert']}: no firing case"
        assert any(not case["exp_alerts"] for case in own), f"{rule['alert']}: no quiet case"


def test_every_alert_is_documented_in_the_runbook() -> None:
    anchors = github_anchors(RUNBOOK.read_text())
    rules = load_alert_rules()
    assert {rule["alert"] for rule in rules} >= {
        "BridgeDeadLetters",
        "BridgeWebhookSuccessRatioLow",
        "BridgeWebhookFailing",
        "BridgeConsumerLagHigh",
        "BridgeConsumerLagGrowing",
        "BridgeNotConsuming",
        "BridgeInstanceDown",
        "BridgeKafkaUnreachable",
        "BridgeConfigReloadRejected",
    }
    for rule in rules:
        name = rule["alert"]
        annotations = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            assert annotations.get(key, "").strip(), f"{name}: annotation {key!r} is missing"
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, name
        link = urlsplit(annotations["runbook_url"])
        assert link.path.endswith("docs/RUNBOOK.md"), f"{name}: runbook_url {link.geturl()!r}"
        assert link.fragment in anchors, f"{name}: no section #{link.fragment} in docs/RUNBOOK.md"
        assert link.fragment == name.lower(), f"{name}: links to the section of another alert"


# ---- the dashboard ----------------------------------------------------------------------------


def test_dashboard_is_importable_with_a_datasource_variable() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    variables = {variable["name"]: variable for variable in dashboard_variables()}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    webhook = variables["webhook"]
    assert webhook["multi"] and webhook["includeAll"]
    assert label_values_as_promql(variable_query(webhook))[1] == "webhook"
    assert "bridge_deliveries_total" in variable_query(webhook)
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == DATASOURCE, variable["name"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_panel_and_target_uses_the_datasource_variable() -> None:
    panels = dashboard_panels()
    assert len(panels) >= 12
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_metric_names_are_read_from_expressions() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{job=~"$job", x="b c"}'
        "[$__rate_interval]))) / on (job) group_left b offset 5m > bool 0.5 unless"
        ' deriv(c[10m:1m]) or vector(1) and absent(up{job="d"})'
    )
    assert metric_names(expr) == {"a_bucket", "b", "c", "up"}


def test_dashboard_and_alerts_use_only_metrics_the_bridge_exports() -> None:
    exported = exported_metric_names() | PROMETHEUS_SERIES
    assert "bridge_deliveries_total" in exported
    assert "bridge_request_duration_seconds_bucket" in exported
    alerts = {f"alert {rule['alert']}": rule["expr"] for rule in load_alert_rules()}
    panels = {
        f"panel {panel['title']!r} {target['refId']}": target["expr"]
        for panel in dashboard_panels()
        for target in panel["targets"]
    }
    variables = {
        f"variable {variable['name']}": label_values_as_promql(variable_query(variable))[0]
        for variable in dashboard_variables()
        if variable["type"] == "query"
    }
    charted: set[str] = set()
    for where, expr in {**alerts, **panels, **variables}.items():
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= exported, f"{where}: not exported by the bridge: {names - exported}"
        if where in panels:
            charted |= names
    assert charted >= CHARTED, f"the dashboard does not chart {CHARTED - charted}"
