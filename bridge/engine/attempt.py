"""One delivery attempt under the engine's own deadline: it always ends in an outcome.

The HTTP client has its own timer, but the engine does not rely on it: :func:`guarded_attempt`
runs the request under an outer deadline of the webhook's timeout plus :data:`ATTEMPT_GRACE_S`,
and turns anything unexpected (an exception of any kind from building or sending the request)
into a not-received outcome with a reason. The delivery then goes up the retry ladder like any
other failure, its lane slot is freed and its record's offset can be committed: a stuck or crashed
attempt is impossible by construction, whatever a receiver sends or a URL holds.

Reasons (the outcome's ``error``, and the ``kind`` label of ``bridge_delivery_errors_total``):

- ``deadline_exceeded``: the attempt had no outcome within timeout + grace (a client defect).
- ``internal_error``: building or sending the request raised; the detail names the exception
  type and where it was raised, never its message (which could carry a header or a secret).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Final

from bridge.http.sender import DeliveryRequest, Outcome

log = logging.getLogger("bridge.engine.attempt")

ATTEMPT_GRACE_S: Final = 1.0
"""How far past its own timeout an attempt may run before the engine ends it."""

DEADLINE_EXCEEDED: Final = "deadline_exceeded"
INTERNAL_ERROR: Final = "internal_error"

Send = Callable[[DeliveryRequest, float], Awaitable[Outcome]]


async def guarded_attempt(
    send: Send,
    build: Callable[[], DeliveryRequest],
    timeout: float,
    on_error: Callable[[str], None],
    context: Callable[[], dict[str, object]] = dict,
) -> Outcome:
    """Build and send one request; return its outcome within ``timeout + ATTEMPT_GRACE_S``.

    Never raises except ``asyncio.CancelledError`` (a cancelled attempt is the caller's to hand
    off). ``on_error(kind)`` is called once for an attempt the guard had to end; ``context()``
    gives log fields naming the delivery.
    """
    started = time.perf_counter()
    limit = timeout + ATTEMPT_GRACE_S
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await send(build(), timeout)
    except Exception as exc:
        if isinstance(exc, TimeoutError) and deadline.expired():
            kind, detail = DEADLINE_EXCEEDED, f"no outcome within {limit:g}s"
        else:
            kind, detail = INTERNAL_ERROR, _where(exc)
    on_error(kind)
    log.error("delivery.guarded", extra={"fields": {**context(), "kind": kind, "detail": detail}})
    return Outcome(None, kind, time.perf_counter() - started, detail)


def _where(exc: BaseException) -> str:
    """The exception's type and the place it was raised, without its message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
