"""Hot reload: watch the configuration file (and its secret files) and apply valid changes.

The watcher polls the SHA-256 of every file the current configuration was read from, through its
path, so it sees in-place edits, replaced files and Kubernetes' ConfigMap and Secret updates (an
atomic swap of the ``..data`` symlink) alike. A changed, valid configuration is handed to
``on_change``; an invalid one is logged and handed to ``on_error``, and the current one stays in
force. While the file stays invalid it is reloaded on every poll, so a secret file that appears
later completes it, but the same problems are reported only once.

The watcher survives everything: a file that makes the loader or ``on_change`` fail in a way
nobody foresaw is rejected like an invalid one (its problem names the exception type, never its
message), and the next good file still applies. :attr:`ConfigWatcher.rejected` holds the problems
of the file on disk while it is rejected (for ``/readyz``), and is empty once a good file is in
force again, including the one in force before.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from bridge.config.loader import load_config
from bridge.core.errors import ConfigError
from bridge.core.settings import Config, sha256_hex

log = logging.getLogger("bridge.config.reload")


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
    def rejected(self) -> list[str]:
        """The problems of the file on disk while it is rejected; empty when it is in force."""
        return list(self._reported or ())

    @property
    def current(self) -> Config:
        """The configuration in force."""
        return self._current

    async def run(self) -> None:
        """Poll every ``interval_seconds`` until cancelled; no file can end the loop."""
        while True:
            await asyncio.sleep(self._interval)
            await self.poll()

    async def poll(self) -> None:
        """Check the files once; reload, then call ``on_change`` or ``on_error`` as needed."""
        result = await asyncio.to_thread(self._reload_if_changed)
        if isinstance(result, Config):
            result = self._apply(result)
        if isinstance(result, ConfigError):
            if result.problems == self._reported:
                return
            self._reported = result.problems
            log.error(
                "config.rejected",
                extra={"fields": {"path": result.path, "problems": result.problems}},
            )
            self._on_error(result)

    def _apply(self, config: Config) -> ConfigError | None:
        """Hand a valid configuration over unless it is the one in force (then, after a rejected
        file, only say that it is in force again); a failing hand-over is a rejection."""
        recovered = self._reported is not None
        if config.sources == self._current.sources and not recovered:
            return None
        try:
            self._on_change(config)
        except Exception as exc:
            return _internal(config.path, "applying", exc)
        self._reported = None
        self._current = config
        log.info(
            "config.reloaded",
            extra={"fields": {"path": str(config.path), "webhooks": len(config.webhooks)}},
        )
        return None

    def _reload_if_changed(self) -> Config | ConfigError | None:
        """Runs in a thread: the new configuration or its error, None when nothing changed."""
        path = self._current.path
        try:
            unchanged = all(
                _fingerprint(source) == digest for source, digest in self._current.sources
            )
            if unchanged and self._reported is None:
                return None
            return load_config(path, self._environ)
        except ConfigError as exc:
            return exc
        except Exception as exc:
            return _internal(path, "reading", exc)


def _internal(path: Path, doing: str, exc: Exception) -> ConfigError:
    """A failure nobody foresaw, as a rejection naming its type (never its message)."""
    log.error(
        "config.reload_failed", extra={"fields": {"doing": doing, "error": type(exc).__name__}}
    )
    problem = f"{path}: internal error while {doing} the configuration ({type(exc).__name__})"
    return ConfigError(str(path), [problem])
