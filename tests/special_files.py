"""Paths that lead to no regular file, as a mistaken or hostile configuration may name them, and
what the loader says of each."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

NOT_REGULAR = {
    "fifo": "not a regular file (a FIFO)",
    "device": "not a regular file (a character device)",
    "directory": "Is a directory",
    "socket": "not a regular file (a socket)",
}
"""Each kind of path :func:`make_special` makes, and the reason the loader gives for it."""


def make_special(path: Path, kind: str) -> Path:
    """Make ``path`` a FIFO (whose plain open() waits for a writer for ever), a symlink to
    /dev/zero (endless), a directory or a Unix socket (bound, then closed: the file stays)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        with socket.socket(socket.AF_UNIX) as server, contextlib.chdir(path.parent):
            server.bind(path.name)  # (relative: a socket's path is short)
    return path


def make_sparse(path: Path, size: int) -> Path:
    """Make ``path`` a file of ``size`` zero bytes that takes no disk space."""
    with path.open("wb") as handle:
        handle.truncate(size)
    return path
