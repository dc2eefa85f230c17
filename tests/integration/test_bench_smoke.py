"""The benchmark command runs end to end at small sizes and writes results (speed not judged)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bridge_harness import REPO

pytestmark = pytest.mark.integration


def test_bench_quick_writes_results(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge",
            "bench",
            "--quick",
            "--only",
            "pure,retry",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["pure"]["records_per_s"] > 0
    timing = results["retry_timing"]
    assert set(timing["rungs"]) == {"1", "2", "3", "4", "5"}
    assert timing["rungs"]["1"]["count"] == results["sizes"]["retry_records"]
    assert "pure path >= 50,000 records/s" in results["targets"]
    assert "targets:" in result.stdout
