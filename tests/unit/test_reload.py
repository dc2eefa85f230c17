"""Hot reload with real files: edits, Kubernetes' symlink swap, secret files, invalid files."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.config.loader import load_config
from bridge.config.reload import ConfigWatcher
from bridge.core.errors import ConfigError
from bridge.core.settings import Config

TEMPLATE = """\
webhooks:
  - id: shop
    account: acct_1
    url: {url}
    events: [transaction.success]
    {secret}
"""


def config_text(url: str = "https://one.example/hook", secret: str = "secret: inline") -> str:
    return TEMPLATE.format(url=url, secret=secret)


class Recorder:
    """A watcher on ``path`` that records what it hands to its callbacks."""

    def __init__(self, path: Path, interval_seconds: float = 0.02) -> None:
        self.changes: list[Config] = []
        self.errors: list[ConfigError] = []
        self.watcher = ConfigWatcher(
            load_config(path, {}),
            self.changes.append,
            self.errors.append,
            interval_seconds=interval_seconds,
            environ={},
        )


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Return once ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_an_edited_file_is_reloaded_by_the_running_watcher(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(config_text())
    recorder = Recorder(path)

    async def scenario() -> None:
        task = asyncio.create_task(recorder.watcher.run())
        try:
            path.write_text(config_text(url="https://two.example/hook"))
            await wait_until(lambda: bool(recorder.changes))
        finally:
            task.cancel()

    asyncio.run(scenario())
    (new,) = recorder.changes
    assert new.webhooks[0].url == "https://two.example/hook"
    assert recorder.watcher.current is new
    assert recorder.errors == []


def test_kubernetes_configmap_symlink_swap_is_seen(tmp_path: Path) -> None:
    def publish(version: str, text: str) -> None:
        """Write a ConfigMap volume version and swap ``..data`` to it atomically, as kubelet."""
        directory = tmp_path / f"..{version}"
        directory.mkdir()
        (directory / "config.yaml").write_text(text)
        (tmp_path / "..data_tmp").symlink_to(directory.name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")

    publish("2026_01_01_00_00_00.1", config_text())
    path = tmp_path / "config.yaml"
    path.symlink_to("..data/config.yaml")
    recorder = Recorder(path)

    async def scenario() -> None:
        task = asyncio.create_task(recorder.watcher.run())
        try:
            publish("2026_01_01_00_05_00.2", config_text(url="https://swapped.example/hook"))
            await wait_until(lambda: bool(recorder.changes))
        finally:
            task.cancel()

    asyncio.run(scenario())
    assert [c.webhooks[0].url for c in recorder.changes] == ["https://swapped.example/hook"]
    assert recorder.changes[0].path == path


def test_an_invalid_file_is_reported_once_and_the_old_config_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(config_text(secret="secret: hunter2-inline"))
    recorder = Recorder(path)
    original = recorder.watcher.current

    async def scenario() -> None:
        path.write_text(config_text(secret="secret: hunter2-inline\n    events: []"))
        for _ in range(3):
            await recorder.watcher.poll()
        assert len(recorder.errors) == 1
        assert recorder.watcher.current is original
        path.write_text(config_text(url="https://fixed.example/hook"))
        await recorder.watcher.poll()

    with caplog.at_level(logging.INFO, logger="bridge.config.reload"):
        asyncio.run(scenario())
    assert recorder.errors[0].problems == [
        f"{path}:7: webhook 'shop': key 'events' is given twice",
        f"{path}:7: webhook 'shop': field 'events': must name at least one event "
        "(expected transaction.success, transaction.failed)",
    ]
    assert [c.webhooks[0].url for c in recorder.changes] == ["https://fixed.example/hook"]
    assert [record.getMessage() for record in caplog.records] == [
        "config.rejected",
        "config.reloaded",
    ]
    rejected = caplog.records[0]
    assert rejected.levelno == logging.ERROR
    assert getattr(rejected, "fields", {})["problems"] == recorder.errors[0].problems
    assert "hunter2" not in caplog.text
    assert all("hunter2" not in str(getattr(record, "fields", "")) for record in caplog.records)


def test_unchanged_content_does_not_reload(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(config_text())
    recorder = Recorder(path)

    async def scenario() -> None:
        os.utime(path, (time.time() + 60, time.time() + 60))
        path.write_text(config_text())
        await recorder.watcher.poll()

    asyncio.run(scenario())
    assert recorder.changes == []


def test_a_rotated_secret_file_is_reloaded(tmp_path: Path) -> None:
    secret = tmp_path / "shop-secret"
    secret.write_text("first\n")
    path = tmp_path / "bridge.yaml"
    path.write_text(config_text(secret=f"secret_file: {secret}"))
    recorder = Recorder(path)

    async def scenario() -> None:
        secret.write_text("second\n")
        await recorder.watcher.poll()

    asyncio.run(scenario())
    assert [c.webhooks[0].secret.reveal() for c in recorder.changes] == [b"second"]


def test_a_secret_file_that_appears_later_completes_a_rejected_file(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(config_text())
    recorder = Recorder(path)
    secret = tmp_path / "late-secret"

    async def scenario() -> None:
        path.write_text(config_text(secret=f"secret_file: {secret}"))
        await recorder.watcher.poll()
        assert len(recorder.errors) == 1
        secret.write_text("arrived")
        await recorder.watcher.poll()

    asyncio.run(scenario())
    assert [c.webhooks[0].secret.reveal() for c in recorder.changes] == [b"arrived"]
    assert len(recorder.errors) == 1


def test_the_watcher_survives_failures_nobody_foresaw_and_applies_the_next_good_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(config_text())
    recorder = Recorder(path)
    original = recorder.watcher.current
    import bridge.config.reload

    def explode(*_args: object) -> Config:
        raise KeyError("hunter2-secret-value")

    async def scenario() -> None:
        task = asyncio.create_task(recorder.watcher.run())
        try:
            with monkeypatch.context() as patch:
                patch.setattr(bridge.config.reload, "load_config", explode)
                path.write_text(config_text(url="https://crash.example/hook"))
                await wait_until(lambda: bool(recorder.errors))
            assert not task.done(), "the watcher's loop ended"
            assert recorder.watcher.current is original
            assert recorder.watcher.rejected == recorder.errors[0].problems
            path.write_text(config_text(url="https://good.example/hook"))
            await wait_until(lambda: bool(recorder.changes))
        finally:
            task.cancel()

    asyncio.run(scenario())
    (error,) = recorder.errors
    assert error.problems == [f"{path}: internal error while reading the configuration (KeyError)"]
    assert "hunter2" not in str(error)
    assert [c.webhooks[0].url for c in recorder.changes] == ["https://good.example/hook"]
    assert recorder.watcher.rejected == []


def test_a_failing_hand_over_is_a_rejection_and_the_old_config_stays(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(config_text())
    errors: list[ConfigError] = []
    applied: list[Config] = []
    fail = [True]

    def on_change(config: Config) -> None:
        if fail[0]:
            raise RuntimeError("apply failed")
        applied.append(config)

    watcher = ConfigWatcher(load_config(path, {}), on_change, errors.append, environ={})
    original = watcher.current

    async def scenario() -> None:
        path.write_text(config_text(url="https://two.example/hook"))
        await watcher.poll()
        assert watcher.current is original and len(errors) == 1
        assert "internal error while applying the configuration (RuntimeError)" in str(errors[0])
        fail[0] = False
        await watcher.poll()  # the same file, tried again: now it applies

    asyncio.run(scenario())
    assert [c.webhooks[0].url for c in applied] == ["https://two.example/hook"]
    assert watcher.current is applied[0] and watcher.rejected == []


def test_going_back_to_the_file_in_force_clears_the_rejection(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    good = config_text()
    path.write_text(good)
    recorder = Recorder(path)

    async def scenario() -> None:
        path.write_text(config_text(url="http://[::1/x"))
        await recorder.watcher.poll()
        assert recorder.watcher.rejected and len(recorder.errors) == 1
        path.write_text(good)
        await recorder.watcher.poll()

    asyncio.run(scenario())
    assert recorder.watcher.rejected == []
    assert len(recorder.changes) == 1, "the file in force again is reported (metrics say ok)"
