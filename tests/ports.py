"""A loopback port that refuses connections, held for the whole test."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port of 127.0.0.1 where a connection is refused for as long as the block runs.

    A socket binds it and never listens: the kernel answers a connection with a reset, and no
    other process (a broker, a client's own ephemeral port) can take the port meanwhile, as it
    could one found free and closed again."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]
