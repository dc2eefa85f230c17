"""Structured logs: one JSON line per event of note, or a readable line for a terminal.

Callers log an event name as the message and the context as ``extra={"fields": {...}}``:
``log.info("delivery.failed", extra={"fields": {"webhook": "shop", "attempt": 2}})``.
Bodies and secrets are never passed in.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Formats a record as ``time level event key=value ...`` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
        line += f"{record.levelname.lower():7s} {record.getMessage()} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(fmt: str = "json", level: str = "info") -> None:
    """Send the bridge's logs to stderr in ``fmt`` (json or text) at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
