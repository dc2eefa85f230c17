"""The operator HTTP port: ``/metrics``, ``/healthz``, ``/readyz`` and ``/status``.

- ``/healthz`` (liveness): 200 while the consume loop has turned within ``LOOP_STALL_S``; a stuck
  process answers 503 and Kubernetes restarts it.
- ``/readyz`` (readiness): 200 when the configuration is loaded, a broker is reachable, and the
  consumer is assigned partitions or waiting for an assignment in a healthy group; 503 otherwise,
  with the failing checks in the body. The body's ``config`` part says whether the file on disk
  is in force and, while a changed file is rejected, its problems (the bridge stays ready: it
  keeps delivering with the configuration in force).
- ``/status``: per-webhook detail outside Prometheus, as JSON (:mod:`bridge.ops.status`): the
  webhooks failing, stalled, out of credit or busy now (ids only, bounded), the totals, and the
  configuration in force.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

LOOP_STALL_S = 60.0


def health_app(
    registry: CollectorRegistry,
    last_loop: Callable[[], float],
    readiness: Callable[[], dict[str, bool]],
    config_state: Callable[[], dict[str, object]] = dict,
    status: Callable[[], dict[str, object]] | None = None,
) -> web.Application:
    """The aiohttp application serving the endpoints (``/status`` only when ``status`` is given)."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_request: web.Request) -> web.Response:
        stalled = time.monotonic() - last_loop()
        ok = stalled < LOOP_STALL_S
        body = {"status": "ok" if ok else "stalled", "loop_age_seconds": round(stalled, 3)}
        return web.json_response(body, status=200 if ok else 503)

    async def readyz(_request: web.Request) -> web.Response:
        checks = readiness()
        ok = all(checks.values())
        return web.Response(
            text=json.dumps({"ready": ok, "checks": checks, "config": config_state()}),
            status=200 if ok else 503,
            content_type="application/json",
        )

    async def status_view(_request: web.Request) -> web.Response:
        assert status is not None
        return web.Response(
            text=json.dumps(status(), separators=(",", ":")),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if status is not None:
        app.router.add_get("/status", status_view)
    return app


async def start_health_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app`` on host:port; returns the runner to clean up at shutdown."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
