"""The benchmark command runs end to end at small sizes and writes results (speed not judged); the
isolation scenario's hostile neighbour behaves as documented."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.devkafka import free_port
from tests.bridge_harness import REPO

pytestmark = pytest.mark.integration


def test_bench_quick_writes_results(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools",
            "bench",
            "--quick",
            "--only",
            "pure,retry,many",
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
    assert results["broker"]["first_group_join_s"] > 0  # joined before anything was measured
    many, one = results["many_webhooks"], results["many_baseline_one"]
    assert many["hosts_seen"] == 50 and len(many["rounds"]) == len(results["many_ratio_rounds"])
    for run in (many, one):  # the bridge's collector figures, read from its /metrics
        assert run["gc_collections"] > 0 and "gc_seconds" in run and "gc_full_collections" in run
        assert run["receiver_cpu_per_1000_s"] > 0  # the stand-in receiver's share of the cores


def test_first_group_joined_before_any_scenario(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The warm-up leaves what a cluster in service has (the offsets topic, so a group joins at
    once) and takes its own topic away."""
    from confluent_kafka.admin import AdminClient

    from devtools.bench import Stage

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    before = set(admin.list_topics(timeout=10).topics)
    assert Stage(kafka_bootstrap, tmp_path).join_first_group(timeout=60) > 0
    deadline = time.monotonic() + 30
    while True:
        topics = set(admin.list_topics(timeout=10).topics)
        left = {name for name in topics - before if name.startswith("bench-join-")}
        if not left:
            break
        assert time.monotonic() < deadline, f"{left} not deleted"
        time.sleep(0.1)
    assert "__consumer_offsets" in topics


# ---- the hostile neighbour of the isolation scenario (bridge/bench_hostile.py) -----------------


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[int, int]]:
    """``devtools.bench_hostile`` in its own process, connections capped at 1.5 s: (port, early)."""
    port, early = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devtools.bench_hostile",
            "--port",
            str(port),
            "--early-port",
            str(early),
            "--max-connection-s",
            "1.5",
        ],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 15
        while _stats(port) is None:
            assert process.poll() is None and time.monotonic() < deadline, "it did not listen"
            time.sleep(0.05)
        yield port, early
    finally:
        process.terminate()
        process.wait(10)


def _stats(port: int) -> dict[str, int] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/__stats", timeout=5) as response:
            stats: dict[str, int] = json.loads(response.read())
            return stats
    except OSError:
        return None


def _request(path: str) -> bytes:
    body = b'{"x": 1}'
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _read(sock: socket.socket, seconds: float) -> tuple[bytes, str]:
    """Everything received within ``seconds``, and how the reading ended: open, closed, reset."""
    data = b""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65_536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data, "reset"
        if not chunk:
            return data, "closed"
        data += chunk
    return data, "open"


def _exactly(sock: socket.socket, size: int) -> bytes:
    """The next ``size`` bytes (within 5 s)."""
    sock.settimeout(5)
    return sock.recv(size, socket.MSG_WAITALL)


def _exchange(port: int, path: str, seconds: float) -> tuple[bytes, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_request(path))
        return _read(sock, seconds)


OK_EMPTY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
NO_CONTENT = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"


def test_hostile_double_and_one_shot_answers(hostile: tuple[int, int]) -> None:
    port, _ = hostile
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_request("/double"))
        assert sock.recv(65_536) == OK_EMPTY + NO_CONTENT  # both in one segment
        assert _read(sock, 0.3) == (b"", "open")  # held until the client lets go
    assert _exchange(port, "/bad-chunked/x", 0.3) == (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "open",
    )
    garbage, _ = _exchange(port, "/garbage", 0.3)
    assert garbage.startswith(b"SSH-2.0-")
    huge, _ = _exchange(port, "/huge-headers", 1.0)
    first = huge.split(b"\r\n")[1]
    assert first.startswith(b"X-Filler: ") and len(first) >= 256 * 1024
    assert huge.endswith(b"Content-Length: 0\r\n\r\n")


def test_hostile_reset_cuts_the_promised_body(hostile: tuple[int, int]) -> None:
    data, end = _exchange(hostile[0], "/reset", 1.0)
    assert data == b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10
    assert end == "reset"


def test_hostile_trickle_and_slow_headers_drip_and_never_end(hostile: tuple[int, int]) -> None:
    port, _ = hostile
    trickle, end = _exchange(port, "/trickle", 0.6)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert trickle.startswith(head) and end == "open"
    chunks = trickle[len(head) :]
    assert chunks == b"1\r\nx\r\n" * (len(chunks) // 6)
    assert 3 <= len(chunks) // 6 <= 20  # one byte every 50 ms
    slow, end = _exchange(port, "/slow-headers", 0.6)
    assert slow.startswith(b"HTTP/1.1 200 OK\r\nX-Slow: a") and end == "open"
    assert b"\r\n\r\n" not in slow
    assert 3 <= slow.count(b"a") <= 20


def test_hostile_stage_stages_a_response_on_an_idle_connection(hostile: tuple[int, int]) -> None:
    with socket.create_connection(("127.0.0.1", hostile[0]), timeout=5) as sock:
        sock.sendall(_request("/stage"))
        assert _exactly(sock, len(NO_CONTENT)) == NO_CONTENT
        assert _read(sock, 0.3) == (NO_CONTENT, "open")  # nobody asked for this one
        sock.sendall(_request("/stage"))  # keep-alive: the next request is answered too
        assert _exactly(sock, len(NO_CONTENT)) == NO_CONTENT


def test_hostile_early_answers_before_the_request(hostile: tuple[int, int]) -> None:
    with socket.create_connection(("127.0.0.1", hostile[1]), timeout=5) as sock:
        assert _exactly(sock, len(NO_CONTENT)) == NO_CONTENT  # nothing was sent yet
        assert _read(sock, 0.2) == (b"", "open")
        sock.sendall(_request("/early"))
        assert _read(sock, 0.3) == (b"", "open")  # read and ignored


def test_hostile_server_survives_anything_and_caps_each_connection(
    hostile: tuple[int, int],
) -> None:
    port, _ = hostile
    before = _stats(port)
    assert before is not None
    for junk in (b"\x16\x03\x01\x02\x00" + bytes(range(256)), b"GET\r\n\r\n", b"A" * 100_000):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(junk)
            assert _read(sock, 2.0)[1] in {"closed", "reset"}
    assert _exchange(port, "/unknown", 0.1) == (
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        "open",
    )
    started = time.monotonic()  # the server lets go after 1.5 s here (30 s by default)
    _, end = _exchange(port, "/trickle", 5.0)
    assert end in {"closed", "reset"} and time.monotonic() - started < 3.0
    after = _stats(port)
    assert after is not None and after["connections"] >= before["connections"] + 5


def test_bench_quick_isolation_runs_every_neighbour(kafka_bootstrap: str, tmp_path: Path) -> None:
    """``--only isolation --quick``: alone, beside a hung webhook, beside the hostile neighbour,
    beside a busy one (the control), and the backlog alone and beside the hostile one; then all of
    it again in the split placement (about 170 s on two cores)."""
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools",
            "bench",
            "--quick",
            "--only",
            "isolation",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=400,
        check=False,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    results = json.loads(out.read_text())
    for name, neighbour in [
        ("isolation_alone", "none"),
        ("isolation_hung", "hung"),
        ("isolation_hostile", "hostile"),
        ("isolation_busy", "busy"),
    ]:
        assert results[name]["neighbour"] == neighbour
        assert results[name]["count"] == 2500  # 500/s for 5 s, every healthy delivery arrived
        # the p99 of the records after the neighbour's first second (its onset) is one of them
        for round_ in results[name]["rounds"]:
            assert 0 < round_["p99_after_onset_ms"] <= round_["max_ms"]
    assert results["isolation_hostile"]["hostile_connections"] > 0
    assert "hostile_connections" not in results["isolation_busy"]
    alone, hostile = results["neighbour_alone"], results["neighbour_hostile"]
    assert alone["deliveries_per_s"] > 0 and alone["neighbour_records"] == 0
    assert hostile["deliveries_per_s"] > 0 and hostile["neighbour_records"] == 250
    assert hostile["hostile_connections"] > 0
    # and again with the bridge on a CPU of its own (split placement)
    for name in ("alone", "hung", "hostile", "busy"):
        assert results[f"split_isolation_{name}"]["count"] == 2500
    assert results["split_neighbour_hostile"]["neighbour_records"] == 250
    assert results["split_neighbour_alone"]["deliveries_per_s"] > 0
    assert {
        "healthy p99 beside a hostile neighbour <= 1.5x alone",
        "healthy throughput beside a hostile neighbour >= alone / 1.5",
        "split placement: healthy p99 beside a hostile neighbour <= 1.5x alone",
        "split placement: healthy throughput beside a hostile neighbour >= alone / 1.5",
    } <= set(results["targets"])
    assert "isolation_hostile" in result.stdout and "neighbour_hostile" in result.stdout
