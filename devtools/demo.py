"""``python -m devtools demo`` (``make demo``): everything at once on this machine, then a clean
stop.

It starts the development broker, creates the topics, starts the sample receiver (one endpoint
answers at once, one fails its first two tries so retries show, one always fails so dead letters
show) and the bridge with ``config/demo.yaml``, produces sample transactions with a progress bar,
shows a live summary read from the bridge's metrics, and stops every process it started when all
deliveries are settled, on Ctrl-C, or on error. It works without a terminal too.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from bridge.config.loader import load_config
from bridge.core.settings import Config
from devtools.devkafka import CACHE, REPO_ROOT, Broker, free_port, stop_process

DEMO_CONFIG = REPO_ROOT / "config" / "demo.yaml"
FLAKY_PATH, FLAKY_FAILURES = "/webhooks/flaky", 2
DOWN_PATH = "/webhooks/down"
SETTLE_TIMEOUT_S = 60.0


def _metric(text: str, name: str, labels: str = "") -> float:
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (match.group(1) or ""):
            total += float(match.group(2))
    return total


def _quantile(text: str, name: str, q: float) -> float | None:
    """A quantile estimated from a histogram's buckets (upper bound of the bucket)."""
    buckets: dict[float, float] = {}
    for match in re.finditer(
        rf'^{re.escape(name)}_bucket\{{.*le="([^"]+)".*\}} (\S+)$', text, re.M
    ):
        bound = float("inf") if match.group(1) == "+Inf" else float(match.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + float(match.group(2))
    if not buckets or buckets[float("inf")] == 0:
        return None
    total = buckets[float("inf")]
    return next(bound for bound, count in sorted(buckets.items()) if count >= q * total)


class Demo:
    """The processes of one demo run and how to show and stop them."""

    def __init__(self, count: int, rate: float) -> None:
        self.count = count
        self.rate = rate
        self.tty = sys.stdout.isatty()
        self.home = CACHE / "demo"
        self.home.mkdir(parents=True, exist_ok=True)
        self.broker: Broker | None = None
        self.processes: list[subprocess.Popen[bytes]] = []
        self.metrics_port = free_port()
        self.receiver_port = free_port()

    def say(self, text: str) -> None:
        print(f"\033[1m{text}\033[0m" if self.tty else text, flush=True)

    def write_config(self, bootstrap: str) -> Path:
        """The demo configuration with this run's broker and metrics port."""
        document = yaml.safe_load(DEMO_CONFIG.read_text())
        document["kafka"]["bootstrap_servers"] = bootstrap
        document["metrics"]["port"] = self.metrics_port
        document["schemas"] = {"directory": str(REPO_ROOT / "schemas")}
        for webhook in document["webhooks"]:
            webhook["url"] = webhook["url"].replace(":8765/", f":{self.receiver_port}/")
        path = self.home / "demo.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def spawn(
        self, args: list[str], log: Path | None = None, tool: str = "bridge"
    ) -> subprocess.Popen[bytes]:
        """Start ``python -m TOOL ARGS`` (``bridge``, or ``devtools`` for the sample tools)."""
        output = log.open("wb") if log is not None else None
        process = subprocess.Popen(
            [sys.executable, "-m", tool, *args],
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "KAFKA_BOOTSTRAP_SERVERS": ""},
            start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
        )
        if output is not None:
            output.close()
        self.processes.append(process)
        return process

    def metrics(self) -> str:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
            ) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.check_processes(what)
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def check_processes(self, what: str) -> None:
        """Fail at once if a process the demo started has exited."""
        for process in self.processes:
            if process.poll() is not None:
                command = " ".join(str(a) for a in process.args[2:4])  # type: ignore[index]
                raise RuntimeError(f"`{command}` exited ({process.returncode}) during {what}")

    def run(self) -> int:
        started = time.monotonic()
        self.say("1/5 starting the Kafka broker (first run downloads it from Maven Central)")
        external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if external:
            bootstrap = external
        else:
            self.broker = Broker(CACHE / "demo-broker")
            bootstrap = self.broker.start()
        broker_ready = time.monotonic()
        path = self.write_config(bootstrap)
        config = load_config(path, environ={})
        self.say(f"2/5 creating topics on {bootstrap}")
        from confluent_kafka.admin import AdminClient

        from bridge.kafka.topics import apply_plan, plan_topics

        report = apply_plan(
            AdminClient({**config.kafka_settings(), "log_level": 0}), plan_topics(config)
        )
        print(f"    created {len(report.created)}, already there {len(report.unchanged)}")
        self.say("3/5 starting the sample receiver and the bridge")
        self.spawn(
            [
                "receive",
                "-c",
                str(path),
                "--port",
                str(self.receiver_port),
                "--flaky",
                f"{FLAKY_PATH}:{FLAKY_FAILURES}",
                "--down",
                DOWN_PATH,
            ]
            + (["--color"] if self.tty else []),
            tool="devtools",
        )
        self.spawn(["run", "-c", str(path)], log=self.home / "bridge.log")
        self.wait(
            lambda: _metric(self.metrics(), "bridge_assigned_partitions") > 0,
            60,
            "the bridge to join its consumer group",
        )
        print(
            f"    bridge metrics: http://127.0.0.1:{self.metrics_port}/metrics  "
            f"(health: /healthz, /readyz); bridge log: {self.home / 'bridge.log'}"
        )
        self.say(f"4/5 producing {self.count} sample transactions")
        failed = self.produce(config)
        expected_received = self._expected_received(config, failed)
        self.say("5/5 deliveries, retries and dead letters (live)")
        self.watch(expected_received, failed)
        elapsed = time.monotonic() - broker_ready
        self.say(
            f"done in {time.monotonic() - started:.0f}s ({elapsed:.0f}s after the broker was ready)"
        )
        self.show_dead_letters(config)
        return 0

    def show_dead_letters(self, config: Config) -> None:
        """What ``bridge dlq list`` shows for this run (the broker stops with the demo)."""
        from bridge.ops.dlq import read_dead_letters

        now = time.time_ns() // 1_000_000
        rows = [letter.row(now) for letter in read_dead_letters(config)]
        print(f"    dead letters (as `bridge dlq list` shows them): {len(rows)}")
        for row in rows[-5:]:
            print("      " + "  ".join(row))

    def _expected_received(self, config: Config, failed: int) -> int:
        """2xx answers the run ends with: every webhook but the always-failing one."""
        total = 0
        for webhook in config.webhooks:
            if webhook.url.endswith(DOWN_PATH):
                continue
            events = webhook.events
            total += (self.count - failed if "transaction.success" in events else 0) + (
                failed if "transaction.failed" in events else 0
            )
        return total

    def produce(self, config: Config) -> int:
        from devtools.sample_producer import produce, random_records

        records = list(random_records(self.count, ["acct_demo"], seed=7))
        failed = sum(1 for r in records if r["status"] == "FAILED")

        def progress(done: int) -> None:
            if self.tty:
                bar = "#" * (30 * done // self.count)
                print(f"\r    [{bar:30s}] {done}/{self.count}", end="", flush=True)
            elif done == self.count or done % 10 == 0:
                print(f"    produced {done}/{self.count}", flush=True)

        produce(config, records, rate=self.rate, progress=progress)
        if self.tty:
            print()
        return failed

    def watch(self, expected_received: int, expected_dead: int) -> None:
        last = ""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            text = self.metrics()
            received = _metric(text, "bridge_deliveries_total", 'outcome="received"')
            retries = _metric(text, "bridge_retries_scheduled_total")
            dead = _metric(text, "bridge_dead_letters_total")
            p50 = _quantile(text, "bridge_end_to_end_latency_seconds", 0.5)
            line = (
                f"    delivered {received:.0f}/{expected_received}  retried {retries:.0f}  "
                f"dead-lettered {dead:.0f}/{expected_dead}  "
                f"end-to-end p50 <= {p50 * 1000:.0f} ms"
                if p50
                else ""
            )
            if line != last:
                print(line, flush=True)
                last = line
            if received >= expected_received and dead >= expected_dead:
                return
            self.check_processes("the deliveries")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not settled after {SETTLE_TIMEOUT_S:.0f}s: {line.strip()}")
            time.sleep(1.0)

    def stop(self) -> None:
        """Stop every process the demo started, the bridge first (it drains and commits)."""
        for process in reversed(self.processes):
            stop_process(process, 30)
        if self.broker is not None:
            self.broker.stop()


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so the demo cleans up either way."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(count: int = 30, rate: float = 10.0) -> int:
    """Run the demo; returns the exit code."""
    demo = Demo(count, rate)
    with _interruptible():
        try:
            return demo.run()
        except KeyboardInterrupt:
            print("\ninterrupted: stopping everything", flush=True)
            return 130
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            print(f"hint: see {demo.home / 'bridge.log'}", file=sys.stderr)
            return 1
        finally:
            demo.stop()
