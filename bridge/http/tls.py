"""TLS contexts for deliveries: one per distinct :class:`~bridge.core.webhook.TlsSettings`, made
once and shared by every connection that uses it (the system store, plus the setting's CA file,
client certificate and least version).

Each context resumes TLS sessions (:class:`ResumingContext`): a new connection to a host offers the
session (ticket) of an earlier full handshake with that host through the same context, so a
receiver that closes its connections after each answer costs an abbreviated handshake rather than
a full one (no certificate sent, parsed and verified). A session is offered only to the host name
it was verified for, only through the context (trust store, client certificate, least version)
that verified it, and for at most :data:`SESSION_MAX_AGE` seconds (less if its ticket says so): it
always comes from a full handshake, never from a resumed one, so the receiver's certificate is
verified again at least that often. A receiver that does not accept the ticket simply makes a full
handshake.

Every context offers only key exchanges whose cost the bridge can bound, because the handshake
runs on the event loop that every delivery shares, and the server chooses. Measured on this
project's machine, the client's CPU for one full handshake: 1.1-2.1 ms with ECDHE; 172-180 ms
when a TLS 1.3 server asks for the ffdhe8192 group; 331-339 ms for TLS 1.2 DHE with a server's
own 8,192-bit prime, 1,147-1,212 ms with a 10,000-bit one (OpenSSL's limit). One receiver that
closes after each answer (an answer: no budget is spent) would so stop every other webhook's
deliveries for a second per handshake. So (:func:`make_context`): TLS 1.2 cipher suites with
ECDHE only (:data:`CIPHERS`: no finite-field DHE, no RSA key transport); the elliptic-curve
groups only (:data:`GROUPS`: X25519, P-256, P-384, P-521, each at most about 1 ms), no
finite-field group; no renegotiation (each would be another full handshake, at the server's
call).

Python 3.11 names one group at most (``set_ecdh_curve``), and P-256 alone broke handshakes with
servers limited to X25519 or P-384, and TLS 1.2 servers with a P-384 or P-521 certificate
(which the client's groups must cover). The list is therefore given to OpenSSL itself
(``SSL_CTX_set1_groups_list``, through ctypes, looked up through Python's ``_ssl`` module),
after checking that the pointer read from the context is its ``SSL_CTX`` (OpenSSL's options for
it must be the context's); :data:`MAX_CERT_LIST` is set the same way. Where that cannot be done,
P-256 alone is offered, with a warning (``tls.groups_fallback``): a receiver that refuses it
fails with ``tls_error``, and none can make the key exchange expensive (the certificate message
then keeps OpenSSL's own bound).

After the handshake, TLS records that carry no data cost the client too, and the receiver alone
decides how many it sends: OpenSSL reads every TLS 1.3 ``NewSessionTicket`` a server sends (a
Python server sends a million with ``num_tickets``), each about 10 µs of the event loop's CPU, and
none reaches the HTTP parser, so neither the header limit nor the body limit sees them. So every
connection's TLS object counts the bytes OpenSSL takes from the socket against the data it hands
back (:class:`BoundedSSLObject`): TLS records beyond :data:`TLS_OVERHEAD_ALLOWANCE` bytes, plus
:data:`TLS_OVERHEAD_PER_DATA_BYTE` per byte of data, end the connection (``tls_error``, "records
without data"). A million tickets end after about a thousand, 10 ms of CPU, instead of about ten
seconds; a legitimate receiver, even one writing its answer a byte per record, stays far below.
"""

from __future__ import annotations

import _ssl
import ctypes
import functools
import logging
import os
import ssl
import sys
import time
from typing import Any, Final

from bridge.core.webhook import TlsSettings

VERSIONS: Final = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
SESSION_MAX_AGE: Final = 300.0
"""Seconds a session is offered for resumption at most, counted from its full handshake."""
_MAX_HOSTS: Final = 1024  # sessions kept per context; past it the cache starts again
TLS_OVERHEAD_ALLOWANCE: Final = 256 * 1024
"""Bytes of TLS records beyond the data they carry that one connection may receive in any case
(session tickets, record headers and tags, alerts): about a thousand tickets."""
TLS_OVERHEAD_PER_DATA_BYTE: Final = 32
"""Further bytes of TLS overhead allowed per byte of data received: a record holding one byte of
data costs 22 to 29 bytes, so even an answer written a byte per record stays within it."""
CIPHERS: Final = (
    "@SECLEVEL=2:ECDHE+AESGCM:ECDHE+CHACHA20:ECDHE+AES:!aNULL:!eNULL:!aDSS:!SHA1:!AESCCM"
)
"""TLS 1.2 cipher suites: Python's defaults without the finite-field DHE ones (TLS 1.3's are
unchanged). See the module's text."""
GROUPS: Final = b"X25519:P-256:P-384:P-521"
"""The key-exchange groups offered, in TLS 1.3 and for TLS 1.2's ECDHE (see the module's text)."""
FALLBACK_GROUP: Final = "prime256v1"
"""The one group offered where :data:`GROUPS` cannot be set."""
_SSL_CTRL_SET_GROUPS_LIST: Final = 92  # OpenSSL's SSL_CTX_set1_groups_list is this SSL_CTX_ctrl
_SSL_CTRL_SET_MAX_CERT_LIST: Final = 51  # and SSL_CTX_set_max_cert_list this one
MAX_CERT_LIST: Final = 32 * 1024
"""The largest certificate message accepted from a receiver (OpenSSL's default: 100 KiB). Every
certificate in it is parsed on the event loop before any is verified: an untrusted chain of 60
certificates (83 KB) cost 31-33 ms per attempt, against about 3 ms for an ordinary one (a hostile
review). Real chains (a leaf, even with a hundred names, and two or three intermediates) stay
well under 16 KB."""

log = logging.getLogger("bridge.http.tls")


@functools.cache
def _libssl() -> ctypes.CDLL | None:
    """OpenSSL's functions as Python's ``_ssl`` module links them: looked up through that
    module's own handle, so they are those of the libssl it uses (or its own, if it carries
    OpenSSL inside), never a second copy. None when they cannot be found."""
    try:
        library = ctypes.CDLL(_ssl.__file__)
        library.SSL_CTX_ctrl.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_char_p
        ]  # fmt: skip
        library.SSL_CTX_ctrl.restype = ctypes.c_long
        library.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
        library.SSL_CTX_get_options.restype = ctypes.c_uint64
    except (OSError, AttributeError, TypeError):  # (TypeError: a built-in _ssl has no file)
        return None
    return library


def _bound_handshake(context: ssl.SSLContext) -> bool:
    """Give ``context``, through OpenSSL itself, the groups of :data:`GROUPS` and the
    certificate-message bound of :data:`MAX_CERT_LIST`; False when that cannot be done safely."""
    library = _libssl()
    if library is None:
        return False
    # CPython's SSLContext object holds its SSL_CTX pointer right after the object's header;
    # it is used only if OpenSSL's options for it are the context's (a mismatched layout would
    # not give the same 64 bits).
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not pointer or library.SSL_CTX_get_options(pointer) != context.options:
        return False
    library.SSL_CTX_ctrl(pointer, _SSL_CTRL_SET_MAX_CERT_LIST, MAX_CERT_LIST, None)
    return bool(library.SSL_CTX_ctrl(pointer, _SSL_CTRL_SET_GROUPS_LIST, 0, GROUPS) == 1)


class TlsFlood(ssl.SSLError):
    """A receiver sent more TLS records without data than a connection allows (see the module's
    text); the transport reports it as the reason the connection was lost."""

    def __str__(self) -> str:  # (an SSLError made in Python would show its args' tuple)
        return str(self.args[0]) if self.args else "too many TLS records without data"


class BoundedSSLObject(ssl.SSLObject):
    """An :class:`ssl.SSLObject` that counts, at each :meth:`read`, the bytes OpenSSL took from
    the incoming buffer against the data it returned, and raises :class:`TlsFlood` once the
    difference passes :data:`TLS_OVERHEAD_ALLOWANCE` plus :data:`TLS_OVERHEAD_PER_DATA_BYTE`
    per byte of data. asyncio's and uvloop's TLS transports read through :meth:`read` whatever
    arrives after the handshake (a ticket flood makes it raise ``SSLWantReadError``, no data),
    and end the connection on any other ``SSLError``. :meth:`ResumingContext.wrap_bio` makes
    every client connection's object one of these."""

    _incoming: ssl.MemoryBIO | None = None
    _overhead = 0
    _allowance = TLS_OVERHEAD_ALLOWANCE

    def read(self, *args: Any) -> Any:
        incoming = self._incoming
        if incoming is None:
            return super().read(*args)
        before = incoming.pending
        data: Any = 0
        try:
            data = super().read(*args)
        finally:
            got = data if isinstance(data, int) else len(data)
            self._overhead += before - incoming.pending - got
            self._allowance += got * TLS_OVERHEAD_PER_DATA_BYTE
            if self._overhead > self._allowance:
                raise TlsFlood(
                    f"the receiver sent {self._overhead} bytes of TLS records without data"
                )
        return data


class ResumingContext(ssl.SSLContext):
    """A verifying client context that resumes sessions: per host name, the session of the last
    full handshake whose ticket is still young is offered by each new connection (see the module
    docstring). Works through :meth:`wrap_bio`, which asyncio's and uvloop's TLS transports call
    for every connection; the client hands sessions back with :meth:`keep_session`."""

    sslobject_class = BoundedSSLObject  # every connection's records are counted (module's text)

    def __init__(self, protocol: int = ssl.PROTOCOL_TLS_CLIENT) -> None:  # (for __new__)
        super().__init__()
        # host name -> (monotonic time the entry ends, the session; None: the host gave none
        # that can be resumed)
        self._sessions: dict[str | bytes, tuple[float, ssl.SSLSession | None]] = {}

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        if session is None and not server_side and server_hostname is not None:
            kept = self._sessions.get(server_hostname)
            if kept is not None:
                if kept[0] > time.monotonic():
                    session = kept[1]
                else:
                    del self._sessions[server_hostname]
        connection = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        if isinstance(connection, BoundedSSLObject):
            connection._incoming = incoming
        return connection

    def wants_session(self, host: str) -> bool:
        """Whether a connection to ``host`` should hand its session to :meth:`keep_session`: none
        is kept for it, or its time is up. Cheap, unlike reading a session."""
        kept = self._sessions.get(host)
        return kept is None or kept[0] <= time.monotonic()

    def keep_session(self, host: str, connection: ssl.SSLObject) -> bool:
        """Offer the session of ``connection`` (made through this context with server name
        ``host``) to new connections to ``host`` if its handshake was a full one and the server
        gave a session ticket (TLS 1.3 or 1.2; sessions resumed by a TLS 1.2 session id alone are
        not, servers rarely keep them). Returns whether it was kept; without a ticket, none is
        offered to ``host`` and none wanted from it for as long as a session would have been.
        Call it once the connection has read data from the server: a TLS 1.3 ticket arrives
        after the handshake."""
        if connection.session_reused or connection.server_side:
            return False
        session = connection.session  # a copy of the session, as its ticket now stands
        resumable = session is not None and session.has_ticket
        lifetime = SESSION_MAX_AGE
        if session is not None and resumable and session.ticket_lifetime_hint > 0:
            lifetime = min(lifetime, session.ticket_lifetime_hint)
        if len(self._sessions) >= _MAX_HOSTS and host not in self._sessions:
            self._sessions.clear()
        self._sessions[host] = (time.monotonic() + lifetime, session if resumable else None)
        return resumable

    def forget_sessions(self) -> None:
        """Offer no kept session any more: the next connection to each host is a full handshake."""
        self._sessions.clear()


class TlsError(Exception):
    """A TLS setting whose files cannot be used (the message names the file)."""


def make_context(settings: TlsSettings) -> ssl.SSLContext:
    """A verifying client context for ``settings``, resuming sessions; TlsError when a file
    cannot be used. Set up as :func:`ssl.create_default_context` sets a client context up."""
    context = ResumingContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and host name
    context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    keylog = os.environ.get("SSLKEYLOGFILE")  # as create_default_context: for debugging
    if keylog and not sys.flags.ignore_environment:
        context.keylog_filename = keylog
    context.minimum_version = VERSIONS[settings.min_version]
    context.set_ciphers(CIPHERS)  # key exchanges of bounded cost only (see the module's text)
    if not _bound_handshake(context):  # (then the certificate message keeps OpenSSL's bound)
        context.set_ecdh_curve(FALLBACK_GROUP)
        log.warning("tls.groups_fallback", extra={"fields": {"offered": FALLBACK_GROUP}})
    context.options |= ssl.OP_NO_RENEGOTIATION
    try:
        if settings.ca_file is not None:
            context.load_verify_locations(cafile=settings.ca_file)
        if settings.client_cert_file is not None:
            context.load_cert_chain(settings.client_cert_file, settings.client_key_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        files = ", ".join(
            path
            for path in (settings.ca_file, settings.client_cert_file, settings.client_key_file)
            if path
        )
        raise TlsError(f"cannot use the TLS files {files}: {exc}") from None
    return context


class TlsContexts:
    """The contexts in use, made on first use of each setting (a failure is remembered too)."""

    def __init__(self) -> None:
        self._contexts: dict[TlsSettings, ssl.SSLContext | TlsError] = {}

    def get(self, settings: TlsSettings) -> ssl.SSLContext:
        """The context of ``settings``; TlsError when its files cannot be used."""
        context = self._contexts.get(settings)
        if context is None:
            try:
                context = make_context(settings)
            except TlsError as exc:
                context = exc
            self._contexts[settings] = context
        if isinstance(context, TlsError):
            raise context
        return context
