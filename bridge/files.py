"""Reading the files an operator names (the configuration file, a directory's files, secret files,
``{file: PATH}`` values, the reload watcher's fingerprints of them all, and the Avro schema files):
regular files only, never past a limit, never waiting. The one module with I/O under the adapters
(:mod:`bridge.config` and :mod:`bridge.codec` both read through it); it imports nothing of the
project.

A plain ``open()`` of a FIFO waits for a writer for ever, and reading ``/dev/zero`` or a sparse
file of a terabyte never ends or fills the memory. :func:`read_regular_file` opens without
waiting (``O_NONBLOCK``), refuses anything ``fstat`` says is not a regular file, and reads until a
read returns nothing, at most one byte past the limit: a read may return fewer bytes than asked
before the end (procfs and sysfs, FUSE, 9p and virtiofs, NFS), and such a file cut short would be
a wrong key or a shorter but valid configuration.
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
    than ``limit`` bytes (``too_large``; never more than ``limit + 1`` bytes are read). It is read
    to its end however few bytes each read returns."""
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
        chunks = []
        total = 0
        while total <= limit:  # (a short read is not the end: only an empty one is)
            promised = status.st_size + 1 - total  # (the rest fstat said, and a byte to see growth)
            chunk = os.read(fd, min(promised if promised > 0 else _READ_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise FileRefused(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    if total > limit:
        raise FileRefused("too large", too_large=True)
    return b"".join(chunks)
