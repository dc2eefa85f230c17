"""Receiver TLS settings against real TLS servers on loopback with a private CA (trustme): a CA
file added to the system store, client certificates for mutual TLS, the least TLS version; a
wrong CA or a missing client certificate is a not-received attempt with reason tls_error. TLS
sessions are resumed per host name and setting, from full handshakes only, for a while."""

from __future__ import annotations

import _ssl
import asyncio
import contextlib
import ctypes
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import trustme

from bridge.core.destinations import DestinationPolicy
from bridge.core.webhook import TlsSettings
from bridge.http import tls
from bridge.http.sender import DeliveryRequest, HttpSender, Outcome
from bridge.http.tls import (
    TLS_FILES_CHECK_S,
    ResumingContext,
    TlsContexts,
    TlsError,
    make_context,
)

ANSWER = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def files(ca: trustme.CA, tmp_path: Path) -> dict[str, str]:
    paths = {
        name: tmp_path / f"{name}.pem" for name in ("ca", "cert_a", "key_a", "cert_b", "key_b")
    }
    ca.cert_pem.write_to_path(paths["ca"])
    for client in ("a", "b"):
        issued = ca.issue_cert(f"client-{client}.example")
        issued.cert_chain_pems[0].write_to_path(paths[f"cert_{client}"])
        issued.private_key_pem.write_to_path(paths[f"key_{client}"])
    return {name: str(path) for name, path in paths.items()}


def server_context(
    ca: trustme.CA, require_client: bool = False, max_version: ssl.TLSVersion | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    if require_client:
        context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(context)
    if max_version is not None:
        context.maximum_version = max_version
    return context


def deliver(
    context: ssl.SSLContext, requests: list[TlsSettings], event_loop: str = "asyncio"
) -> tuple[list[Outcome], list[str]]:
    """Send one request per setting to a TLS server answering 204 (on ``event_loop``: "asyncio"
    or "uvloop", the bridge's); returns the outcomes and the client certificate (subject) the
    server saw on each connection."""
    peers: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cert = writer.get_extra_info("peercert") or {}
        subject = dict(item[0] for item in cert.get("subject", ()))
        peers.append(str(subject.get("commonName", "")) or str(cert.get("subjectAltName", "")))
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                writer.write(ANSWER)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            writer.close()

    async def main() -> list[Outcome]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        sender = HttpSender(DestinationPolicy(allow_private=True))
        try:
            return [
                await sender.send(
                    DeliveryRequest(f"https://127.0.0.1:{port}/hook", {}, b"{}", tls), 3.0
                )
                for tls in requests
            ]
        finally:
            await sender.close()
            server.close()

    if event_loop == "uvloop":
        import uvloop

        return uvloop.run(main()), peers
    return asyncio.run(main()), peers


def test_a_private_ca_is_trusted_only_when_configured(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    (trusted, untrusted), _ = deliver(
        server_context(ca), [TlsSettings(ca_file=files["ca"]), TlsSettings()]
    )
    assert trusted.status == 204
    assert (untrusted.status, untrusted.error) == (None, "tls_error")
    assert "certificate verify failed" in untrusted.detail


def test_mutual_tls_sends_the_configured_client_certificate(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    with_a = TlsSettings(files["ca"], files["cert_a"], files["key_a"])
    with_b = TlsSettings(files["ca"], files["cert_b"], files["key_b"])
    without = TlsSettings(ca_file=files["ca"])
    outcomes, peers = deliver(server_context(ca, require_client=True), [with_a, with_b, without])
    assert [o.status for o in outcomes[:2]] == [204, 204]
    assert (outcomes[2].status, outcomes[2].error) == (None, "tls_error")
    # one connection per setting: a connection with one certificate never carries another's
    assert any("client-a" in peer for peer in peers) and any("client-b" in peer for peer in peers)


def test_the_least_tls_version_is_enforced(ca: trustme.CA, files: dict[str, str]) -> None:
    old_server = server_context(ca, max_version=ssl.TLSVersion.TLSv1_2)
    (at_12, at_13), _ = deliver(
        old_server,
        [TlsSettings(ca_file=files["ca"]), TlsSettings(ca_file=files["ca"], min_version="TLSv1.3")],
    )
    assert at_12.status == 204
    assert (at_13.status, at_13.error) == (None, "tls_error")


def test_unusable_tls_files_are_a_tls_error_naming_the_file(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    settings = TlsSettings(client_cert_file=str(garbage), client_key_file=str(garbage))
    with pytest.raises(TlsError, match=r"garbage\.pem"):
        make_context(settings)
    (outcome,), _ = deliver(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), [settings])
    assert (outcome.status, outcome.error) == (None, "tls_error")
    assert "garbage.pem" in outcome.detail


CLOSING_ANSWER = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def deliver_closing(
    context: ssl.SSLContext, requests: list[tuple[str, TlsSettings]]
) -> tuple[list[Outcome], list[bool]]:
    """Send each (host, setting) in turn to a TLS server that answers 204 and closes; returns the
    outcomes and, per connection, whether the server saw it resume a session."""
    resumed: list[bool] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        resumed.append(writer.get_extra_info("ssl_object").session_reused)
        try:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(CLOSING_ANSWER)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        writer.close()

    async def main() -> list[Outcome]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        sender = HttpSender(DestinationPolicy(allow_private=True))
        try:
            return [
                await sender.send(DeliveryRequest(f"https://{host}:{port}/h", {}, b"{}", tls), 3.0)
                for host, tls in requests
            ]
        finally:
            await sender.close()
            server.close()

    return asyncio.run(main()), resumed


def test_sessions_are_resumed_per_host_name_and_setting(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """A receiver closing after each answer: the next connection resumes the session of the
    first full handshake, but only to the same host name through the same setting."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    first = TlsSettings(ca_file=files["ca"])
    other = TlsSettings(ca_file=files["ca"], min_version="TLSv1.3")  # another context
    outcomes, resumed = deliver_closing(
        context,
        [
            ("127.0.0.1", first),
            ("127.0.0.1", first),
            ("127.0.0.1", first),
            ("localhost", first),  # another host name: a full handshake, then resumed
            ("localhost", first),
            ("127.0.0.1", other),
            ("127.0.0.1", other),
        ],
    )
    assert [o.status for o in outcomes] == [204] * 7
    assert resumed == [False, True, True, False, True, False, True]


def test_sessions_are_not_offered_once_their_time_is_up(
    ca: trustme.CA, files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls, "SESSION_MAX_AGE", 0.0)  # every kept session is already too old
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    settings = TlsSettings(ca_file=files["ca"])
    outcomes, resumed = deliver_closing(context, [("127.0.0.1", settings)] * 3)
    assert [o.status for o in outcomes] == [204] * 3
    assert resumed == [False, False, False]


class MemoryEnd:
    """One end of a TLS connection over memory buffers (no socket)."""

    def __init__(self, context: ssl.SSLContext, server_side: bool, host: str | None = None):
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(
            self.incoming, self.outgoing, server_side=server_side, server_hostname=host
        )


def connect(client: MemoryEnd, server: MemoryEnd) -> ssl.SSLObject:
    """Run the handshake between two ends, then send one byte from the server (a TLS 1.3 ticket
    comes after the handshake, before that byte); returns the client's TLS object."""
    for _ in range(4):
        for end in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):  # waiting for the other end
                end.tls.do_handshake()
        server.incoming.write(client.outgoing.read())
        client.incoming.write(server.outgoing.read())
    server.tls.write(b"x")
    client.incoming.write(server.outgoing.read())
    assert client.tls.read(1) == b"x"
    return client.tls


def test_only_a_full_handshake_gives_the_session_to_keep(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """A resumed connection's session is never kept: each kept session comes from a handshake
    that verified the certificate, so it is verified again at least every SESSION_MAX_AGE."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = make_context(TlsSettings(ca_file=files["ca"]))
    assert isinstance(client, ResumingContext)
    assert client.wants_session("127.0.0.1")
    full = connect(MemoryEnd(client, False, "127.0.0.1"), MemoryEnd(server, True))
    assert not full.session_reused
    assert client.keep_session("127.0.0.1", full)
    assert not client.wants_session("127.0.0.1")
    resumed = connect(MemoryEnd(client, False, "127.0.0.1"), MemoryEnd(server, True))
    assert resumed.session_reused
    assert not client.keep_session("127.0.0.1", resumed)
    client.forget_sessions()
    assert client.wants_session("127.0.0.1")
    fresh = connect(MemoryEnd(client, False, "127.0.0.1"), MemoryEnd(server, True))
    assert not fresh.session_reused


def test_sessions_are_kept_for_every_host_up_to_the_bound(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """More hosts than the 1,024 that once made the kept sessions start again from nothing:
    every host's session up to SESSION_HOSTS is offered; one more drops only the oldest."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = make_context(TlsSettings(ca_file=files["ca"]))
    assert isinstance(client, ResumingContext)
    full = connect(MemoryEnd(client, False, "127.0.0.1"), MemoryEnd(server, True))
    hosts = [f"h{n}.example" for n in range(tls.SESSION_HOSTS + 1)]
    for host in hosts:  # (one connection's session under each name: what is kept is the point)
        assert client.keep_session(host, full)
    assert client.wants_session(hosts[0])
    assert not any(client.wants_session(host) for host in hosts[1:])


def test_a_host_giving_no_ticket_is_not_asked_again_for_a_while(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """A server that gives no session ticket (TLS 1.3 or 1.2): nothing is offered, and its
    sessions are not read again (reading one costs time) until SESSION_MAX_AGE passes. A TLS 1.2
    server that gives tickets is resumed like a TLS 1.3 one."""
    no_tickets_13 = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    no_tickets_13.num_tickets = 0
    no_tickets_12 = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    no_tickets_12.maximum_version = ssl.TLSVersion.TLSv1_2
    no_tickets_12.options |= ssl.OP_NO_TICKET
    tickets_12 = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tickets_12.maximum_version = ssl.TLSVersion.TLSv1_2
    client = make_context(TlsSettings(ca_file=files["ca"]))
    assert isinstance(client, ResumingContext)
    for host, server, version in [
        ("127.0.0.1", no_tickets_13, "TLSv1.3"),
        ("localhost", no_tickets_12, "TLSv1.2"),
    ]:
        ca.issue_cert(host).configure_cert(server)
        first = connect(MemoryEnd(client, False, host), MemoryEnd(server, True))
        assert first.version() == version
        assert not client.keep_session(host, first)
        assert not client.wants_session(host)
        assert not connect(MemoryEnd(client, False, host), MemoryEnd(server, True)).session_reused
    ca.issue_cert("h12.example").configure_cert(tickets_12)
    first = connect(MemoryEnd(client, False, "h12.example"), MemoryEnd(tickets_12, True))
    assert first.version() == "TLSv1.2"
    assert client.keep_session("h12.example", first)
    assert connect(
        MemoryEnd(client, False, "h12.example"), MemoryEnd(tickets_12, True)
    ).session_reused


# --- Key exchanges of bounded cost: the handshake runs on the loop every delivery shares -------


@pytest.fixture(scope="module")
def rsa_ca() -> trustme.CA:
    return trustme.CA(key_type=trustme.KeyType.RSA)


def openssl(*args: str, cwd: Path) -> None:
    """Run ``openssl`` (installed by ``make setup``: deploy/kafka/ensure-net-tools.sh)."""
    assert shutil.which("openssl"), "the openssl command is missing: run make setup"
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def test_a_tls12_server_choosing_finite_field_dhe_is_refused(
    rsa_ca: trustme.CA, tmp_path: Path
) -> None:
    """A server's own DH prime costs the client up to a second of CPU per handshake (tls.py's
    text): the bridge offers no DHE suite, so such a server cannot complete a handshake; the same
    server with ECDHE answers."""
    openssl("genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt", "group:ffdhe2048",
            "-out", "dh.pem", cwd=tmp_path)  # fmt: skip
    rsa_ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    outcomes = []
    for suite in ("DHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256"):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        rsa_ca.issue_cert("127.0.0.1", key_type=trustme.KeyType.RSA).configure_cert(context)
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.load_dh_params(str(tmp_path / "dh.pem"))
        context.set_ciphers(suite)
        (outcome,), _ = deliver(context, [TlsSettings(ca_file=str(tmp_path / "ca.pem"))])
        outcomes.append(outcome)
    dhe, ecdhe = outcomes
    assert (dhe.status, dhe.error) == (None, "tls_error"), dhe
    assert ecdhe.status == 204


SERVERS = [  # (openssl s_server options, certificate key, whether the handshake completes)
    (("-tls1_3", "-groups", "ffdhe2048"), "ec:P-256", False),
    (("-tls1_3", "-groups", "ffdhe8192"), "ec:P-256", False),
    (("-tls1_3", "-groups", "P-256"), "ec:P-256", True),
    (("-tls1_3", "-groups", "X25519"), "ec:P-256", True),
    (("-tls1_3", "-groups", "X25519:P-384"), "ec:P-256", True),
    (("-tls1_3", "-groups", "P-521"), "ec:P-256", True),
    (("-tls1_2", "-curves", "secp384r1"), "ec:P-256", True),
    (("-tls1_2", "-curves", "X25519"), "rsa:2048", True),
    (("-tls1_2",), "ec:P-384", True),  # the client's groups must cover the certificate's curve
    (("-tls1_2",), "ec:P-521", True),
    ((), "rsa:2048", True),
]


@pytest.mark.parametrize(("options", "key", "completes"), SERVERS)
def test_only_elliptic_curve_groups_are_offered_and_common_servers_complete(
    tmp_path: Path, options: tuple[str, ...], key: str, completes: bool
) -> None:
    """``openssl s_server`` limited as given (Python cannot limit a server's groups), with a
    self-signed certificate of ``key``: a server that wants a finite-field group (ffdhe8192:
    175 ms of client CPU per handshake) gets no handshake; servers limited to any of the
    elliptic-curve groups, or with a P-384 or P-521 certificate, do."""
    kind, _, size = key.partition(":")
    algorithm = ("-newkey", f"rsa:{size}") if kind == "rsa" else ("-newkey", "ec")
    curve = ("-pkeyopt", f"ec_paramgen_curve:{size}") if kind == "ec" else ()
    openssl("req", "-x509", *algorithm, *curve, "-keyout", "k.pem", "-out", "c.pem", "-days",
            "1", "-nodes", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            cwd=tmp_path)  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        ["openssl", "s_server", "-accept", f"127.0.0.1:{port}", "-cert", "c.pem", "-key", "k.pem",
         *options, "-quiet", "-naccept", "1"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                raw = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "openssl s_server did not listen"
                time.sleep(0.05)
        context = make_context(TlsSettings(ca_file=str(tmp_path / "c.pem")))
        with raw:
            if completes:
                with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls_socket:
                    assert tls_socket.version() in {"TLSv1.2", "TLSv1.3"}
            else:
                with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE"):
                    context.wrap_socket(raw, server_hostname="127.0.0.1")
    finally:
        server.kill()
        server.wait(10)


def test_where_the_groups_cannot_be_given_p256_alone_is_offered_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tls, "_libssl", lambda: None)
    with caplog.at_level("WARNING", logger="bridge.http.tls"):
        context = make_context(TlsSettings())
    assert [r.getMessage() for r in caplog.records] == ["tls.groups_fallback"]
    assert context.options & ssl.OP_NO_RENEGOTIATION


def test_every_context_offers_no_dhe_suite_and_refuses_renegotiation() -> None:
    context = make_context(TlsSettings())
    names = [cipher["name"] for cipher in context.get_ciphers()]
    assert names and not [name for name in names if name.startswith("DHE")]
    assert {"TLS_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"} <= set(names)
    assert context.options & ssl.OP_NO_RENEGOTIATION


def test_a_certificate_message_past_the_bound_is_refused_before_it_is_parsed(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """A receiver padding its certificate chain makes the client parse every certificate on the
    event loop: past :data:`tls.MAX_CERT_LIST` bytes the handshake fails at once (tls_error);
    the same receiver with an ordinary chain answers."""
    issued = ca.issue_cert("127.0.0.1")
    chain = tmp_path / "chain.pem"
    padding = [trustme.CA().cert_pem.bytes() for _ in range(80)]  # about 40 KB more
    chain.write_bytes(issued.private_key_pem.bytes() + issued.cert_chain_pems[0].bytes())
    padded = tmp_path / "padded.pem"
    padded.write_bytes(chain.read_bytes() + b"".join(padding))
    assert sum(len(p) for p in padding) * 3 // 4 > tls.MAX_CERT_LIST  # (DER is 3/4 of PEM)
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    outcomes = []
    for served in (padded, chain):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(served))
        (outcome,), _ = deliver(context, [TlsSettings(ca_file=str(tmp_path / "ca.pem"))])
        outcomes.append(outcome)
    too_long, ordinary = outcomes
    assert (too_long.status, too_long.error) == (None, "tls_error"), too_long
    assert "excessive message size" in too_long.detail.lower(), too_long.detail
    assert ordinary.status == 204


def ticket_server(ca: trustme.CA, tickets: int) -> ssl.SSLContext:
    """A TLS 1.3 server context that sends ``tickets`` session tickets after each handshake
    (about 255 bytes each, none carrying data)."""
    context = server_context(ca)
    context.num_tickets = tickets
    return context


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_a_flood_of_records_without_data_ends_the_connection_early(
    ca: trustme.CA, files: dict[str, str], event_loop: str
) -> None:
    """A receiver sending 20,000 session tickets before its answer (5 MB that OpenSSL reads and
    the HTTP parser never sees: 0.2 s of the event loop's CPU) loses the connection once it
    passes the records allowed without data: tls_error, nothing parsed. A receiver sending
    fewer answers; both on uvloop's TLS transport and on asyncio's."""
    settings = TlsSettings(ca_file=files["ca"])
    within = 8  # (tickets of about 255 bytes: well within both bounds)
    (flooded,), _ = deliver(ticket_server(ca, 20_000), [settings], event_loop)
    (ordinary,), _ = deliver(ticket_server(ca, within), [settings], event_loop)
    assert (flooded.status, flooded.error) == (None, "tls_error"), flooded
    refused_at = min(tls.TLS_RECORDS_WITHOUT_DATA, tls.TLS_BYTES_WITHOUT_DATA // 255) + 1
    assert f"sent {refused_at} TLS records" in flooded.detail, flooded.detail
    assert ordinary.status == 204, ordinary


def handshake(ca: trustme.CA, files: dict[str, str], tickets: int) -> tuple[MemoryEnd, MemoryEnd]:
    """A client and a server end (memory buffers) after the handshake, the server's tickets
    in the client's incoming buffer, not yet read."""
    client = MemoryEnd(make_context(TlsSettings(ca_file=files["ca"])), False, "127.0.0.1")
    server = MemoryEnd(ticket_server(ca, tickets), True)
    for _ in range(4):
        for end in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.tls.do_handshake()
        server.incoming.write(client.outgoing.read())
        client.incoming.write(server.outgoing.read())
    client.tls.write(b"GET")  # the request: its answer's records are counted
    server.incoming.write(client.outgoing.read())
    with contextlib.suppress(ssl.SSLWantReadError):
        server.tls.read(3)
    return client, server


def read_all(end: MemoryEnd) -> bytes:
    data = b""
    with contextlib.suppress(ssl.SSLWantReadError):
        while True:
            data += end.tls.read(65536)
    return data


def test_an_answer_in_many_small_records_is_read_and_each_request_starts_the_count(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """An answer written a byte per record, up to the records allowed per exchange, is read
    whole; the next request starts the count again; one record more in one exchange ends the
    connection."""
    client, server = handshake(ca, files, tickets=2)
    per_answer = tls.TLS_RECORDS_PER_EXCHANGE - 8  # (the two tickets, and a margin)
    for _ in range(3):
        answer = bytes(range(256)) * (per_answer // 256) + b"!" * (per_answer % 256)
        received = b""
        for at in range(0, len(answer), 100):
            for byte in answer[at : at + 100]:
                server.tls.write(bytes([byte]))
            client.incoming.write(server.outgoing.read())
            received += read_all(client)
        assert received == answer
        client.tls.write(b"GET")  # the next request
    for _ in range(tls.TLS_RECORDS_PER_EXCHANGE + 1):
        server.tls.write(b"x")
    client.incoming.write(server.outgoing.read())
    with pytest.raises(tls.TlsFlood, match=f"sent {tls.TLS_RECORDS_PER_EXCHANGE} TLS records"):
        read_all(client)


def test_a_large_answer_may_take_one_record_more_per_kib(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """Records that carry a KiB of data or more widen the bound as they come: 2,000 full
    records (32 MB, a body far past any cap) are read; the count starts again with each
    request, so the data of one answer never pays for the records of the next."""
    client, server = handshake(ca, files, tickets=2)
    full = b"f" * 16384
    received = 0
    for _ in range(2000):
        server.tls.write(full)
        client.incoming.write(server.outgoing.read())
        received += len(read_all(client))
    assert received == 2000 * len(full)
    client.tls.write(b"GET")  # the next request: its answer's records are counted afresh
    for _ in range(tls.TLS_RECORDS_PER_EXCHANGE + 1):
        server.tls.write(b"x")
    client.incoming.write(server.outgoing.read())
    with pytest.raises(tls.TlsFlood):
        read_all(client)


def test_records_without_data_are_refused_past_the_bound_however_they_arrive(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """Tickets fed to the client a few bytes at a time, a record at a time, or all at once are
    refused as soon as one more than the bound has been read: OpenSSL never gets further."""
    for piece in (7, 255, 1500, 1 << 30):
        client, _server = handshake(ca, files, tickets=3_000)
        flood = client.incoming.read()  # (the tickets, moved there by the handshake)
        one = len(flood) // 3_000
        fed = 0
        with pytest.raises(tls.TlsFlood, match="without data"):
            for at in range(0, len(flood), piece):
                client.incoming.write(flood[at : at + piece])
                fed = min(at + piece, len(flood))
                read_all(client)
        assert isinstance(client.tls, tls.BoundedSSLObject)
        # the first record past either bound (64 records; 8 KiB: 33 tickets of 255 bytes)
        refused_at = min(tls.TLS_RECORDS_WITHOUT_DATA, tls.TLS_BYTES_WITHOUT_DATA // one) + 1
        assert client.tls._without_data == client.tls._records == refused_at
        if piece < one:  # fed in small pieces: nothing read beyond the refused record
            assert fed <= refused_at * one + piece


def key_update(end: MemoryEnd) -> None:
    """Make OpenSSL send a TLS 1.3 KeyUpdate from ``end`` (``SSL_key_update``, which Python
    does not offer: reached through ctypes, its pointer checked as the module's own is)."""
    library = ctypes.CDLL(_ssl.__file__)
    library.SSL_key_update.argtypes = [ctypes.c_void_p, ctypes.c_int]
    library.SSL_version.argtypes = [ctypes.c_void_p]
    # CPython's _ssl._SSLSocket: the object's header, its socket's weak reference, then SSL*.
    pointer = ctypes.c_void_p.from_address(id(end.tls._sslobj) + object.__basicsize__ + 8).value
    assert library.SSL_version(pointer) == 0x0304, "not the SSL* of a TLS 1.3 connection"
    assert library.SSL_key_update(pointer, 0) == 1  # SSL_KEY_UPDATE_NOT_REQUESTED
    end.tls.do_handshake()  # sends it


def test_key_updates_interleaved_with_data_are_bounded_per_exchange(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """A KeyUpdate costs the client a key derivation (about 25 µs) in 28 bytes; OpenSSL itself
    refuses only more than 32 in a row without data. Groups of 30 between single bytes of data
    pass OpenSSL's check; the client refuses the group that takes an exchange past the bound,
    and takes a legitimate number in the next exchange."""
    client, server = handshake(ca, files, tickets=0)
    received = b""
    with pytest.raises(tls.TlsFlood, match="without data"):
        for _ in range(tls.TLS_RECORDS_WITHOUT_DATA // 30 + 2):
            for _ in range(30):
                key_update(server)
            server.tls.write(b"d")
            client.incoming.write(server.outgoing.read())
            received += read_all(client)
    assert received == b"d" * (tls.TLS_RECORDS_WITHOUT_DATA // 30)
    client, server = handshake(ca, files, tickets=0)
    for _ in range(2):
        for _ in range(tls.TLS_RECORDS_WITHOUT_DATA // 2):
            key_update(server)
        server.tls.write(b"ok")
        client.incoming.write(server.outgoing.read())
        assert read_all(client) == b"ok"
        client.tls.write(b"GET")  # the next request


def test_records_without_data_are_bounded_in_bytes_too(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """One record may hold hundreds of small messages, each handled in the same call, so the
    bytes of the records without data are bounded as well as their number: tickets carrying
    the client's certificate (about 830 bytes each) are refused past TLS_BYTES_WITHOUT_DATA,
    long before the count; fewer are taken."""
    mutual = TlsSettings(files["ca"], files["cert_a"], files["key_a"])
    outcomes = []
    for tickets in (40, 4):
        context = server_context(ca, require_client=True)
        context.num_tickets = tickets
        (outcome,), _ = deliver(context, [mutual], "uvloop")
        outcomes.append(outcome)
    flooded, ordinary = outcomes
    assert (flooded.status, flooded.error) == (None, "tls_error"), flooded
    records = int(flooded.detail.split("sent ")[1].split()[0])
    assert records < tls.TLS_RECORDS_WITHOUT_DATA // 2, flooded.detail  # the bytes ended it
    assert ordinary.status == 204, ordinary


def reframed(flight: bytes, size: int) -> bytes:
    """The same TLS records, each cut into records of at most ``size`` bytes of payload (as a
    server may: a handshake message can span records)."""
    out, at = bytearray(), 0
    while at < len(flight):
        head, length = flight[at : at + 3], int.from_bytes(flight[at + 3 : at + 5], "big")
        body = flight[at + 5 : at + 5 + length]
        at += 5 + length
        for start in range(0, len(body), size):
            piece = body[start : start + size]
            out += head + len(piece).to_bytes(2, "big") + piece
    return bytes(out)


def tls12_first_flight(ca: trustme.CA, files: dict[str, str]) -> tuple[MemoryEnd, bytes]:
    """A client that sent its hello to a TLS 1.2 server, and the server's first flight (its
    hello, certificate, key exchange: plaintext records), not yet given to the client."""
    client = MemoryEnd(make_context(TlsSettings(ca_file=files["ca"])), False, "127.0.0.1")
    server = MemoryEnd(server_context(ca, max_version=ssl.TLSVersion.TLSv1_2), True)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.tls.do_handshake()
    server.incoming.write(client.outgoing.read())
    with contextlib.suppress(ssl.SSLWantReadError):
        server.tls.do_handshake()
    return client, server.outgoing.read()


@pytest.mark.parametrize(("size", "refused"), [(64, False), (1, True)])
def test_a_handshake_in_more_records_than_allowed_is_refused(
    ca: trustme.CA, files: dict[str, str], size: int, refused: bool
) -> None:
    """A TLS 1.2 server's first flight (plaintext) cut into one-byte records costs the client a
    turn per record, over a thousand: refused past TLS_RECORDS_PER_EXCHANGE records in the
    handshake. Cut into 64-byte records it goes on."""
    client, flight = tls12_first_flight(ca, files)
    client.incoming.write(reframed(flight, size))
    assert isinstance(client.tls, tls.BoundedSSLObject)
    if refused:
        with pytest.raises(tls.TlsFlood, match="in its handshake"):
            client.tls.do_handshake()
        assert client.tls._records == tls.TLS_RECORDS_PER_EXCHANGE
        return
    with pytest.raises(ssl.SSLWantReadError):  # waiting for the server's Finished
        client.tls.do_handshake()
    assert client.outgoing.pending  # its own next flight, written
    assert client.tls._records > 10  # (the case means something: many records, all taken)


def hello_requests(count: int) -> bytes:
    """Plaintext TLS 1.2 handshake records holding ``count`` HelloRequests (4 bytes each), as
    a server may send before its ServerHello; a client skips them, and they are in no hash."""
    out, left = bytearray(), count
    while left:
        n = min(left, 4096)
        out += b"\x16\x03\x03" + (4 * n).to_bytes(2, "big") + b"\x00\x00\x00\x00" * n
        left -= n
    return bytes(out)


@pytest.mark.parametrize(("requests", "refused"), [(10, False), (40 * 4096, True)])
def test_a_handshake_padded_past_its_bytes_is_refused(
    ca: trustme.CA, files: dict[str, str], requests: int, refused: bool
) -> None:
    """HelloRequests before the ServerHello cost the client a parse each and carry nothing: a
    first flight padded with 640 KiB of them (40 full records, under the record bound) is
    refused past TLS_HANDSHAKE_BYTES; ten of them are skipped and the handshake goes on."""
    client, flight = tls12_first_flight(ca, files)
    client.incoming.write(hello_requests(requests) + flight)
    if refused:
        with pytest.raises(tls.TlsFlood, match="in its handshake"):
            client.tls.do_handshake()
        assert isinstance(client.tls, tls.BoundedSSLObject)
        assert client.tls._handshake_bytes <= tls.TLS_HANDSHAKE_BYTES + 5 + 4 * 4096
        return
    with pytest.raises(ssl.SSLWantReadError):  # waiting for the server's Finished
        client.tls.do_handshake()
    assert client.outgoing.pending  # its own next flight, written


@pytest.mark.parametrize(("version", "refused"), [("TLSv1.2", True), ("TLSv1.3", False)])
def test_a_handshake_record_after_a_tls12_handshake_is_refused_unread(
    ca: trustme.CA, files: dict[str, str], version: str, refused: bool
) -> None:
    """After a TLS 1.2 handshake (no renegotiation) a handshake record can only hold
    HelloRequests, each answered by an alert: one larger than a single one is refused before
    OpenSSL reads it (its content does not matter). In TLS 1.3 every record after the
    handshake says it is data; OpenSSL judges this one (a bad record: an SSLError)."""
    client = MemoryEnd(make_context(TlsSettings(ca_file=files["ca"])), False, "127.0.0.1")
    maximum = ssl.TLSVersion.TLSv1_2 if version == "TLSv1.2" else ssl.TLSVersion.TLSv1_3
    server = MemoryEnd(server_context(ca, max_version=maximum), True)
    connect(client, server)
    client.tls.do_handshake()  # (done: as a transport does, which always asks before reading)
    assert client.tls.version() == version
    client.incoming.write(b"\x16\x03\x03\x00\x64" + bytes(100))
    with pytest.raises(ssl.SSLError) as raised:
        client.tls.read(1024)
    assert isinstance(raised.value, tls.TlsFlood) is refused, raised.value


def test_a_session_with_a_large_certificate_is_not_kept(
    ca: trustme.CA, files: dict[str, str]
) -> None:
    """What a kept session holds grows with the server's certificate (about 190 KB for one of
    28 KB): over SESSION_CERT_LIMIT it is not kept, and the host is not asked again for a
    while, as one giving no ticket."""
    names = [f"n{n:04d}-{'x' * 40}.example" for n in range(200)]  # a certificate over 8 KiB
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", *names).configure_cert(server)
    client = make_context(TlsSettings(ca_file=files["ca"]))
    assert isinstance(client, ResumingContext)
    connection = connect(MemoryEnd(client, False, "127.0.0.1"), MemoryEnd(server, True))
    assert len(connection.getpeercert(binary_form=True) or b"") > tls.SESSION_CERT_LIMIT
    assert not client.keep_session("127.0.0.1", connection)
    assert not client.wants_session("127.0.0.1")
    again = connect(MemoryEnd(client, False, "127.0.0.1"), MemoryEnd(server, True))
    assert not again.session_reused


class ManualServer:
    """The server end of one TLS connection on a real socket, its records made by hand: the
    test decides when each byte of them is sent."""

    def __init__(
        self, context: ssl.SSLContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.end = MemoryEnd(context, server_side=True)
        self.reader, self.writer = reader, writer
        self.plain = b""

    async def send(self, raw: bytes) -> None:
        self.writer.write(raw)
        await self.writer.drain()

    async def _receive(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            raise ConnectionError("the client closed")
        self.end.incoming.write(data)

    async def handshake(self) -> None:
        while True:
            try:
                self.end.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self.send(self.end.outgoing.read())
                await self._receive()
        await self.send(self.end.outgoing.read())

    async def request(self) -> None:
        """Read one request, head and body (Content-Length)."""
        while True:
            with contextlib.suppress(ssl.SSLWantReadError):
                while True:
                    self.plain += self.end.tls.read(65536)
            head, found, rest = self.plain.partition(b"\r\n\r\n")
            if found:
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                if len(rest) >= length:
                    self.plain = rest[length:]
                    return
            await self._receive()

    def sealed(self, data: bytes) -> bytes:
        """The TLS records carrying ``data`` (not sent)."""
        self.end.tls.write(data)
        return self.end.outgoing.read()


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_an_answer_staged_in_the_tls_layer_while_idle_is_never_the_next_answer(
    ca: trustme.CA, files: dict[str, str], event_loop: str
) -> None:
    """After its first answer the receiver sends, while the connection is idle, all but the
    last byte of a record holding a complete answer, and the last byte only once the next
    request came. The bytes wait in the TLS layer, not the socket, and no HTTP parser sees them
    before the request: the connection must not carry it (one exchange per connection), so the
    second request goes on a new connection and gets that connection's answer."""
    stale = b"HTTP/1.1 299 Staged\r\nContent-Length: 0\r\n\r\n"
    connections: list[int] = []
    staged: asyncio.Event | None = None  # (made in main: each event loop its own)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        server = ManualServer(server_context(ca), reader, writer)
        try:
            await server.handshake()
            await server.request()
            if len(connections) > 1:  # a new connection for the second request: answered
                await server.send(server.sealed(ANSWER))
                await server.request()
                return
            await server.send(server.sealed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
            record = server.sealed(stale)  # (made before any second request exists)
            await server.send(record[:-1])
            assert staged is not None
            staged.set()
            await server.request()  # the second request, if it came on this connection
            await server.send(record[-1:])
            await server.request()
        except (OSError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def main() -> list[Outcome]:
        nonlocal staged
        staged = asyncio.Event()
        listener = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        sender = HttpSender(DestinationPolicy(allow_private=True))
        settings = TlsSettings(ca_file=files["ca"])
        request = DeliveryRequest(f"https://127.0.0.1:{port}/hook", {}, b"{}", settings)
        try:
            first = await sender.send(request, 3.0)
            await asyncio.wait_for(staged.wait(), 5.0)
            await asyncio.sleep(0.05)  # the staged bytes reach the client's TLS layer
            return [first, await sender.send(request, 3.0)]
        finally:
            await sender.close()
            listener.close()

    if event_loop == "uvloop":
        import uvloop

        outcomes = uvloop.run(main())
    else:
        outcomes = asyncio.run(main())
    assert [outcome.status for outcome in outcomes] == [200, 204], outcomes
    assert len(connections) == 2


def test_the_tls_layer_says_when_bytes_wait_in_it(ca: trustme.CA, files: dict[str, str]) -> None:
    """``holds_bytes``: a record's start not given to OpenSSL yet, or a whole record not read,
    is bytes waiting; once the data is read, nothing is."""
    client = MemoryEnd(make_context(TlsSettings(ca_file=files["ca"])), False, "127.0.0.1")
    server = MemoryEnd(server_context(ca), True)
    bounded = connect(client, server)
    assert isinstance(bounded, tls.BoundedSSLObject)
    assert not bounded.holds_bytes()
    server.tls.write(b"answer")
    record = server.outgoing.read()
    for cut in (1, 4, 5, len(record) - 1):  # in the header, at its end, in the body
        client.incoming.write(record[:cut])
        with contextlib.suppress(ssl.SSLWantReadError):
            bounded.read(1024)
        assert bounded.holds_bytes(), cut
        client.incoming.write(record[cut:])
        assert bounded.holds_bytes()
        assert bounded.read(1024) == b"answer"
        assert not bounded.holds_bytes()
        server.tls.write(b"answer")
        record = server.outgoing.read()
    client.incoming.write(record)
    assert bounded.read(3) == b"ans"  # OpenSSL holds the rest of the data
    assert bounded.holds_bytes()
    assert bounded.read(1024) == b"wer"
    assert not bounded.holds_bytes()


def test_a_settings_files_are_looked_at_again_a_failure_tried_again_a_renewal_used(
    tmp_path: Path,
) -> None:
    """Contexts were made once per setting and kept for good, failures too: a CA file missing
    for a moment (a Secret being swapped) failed its webhook until the bridge restarted, and a
    certificate renewed in place was not used. Every ``TLS_FILES_CHECK_S`` the files' stat is
    looked at: a failure is tried again, a changed file makes a new context, an unchanged one
    keeps it (nothing is read in between)."""
    now = [0.0]
    contexts = TlsContexts(clock=lambda: now[0])
    path = tmp_path / "ca.pem"
    settings = TlsSettings(ca_file=str(path))
    with pytest.raises(TlsError, match="No such file"):
        contexts.get(settings)
    trustme.CA().cert_pem.write_to_path(str(path))
    now[0] += TLS_FILES_CHECK_S / 2
    with pytest.raises(TlsError):  # remembered within the interval
        contexts.get(settings)
    now[0] += TLS_FILES_CHECK_S / 2
    first = contexts.get(settings)
    now[0] += TLS_FILES_CHECK_S
    assert contexts.get(settings) is first, "unchanged files: the same context"
    renewed = tmp_path / "renewed.pem"
    trustme.CA().cert_pem.write_to_path(str(renewed))
    renewed.replace(path)  # (as a Secret's swap does: a new file at the path)
    assert contexts.get(settings) is first, "within the interval"
    now[0] += TLS_FILES_CHECK_S
    second = contexts.get(settings)
    assert second is not first
    assert len(second.get_ca_certs()) == len(first.get_ca_certs())
