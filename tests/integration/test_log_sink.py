"""A reader of the bridge's log that stops reading stalls no delivery.

The bridge's stdout and stderr are a pipe of one page (4 KiB) that the test does not read while
it checks: once it is full, every write to it waits. Three hundred webhooks of one account answer
500, so each of them writes a ``delivery.failed`` line (one per webhook and window): far more
than the pipe holds. A healthy webhook of another account must still get every record.
"""

from __future__ import annotations

import array
import fcntl
import os
import termios
import threading
import time
from collections.abc import Callable

import pytest

from devtools.samples import make_record
from tests.bridge_harness import BridgeSetup, webhook
from tests.kafka_helpers import wait_for
from tests.receiver import Receiver, always

pytestmark = pytest.mark.integration

F_SETPIPE_SZ = 1031
PIPE_BYTES = 4096
NOISY = 300


def waiting_bytes(read_end: int) -> int:
    """How many bytes wait in the pipe, unread."""
    count = array.array("i", [0])
    fcntl.ioctl(read_end, termios.FIONREAD, count)
    return count[0]


def test_a_stalled_log_reader_stalls_no_delivery(
    receiver: Receiver, bridge_setup: Callable[..., BridgeSetup]
) -> None:
    receiver.behaviours["/fail"] = always(500)
    hooks = [webhook(f"noisy-{n}", "acct_noisy", receiver.url("/fail")) for n in range(NOISY)]
    setup = bridge_setup([*hooks, webhook("ok", "acct_ok", receiver.url("/ok"))])
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_BYTES)
    drained = threading.Event()
    try:
        bridge = setup.start_bridge(output=write_end)
        os.close(write_end)
        setup.produce_records([make_record("tx-noisy-1", "acct_noisy")])
        wait_for(
            lambda: waiting_bytes(read_end) >= PIPE_BYTES - 512 and len(receiver.on("/fail")) > 50,
            30,
            message="the log pipe to fill with the failing webhooks' lines",
        )
        started = time.monotonic()
        setup.produce_records([make_record(f"tx-ok-{n}", "acct_ok") for n in range(20)])
        wait_for(
            lambda: len(receiver.received_ids("/ok")) == 20,
            30,
            message="every healthy record delivered while nobody reads the log",
        )
        assert waiting_bytes(read_end) >= PIPE_BYTES - 512  # still full: nobody read it
        assert time.monotonic() - started < 30
        assert bridge.gauge("bridge_assigned_partitions") > 0  # the operator port answers too
    finally:
        reader = threading.Thread(target=_drain, args=(read_end, drained), daemon=True)
        reader.start()  # the bridge may now write what it holds, and stop
        setup.stop_all()
        drained.wait(30)
        os.close(read_end)


def _drain(fd: int, done: threading.Event) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    finally:
        done.set()
