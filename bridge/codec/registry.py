"""A small Confluent-compatible schema registry client: writer schemas by id, cached forever.

Schemas by id are immutable, so every fetched schema is kept for the life of the process. A schema
id the registry does not know is a bad record (:class:`DecodeError`, reason ``unknown_schema_id``),
remembered as such for :data:`UNKNOWN_ID_MEMORY_S` (the last :data:`UNKNOWN_IDS_REMEMBERED` ids),
so records naming the same bogus id cost one request per interval; a registry that cannot answer
is :class:`RegistryUnavailableError`, which is retriable, so good records are never dead-lettered
because the registry is down.

A request ends by one deadline, the client's ``timeout``, whatever the server does: every socket
operation (connecting, TLS, sending, the answer's head and body) waits at most until then (httpx's
own timeouts are per operation: a registry sending a byte every 2 s held a fetch, and with it the
consume loop, for ever). An answer is read as a stream and no further than
:data:`ANSWER_LIMIT` bytes (a 200 MB answer took 634 MB); a longer one is the registry failing
(:class:`RegistryUnavailableError`): a Confluent registry keeps its schemas in a Kafka topic whose
records are at most 1 MB by default, and the bridge reads no schema file over 1 MiB either, so an
answer past the limit is a proxy or a registry misbehaving, not a schema the record needs.

Error messages name the registry by :func:`display_url` (no userinfo, no query string) and never
repeat credentials: basic-auth credentials are passed as ``auth``, never in the URL.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote, urlsplit, urlunsplit

import httpcore
import httpx

from bridge.codec.encoding import AvroSchema
from bridge.core.errors import DecodeError, RegistryUnavailableError
from bridge.core.expiring import Expiring

# Confluent-compatible registries (Confluent, Karapace, Apicurio ccompat) answer an unknown id with
# HTTP 404 and this error code; any other 404 means a wrong URL, not a bad record.
SCHEMA_NOT_FOUND_ERROR_CODE = 40403
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ANSWER_LIMIT: Final = 1024 * 1024
"""The most bytes of an answer read (the transaction schema is about 4 KB)."""
UNKNOWN_ID_MEMORY_S: Final = 60.0
UNKNOWN_IDS_REMEMBERED: Final = 1000


class RegistryRefusedError(Exception):
    """The registry refused the client's credentials (HTTP 401 or 403): no retry mends it."""


class SchemaRegistryClient:
    """Fetches and registers Avro schemas on a Confluent-compatible registry over HTTP."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 5.0,
        auth: tuple[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Connect lazily to ``base_url``, which may carry a path such as ``/apis/ccompat/v7``;
        each request ends within ``timeout`` seconds (``clock`` times the unknown ids)."""
        self.base_url = display_url(base_url)
        self._user = auth[0] if auth else None
        self._secrets = [part for part in (*(auth or ()), _userinfo(base_url)) if part]
        self._schemas_by_id: dict[int, AvroSchema] = {}
        self._unknown_ids: Expiring[int, str] = Expiring(limit=UNKNOWN_IDS_REMEMBERED)
        self._unknown_ids_lock = threading.Lock()
        self._clock = clock
        self._timeout = timeout
        self._deadline = _Deadline()
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            auth=auth,
            transport=transport or _DeadlineTransport(self._deadline),
            headers={"Accept": f"{_CONTENT_TYPE}, application/json", "Accept-Encoding": "identity"},
        )

    def probe(self) -> None:
        """Ask for the registry's subjects: return when it answers, raise
        :class:`RegistryRefusedError` when it refuses the credentials (or their absence) and
        :class:`RegistryUnavailableError` when it cannot answer. Messages name the user, never
        the password."""
        status, _ = self._request("GET", "/subjects", read_body=False)
        if status in (401, 403):
            who = f"user {self._user!r}" if self._user else "no credentials"
            raise RegistryRefusedError(
                f"schema registry at {self.base_url} refused the request with {who} (HTTP {status})"
            )
        if status != 200:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} answered HTTP {status} to GET /subjects"
            )

    def cached(self, schema_id: int) -> AvroSchema | None:
        """The schema already fetched for ``schema_id``, or None; never does I/O."""
        return self._schemas_by_id.get(schema_id)

    def fetch(self, schema_id: int) -> AvroSchema:
        """The writer schema registered under ``schema_id``; blocking I/O on the first call only."""
        schema = self._schemas_by_id.get(schema_id)
        if schema is not None:
            return schema
        unknown = self._unknown_ids.get(schema_id)
        if unknown is not None and unknown[0] > self._clock():
            raise DecodeError("unknown_schema_id", unknown[1])
        path = f"/schemas/ids/{schema_id}"
        status, body = self._request("GET", path)
        if status == 404 and _error_code(body) == SCHEMA_NOT_FOUND_ERROR_CODE:
            detail = f"schema id {schema_id} is not in the schema registry at {self.base_url}"
            with self._unknown_ids_lock:
                now = self._clock()
                self._unknown_ids.put(schema_id, now + UNKNOWN_ID_MEMORY_S, detail, now)
            raise DecodeError("unknown_schema_id", detail)
        if status != 200:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} answered HTTP {status} "
                f"for schema id {schema_id}"
            )
        if body is None:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} answered GET {path} with more than "
                f"{ANSWER_LIMIT:,} bytes"
            )
        schema = _schema_from_answer(body, schema_id, self.base_url)
        self._schemas_by_id[schema_id] = schema
        return schema

    def register(self, subject: str, schema: AvroSchema) -> int:
        """Register ``schema`` under ``subject`` and return its id (idempotent on the registry)."""
        status, body = self._request(
            "POST",
            f"/subjects/{quote(subject, safe='')}/versions",
            content=json.dumps({"schema": json.dumps(schema)}),
            headers={"Content-Type": _CONTENT_TYPE},
        )
        if status >= 500 or body is None:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} answered HTTP {status} "
                f"when registering subject {subject!r}"
                + ("" if body is not None else f" with more than {ANSWER_LIMIT:,} bytes")
            )
        if status != 200:
            raise ValueError(
                f"schema registry at {self.base_url} refused the schema for subject {subject!r}: "
                f"HTTP {status} {body[:500].decode('utf-8', 'replace')}"
            )
        schema_id = int(json.loads(body)["id"])
        self._schemas_by_id[schema_id] = schema
        return schema_id

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> SchemaRegistryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _request(
        self, method: str, path: str, *, read_body: bool = True, **kwargs: Any
    ) -> tuple[int, bytes | None]:
        """The status and body of one request ended by the deadline; the body is None when it is
        longer than :data:`ANSWER_LIMIT` (read no further), empty when not ``read_body``."""
        self._deadline.at = time.monotonic() + self._timeout
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if not read_body:
                    return response.status_code, b""
                length = response.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > ANSWER_LIMIT:
                    return response.status_code, None
                body = bytearray()
                for chunk in response.iter_raw():
                    body += chunk
                    if len(body) > ANSWER_LIMIT:
                        return response.status_code, None
                return response.status_code, bytes(body)
        except httpx.TimeoutException as exc:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} did not answer {method} {path} within "
                f"{self._timeout:g}s ({type(exc).__name__})"
            ) from None
        except httpx.RequestError as exc:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} unreachable ({method} {path}): "
                f"{type(exc).__name__}: {self._masked(str(exc))}"
            ) from None
        finally:
            self._deadline.at = None

    def _masked(self, text: str) -> str:
        """``text`` with every credential of this client replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def display_url(url: str) -> str:
    """``url`` as it may be shown: without userinfo and query string."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _userinfo(url: str) -> str:
    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[0] if "@" in netloc else ""


def _error_code(answer: bytes | None) -> object:
    try:
        body = json.loads(answer or b"")
    except ValueError:
        return None
    return body.get("error_code") if isinstance(body, dict) else None


def _schema_from_answer(answer: bytes, schema_id: int, base_url: str) -> AvroSchema:
    try:
        body = json.loads(answer)
        schema_type = body.get("schemaType", "AVRO")
        schema_text = body["schema"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RegistryUnavailableError(
            f"schema registry at {base_url} sent an unreadable answer for schema id {schema_id}"
        ) from exc
    if schema_type != "AVRO":
        raise DecodeError(
            "unsupported_schema_type",
            f"schema id {schema_id} is a {schema_type} schema; only Avro records are read",
        )
    try:
        schema: AvroSchema = json.loads(schema_text)
    except (ValueError, TypeError) as exc:
        raise DecodeError(
            "invalid_writer_schema", f"schema id {schema_id} is not JSON: {exc}"
        ) from exc
    return schema


class _Deadline(threading.local):
    """When the request in progress on this thread must end (``time.monotonic()``), if any."""

    at: float | None = None

    def clamp(
        self, timeout: float | None, expired: type[httpcore.TimeoutException]
    ) -> float | None:
        """``timeout`` shortened to the time left; ``expired`` raised when none is left."""
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise expired("the request's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the deadline of the request using it."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        limit = self._deadline.clamp(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, limit), self._deadline
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sockets, each operation ending by the deadline of the request in progress."""

    def __init__(self, deadline: _Deadline) -> None:
        self._sockets = httpcore.SyncBackend()
        self._deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        limit = self._deadline.clamp(timeout, httpcore.ConnectTimeout)
        stream = self._sockets.connect_tcp(host, port, limit, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        limit = self._deadline.clamp(timeout, httpcore.ConnectTimeout)
        stream = self._sockets.connect_unix_socket(path, limit, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._sockets.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's default transport over :class:`_DeadlineBackend` (httpx takes no network backend:
    its connection pool is replaced by the same pool over that backend)."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(deadline),
        )
