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
decides how many it sends: OpenSSL reads every TLS 1.3 ``NewSessionTicket`` (about 10 µs each; a
Python server sends a million with ``num_tickets``) and every ``KeyUpdate`` (about 25 µs each: a
key derived), and none reaches the HTTP parser, so neither the head limit nor the body cap sees
them. Counting bytes alone does not bound that work: a ``KeyUpdate`` is 28 bytes, and OpenSSL
handles every record without data it has in one call. So OpenSSL is given the receiver's bytes
one TLS record at a time (:class:`BoundedSSLObject`: the transport writes to a buffer of its own,
and a record moves on only when OpenSSL has used the one before), and each exchange (from each
request the client writes until the next) may bring at most :data:`TLS_RECORDS_WITHOUT_DATA`
records that carry no data, :data:`TLS_BYTES_WITHOUT_DATA` bytes of them (one record may pack
hundreds of small messages), and :data:`TLS_RECORDS_PER_EXCHANGE` records in all (one more per
KiB of data); the handshake at most as many records and :data:`TLS_HANDSHAKE_BYTES` bytes (it
may be padded with HelloRequests, which OpenSSL skips); after a TLS 1.2 handshake, whose record
types are in the clear, a handshake record larger than one HelloRequest is refused outright.
Past any bound the connection ends (``tls_error``). Three hostile reviews measured what each
bound leaves: a record packed with tickets on top of the bytes allowed (11.6 ms of the client's
CPU measured with 8 KiB, about 13 ms with 12 KiB), 2.4 ms for a padded handshake, against 2 s
and more before.
"""

from __future__ import annotations

import _ssl
import builtins
import ctypes
import functools
import logging
import os
import ssl
import sys
import time
from typing import Any, Final, cast

from bridge.core.expiring import Expiring
from bridge.core.webhook import TlsSettings

VERSIONS: Final = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
SESSION_MAX_AGE: Final = 300.0
"""Seconds a session is offered for resumption at most, counted from its full handshake."""
SESSION_HOSTS: Final = 2_048
"""Hosts whose session a context keeps at most (past it the one kept longest goes). A kept
session holds the server's parsed certificates, about 14 KB with a common one (measured: 1,024
hosts about 14 MB, 2,048 about 29 MB per TLS setting)."""
SESSION_CERT_LIMIT: Final = 8 * 1024
"""A session whose server certificate is larger than this (DER bytes) is not kept: a 28 KB
certificate of 480 names made each kept session hold about 190 KB (a review measured it)."""
TLS_RECORDS_WITHOUT_DATA: Final = 64
"""TLS records carrying no data (session tickets, key updates, warning alerts, empty records) a
receiver may send per exchange; a server sends one or two tickets after a handshake."""
TLS_BYTES_WITHOUT_DATA: Final = 12 * 1024
"""Bytes of those records: one record may hold hundreds of small messages (900 tickets of 18
bytes, 5-7 ms of OpenSSL's work), each handled in the same call. The bound is checked before
each record, so the worst is 12 KiB and one more record, about 13 ms. Two real tickets are
about 500 bytes; eight carrying an RSA client certificate 8.6 KB."""
TLS_RECORDS_PER_EXCHANGE: Final = 256
"""TLS records a receiver may send per exchange in all, one more for each KiB of data: an answer
fits in a few, a large body (records carry up to 16 KiB) in one per 16 KiB."""
TLS_HANDSHAKE_BYTES: Final = 128 * 1024
"""Bytes a receiver's handshake may take: OpenSSL skips HelloRequests during a handshake without
bound (4,096 per record, 75 µs); a real one is under 2 * MAX_CERT_LIST."""
_RECORD_HEADER: Final = 5  # content type, version, length (two bytes)
_RECORD_TYPES: Final = frozenset(range(20, 25))  # change cipher spec, alert, handshake, data...
_RECORD_BODY_MAX: Final = 2**14 + 2048  # the largest record of any TLS version
_WANT_READ: Final = "The operation did not complete (read)"  # OpenSSL's words, as _ssl says them
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
    """A receiver sent more TLS records in one exchange than the bounds allow (see the module's
    text); the transport reports it as the reason the connection was lost."""

    def __str__(self) -> str:  # (an SSLError made in Python would show its args' tuple)
        return str(self.args[0]) if self.args else "too many TLS records in one answer"


class BoundedSSLObject(ssl.SSLObject):
    """An :class:`ssl.SSLObject` that gives OpenSSL the receiver's bytes one TLS record at a
    time and bounds the records of each exchange and of the handshake (see the module's text).

    The transport writes into ``_outer`` and calls :meth:`do_handshake`, :meth:`read`,
    :meth:`write` and :meth:`unwrap` as usual (asyncio's and uvloop's TLS transports both do);
    OpenSSL reads ``_inner``, into which :meth:`_give` moves the next whole record only when
    OpenSSL asks for more. Whatever is not moved yet stays in ``_outer`` (but for the start of a
    record whose end has not arrived), so the transport's view of what is waiting is unchanged.
    The handshake's end and :meth:`write` (the client's request) start a new count.
    :class:`TlsFlood` (an ``SSLError``, which ends the connection) is raised past a bound.
    :meth:`ResumingContext.wrap_bio` makes every client connection's object one of these."""

    _sslobj: Any  # OpenSSL's connection (set by SSLObject._create; what its methods call)
    _outer: ssl.MemoryBIO | None = None  # the transport's buffer (None: reads it directly)
    _inner: ssl.MemoryBIO | None = None  # OpenSSL's
    _held: bytearray  # the start of a record whose end is not here yet (set by wrap_bio)
    _ended = False  # the end of the stream was given to OpenSSL
    _records = 0  # records given since the count started
    _without_data = 0  # ... after which OpenSSL still had no data
    _bytes_without_data = 0  # ... and their bytes
    _data = 0  # bytes of data returned
    _handshake_bytes = 0  # bytes given during the handshake
    _tls12 = False  # the handshake ended in TLS 1.2, whose record types are in the clear

    def _give(self) -> int:
        """Move the next whole record to OpenSSL (at the end of the stream: what is left, then
        the end); the bytes moved (at least 1 when anything was), 0 when nothing was."""
        outer, inner = self._outer, self._inner
        assert outer is not None and inner is not None
        held = self._held
        if not held and outer.pending >= _RECORD_HEADER:  # the usual case: a record's start
            head = outer.read(_RECORD_HEADER)
            size = head[3] << 8 | head[4]
            if (
                head[0] in _RECORD_TYPES
                and head[1] == 3
                and size <= _RECORD_BODY_MAX
                and outer.pending >= size  # and its end
            ):
                self._admit(head[0], size)
                inner.write(head)
                inner.write(outer.read(size))
                self._records += 1
                return _RECORD_HEADER + size
            held += head
        elif len(held) < _RECORD_HEADER:
            held += outer.read(_RECORD_HEADER - len(held))
        if (
            (held and held[0] not in _RECORD_TYPES)
            or (len(held) > 1 and held[1] != 3)
            or (len(held) >= _RECORD_HEADER and (held[3] << 8 | held[4]) > _RECORD_BODY_MAX)
        ):  # no TLS record: OpenSSL refuses it at once, as it would the whole stream
            held += outer.read()
            inner.write(held)
            given = len(held)
            held.clear()
            self._records += 1
            return given
        if len(held) >= _RECORD_HEADER:
            size = _RECORD_HEADER + (held[3] << 8 | held[4])
            if len(held) < size:
                held += outer.read(size - len(held))
            if len(held) == size:
                self._admit(held[0], size - _RECORD_HEADER)
                inner.write(held)
                held.clear()
                self._records += 1
                return size
        if outer.eof and not self._ended:  # OpenSSL says what the end means
            self._ended = True
            given = len(held) + 1
            inner.write(held)
            held.clear()
            inner.write_eof()
            return given
        return 0

    def holds_bytes(self) -> bool:
        """Whether bytes from the receiver wait here: a record, or the start of one, not given to
        OpenSSL yet, or bytes or data OpenSSL has not handed on. On an idle connection they are
        bytes nobody asked for (see ``_Connection.quiet``)."""
        outer, inner = self._outer, self._inner
        if outer is None or inner is None:
            return bool(self.pending())
        return bool(self._held or outer.pending or inner.pending or self._sslobj.pending())

    def _admit(self, kind: int, size: int) -> None:
        """After a TLS 1.2 handshake a handshake record can only hold HelloRequests (4 bytes,
        each answered by an alert: about 3 µs); one record may pack 4,096 of them."""
        if self._tls12 and kind == 22 and size > 64:
            raise self._refuse("(a handshake record after the handshake)")

    def _refuse(self, where: str) -> TlsFlood:
        return TlsFlood(
            f"the receiver sent {self._records} TLS records {where}, {self._without_data} of "
            f"them ({self._bytes_without_data} bytes) without data"
        )

    def _check(self) -> None:
        """TlsFlood once this exchange has brought more records than allowed."""
        if (
            self._without_data > TLS_RECORDS_WITHOUT_DATA
            or self._bytes_without_data > TLS_BYTES_WITHOUT_DATA
            or self._records >= TLS_RECORDS_PER_EXCHANGE + (self._data >> 10)
        ):
            raise self._refuse("in one answer")

    def _restart(self) -> None:
        self._records = self._without_data = self._bytes_without_data = self._data = 0

    def read(self, len: int = 1024, buffer: Any = None) -> Any:  # (SSLObject.read's names)
        if self._inner is None:
            return super().read(len, buffer)
        connection = self._sslobj  # (what SSLObject.read calls)
        arguments = (len,) if buffer is None else (len, buffer)
        if self._inner.pending or connection.pending():  # OpenSSL has bytes, or data, already
            try:
                return self._counted(connection.read(*arguments))
            except ssl.SSLWantReadError:
                pass
        while True:  # one record at a time; after which OpenSSL still asks for more: no data
            self._check()
            given = self._give()
            if not given:
                raise _want_read()
            try:
                return self._counted(connection.read(*arguments))
            except ssl.SSLWantReadError:
                self._without_data += 1
                self._bytes_without_data += given

    def _counted(self, data: Any) -> Any:
        self._data += data if isinstance(data, int) else builtins.len(data)
        return data

    def unwrap(self) -> Any:
        if self._inner is None:
            return super().unwrap()
        while True:  # as read: the closing reads the receiver's records too
            try:
                return super().unwrap()
            except ssl.SSLWantReadError:
                self._check()
                given = self._give()
                if not given:
                    raise
                self._without_data += 1
                self._bytes_without_data += given

    def do_handshake(self) -> None:
        if self._inner is None:
            return super().do_handshake()
        while True:  # (the messages' sizes are OpenSSL's to bound; their records are counted)
            try:
                super().do_handshake()
            except ssl.SSLWantReadError:
                if self._records >= TLS_RECORDS_PER_EXCHANGE:
                    raise self._refuse("in its handshake") from None
                given = self._give()
                if not given:
                    raise
                self._handshake_bytes += given
                if self._handshake_bytes > TLS_HANDSHAKE_BYTES:
                    raise self._refuse("in its handshake") from None
                continue
            self._tls12 = self.version() == "TLSv1.2"
            self._restart()  # the answers' counts start now
            return

    def write(self, data: Any) -> int:
        self._restart()  # a request: its answer's records are counted
        return int(self._sslobj.write(data))


def _want_read() -> ssl.SSLWantReadError:
    """The error OpenSSL gives a read that needs more bytes, as ``_ssl`` makes it."""
    error = ssl.SSLWantReadError(ssl.SSL_ERROR_WANT_READ, _WANT_READ)
    error.library = error.reason = None  # type: ignore[assignment]  # (as _ssl's: None)
    return error


class ResumingContext(ssl.SSLContext):
    """A verifying client context that resumes sessions: per host name, the session of the last
    full handshake whose ticket is still young is offered by each new connection (see the module
    docstring). Works through :meth:`wrap_bio`, which asyncio's and uvloop's TLS transports call
    for every connection; the client hands sessions back with :meth:`keep_session`."""

    sslobject_class = BoundedSSLObject  # every connection's records are bounded (module's text)

    def __init__(self, protocol: int = ssl.PROTOCOL_TLS_CLIENT) -> None:  # (for __new__)
        super().__init__()
        # host name -> (monotonic time the entry ends, the session; None: the host gave none
        # that can be resumed)
        self._sessions: Expiring[str | bytes, ssl.SSLSession | None] = Expiring(SESSION_HOSTS)

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
        if not issubclass(self.sslobject_class, BoundedSSLObject):
            return super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        inner = ssl.MemoryBIO()  # OpenSSL's: the transport's bytes move there a record at a time
        connection = super().wrap_bio(inner, outgoing, server_side, server_hostname, session)
        bounded = cast(BoundedSSLObject, connection)
        bounded._outer, bounded._inner, bounded._held = incoming, inner, bytearray()
        return bounded

    def wants_session(self, host: str) -> bool:
        """Whether a connection to ``host`` should hand its session to :meth:`keep_session`: none
        is kept for it, or its time is up. Cheap, unlike reading a session."""
        kept = self._sessions.get(host)
        return kept is None or kept[0] <= time.monotonic()

    def keep_session(self, host: str, connection: ssl.SSLObject) -> bool:
        """Offer the session of ``connection`` (made through this context with server name
        ``host``) to new connections to ``host`` if its handshake was a full one and the server
        gave a session ticket (TLS 1.3 or 1.2; sessions resumed by a TLS 1.2 session id alone are
        not, servers rarely keep them), and its certificate is at most
        :data:`SESSION_CERT_LIMIT` bytes. Returns whether it was kept; without a ticket, none is
        offered to ``host`` and none wanted from it for as long as a session would have been.
        Call it once the connection has read data from the server: a TLS 1.3 ticket arrives
        after the handshake."""
        if connection.session_reused or connection.server_side:
            return False
        session = connection.session  # a copy of the session, as its ticket now stands
        resumable = session is not None and session.has_ticket
        if resumable:  # (what a kept session holds grows with the server's certificate)
            certificate = connection.getpeercert(binary_form=True)
            resumable = certificate is not None and len(certificate) <= SESSION_CERT_LIMIT
        lifetime = SESSION_MAX_AGE
        if session is not None and resumable and session.ticket_lifetime_hint > 0:
            lifetime = min(lifetime, session.ticket_lifetime_hint)
        now = time.monotonic()
        self._sessions.put(host, now + lifetime, session if resumable else None, now)
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


TLS_FILES_CHECK_S: Final = 10.0
"""How often, at most, a setting's files are looked at again (their ``stat``): a context is made
again when one of them changed, and a failure is tried again."""


def _files_stamp(settings: TlsSettings) -> tuple[tuple[int, int, int] | None, ...]:
    """What says a setting's files changed: each one's inode, size and modification time (None
    for a file that cannot be looked at: making the context says why)."""
    stamps: list[tuple[int, int, int] | None] = []
    for path in (settings.ca_file, settings.client_cert_file, settings.client_key_file):
        if path is None:
            continue
        try:
            info = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(stamps)


class TlsContexts:
    """The contexts in use, made on first use of each setting. Every ``TLS_FILES_CHECK_S`` a
    setting's files are looked at again: a context is made again from files renewed in place
    (a Kubernetes Secret swapped, a certificate renewed) and a failure (a file missing for a
    moment) is tried again; kept for good, both lasted until the bridge restarted."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        # setting -> (context or failure, files' stamp, when to look at the files again)
        self._contexts: dict[
            TlsSettings, tuple[ssl.SSLContext | TlsError, tuple[Any, ...], float]
        ] = {}

    def get(self, settings: TlsSettings) -> ssl.SSLContext:
        """The context of ``settings``; TlsError when its files cannot be used."""
        entry = self._contexts.get(settings)
        now = self._clock()
        if entry is None or now >= entry[2]:
            stamp = _files_stamp(settings)
            if entry is None or stamp != entry[1] or isinstance(entry[0], TlsError):
                try:
                    made: ssl.SSLContext | TlsError = make_context(settings)
                except TlsError as exc:
                    made = exc
            else:
                made = entry[0]
            entry = self._contexts[settings] = (made, stamp, now + TLS_FILES_CHECK_S)
        context = entry[0]
        if isinstance(context, TlsError):
            raise context
        return context
