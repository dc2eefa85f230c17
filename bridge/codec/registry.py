"""A small Confluent-compatible schema registry client: writer schemas by id, cached forever.

Schemas by id are immutable, so every fetched schema is kept for the life of the process. A schema
id the registry does not know is a bad record (:class:`DecodeError`, reason ``unknown_schema_id``);
a registry that cannot answer is :class:`RegistryUnavailableError`, which is retriable, so good
records are never dead-lettered because the registry is down.

Error messages name the registry by :func:`display_url` (no userinfo, no query string) and never
repeat credentials: basic-auth credentials are passed as ``auth``, never in the URL.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from bridge.codec.encoding import AvroSchema
from bridge.core.errors import DecodeError, RegistryUnavailableError

# Confluent-compatible registries (Confluent, Karapace, Apicurio ccompat) answer an unknown id with
# HTTP 404 and this error code; any other 404 means a wrong URL, not a bad record.
SCHEMA_NOT_FOUND_ERROR_CODE = 40403
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


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
    ) -> None:
        """Connect lazily to ``base_url``, which may carry a path such as ``/apis/ccompat/v7``."""
        self.base_url = display_url(base_url)
        self._user = auth[0] if auth else None
        self._secrets = [part for part in (*(auth or ()), _userinfo(base_url)) if part]
        self._schemas_by_id: dict[int, AvroSchema] = {}
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            auth=auth,
            transport=transport,
            headers={"Accept": f"{_CONTENT_TYPE}, application/json"},
        )

    def probe(self) -> None:
        """Ask for the registry's subjects: return when it answers, raise
        :class:`RegistryRefusedError` when it refuses the credentials (or their absence) and
        :class:`RegistryUnavailableError` when it cannot answer. Messages name the user, never
        the password."""
        response = self._request("GET", "/subjects")
        status = response.status_code
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
        response = self._request("GET", f"/schemas/ids/{schema_id}")
        if response.status_code == 404 and _error_code(response) == SCHEMA_NOT_FOUND_ERROR_CODE:
            raise DecodeError(
                "unknown_schema_id",
                f"schema id {schema_id} is not in the schema registry at {self.base_url}",
            )
        if response.status_code != 200:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} answered HTTP {response.status_code} "
                f"for schema id {schema_id}"
            )
        schema = _schema_from_response(response, schema_id, self.base_url)
        self._schemas_by_id[schema_id] = schema
        return schema

    def register(self, subject: str, schema: AvroSchema) -> int:
        """Register ``schema`` under ``subject`` and return its id (idempotent on the registry)."""
        response = self._request(
            "POST",
            f"/subjects/{quote(subject, safe='')}/versions",
            content=json.dumps({"schema": json.dumps(schema)}),
            headers={"Content-Type": _CONTENT_TYPE},
        )
        if response.status_code >= 500:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} answered HTTP {response.status_code} "
                f"when registering subject {subject!r}"
            )
        if response.status_code != 200:
            raise ValueError(
                f"schema registry at {self.base_url} refused the schema for subject {subject!r}: "
                f"HTTP {response.status_code} {response.text[:500]}"
            )
        schema_id = int(response.json()["id"])
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

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.RequestError as exc:
            raise RegistryUnavailableError(
                f"schema registry at {self.base_url} unreachable ({method} {path}): "
                f"{type(exc).__name__}: {self._masked(str(exc))}"
            ) from None

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


def _error_code(response: httpx.Response) -> object:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("error_code") if isinstance(body, dict) else None


def _schema_from_response(response: httpx.Response, schema_id: int, base_url: str) -> AvroSchema:
    try:
        body = response.json()
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
