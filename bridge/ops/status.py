"""The operator's status view: ``GET /status`` on the operator port, and ``bridge status``.

``/status`` answers JSON: the webhooks that need a look now (failing, stalled, out of unanswered
credit, or with deliveries active or waiting for one of their slots; never the idle ones), the
most pressing first and at most :data:`STATUS_LIMIT` of them (``left_out`` says how many more
there are), the totals of the process, and the configuration in force. Webhooks appear by id
only: never a URL (it may carry credentials) and never a secret. The body is built by
``Pipeline.status`` (the engine) and ``App.status`` (the configuration part); this module holds
its bounds, the order of the list, and the client side (:func:`fetch_status`,
:func:`render_status`).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

STATUS_LIMIT = 100
"""At most this many webhooks are listed; the body says how many were left out."""

DEFAULT_URL = "http://127.0.0.1:9464"


def pressing_first(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key of the list: stalled, then out of credit, then failing (longest first), then the
    most deliveries waiting, then the most active, then by id."""
    since = row.get("failing_since")
    return (
        not row.get("stalled"),
        not row.get("out_of_credit"),
        since is None,
        since or 0.0,
        -(row.get("waiting") or 0),
        -(row.get("active") or 0),
        row["id"],
    )


def bounded(rows: list[dict[str, Any]], limit: int = STATUS_LIMIT) -> dict[str, Any]:
    """The ``webhooks`` part of the body: ``rows`` in :func:`pressing_first` order, cut at
    ``limit``, with how many there were and how many were left out."""
    rows.sort(key=pressing_first)
    listed = rows[: max(0, limit)]
    return {
        "webhooks": listed,
        "needing_attention": len(rows),
        "listed": len(listed),
        "left_out": len(rows) - len(listed),
    }


class StatusError(Exception):
    """The bridge's ``/status`` could not be read."""


def status_url(base: str) -> str:
    """``base`` (``http://host:port``, ``host:port``, or the ``/status`` URL itself) as the
    ``/status`` URL; StatusError for another scheme."""
    base = base.strip()
    if "://" not in base:
        base = f"http://{base}"
    if not base.lower().startswith(("http://", "https://")):
        raise StatusError(f"{base!r} is not an http:// or https:// URL")
    base = base.rstrip("/")
    return base if base.endswith("/status") else f"{base}/status"


def fetch_status(base: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET ``/status`` of the bridge at ``base``; StatusError when it cannot be read."""
    url = status_url(base)  # http or https only, never a file
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        exc.close()  # its response holds the socket until closed
        raise StatusError(f"{url} answered HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise StatusError(f"cannot read {url}: {reason}") from None
    if not isinstance(body, dict) or not isinstance(body.get("webhooks"), list):
        raise StatusError(f"{url} did not answer a bridge status")
    return body


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def state_of(row: Mapping[str, Any]) -> str:
    """One word for a webhook's row: stalled, no-credit, failing or busy."""
    if row.get("stalled"):
        return "stalled"
    if row.get("out_of_credit"):
        return "no-credit"
    if row.get("failing_since") is not None:
        return "failing"
    return "busy"


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def render_status(body: Mapping[str, Any], now: float | None = None) -> str:
    """The status as text for a terminal: a summary, the configuration, and one row per webhook
    listed."""
    now = body.get("time", time.time()) if now is None else now
    totals = body.get("totals", {})
    lines = [
        f"{body.get('needing_attention', 0)} webhook(s) need attention "
        f"({totals.get('webhooks_failing', 0)} failing) of "
        f"{totals.get('webhooks_configured', 0)} configured; "
        f"{totals.get('in_flight', 0)}/{totals.get('max_in_flight', 0)} deliveries in flight"
        f"{' (at the limit)' if totals.get('backpressure') else ''}; "
        f"{totals.get('paused_partitions', 0)}/{totals.get('assigned_partitions', 0)} "
        "partitions paused"
    ]
    config = body.get("config")
    if isinstance(config, Mapping):
        applied = config.get("applied_at")
        state = "in force" if config.get("in_force", True) else "a newer file is REJECTED"
        lines.append(
            f"config: {config.get('path')}, {config.get('webhooks')} webhook(s), "
            f"generation {config.get('generation')} "
            f"(applied {_age(None if applied is None else now - applied)} ago), {state}"
        )
    rows = [
        [
            str(row.get("id")),
            state_of(row),
            _age(None if row.get("failing_since") is None else now - row["failing_since"]),
            str(row.get("active", "-")),
            str(row.get("limit") if row.get("limit") is not None else "-"),
            str(row.get("waiting", "-")),
            "-" if row.get("credit") is None else f"{row['credit']:.0f}",
        ]
        for row in body.get("webhooks", [])
    ]
    if rows:
        lines += _table(
            rows, ["WEBHOOK", "STATE", "FAILING FOR", "ACTIVE", "LIMIT", "WAITING", "CREDIT"]
        )
    else:
        lines.append("no webhook failing, stalled or busy")
    if body.get("left_out"):
        lines.append(f"... and {body['left_out']} more not listed (the list is capped)")
    return "\n".join(lines)
