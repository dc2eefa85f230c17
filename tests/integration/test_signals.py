"""SIGTERM as PID 1: every one-shot command ends at once, even blocked in a call into librdkafka.

Each command runs as PID 1 of a PID namespace of its own (``unshare --pid --fork``), as it does in
a container, where the kernel drops every signal the process installed no handler for. The peer
it talks to (the Kafka bootstrap server, a receiver, the operator port) is a socket on loopback
that accepts connections and never answers, so the command is blocked for its whole timeout
unless SIGTERM ends it. ``bridge run`` drains on SIGTERM instead (tests/integration/
test_operations.py and the container test).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.kafka_helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
PID_1 = ["unshare", "--pid", "--fork"]  # the command after it is PID 1 of a new namespace
TEST_CONFIG = ["-c", "config/test.yaml"]


class Silent:
    """A loopback server that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.accepted.append(connection)

    def close(self) -> None:
        self.server.close()
        for connection in self.accepted:
            connection.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def inner_pid(outer: int) -> int:
    """The pid (in this namespace) of the child that ``unshare --fork`` (pid ``outer``) runs."""
    children: list[str] = []

    def started() -> bool:
        children[:] = Path(f"/proc/{outer}/task/{outer}/children").read_text().split()
        return bool(children)

    wait_for(started, 10, interval=0.02, message="unshare to start its child")
    return int(children[0])


def namespace_pids(pid: int) -> list[int]:
    """The pids of ``pid`` from the outermost namespace to its own (``NSpid`` in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(n) for n in line.split()[1:]]
    raise AssertionError(f"no NSpid for {pid}")


def config_file(tmp_path: Path, port: int) -> Path:
    """A configuration whose broker and webhook are the silent server."""
    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    config["kafka"]["bootstrap_servers"] = f"127.0.0.1:{port}"
    config["metrics"]["port"] = port
    config["webhooks"][0]["url"] = f"http://127.0.0.1:{port}/hook"
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


COMMANDS = {
    "check": ["check", "--timeout", "60"],
    "topics": ["topics"],
    "dlq list": ["dlq", "list"],
    "dlq replay": ["dlq", "replay", "--all"],
    "test-webhook": ["test-webhook", "test-both"],
    "status": ["status", "--timeout", "60"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_blocked_one_shot_command_ends_at_once_on_sigterm_as_pid_1(
    name: str, silent: Silent, tmp_path: Path
) -> None:
    config = config_file(tmp_path, silent.port)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "BRIDGE_"))}
    process = subprocess.Popen(
        [*PID_1, sys.executable, "-m", "bridge", *COMMANDS[name], "-c", str(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = inner_pid(process.pid)
        assert namespace_pids(pid)[-1] == 1, "the command is PID 1 of its namespace"
        # Blocked: it reached the silent server, which will never answer.
        wait_for(lambda: silent.accepted, 30, interval=0.05, message=f"{name} to connect")
        os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        _out, err = process.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 143, (process.returncode, err)
    assert "terminated (SIGTERM)" in err
    assert "Traceback" not in err
    assert took < 5, f"{name} took {took:.1f} s to end after SIGTERM"


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path: Path) -> None:
    """`bridge check ... | head -1`: exit 141 (SIGPIPE's), no traceback."""
    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    hooks = config["webhooks"]
    config["webhooks"] = [
        {**hooks[0], "id": f"hook-{n}", "url": f"http://127.0.0.1:18080/hook/{n}"}
        for n in range(5000)
    ]
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(config))
    reader_r, writer = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-m", "bridge", "check", "--offline", "-c", str(path)],
        cwd=REPO,
        stdout=writer,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(writer)
    with os.fdopen(reader_r, "rb") as reader:
        assert reader.read(16)  # the first bytes, then the reader goes away
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 141, (process.returncode, err)
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_the_sample_receiver_ends_on_sigterm_as_pid_1(tmp_path: Path) -> None:
    """`python -m devtools receive` (long-running, no drain to do) exits 0 on SIGTERM as PID 1."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [*PID_1, sys.executable, "-m", "devtools", "receive", "--port", str(port), *TEST_CONFIG],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = inner_pid(process.pid)
        assert namespace_pids(pid)[-1] == 1

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_for(listening, 30, interval=0.1, message="the receiver to listen")
        os.kill(pid, signal.SIGTERM)
        _out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, (process.returncode, err)
