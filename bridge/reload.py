"""Hot reload: watch the configuration file (and its secret files) and apply valid changes.

The watcher polls the SHA-256 of every file the current configuration was read from, through its
path, so it sees in-place edits, replaced files and Kubernetes' ConfigMap and Secret updates (an
atomic swap of the ``..data`` symlink) alike. A changed, valid configuration is handed to
``on_change``; an invalid one is logged and handed to ``on_error``, and the current one stays in
force. While the file stays invalid it is reloaded on every poll, so a secret file that appears
later completes it, but the same problems are reported only once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from bridge.config import Config, load_config, sha256_hex
from bridge.errors import ConfigError

log = logging.getLogger("bridge.reload")


def _fingerprint(path: Path) -> str | None:
    """SHA-256 of the file's current content (following symlinks), None when it cannot be read."""
    try:
        return sha256_hex(path.read_bytes())
    except OSError:
        return None


class ConfigWatcher:
    """Polls the files of the current configuration and reloads it when one of them changes."""

    def __init__(
        self,
        current: Config,
        on_change: Callable[[Config], None],
        on_error: Callable[[ConfigError], None],
        *,
        interval_seconds: float = 1.0,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self._current = current
        self._on_change = on_change
        self._on_error = on_error
        self._interval = interval_seconds
        self._environ = environ
        self._reported: list[str] | None = None  # problems of the rejected file, while it is bad

    @property
    def current(self) -> Config:
        """The configuration in force."""
        return self._current

    async def run(self) -> None:
        """Poll every ``interval_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            await self.poll()

    async def poll(self) -> None:
        """Check the files once; reload, then call ``on_change`` or ``on_error`` as needed."""
        result = await asyncio.to_thread(self._reload_if_changed)
        if isinstance(result, ConfigError):
            if result.problems == self._reported:
                return
            self._reported = result.problems
            log.error(
                "config.rejected",
                extra={"fields": {"path": result.path, "problems": result.problems}},
            )
            self._on_error(result)
            return
        self._reported = None
        if result is None or result.sources == self._current.sources:
            return
        self._current = result
        log.info(
            "config.reloaded",
            extra={"fields": {"path": str(result.path), "webhooks": len(result.webhooks)}},
        )
        self._on_change(result)

    def _reload_if_changed(self) -> Config | ConfigError | None:
        """Runs in a thread: the new configuration or its error, None when nothing changed."""
        unchanged = all(_fingerprint(path) == digest for path, digest in self._current.sources)
        if unchanged and self._reported is None:
            return None
        try:
            return load_config(self._current.path, self._environ)
        except ConfigError as exc:
            return exc
