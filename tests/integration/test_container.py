"""The container image, built from deploy/docker/Dockerfile and run as production runs it.

`make image` (deploy/docker/build-image.sh) builds it: `docker build` where a Docker engine runs,
else buildah on a locally bootstrapped Debian base (cached in .cache/container), and reuses the
image when its build context is unchanged. The tests run `bridge run` in it as non-root on a
read-only root filesystem with the configuration mounted read-only, against the session's broker,
and check delivery, the health endpoints, the budgets and the SIGTERM drain as PID 1.

Skipped, with the reason, only where the container tools cannot be installed (no root, no apt).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import resource
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.devkafka import free_port
from devtools.samples import make_record
from tests.bridge_harness import BridgeSetup, secret_of, webhook
from tests.kafka_helpers import committed_offsets, wait_for
from tests.receiver import Answer, Receiver

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/transaction-webhook-bridge:test"
# The image of the previous Dockerfile measured 267 MB (podman's size, on the local Debian base of
# deploy/docker/build-image.sh); the new one measured 241 MB there. The budget holds it below the
# old size. (On python:slim both are smaller: that base has no perl.)
SIZE_BUDGET_BYTES = 250_000_000
COLD_START_BUDGET_S = 30.0  # `podman run` to /readyz 200
GRACE_S = 5.0  # delivery.shutdown_grace_seconds in the test configuration
UID = "10001:10001"


def _docker_engine() -> bool:
    if os.environ.get("CONTAINER_ENGINE"):
        return os.environ["CONTAINER_ENGINE"] == "docker"
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def engine() -> list[str]:
    """The command that runs containers: docker where an engine runs, else podman with runc."""
    if _docker_engine():
        return ["docker"]
    tools = subprocess.run(
        ["sh", "deploy/docker/ensure-container-tools.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if tools.returncode != 0:
        pytest.skip(f"container tools unavailable: {tools.stderr.strip()}")
    return ["podman"]


def _run_flags(engine: list[str]) -> list[str]:
    # runc: crun fails on some hosts' cgroup set-ups. Explicit ulimits within this host's hard
    # limits: the engine's defaults (nofile 1048576) may exceed them, and runc then cannot start.
    runtime = ["--runtime", "runc"] if engine == ["podman"] else []
    nofile = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1])
    return [*runtime, "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


@pytest.fixture(scope="module")
def image(engine: list[str]) -> str:
    """Build the image (or reuse the cached one for the same build context).

    BRIDGE_TEST_IMAGE names an image built beforehand (a CI step, say) to test instead."""
    if os.environ.get("BRIDGE_TEST_IMAGE"):
        return os.environ["BRIDGE_TEST_IMAGE"]
    started = time.monotonic()
    built = subprocess.run(
        ["sh", "deploy/docker/build-image.sh", TAG],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "CONTAINER_ENGINE": engine[0]},
    )
    assert built.returncode == 0, f"image build failed:\n{built.stderr[-4000:]}"
    print(f"image ready in {time.monotonic() - started:.1f} s: {built.stderr.strip()}")
    return TAG


def _inspect(engine: list[str], image: str) -> dict[str, Any]:
    out = subprocess.run(
        [*engine, "image", "inspect", image], capture_output=True, text=True, check=True
    )
    document: dict[str, Any] = json.loads(out.stdout)[0]
    return document


def _shell(engine: list[str], image: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *engine,
            "run",
            "--rm",
            *_run_flags(engine),
            "--read-only",
            "--entrypoint",
            "sh",
            image,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_image_is_small_non_root_and_holds_no_build_tooling(
    engine: list[str], image: str
) -> None:
    meta = _inspect(engine, image)
    assert meta["Size"] < SIZE_BUDGET_BYTES, f"image is {meta['Size'] / 1e6:.0f} MB"
    config = meta["Config"]
    assert config["User"] == UID
    assert config["Entrypoint"] == ["bridge"], "exec form: the bridge itself is PID 1"
    probe = _shell(
        engine,
        image,
        "id -u; bridge --version; "
        "for tool in pip pip3 gcc cc make git; do command -v $tool && echo FOUND $tool; done; "
        "python -m pip --version >/dev/null 2>&1 && echo FOUND pip-module; "
        "python -c 'import devtools' 2>/dev/null && echo FOUND devtools; "
        "ls /src /wheels 2>/dev/null && echo FOUND build-tree; "
        "ls /opt/bridge/schemas",
    )
    assert probe.returncode == 0, probe.stderr
    assert "FOUND" not in probe.stdout, probe.stdout
    lines = probe.stdout.split()
    assert lines[0] == "10001"
    assert "transaction_outcome.avsc" in lines


def _http(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError:
        return 0


class Container:
    """One detached `bridge run` container with its configuration directory."""

    def __init__(self, engine: list[str], image: str, setup: BridgeSetup, workdir: Path) -> None:
        self.engine = engine
        self.image = image
        self.port = free_port()
        self.name = f"bridge-test-{os.getpid()}-{self.port}"
        document = yaml.safe_load(setup.write_config().read_text())
        document["schemas"]["directory"] = "/opt/bridge/schemas"
        document["metrics"] = {"host": "127.0.0.1", "port": self.port}
        # The mounted directory must be readable by the container's user (tmp_path is 0700).
        self.config_dir = workdir / "container-config"
        self.config_dir.mkdir(mode=0o755)
        self.config_dir.chmod(0o755)
        (self.config_dir / "bridge.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
        (self.config_dir / "bridge.yaml").chmod(0o644)
        self.started = 0.0

    def start(self) -> None:
        read_only_tmpfs = ["--read-only-tmpfs=false"] if self.engine == ["podman"] else []
        self.started = time.monotonic()
        subprocess.run(
            [
                *self.engine,
                "run",
                "--detach",
                "--name",
                self.name,
                *_run_flags(self.engine),
                "--read-only",
                *read_only_tmpfs,
                "--user",
                UID,
                "--network",
                "host",
                "--volume",
                f"{self.config_dir}:/etc/bridge:ro",
                self.image,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def logs(self) -> str:
        out = subprocess.run(
            [*self.engine, "logs", self.name], capture_output=True, text=True, timeout=30
        )
        return (out.stdout + out.stderr)[-6000:]

    def running(self) -> bool:
        out = subprocess.run(
            [*self.engine, "inspect", "--format", "{{.State.Running}}", self.name],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip() == "true"

    def wait_ready(self, timeout: float) -> float:
        """Seconds from `run` to /readyz 200."""
        deadline = time.monotonic() + timeout
        while _http(self.port, "/readyz") != 200:
            if time.monotonic() > deadline or not self.running():
                raise AssertionError(f"/readyz not 200 within {timeout}s:\n{self.logs()}")
            time.sleep(0.1)
        return time.monotonic() - self.started

    def exec(self, *command: str) -> str:
        out = subprocess.run(
            [*self.engine, "exec", self.name, *command],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout

    def terminate(self, timeout: float) -> tuple[int, float]:
        """SIGTERM as the orchestrator sends it; (exit code, seconds until it exited)."""
        began = time.monotonic()
        subprocess.run(
            [*self.engine, "kill", "--signal", "TERM", self.name],
            check=True,
            capture_output=True,
            timeout=30,
        )
        waited = subprocess.run(
            [*self.engine, "wait", self.name], capture_output=True, text=True, timeout=timeout
        )
        return int(waited.stdout.strip().splitlines()[-1]), time.monotonic() - began

    def remove(self) -> None:
        subprocess.run([*self.engine, "rm", "--force", self.name], capture_output=True, timeout=60)


@pytest.fixture
def container_factory(engine: list[str], image: str, tmp_path: Path) -> Iterator[Any]:
    made: list[Container] = []

    def make(setup: BridgeSetup) -> Container:
        container = Container(engine, image, setup, tmp_path)
        made.append(container)
        return container

    yield make
    for container in made:
        container.remove()


def test_bridge_run_in_the_container_delivers_reports_health_and_drains_on_sigterm(
    receiver: Receiver, bridge_setup: Any, container_factory: Any
) -> None:
    receiver.behaviours["/slow"] = lambda _seen: Answer(200, delay=1.0)
    setup: BridgeSetup = bridge_setup(
        [
            webhook("hook", "acct_1", receiver.url("/hook")),
            webhook("slow", "acct_2", receiver.url("/slow")),
        ],
        partitions=1,
        delivery={"shutdown_grace_seconds": GRACE_S},
    )
    container: Container = container_factory(setup)
    container.start()
    cold_start = container.wait_ready(COLD_START_BUDGET_S)
    print(f"cold start to /readyz 200: {cold_start:.1f} s")
    assert _http(container.port, "/healthz") == 200
    assert container.exec("cat", "/proc/1/cmdline").split("\0")[:2] == [
        "/opt/venv/bin/python",
        "/opt/venv/bin/bridge",
    ], "the bridge is PID 1"

    setup.produce_records(
        [
            make_record("tx-ok", "acct_1", success=True),
            make_record("tx-ko", "acct_1", success=False),
        ]
    )
    wait_for(lambda: len(receiver.on("/hook")) == 2, 30, message=f"deliveries\n{container.logs()}")
    for request in receiver.on("/hook"):
        expected = hmac.new(secret_of("hook").encode(), request.body, hashlib.sha256).hexdigest()
        assert request.headers["x-service-secret"] == expected
        assert request.headers["webhook-signature"].startswith("v1,")
        assert json.loads(request.body)["event"] in {"transaction.success", "transaction.failed"}

    # Deliveries in flight when SIGTERM arrives are drained, committed, and the exit code is 0.
    setup.produce_records([make_record(f"tx-slow-{i}", "acct_2") for i in range(3)])
    wait_for(lambda: len(receiver.on("/slow")) == 3, 20, message="three slow requests in flight")
    code, took = container.terminate(timeout=GRACE_S + 20)
    print(f"SIGTERM to exit: {took:.1f} s (grace {GRACE_S} s)")
    assert code == 0, container.logs()
    assert took < GRACE_S + 3, f"took {took:.1f}s to stop:\n{container.logs()}"
    assert len(receiver.received_ids("/slow")) == 3
    assert committed_offsets(setup.bootstrap, setup.group, setup.source) == [5]
