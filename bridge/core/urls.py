"""Webhook URLs: the one place a URL is judged, for the configuration loader and the HTTP client.

:func:`parse_webhook_url` turns a configured URL into the parts a request needs, or raises
:class:`UrlError` with a sentence naming what is wrong. The rules (pure, no I/O):

- ``http`` or ``https``, an absolute URL with a host; no whitespace or control characters.
- No userinfo (``user:password@``): credentials in a URL leak into logs and tools, and the bridge
  would not send them anyway. No fragment (``#...``): it is never sent.
- A host that is not ASCII is first mapped whole by UTS-46 (the ``idna`` package, as the WHATWG
  URL standard does): a fullwidth ``A`` (U+FF21) becomes ``a``, and the ideographic, fullwidth
  and halfwidth full stops (U+3002, U+FF0E, U+FF61) become ``.``. Every check below runs on the
  mapped host, split into labels after the mapping, which is the host the bridge connects to:
  ``169.254.169.254`` written with U+FF0E is that IP address, not one label of a name.
- The host is an IP literal (IPv6 in brackets, no zone id) or a domain name checked label by
  label: non-ASCII labels by IDNA 2008 (``faß.de`` is ``xn--fa-hia.de``, not ``fass.de`` as
  Python's IDNA 2003 codec makes it); ASCII labels as letters, digits, ``-`` and ``_``; every
  label 1 to 63 octets, the name at most 253. A name whose last label is a number (``127.1``,
  ``0x7f.1``) is refused: resolvers read it as an IPv4 address in a legacy form.
- The port, when given, is 1 to 65535.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, urlsplit

import idna

from bridge.core.errors import clipped

DEFAULT_PORTS: Final = {"http": 80, "https": 443}
PATH_SAFE: Final = "/%:@!$&'()*+,;=-._~?"
MAX_URL_LENGTH: Final = 8192

_ASCII_LABEL: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL: Final = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_FORBIDDEN: Final = re.compile(r"[\x00-\x20\x7f-\x9f]")
_AUTHORITY_END: Final = re.compile(r"[/?#]")
_BRACKETED_NETLOC: Final = re.compile(r"\[[^\]]*\](?::[0-9]*)?")
_QUOTED_ALREADY: Final = re.compile("[A-Za-z0-9_.~" + re.escape("-" + PATH_SAFE) + "]*")
"""Text that ``quote(text, safe=PATH_SAFE)`` returns as it is (unreserved or safe ASCII)."""
_IPV4_CHARS: Final = re.compile(r"[0-9.]+")  # all an IPv4 address in dotted form is made of
_PLAIN_URL: Final = re.compile(
    r"(https?)://([a-z0-9_.-]+)(?::([1-9][0-9]{0,4}))?"
    r"(/[A-Za-z0-9_.~%:@!$&'()*+,;=/-]*)?(?:\?([A-Za-z0-9_.~%:@!$&'()*+,;=/?-]*))?"
)
"""The URLs most webhooks have: a lowercase scheme, an ASCII host name or IPv4 address in lowercase,
an optional port from 1 to 99999 without leading zeros, a path and a query of characters that
need no quoting. No userinfo, fragment, brackets, whitespace or control character can match, so
for these ``urlsplit`` and the checks below have nothing to say: :func:`parse_webhook_url` takes
them apart directly (about a quarter of the time), with the same result (a property test)."""


class UrlError(ValueError):
    """A URL that cannot be a webhook destination; the message says why and never echoes the
    URL's userinfo or port text. ``reason`` is ``"userinfo"`` for a URL with credentials (callers
    may word that one for their field), else ``"invalid"``."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class WebhookUrl:
    """A webhook URL taken apart: where to connect and what to put in the request line."""

    scheme: str
    host: str  # ASCII: a lowercase domain name (A-labels), or an IP address without brackets
    port: int
    target: str  # the request-target: percent-encoded path and query
    is_ip: bool

    @property
    def authority(self) -> str:
        """The ``Host`` header: the host (IPv6 in brackets) and the port unless it is the
        scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


def parse_webhook_url(url: str) -> WebhookUrl:
    """The parts of an absolute http(s) URL, or UrlError naming what is wrong."""
    if len(url) > MAX_URL_LENGTH:
        raise UrlError(f"longer than {MAX_URL_LENGTH} characters")
    plain = _PLAIN_URL.fullmatch(url)
    if plain is not None:
        scheme, hostname, port_text, path, query = plain.groups()
        number = int(port_text) if port_text else DEFAULT_PORTS[scheme]
        if number <= 65535:
            host, is_ip = _host(hostname, False)
            target = path or "/"
            if query:
                target = f"{target}?{query}"
            return WebhookUrl(scheme, host, number, target, is_ip)
    forbidden = _FORBIDDEN.search(url)
    if forbidden is not None:
        raise UrlError(f"contains {_describe(forbidden.group())} at position {forbidden.start()}")
    if _has_userinfo(url):
        raise UrlError(
            "must not contain userinfo (user:password before the host): credentials in a URL "
            "leak into logs and are not sent; authenticate the request by its signature",
            reason="userinfo",
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # the library's words, without the URL (it may hold userinfo)
        reason = "malformed IPv6 address" if "IPv6" in str(exc) else "invalid characters"
        raise UrlError(f"not a valid URL ({reason} in the host)") from None
    try:
        port = parts.port
    except ValueError:
        raise UrlError("the port is not a number from 1 to 65535") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise UrlError("must be an absolute http:// or https:// URL")
    if parts.fragment or url.endswith("#"):
        raise UrlError("must not contain a fragment (#...): it is never sent")
    hostname = parts.hostname
    if not hostname:
        raise UrlError("must have a host")
    if port == 0:
        raise UrlError("port 0 is not a destination")
    bracketed = parts.netloc.startswith("[")
    if bracketed and not _BRACKETED_NETLOC.fullmatch(parts.netloc):
        raise UrlError("an IPv6 address in brackets may only be followed by ':port'")
    host, is_ip = _host(hostname, bracketed)
    target = _quote(parts.path or "/")
    if parts.query:
        target = f"{target}?{_quote(parts.query)}"
    return WebhookUrl(parts.scheme, host, port or DEFAULT_PORTS[parts.scheme], target, is_ip)


def _quote(text: str) -> str:
    """``quote(text, safe=PATH_SAFE)``, without its work when nothing needs quoting."""
    return text if _QUOTED_ALREADY.fullmatch(text) else quote(text, safe=PATH_SAFE)


def url_authority(url: str) -> str:
    """The authority of ``url`` as written: what follows ``scheme://`` up to the first ``/``,
    ``?`` or ``#`` ("" without ``//``). For a URL :func:`parse_webhook_url` accepts it is
    ``urlsplit(url).netloc``, without building the rest of the split."""
    rest = url.partition(":")[2]
    if not rest.startswith("//"):
        return ""
    return _AUTHORITY_END.split(rest[2:], maxsplit=1)[0]


def shown_authority(url: str) -> str:
    """The authority of an accepted ``url`` as the bridge connects to it, for people to read. An
    ASCII authority is shown as written, in lowercase (a trailing dot or a default port aside,
    the host connected to; and cheap, for a table of 100,000 webhooks); any other is parsed and
    shown as its ``Host`` header, its host mapped (with U+FF0E for its dots, ``169.254.169.254``
    is shown with ASCII dots)."""
    authority = url_authority(url)
    if authority.isascii():
        return authority.lower()
    return parse_webhook_url(url).authority


def _has_userinfo(url: str) -> bool:
    """Whether the authority of ``url`` holds an ``@``, also after NFKC normalisation (a
    fullwidth commercial at, U+FF20, becomes one in ``urlsplit``'s own check)."""
    authority = url_authority(url)
    if authority.isascii():  # NFKC leaves ASCII as it is
        return "@" in authority
    return "@" in unicodedata.normalize("NFKC", authority)


def _remembered(judge: Callable[[str], str]) -> Callable[[str], str]:
    """``judge`` with its verdicts remembered, the last 4,096 texts (a name is judged the same
    way every time; many webhooks share a host, and IDNA is slow): an answer, or a refusal kept
    as its message and raised anew each time as an UrlError (a configuration's alias can give
    thousands of webhooks one refused host: judging it again cost 0.4 ms each)."""

    @functools.lru_cache(maxsize=4096)
    def verdict(text: str) -> tuple[bool, str]:
        try:
            return True, judge(text)
        except UrlError as exc:
            return False, str(exc)

    @functools.wraps(judge)
    def remembered(text: str) -> str:
        accepted, answer = verdict(text)
        if accepted:
            return answer
        raise UrlError(answer)

    return remembered


@_remembered
def ascii_host(host: str) -> str:
    """A domain name as lowercase ASCII (IDNA 2008 A-labels), or UrlError naming the fault."""
    host = mapped_host(host)
    name = host[:-1] if host.endswith(".") else host
    if not name:
        raise UrlError("the host name is empty")
    labels = []
    for label in name.split("."):
        if not label:
            raise UrlError(f"host {_shown(host)} has an empty label")
        labels.append(_label(label.lower() if label.isascii() else label, host))
    ascii_name = ".".join(labels)
    if len(ascii_name) > 253:
        raise UrlError(f"host name longer than 253 characters ({len(ascii_name)})")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise UrlError(f"host {_shown(host)} ends in a number: write an IP address in dotted form")
    return ascii_name


@_remembered
def mapped_host(host: str) -> str:
    """``host`` mapped by UTS-46 (non-transitional, without the STD3 rules, as WHATWG URL does:
    the labels are checked afterwards), or UrlError. An ASCII host is returned as it is: the
    mapping would only lowercase it, which the callers do. Verdicts are remembered, as
    :func:`ascii_host`'s (``_host`` maps a host, then ``ascii_host`` maps it again: 4.5 µs
    each for a name that is not ASCII)."""
    if host.isascii():
        return host
    try:
        return idna.uts46_remap(host, std3_rules=False, transitional=False)
    except (idna.IDNAError, UnicodeError) as exc:
        reason = f"is not a valid internationalised name: {clipped(str(exc), 120)}"
        raise UrlError(f"host {_shown(host)} {reason}") from None


def _host(hostname: str, bracketed: bool) -> tuple[str, bool]:
    if bracketed:
        if "%" in hostname:
            raise UrlError("an IPv6 zone id (%...) is not allowed in a webhook URL")
        try:
            return str(ipaddress.IPv6Address(hostname)), True
        except ValueError:
            raise UrlError(f"[{clipped(hostname)}] is not an IPv6 address") from None
    hostname = mapped_host(hostname)  # before any check: the host the bridge connects to
    if _IPV4_CHARS.fullmatch(hostname):  # else not an IPv4 address: spare the exception
        try:
            return str(ipaddress.IPv4Address(hostname)), True
        except ValueError:
            pass
    return ascii_host(hostname), False


def _label(label: str, host: str) -> str:
    if label.isascii() and not label.startswith("xn--"):
        if len(label) > 63:
            raise UrlError(f"host {_shown(host)} has a label longer than 63 characters")
        if not _ASCII_LABEL.fullmatch(label):
            raise UrlError(
                f"host {_shown(host)} has an invalid label {_shown(label)} "
                "(letters, digits, '-' and '_'; no '-' at either end)"
            )
        return label
    try:
        return idna.encode(label, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        reason = clipped(str(exc), 120)
        raise UrlError(
            f"host {_shown(host)} is not a valid internationalised name: {reason}"
        ) from None


def _shown(text: str) -> str:
    """``repr`` of a part of a URL, shortened for a message."""
    return repr(clipped(text))


def _describe(char: str) -> str:
    return "whitespace" if char.isspace() else f"a control character (U+{ord(char):04X})"
