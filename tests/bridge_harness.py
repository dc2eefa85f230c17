"""Run the real bridge (``python -m bridge run``) as a process against the real broker."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient

from bridge.codec.encoding import load_schema_file
from bridge.config.loader import load_config
from bridge.kafka.topics import apply_plan, plan_topics
from bridge.ops.health import RENDERED_HEADER
from devtools.devkafka import free_port
from devtools.samples import encode_records
from tests.kafka_helpers import QUIET, consume, produce, unique_name, wait_for

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema_file(REPO / "schemas" / "transaction_outcome.avsc")


def secret_of(hook_id: str) -> str:
    """The test secret of a webhook: made from its id by a hash, so that it holds no part of the
    id (the loader refuses a shown field holding 16 characters of a secret in a row)."""
    return "secret-" + hashlib.sha256(hook_id.encode()).hexdigest()[:24]


def webhook(hook_id: str, account: str, url: str, **extra: Any) -> dict[str, Any]:
    """A webhook entry of the test configuration."""
    return {
        "id": hook_id,
        "account": account,
        "url": url,
        "events": ["transaction.success", "transaction.failed"],
        "secret": secret_of(hook_id),
        **extra,
    }


@dataclass
class BridgeSetup:
    """One test's topics, consumer group and configuration file, and the bridges it runs."""

    bootstrap: str
    workdir: Path
    webhooks: list[dict[str, Any]]
    partitions: int = 3
    retry: dict[str, Any] = field(default_factory=dict)
    delivery: dict[str, Any] = field(default_factory=dict)
    schemas: dict[str, Any] = field(default_factory=dict)
    kafka: dict[str, Any] = field(default_factory=dict)
    topics: dict[str, Any] = field(default_factory=dict)
    source: str = field(default_factory=lambda: unique_name("tx"))
    group: str = field(default_factory=lambda: unique_name("bridge"))
    processes: list[BridgeProcess] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the bridge processes (and of loading the file), e.g. KAFKA_*."""

    @property
    def config_path(self) -> Path:
        return self.workdir / "bridge.yaml"

    def write_config(self, webhooks: list[dict[str, Any]] | None = None) -> Path:
        """Write (or rewrite, for reload tests) the configuration file atomically."""
        if webhooks is not None:
            self.webhooks = webhooks
        document = {
            "kafka": {"bootstrap_servers": self.bootstrap, "group_id": self.group, **self.kafka},
            "schemas": {"mode": "embedded", "directory": str(REPO / "schemas"), **self.schemas},
            "topics": {"source": self.source, "partitions": self.partitions, **self.topics},
            "retry": {"attempts": 5, "first_delay_ms": 500, "increment_ms": 500, **self.retry},
            "delivery": {
                "timeout_seconds": 2.0,
                "allow_private_networks": True,
                "shutdown_grace_seconds": 5.0,
                **self.delivery,
            },
            "metrics": {"host": "127.0.0.1", "port": 0},
            "logging": {"format": "json", "level": "info"},
            "webhooks": self.webhooks,
        }
        temporary = self.config_path.with_suffix(".tmp")
        temporary.write_text(yaml.safe_dump(document, sort_keys=False))
        temporary.replace(self.config_path)
        return self.config_path

    def create_topics(self) -> None:
        """Create the source, delay and dead-letter topics the configuration names."""
        config = load_config(self.write_config(), {**os.environ, **self.env})
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **QUIET})
        apply_plan(admin, plan_topics(config))

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.source}.dlq"

    def delay_topic(self, rung: int) -> str:
        return f"{self.source}.retry.{rung}"

    def start_bridge(self, wait_assigned: bool = True, output: int | None = None) -> BridgeProcess:
        """Start one bridge process; by default wait until it has partitions assigned.
        ``output``: a file descriptor for its stdout and stderr instead of its log file."""
        process = BridgeProcess(
            self.config_path, self.workdir / f"bridge-{len(self.processes)}.log", self.env
        )
        self.processes.append(process)
        process.start(wait_assigned=wait_assigned, output=output)
        return process

    def produce_records(self, records: list[dict[str, Any]]) -> None:
        """Produce records (plain Avro, keyed by transaction id) to the source topic."""
        for record, value in zip(records, encode_records(SCHEMA, records), strict=True):
            produce(self.bootstrap, self.source, [value], key=record["transactionId"].encode())

    def produce_raw(self, values: list[bytes]) -> None:
        """Produce raw values (for poison records) to the source topic."""
        produce(self.bootstrap, self.source, values)

    def dead_letters(self, count: int, timeout: float = 30.0) -> list[Message]:
        """Read ``count`` records of the dead-letter topic."""
        return consume(self.bootstrap, self.dead_letter_topic, count, timeout=timeout)

    def stop_all(self) -> None:
        for process in self.processes:
            process.terminate()


def setups(bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., BridgeSetup]]:
    """The body of a ``bridge_setup`` fixture: makes set-ups (own topics, group, config) on
    ``bootstrap`` for webhooks, and stops their bridges at the end."""
    made: list[BridgeSetup] = []

    def make(webhooks: list[dict[str, Any]], **options: Any) -> BridgeSetup:
        setup = BridgeSetup(bootstrap, tmp_path, webhooks, **options)
        setup.create_topics()
        made.append(setup)
        return setup

    yield make
    for setup in made:
        setup.stop_all()


class BridgeProcess:
    """One ``python -m bridge run`` process with its log file and metrics port."""

    def __init__(
        self, config_path: Path, log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.env = dict(env or {})
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(
        self, wait_assigned: bool = True, timeout: float = 60.0, output: int | None = None
    ) -> None:
        """Start the process; by default wait until it has partitions assigned. ``output``: a
        file descriptor for its stdout and stderr instead of its log file."""
        text = self.config_path.read_text().replace("port: 0", f"port: {self.port}")
        own_config = self.log_path.with_suffix(".yaml")
        own_config.write_text(text)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bridge", "run", "-c", str(own_config)],
                stdout=log if output is None else output,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
            )
        if wait_assigned:
            wait_for(
                lambda: self.gauge("bridge_assigned_partitions") > 0,
                timeout,
                message=f"bridge to be assigned partitions (log: {self.log_path})",
            )

    @property
    def own_config(self) -> Path:
        return self.log_path.with_suffix(".yaml")

    def metrics(self) -> str:
        """The /metrics text read after this call began (the bridge renders it at most once a
        second: an answer from before is asked again), or '' while the port is not up."""
        self._check_alive()  # (once: a replica may be killed while it is asked again)
        asked = time.time()
        deadline = time.monotonic() + 5
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/metrics", timeout=2
                ) as r:
                    text = str(r.read().decode())
                    rendered = float(r.headers.get(RENDERED_HEADER) or "inf")
            except OSError:
                return ""
            if rendered >= asked - 0.002 or time.monotonic() > deadline:
                return text
            time.sleep(0.05)

    def gauge(self, name: str, labels: str = "") -> float:
        """The value of one metric sample (sum over series when ``labels`` is empty)."""
        total = 0.0
        pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
        for match in pattern.finditer(self.metrics()):
            if labels in (match.group(1) or ""):
                total += float(match.group(2))
        return total

    def http(self, path: str) -> tuple[int, str]:
        """GET an operator endpoint: (status, body)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode()
        except OSError:
            return 0, ""  # not listening (yet)

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"bridge exited with {self.process.returncode}; log tail:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_lines(self) -> list[str]:
        return (
            self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        )

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it was not running)."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"bridge did not stop within {timeout}s:\n{self.log_tail()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def wait_until(condition: Any, timeout: float, message: str) -> Any:
    """Wait for ``condition`` with a deadline (re-exported for tests)."""
    return wait_for(condition, timeout, message=message)


def now() -> float:
    return time.time()
