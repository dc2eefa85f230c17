"""The process's open-file limit, raised to what the configured connections may need.

Every delivery in flight holds a socket, and so does every idle keep-alive connection; the Kafka
clients, the operator port and the configuration watcher hold a few more. A soft limit of 1,024
(many systems' default) is below what the defaults allow (``max_in_flight`` 1,000 plus
``max_idle_connections`` 2,000), and a connection refused by it fails a delivery
(``connection_error``, EMFILE) for no fault of its receiver. The soft limit is raised, up to the
hard one, as other network services do at start; a hard limit too low for the settings is
reported, not fatal.
"""

from __future__ import annotations

import contextlib
import resource
from dataclasses import dataclass

OTHER_FILES = 512
"""Descriptors kept for everything but the delivery connections: Kafka's sockets (one or two per
broker per client), the operator port's connections, files, the reload child's pipes."""


@dataclass(frozen=True, slots=True)
class OpenFiles:
    """The open-file limit after :func:`raise_open_file_limit`."""

    wanted: int
    soft: int  # now
    hard: int  # -1: unlimited

    @property
    def enough(self) -> bool:
        return self.soft >= self.wanted


def wanted_open_files(max_in_flight: int, max_idle_connections: int) -> int:
    """Descriptors the delivery settings may need at once, with room for everything else."""
    return max_in_flight + max_idle_connections + OTHER_FILES


def raise_open_file_limit(wanted: int) -> OpenFiles:
    """Raise the soft RLIMIT_NOFILE to ``wanted`` (at most the hard limit); never lower it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        # (ValueError, OSError: a kernel ceiling, fs.nr_open, below the hard limit)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    return OpenFiles(
        wanted=wanted,
        soft=wanted if soft == unlimited else soft,
        hard=-1 if hard == unlimited else hard,
    )
