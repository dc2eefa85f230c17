"""The bridge's error tree.

Every error says whether it is retriable, so the pipeline decides "try again later" versus
"dead letter" from one attribute instead of a chain of ``isinstance`` checks::

    BridgeError (retriable: bool, reason: str)
    ├── ConfigError                  invalid configuration file (never retriable)
    ├── RecordError                  a source record that can never become a notification
    │   ├── DecodeError              bytes that are not a transaction record we can read
    │   └── MappingError             a decoded record that breaks the notification contract
    ├── RegistryUnavailableError     the schema registry cannot answer now (retriable)
    └── DestinationRefusedError      the destination address is not allowed by policy

The engine reads ``retriable`` where a record is turned into a notification: a retriable error
holds the record's partition and tries again later; any other is dead-lettered with its
``reason`` (the dead-letter reason and metric label). A refused destination never reaches the
engine as an exception: the HTTP client reports it as the outcome ``destination_refused``, which
goes up the retry ladder like any failed attempt. Errors about a record keep the raw bytes
(``raw``) so the record can be dead-lettered whole.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every error the bridge raises on purpose."""

    retriable: bool = False
    reason: str = "error"

    @property
    def detail(self) -> str:
        """What happened, for logs and dead-letter headers (never a secret)."""
        return str(self)


class ConfigError(BridgeError):
    """The configuration file is invalid; ``problems`` lists every problem found, one per line
    (each :func:`printable`: a file's name or a value cannot split it or write to a terminal)."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = [printable(problem) for problem in problems]
        listing = "\n".join(f"  - {problem}" for problem in self.problems)
        count = len(self.problems)
        shown = printable(path)
        super().__init__(f"{shown}: {count} problem(s) in the configuration:\n{listing}")


def clipped(text: str, limit: int = 60) -> str:
    """``text`` shortened to ``limit`` characters for a message, ``...`` marking the cut: a value
    of 8,000 characters makes no message longer."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def printable(text: str) -> str:
    """``text`` as one safe line for a terminal or a log: every character that is not printable
    (controls, line breaks, bidi controls and other format characters, lone surrogates such as
    a file name's bytes that are not UTF-8) escaped as in a Python string literal (``\\n``,
    ``\\x1b``, ``\\u202e``, ``\\udcff``). What it returns is printable: it is its own result."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


class RecordError(BridgeError):
    """A source record that can never become a notification: it goes to the dead-letter topic."""

    retriable = False

    def __init__(self, reason: str, detail: str, raw: bytes | None = None) -> None:
        self.reason = reason
        self._detail = detail
        self.raw = raw
        super().__init__(f"{reason}: {detail}")

    @property
    def detail(self) -> str:
        """What is wrong with the record."""
        return self._detail


class DecodeError(RecordError):
    """The record's bytes cannot be decoded into a transaction record."""


class MappingError(RecordError):
    """The decoded record cannot be turned into the documented notification body."""


class RegistryUnavailableError(BridgeError):
    """The schema registry is unreachable or failing; the record must be tried again later."""

    retriable = True
    reason = "registry_unavailable"


class DestinationRefusedError(BridgeError):
    """The destination resolved to an address that the outbound policy refuses."""

    retriable = True

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self._detail = detail
        super().__init__(f"{reason}: {detail}")

    @property
    def detail(self) -> str:
        """Which address was refused, and why."""
        return self._detail
