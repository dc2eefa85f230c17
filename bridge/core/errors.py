"""The bridge's error tree.

Every error says whether it is retriable, so the pipeline decides "try again later" versus
"dead letter" from one attribute instead of a chain of ``isinstance`` checks::

    BridgeError (retriable: bool)
    ├── ConfigError                  invalid configuration file (never retriable)
    ├── RecordError                  a source record that can never become a notification
    │   ├── DecodeError              bytes that are not a transaction record we can read
    │   └── MappingError             a decoded record that breaks the notification contract
    ├── RegistryUnavailableError     the schema registry cannot answer now (retriable)
    └── DeliveryError                one HTTP delivery was not received (retriable)
        └── DestinationRefusedError  the destination address is not allowed by policy

Errors about a record keep the raw bytes (``raw``) so the record can be dead-lettered whole, and a
short machine-readable ``reason`` used as the dead-letter reason and metric label.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every error the bridge raises on purpose."""

    retriable: bool = False


class ConfigError(BridgeError):
    """The configuration file is invalid; ``problems`` lists every problem found, one per line."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems)
        listing = "\n".join(f"  - {problem}" for problem in self.problems)
        count = len(self.problems)
        super().__init__(f"{path}: {count} problem(s) in the configuration:\n{listing}")


class RecordError(BridgeError):
    """A source record that can never become a notification: it goes to the dead-letter topic."""

    retriable = False

    def __init__(self, reason: str, detail: str, raw: bytes | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.raw = raw
        super().__init__(f"{reason}: {detail}")


class DecodeError(RecordError):
    """The record's bytes cannot be decoded into a transaction record."""


class MappingError(RecordError):
    """The decoded record cannot be turned into the documented notification body."""


class RegistryUnavailableError(BridgeError):
    """The schema registry is unreachable or failing; the record must be tried again later."""

    retriable = True


class DeliveryError(BridgeError):
    """One delivery was not received: a non-2xx status, a timeout or a connection error."""

    retriable = True

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.status = status
        super().__init__(f"{reason}: {detail}")


class DestinationRefusedError(DeliveryError):
    """The destination resolved to an address that outbound policy refuses."""
