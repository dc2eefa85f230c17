"""The first-run tools a new user meets: the demo, the sample receiver and the sample producer."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devtools.devkafka import free_port
from tests.bridge_harness import REPO
from tests.kafka_helpers import wait_for

pytestmark = pytest.mark.integration


def test_demo_shows_deliveries_retries_and_dead_letters_then_stops(kafka_bootstrap: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devtools", "demo", "--count", "12", "--rate", "20"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
        check=False,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "signature ok" in out and "(try 3)" in out, "deliveries and retries are shown"
    assert "always fails -> 503" in out
    final = [line for line in out.splitlines() if line.strip().startswith("delivered")][-1]
    delivered, expected = final.split()[1].split("/")
    dead, dead_expected = final.split()[5].split("/")
    assert delivered == expected and dead == dead_expected and int(dead) > 0, final
    assert "done in" in out
    leftovers = subprocess.run(
        ["pgrep", "-f", ".cache/demo/demo.yaml"], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout == "", "the demo leaves no process behind"


def test_sample_receiver_rejects_a_bad_signature(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devtools",
            "receive",
            "-c",
            "config/test.yaml",
            "--port",
            str(port),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def post() -> int:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/webhooks/both",
                data=b'{"event":"transaction.success"}',
                headers={
                    "x-service-secret": "0" * 64,
                    "webhook-id": "msg_x",
                    "webhook-timestamp": "1",
                    "webhook-signature": "v1,AAAA",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                exc.close()
                return exc.code
            except OSError:
                return 0

        assert wait_for(post, 20, message="the receiver to answer") == 401
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert "signature rejected" in output


def test_sample_producer_reports_a_bad_json_line(tmp_path: Path) -> None:
    transactions = tmp_path / "tx.jsonl"
    transactions.write_text('{"transactionId": "t1", "accountHolderId": "a"}\n{"oops": 1}\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools",
            "produce",
            "-c",
            "config/test.yaml",
            "--json",
            str(transactions),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{transactions}:2" in result.stderr and "oops" in result.stderr
