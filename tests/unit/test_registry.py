"""Tests of bridge.codec.registry against a real Confluent-compatible HTTP server on loopback."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bridge.codec.decoding import Decoder
from bridge.codec.encoding import encode_confluent
from bridge.codec.registry import (
    ANSWER_LIMIT,
    UNKNOWN_ID_MEMORY_S,
    UNKNOWN_IDS_REMEMBERED,
    RegistryRefusedError,
    SchemaRegistryClient,
)
from bridge.core.errors import DecodeError, RegistryUnavailableError
from tests.ports import refused_port

BASE_PATH = "/apis/ccompat/v7"
SLOW_ID = 777
FAILING_ONCE_ID = 500
PROTOBUF_ID = 600
GARBAGE_ID = 601
CONFLICT_SUBJECT = "refused-value"


class FakeRegistry(ThreadingHTTPServer):
    """A Confluent-compatible registry holding schemas in memory, recording every request."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), RegistryHandler)
        self.schemas: dict[int, str] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.failed_once: set[int] = set()
        self.release_slow = threading.Event()
        self.required_authorization: str | None = None  # of GET /subjects, when set
        self.subjects_status = 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{BASE_PATH}"


class RegistryHandler(BaseHTTPRequestHandler):
    server: FakeRegistry

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path, self.headers.get("Authorization")))
        prefix = f"{BASE_PATH}/schemas/ids/"
        if self.path == f"{BASE_PATH}/subjects":
            expected = self.server.required_authorization
            if expected is not None and self.headers.get("Authorization") != expected:
                self._json(401, {"error_code": 401, "message": "Unauthorized"})
            elif self.server.subjects_status != 200:
                self._send(self.server.subjects_status, b"{}")
            else:
                self._json(200, [])
            return
        if not self.path.startswith(prefix):
            self._send(404, b"<html>Not Found</html>", "text/html")
            return
        schema_id = int(self.path.removeprefix(prefix))
        if schema_id == SLOW_ID:
            self.server.release_slow.wait(timeout=10)
            self._send(500, b"{}")
        elif schema_id == FAILING_ONCE_ID and schema_id not in self.server.failed_once:
            self.server.failed_once.add(schema_id)
            self._json(500, {"error_code": 50001, "message": "Error in the backend data store"})
        elif schema_id == PROTOBUF_ID:
            self._json(200, {"schema": 'syntax = "proto3";', "schemaType": "PROTOBUF"})
        elif schema_id == GARBAGE_ID:
            self._send(200, b"<html>login page</html>", "text/html")
        elif schema_id in self.server.schemas:
            self._json(200, {"schema": self.server.schemas[schema_id]})
        else:
            self._json(404, {"error_code": 40403, "message": "Schema not found"})

    def do_POST(self) -> None:
        self.server.requests.append(("POST", self.path, self.headers.get("Authorization")))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if CONFLICT_SUBJECT in self.path:
            self._json(
                409, {"error_code": 409, "message": "Schema being registered is incompatible"}
            )
            return
        schema_text = body["schema"]
        known = [id_ for id_, text in self.server.schemas.items() if text == schema_text]
        schema_id = known[0] if known else len(self.server.schemas) + 1
        self.server.schemas[schema_id] = schema_text
        self._json(200, {"id": schema_id})

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def _json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload).encode(), "application/vnd.schemaregistry.v1+json")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def registry_server() -> Iterator[FakeRegistry]:
    server = FakeRegistry()
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server
    server.release_slow.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def client(registry_server: FakeRegistry) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient(registry_server.url, timeout=2.0) as registry_client:
        yield registry_client


def test_fetch_reads_the_schema_once_then_serves_it_from_cache(
    registry_server: FakeRegistry, client: SchemaRegistryClient, reader_schema: Any
) -> None:
    registry_server.schemas[1] = json.dumps(reader_schema)
    assert client.cached(1) is None
    assert client.fetch(1) == reader_schema
    assert client.fetch(1) == reader_schema
    assert client.cached(1) == reader_schema
    assert [path for _, path, _ in registry_server.requests] == [f"{BASE_PATH}/schemas/ids/1"]


def test_unknown_schema_id_is_a_bad_record(client: SchemaRegistryClient) -> None:
    with pytest.raises(DecodeError) as caught:
        client.fetch(42)
    assert (caught.value.reason, caught.value.retriable) == ("unknown_schema_id", False)
    assert "42" in caught.value.detail


def test_404_without_the_registry_error_code_means_a_wrong_url(
    registry_server: FakeRegistry,
) -> None:
    wrong_base = registry_server.url.removesuffix(BASE_PATH)
    with (
        SchemaRegistryClient(wrong_base) as client,
        pytest.raises(RegistryUnavailableError) as caught,
    ):
        client.fetch(1)
    assert caught.value.retriable
    assert "404" in str(caught.value)


def test_server_error_is_retriable_and_the_next_fetch_succeeds(
    registry_server: FakeRegistry, client: SchemaRegistryClient, reader_schema: Any
) -> None:
    registry_server.schemas[FAILING_ONCE_ID] = json.dumps(reader_schema)
    with pytest.raises(RegistryUnavailableError) as caught:
        client.fetch(FAILING_ONCE_ID)
    assert caught.value.retriable
    assert "HTTP 500" in str(caught.value)
    assert client.fetch(FAILING_ONCE_ID) == reader_schema


def test_connection_refused_is_retriable() -> None:
    with refused_port() as port:
        client = SchemaRegistryClient(f"http://127.0.0.1:{port}")
        with client, pytest.raises(RegistryUnavailableError) as caught:
            client.fetch(1)
    assert "unreachable" in str(caught.value)


def test_timeout_is_retriable(registry_server: FakeRegistry) -> None:
    client = SchemaRegistryClient(registry_server.url, timeout=0.2)
    with client, pytest.raises(RegistryUnavailableError) as caught:
        client.fetch(SLOW_ID)
    assert "Timeout" in str(caught.value)


def test_unreadable_answer_is_retriable(client: SchemaRegistryClient) -> None:
    with pytest.raises(RegistryUnavailableError):
        client.fetch(GARBAGE_ID)


def test_schema_that_is_not_avro_is_a_bad_record(client: SchemaRegistryClient) -> None:
    with pytest.raises(DecodeError) as caught:
        client.fetch(PROTOBUF_ID)
    assert caught.value.reason == "unsupported_schema_type"
    assert "PROTOBUF" in caught.value.detail


def test_register_returns_the_id_that_fetch_reads(
    registry_server: FakeRegistry, client: SchemaRegistryClient, reader_schema: Any
) -> None:
    schema_id = client.register("payments/transactions-value", reader_schema)
    assert client.register("payments/transactions-value", reader_schema) == schema_id
    method, path, _ = registry_server.requests[0]
    assert (method, path) == (
        "POST",
        f"{BASE_PATH}/subjects/payments%2Ftransactions-value/versions",
    )
    with SchemaRegistryClient(registry_server.url) as fresh_client:
        assert fresh_client.fetch(schema_id) == reader_schema


def test_refused_registration_says_why(client: SchemaRegistryClient, reader_schema: Any) -> None:
    with pytest.raises(ValueError, match="incompatible"):
        client.register(CONFLICT_SUBJECT, reader_schema)


def test_basic_auth_is_sent(registry_server: FakeRegistry, reader_schema: Any) -> None:
    registry_server.schemas[1] = json.dumps(reader_schema)
    with SchemaRegistryClient(registry_server.url, auth=("key", "secret")) as client:
        client.fetch(1)
    expected = "Basic " + base64.b64encode(b"key:secret").decode()
    assert registry_server.requests[0][2] == expected


def test_decoder_fetches_through_the_registry_once(
    registry_server: FakeRegistry,
    client: SchemaRegistryClient,
    reader_schema: Any,
    make_record: Callable[..., dict[str, Any]],
) -> None:
    schema_id = client.register("transactions-value", reader_schema)
    value = encode_confluent(schema_id, reader_schema, make_record())
    unknown = encode_confluent(99, reader_schema, make_record())
    with SchemaRegistryClient(registry_server.url) as consumer_side:
        decoder = Decoder(reader_schema, registry=consumer_side)
        assert decoder.schema_id_to_fetch(value) == schema_id
        assert decoder.decode(value) == make_record()
        assert decoder.decode(value) == make_record()
        assert decoder.schema_id_to_fetch(value) is None
        with pytest.raises(DecodeError) as caught:
            decoder.decode(unknown)

    assert (caught.value.reason, caught.value.raw) == ("unknown_schema_id", unknown)
    assert [path for _, path, _ in registry_server.requests[1:]] == [
        f"{BASE_PATH}/schemas/ids/{schema_id}",
        f"{BASE_PATH}/schemas/ids/99",
    ]


def test_decoder_keeps_good_records_when_the_registry_is_down(
    reader_schema: Any, make_record: Callable[..., dict[str, Any]]
) -> None:
    with refused_port() as port, SchemaRegistryClient(f"http://127.0.0.1:{port}") as down:
        decoder = Decoder(reader_schema, registry=down)
        with pytest.raises(RegistryUnavailableError):
            decoder.decode(encode_confluent(1, reader_schema, make_record()))


def test_registry_errors_never_carry_credentials_or_the_query_string() -> None:
    with refused_port() as port:
        url = f"http://alice:url-pass-1@127.0.0.1:{port}/ccompat?apikey=query-token-2"
        client = SchemaRegistryClient(url, timeout=1.0, auth=("bob", "auth-pass-3"))
        with pytest.raises(RegistryUnavailableError) as caught:
            client.fetch(7)
    text = str(caught.value)
    assert f"schema registry at http://127.0.0.1:{port}/ccompat unreachable" in text
    for secret in ("alice", "url-pass-1", "query-token-2", "auth-pass-3"):
        assert secret not in text
    assert caught.value.__cause__ is None, "the library's error (which may hold the URL) is dropped"


def test_probe_tells_refused_credentials_from_an_unavailable_registry(
    registry_server: FakeRegistry,
) -> None:
    """``probe`` (``bridge check``, ``bridge run`` at start): a 401 or 403 is a refusal naming
    the user and never the password; any other failure is the registry being unavailable."""
    token = base64.b64encode(b"bridge:right-Password-1").decode()
    registry_server.required_authorization = f"Basic {token}"
    with SchemaRegistryClient(registry_server.url, auth=("bridge", "right-Password-1")) as good:
        good.probe()
    refusals = ((("bridge", "wrong-Password-2"), "user 'bridge'"), (None, "no credentials"))
    for auth, who in refusals:
        refused = SchemaRegistryClient(registry_server.url, auth=auth)
        with refused, pytest.raises(RegistryRefusedError) as caught:
            refused.probe()
        assert str(caught.value) == (
            f"schema registry at {registry_server.url} refused the request with {who} (HTTP 401)"
        )
        assert "Password" not in str(caught.value)
    registry_server.required_authorization = None
    registry_server.subjects_status = 503
    failing = SchemaRegistryClient(registry_server.url)
    with failing, pytest.raises(RegistryUnavailableError, match="HTTP 503 to GET /subjects"):
        failing.probe()
    with refused_port() as port:
        nobody = SchemaRegistryClient(f"http://127.0.0.1:{port}", timeout=1.0)
        with nobody, pytest.raises(RegistryUnavailableError, match="unreachable"):
            nobody.probe()


# --- Registries that answer too slowly, too much, or the same "unknown" again -------------------


class RawServer:
    """A server on 127.0.0.1 that reads a request's head, then runs ``answer`` on the socket."""

    def __init__(self, answer: Callable[[socket.socket, threading.Event], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.answer = answer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener, self.listener.accept()[0] as connection:
            head = b""
            while b"\r\n\r\n" not in head:
                head += connection.recv(4096)
            with contextlib.suppress(OSError):  # the client gave up and closed
                self.answer(connection, self.stop)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def trickle(data: bytes, every_s: float = 0.05) -> Callable[[socket.socket, threading.Event], None]:
    """Send ``data`` a byte at a time, one each ``every_s`` (well within any read timeout)."""

    def answer(connection: socket.socket, stop: threading.Event) -> None:
        for index in range(len(data)):
            if stop.wait(every_s):
                return
            connection.sendall(data[index : index + 1])

    return answer


def endless(head: bytes) -> Callable[[socket.socket, threading.Event], None]:
    """Send ``head``, then 64 KB chunks of a JSON string for as long as the client reads."""

    def answer(connection: socket.socket, stop: threading.Event) -> None:
        connection.sendall(head + b'{"schema": "')
        chunk = b"x" * 65536
        while not stop.is_set():
            connection.sendall(chunk)

    return answer


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(answer: Callable[[socket.socket, threading.Event], None]) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


ANSWER = json.dumps({"schema": '"string"'}).encode()
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    "sent",
    [
        OK_HEAD + b"X-Pad: " + b"a" * 400 + b"\r\n\r\n",  # the head never ends in time
        OK_HEAD + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode() + ANSWER,
    ],
    ids=["head", "body"],
)
def test_a_registry_trickling_its_answer_is_given_up_at_the_deadline(
    raw_server: Callable[..., RawServer], sent: bytes
) -> None:
    """A byte every 50 ms never trips a read timeout of 0.5 s (httpx's timeouts are per read: a
    byte every 2 s held the fetch, and the consume loop, for ever); the request ends at 0.5 s."""
    server = raw_server(trickle(sent))
    client = SchemaRegistryClient(server.url, timeout=0.5)
    started = time.monotonic()
    with client, pytest.raises(RegistryUnavailableError) as caught:
        client.fetch(1)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 1.5, elapsed
    assert str(caught.value) == (
        f"schema registry at {server.url} did not answer GET /schemas/ids/1 within 0.5s "
        "(ReadTimeout)"
    )


@pytest.mark.parametrize(
    "head",
    [
        OK_HEAD + b"Content-Length: 209715200\r\n\r\n",
        OK_HEAD + b"Connection: close\r\n\r\n",  # no length: the body ends with the connection
    ],
    ids=["declared", "undeclared"],
)
def test_an_answer_over_the_limit_is_not_read_past_it(
    raw_server: Callable[..., RawServer], head: bytes
) -> None:
    """A 200 MB answer grew the bridge to 634 MB; now no more than the limit and a chunk is held,
    and the answer is the registry failing (retriable: the record is not dead-lettered)."""
    server = raw_server(endless(head))
    tracemalloc.start()
    try:
        with (
            SchemaRegistryClient(server.url, timeout=5.0) as client,
            pytest.raises(RegistryUnavailableError) as caught,
        ):
            client.fetch(1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value) == (
        f"schema registry at {server.url} answered GET /schemas/ids/1 with more than "
        f"{ANSWER_LIMIT:,} bytes"
    )
    assert peak < 3 * ANSWER_LIMIT, peak


class FakeClock:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_unknown_id_is_remembered_for_a_while(registry_server: FakeRegistry) -> None:
    """Records naming the same bogus id cost one request per interval, not one each."""
    clock = FakeClock()
    with SchemaRegistryClient(registry_server.url, clock=clock) as client:
        for _ in range(3):
            with pytest.raises(DecodeError) as caught:
                client.fetch(42)
            assert (caught.value.reason, caught.value.retriable) == ("unknown_schema_id", False)
            assert "schema id 42 is not in the schema registry" in caught.value.detail
        assert len(registry_server.requests) == 1
        clock.now += UNKNOWN_ID_MEMORY_S
        with pytest.raises(DecodeError):
            client.fetch(42)
        assert len(registry_server.requests) == 2


def test_only_the_last_unknown_ids_are_remembered(registry_server: FakeRegistry) -> None:
    """The ids remembered are bounded: past the limit, the one seen longest ago is asked again."""
    ids = range(10_000, 10_000 + UNKNOWN_IDS_REMEMBERED + 1)
    with SchemaRegistryClient(registry_server.url) as client:
        for schema_id in ids:
            with pytest.raises(DecodeError):
                client.fetch(schema_id)
        asked = len(registry_server.requests)
        for schema_id in (ids[-1], ids[1], ids[0]):
            with pytest.raises(DecodeError):
                client.fetch(schema_id)
    assert [path for _, path, _ in registry_server.requests[asked:]] == [
        f"{BASE_PATH}/schemas/ids/{ids[0]}"
    ]
