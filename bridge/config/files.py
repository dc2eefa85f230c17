"""Reading the configuration's files (the configuration file, a directory's files, secret files,
``{file: PATH}`` values, and the reload watcher's fingerprints of them all): regular files only,
never past a limit, never waiting.

A plain ``open()`` of a FIFO waits for a writer for ever, and reading ``/dev/zero`` or a sparse
file of a terabyte never ends or fills the memory. :func:`read_regular_file` opens without
waiting (``O_NONBLOCK``), refuses anything ``fstat`` says is not a regular file, and reads at most
one byte past the limit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Final

_READ_CHUNK: Final = 1024 * 1024  # read past what fstat said in pieces this large

_OPEN_FLAGS: Final = (
    os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
)  # (O_NOCTTY: a terminal named as a file never becomes this process's)


class FileRefused(Exception):
    """A file that is not read; the message says why, without the path (the caller names it)."""

    def __init__(self, reason: str, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_large = too_large


def _not_regular(mode: int) -> str:
    """Why a file of this ``st_mode`` is not read."""
    if stat.S_ISDIR(mode):
        return os.strerror(errno.EISDIR)
    kinds = {
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    kind = next((name for test, name in kinds.items() if test(mode)), "not a file")
    return f"not a regular file ({kind})"


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed), or FileRefused: it cannot
    be opened, is not a regular file (a directory, a FIFO, a device, a socket), or holds more
    than ``limit`` bytes (``too_large``; never more than ``limit + 1`` bytes are read)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if exc.errno == errno.ENXIO:  # (a socket cannot be opened: say what it is)
            with contextlib.suppress(OSError):
                reason = _not_regular(os.stat(path).st_mode)
        raise FileRefused(reason) from None
    except ValueError:  # a NUL byte or an unencodable character in the path
        raise FileRefused("invalid path") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise FileRefused(_not_regular(status.st_mode))
        if status.st_size > limit:
            raise FileRefused("too large", too_large=True)
        wanted = status.st_size + 1
        chunks = [os.read(fd, wanted)]
        total = len(chunks[0])
        while len(chunks[-1]) == wanted and total <= limit:  # (it grew since fstat)
            wanted = min(_READ_CHUNK, limit + 1 - total)
            chunks.append(os.read(fd, wanted))
            total += len(chunks[-1])
    except OSError as exc:
        raise FileRefused(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    if total > limit:
        raise FileRefused("too large", too_large=True)
    return b"".join(chunks)
