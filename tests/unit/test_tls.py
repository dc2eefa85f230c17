"""Receiver TLS settings against real TLS servers on loopback with a private CA (trustme): a CA
file added to the system store, client certificates for mutual TLS, the least TLS version; a
wrong CA or a missing client certificate is a not-received attempt with reason tls_error."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
import trustme

from bridge.core.destinations import DestinationPolicy
from bridge.core.webhook import TlsSettings
from bridge.http.sender import DeliveryRequest, HttpSender, Outcome
from bridge.http.tls import TlsError, make_context

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
    context: ssl.SSLContext, requests: list[TlsSettings]
) -> tuple[list[Outcome], list[str]]:
    """Send one request per setting to a TLS server answering 204; returns the outcomes and the
    client certificate (subject) the server saw on each connection."""
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
