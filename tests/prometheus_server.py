"""A real Prometheus server on loopback for the integration tests: it scrapes one bridge every
second and evaluates the alert rules (``deploy/prometheus/alerts.yaml`` unless told otherwise)."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from devtools.devkafka import free_port
from tests.kafka_helpers import wait_for
from tests.unit.test_prometheus_rules import ALERTS, prometheus_tool

JOB = "transaction-webhook-bridge"  # the scrape job the alert rules expect


class Prometheus:
    """A Prometheus server process on loopback, scraping the bridge and evaluating the alerts."""

    def __init__(
        self, workdir: Path, target_port: int, rule_files: tuple[Path, ...] = (ALERTS,)
    ) -> None:
        binary = prometheus_tool("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"  # (one server per folder)
        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        "evaluation_interval": "1s",
                    },
                    "rule_files": [str(path) for path in rule_files],
                    "scrape_configs": [
                        {
                            "job_name": JOB,
                            "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                        }
                    ],
                }
            )
        )
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )

    def wait_ready(self) -> None:
        """Wait until the server answers ``/-/ready`` (it has loaded its configuration)."""
        wait_for(self._ready, 30, message=f"Prometheus to be ready (log: {self.log_path})")

    def _ready(self) -> bool:
        self._check_alive()
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            log = self.log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(f"Prometheus exited with {self.process.returncode}:\n{log}")

    def api(self, path: str, **params: str) -> Any:
        """GET an HTTP API path; returns ``data``, fails with Prometheus's error message."""
        self._check_alive()
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {params}: {body}"
        assert not body.get("warnings"), f"{path} {params}: {body['warnings']}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Evaluate an instant query; fails on any error or warning."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data}"
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        """SIGTERM, wait, and SIGKILL if it does not stop."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def alerts(self, name: str, state: str | None = None) -> list[dict[str, Any]]:
        """The active alerts named ``name`` (pending or firing; only ``state`` if given)."""
        return [
            alert
            for alert in self.api("alerts")["alerts"]
            if alert["labels"]["alertname"] == name and state in (None, alert["state"])
        ]


QUICK = "quick"
"""The ``copy`` label of an alert in a :func:`quick_copy` (to tell it from the real one)."""


def quick_copy(folder: Path, alert: str, wait: str) -> Path:
    """A rule file holding only ``alert`` of the real rules, with ``for: wait`` and the label
    ``copy="quick"``: a test sees its expression fire in the real Prometheus without waiting its
    real ``for`` (whose timing promtool's unit tests check)."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"] if rule.get("alert") == alert]
    assert len(rules) == 1, f"no single alert {alert} in {ALERTS}"
    rule = {**rules[0], "for": wait, "labels": {**rules[0].get("labels", {}), "copy": QUICK}}
    path = folder / f"{alert}-quick.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": f"{alert} quick", "rules": [rule]}]}))
    return path
