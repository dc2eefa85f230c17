"""The shared webhook URL rules: every refusal names the fault and never echoes credentials."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import idna
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bridge.core import urls
from bridge.core.urls import (
    UrlError,
    WebhookUrl,
    parse_webhook_url,
    shown_authority,
    url_authority,
)
from devtools.bench_config import config_text


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://faß.de/x", WebhookUrl("https", "xn--fa-hia.de", 443, "/x", False)),  # not fass.de
        (
            "https://Bücher.Example:8443/a?q=ä",
            WebhookUrl("https", "xn--bcher-kva.example", 8443, "/a?q=%C3%A4", False),
        ),
        (
            "https://EXAMPLE.com./p?q=%20",
            WebhookUrl("https", "example.com", 443, "/p?q=%20", False),
        ),
        ("http://[::1]:8080/h", WebhookUrl("http", "::1", 8080, "/h", True)),
        ("http://1.2.3.4/", WebhookUrl("http", "1.2.3.4", 80, "/", True)),
        ("http://under_score.example/", WebhookUrl("http", "under_score.example", 80, "/", False)),
    ],
)
def test_valid_urls_are_taken_apart(url: str, expected: WebhookUrl) -> None:
    assert parse_webhook_url(url) == expected


def test_the_host_header_carries_the_port_only_when_it_is_not_the_default() -> None:
    assert parse_webhook_url("https://h.example:443/").authority == "h.example"
    assert parse_webhook_url("http://[::1]:81/").authority == "[::1]:81"


@pytest.mark.parametrize(
    ("url", "fault"),
    [
        ("https://a..example.com/hook", "empty label"),
        ("https://" + "a" * 64 + ".example/", "longer than 63"),
        ("https://" + ".".join(["abcdefghij"] * 24) + "/", "longer than 253"),
        ("http://ex\x00ample.com/", "control character (U+0000)"),
        ("http://exa\u0085mple.com/", "whitespace"),  # NEL
        ("http://exa\u009bmple.com/", "control character (U+009B)"),
        ("http://☃.net/", "not a valid internationalised name"),
        ("http://-lead.example/", "invalid label"),
        ("http://127.1/", "ends in a number"),
        ("http://0x7f.1/", "ends in a number"),
        ("http://[::1/x", "malformed IPv6"),
        ("http://[::1]x/", "followed by ':port'"),
        ("http://[fe80::1%25eth0]/", "zone id"),
        ("http://h.example:0/", "port 0"),
        ("ftp://h.example/", "http:// or https://"),
        ("http:///path", "must have a host"),
        ("http://h.example/#top", "fragment"),
    ],
)
def test_refusals_name_the_fault(url: str, fault: str) -> None:
    with pytest.raises(UrlError) as caught:
        parse_webhook_url(url)
    assert fault in str(caught.value)
    assert caught.value.reason == "invalid"


@pytest.mark.parametrize(
    "url",
    [
        "https://alice:hunter2@h.example/",
        "https://alice@h.example/",
        "https://alice:hunter2\uff20h.example/",  # a fullwidth at sign, NFKC-equal to '@'
        "https://:hunter2@[::1]:8443/",
    ],
)
def test_userinfo_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(UrlError) as caught:
        parse_webhook_url(url)
    assert caught.value.reason == "userinfo"
    assert "hunter2" not in str(caught.value) and "alice" not in str(caught.value)


def test_a_bad_port_is_not_echoed() -> None:
    with pytest.raises(UrlError) as caught:
        parse_webhook_url("https://h.example:hunter2/")
    assert "hunter2" not in str(caught.value)


# ---- the direct path for plain URLs (_PLAIN_URL) gives what the general one gives ------------

_PIECES = st.sampled_from(
    ["a", "Z", "0", "9", "-", "_", ".", "~", "%", "%2F", ":", "@", "!", "$", "&", "'", "(", "*",
     "+", ",", ";", "=", "/", "?", "#", "[", "]", " ", "\t", "ä", "\x00", "ß", "xn--", "A"]
)  # fmt: skip
_HOSTS = st.sampled_from(
    ["h.example", "a", "H.example", "a..b", "a.b.", "-a.b", "a_b.c", "1.2.3.4", "1.2.3",
     "0x7f.1", "256.1.1.1", "a" * 64 + ".c", "xn--bcher-kva.example", "", "127.0.0.1", "h"]
)  # fmt: skip
_PORTS = st.sampled_from(["", ":", ":0", ":1", ":80", ":443", ":08", ":65535", ":65536", ":99999",
                          ":123456", ":x"])  # fmt: skip


def _outcome(url: str) -> WebhookUrl | str:
    try:
        return parse_webhook_url(url)
    except UrlError as exc:
        return f"UrlError: {exc}"


@settings(max_examples=3000, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "HTTP", "ftp", "http:", ""]),
    host=_HOSTS,
    port=_PORTS,
    path=st.lists(_PIECES, max_size=8).map("".join),
    query=st.none() | st.lists(_PIECES, max_size=6).map("".join),
)
def test_plain_urls_are_taken_apart_as_the_general_path_does(
    scheme: str, host: str, port: str, path: str, query: str | None
) -> None:
    url = f"{scheme}://{host}{port}{'/' + path if path else ''}"
    if query is not None:
        url = f"{url}?{query}"
    direct = _outcome(url)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(urls, "_PLAIN_URL", re.compile(r"(?!)"))  # matches nothing
        general = _outcome(url)
    assert direct == general, url


def test_plain_urls_take_the_direct_path() -> None:
    """The common shapes match it (else the property above proves nothing about them)."""
    for url in [
        "https://hooks.shop-1.net/webhooks/4?source=bridge",
        "http://93.184.7.8:8443/in",
        "https://h.example",
        "https://h.example:65535/a/b;c=d?x=1&y=%C3%A4",
    ]:
        assert urls._PLAIN_URL.fullmatch(url), url


_URL_PARTS = st.tuples(
    st.sampled_from(["http", "https", "HTTPS", "Http"]),
    st.sampled_from(
        ["h.example", "Bücher.Example", "faß.de", "1.2.3.4", "[::1]", "[2606:2800:220::5]", "x."]
    ),
    st.sampled_from(["", ":1", ":8443", ":65535"]),
    st.sampled_from(["", "/", "/a/b", "/p:q@r", "/a//b", "/?", "/x?y=1/2"]),
    st.sampled_from(["", "?", "?q=%20", "?a=b/c#", "?u=http://x/y", "?k=a:b@c"]),
)


@given(_URL_PARTS)
@settings(max_examples=400, deadline=None)
def test_the_authority_of_every_accepted_url_is_urlsplits_netloc(
    parts: tuple[str, ...],
) -> None:
    url = "{}://{}{}{}{}".format(*parts)
    try:
        parse_webhook_url(url)
    except UrlError:
        assume(False)  # refused: nobody asks its authority
    assert url_authority(url) == urlsplit(url).netloc


def test_the_authority_of_each_url_of_the_benchmark_configuration_is_urlsplits_netloc() -> None:
    urls = re.findall(r"url: \"?([^\"\s]+)", config_text(2_000))
    assert len(urls) == 2_000
    for url in urls:
        assert url_authority(url) == urlsplit(url).netloc, url


def test_a_url_without_double_slash_has_no_authority() -> None:
    assert url_authority("mailto:a@b.example") == ""
    assert url_authority("https://h.example#x") == "h.example"


# ---- hosts are mapped (UTS-46) before they are split into labels and judged ------------------

_DOTS = ".\u3002\uff0e\uff61"
"""The full stop and every character UTS-46 maps to it (ideographic, fullwidth, halfwidth
ideographic: ``idna.uts46_remap`` over all of Unicode finds no other, a scan too slow for a unit
test)."""

_DOTTED_HOSTS = st.sampled_from(
    ["169.254.169.254", "127.0.0.1", "1.2.3.4", "0.0.0.0", "0x7f.0.0.1", "a.127", "127.1",
     "a.0x10", "256.1.1.1", "1.2.3.4.", "h.example", "h.example.", "a..b", ".a", "faß.de",
     "bücher.example", "xn--bcher-kva.example", "under_score.example", "-a.b", "\uff41.example"]
)  # fmt: skip


def test_every_dot_variant_is_a_full_stop_to_uts46() -> None:
    for dot in _DOTS:
        assert idna.uts46_remap(f"a{dot}b", std3_rules=False) == "a.b"


@settings(max_examples=500, deadline=None)
@given(host=_DOTTED_HOSTS, dots=st.lists(st.sampled_from(_DOTS), min_size=4, max_size=4))
def test_a_host_with_any_dots_is_judged_as_with_ascii_dots(host: str, dots: list[str]) -> None:
    """The verdict, the host connected to and whether it is an IP address are those of the same
    host written with ASCII dots."""
    pieces = host.split(".")
    written = pieces[0] + "".join(
        dot + piece for dot, piece in zip(dots * 2, pieces[1:], strict=False)
    )
    assert _outcome(f"https://{written}/x") == _outcome(f"https://{host}/x")


_METADATA, _BUECHER = "169.254.169.254", "xn--bcher-kva.example"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://169\uff0e254\uff0e169\uff0e254/", WebhookUrl("https", _METADATA, 443, "/", True)),
        ("https://1\u30022\uff613\uff0e4:8443/", WebhookUrl("https", "1.2.3.4", 8443, "/", True)),
        ("https://B\u00fccher\uff0eExample/", WebhookUrl("https", _BUECHER, 443, "/", False)),
    ],
)  # fmt: skip
def test_an_ip_address_or_a_name_written_with_other_dots_is_what_it_maps_to(
    url: str, expected: WebhookUrl
) -> None:
    assert parse_webhook_url(url) == expected


@pytest.mark.parametrize(
    "host", ["0x7f\uff0e0\uff0e0\uff0e1", "a\uff0e127", "a.\uff11\uff12\uff17"]
)
def test_a_name_that_maps_to_one_ending_in_a_number_is_refused(host: str) -> None:
    with pytest.raises(UrlError, match="ends in a number"):
        parse_webhook_url(f"https://{host}/")


def test_the_authority_shown_is_the_one_connected_to() -> None:
    assert (
        shown_authority("https://169\uff0e254\uff0e169\uff0e254:8443/m") == "169.254.169.254:8443"
    )
    assert shown_authority("https://B\u00fccher\uff0eExample/") == "xn--bcher-kva.example"
    assert shown_authority("https://Hooks.Example:8443/x") == "hooks.example:8443"


@pytest.mark.parametrize(
    "host",
    [
        "ab\ufdd0" * 3000 + ".com",  # refused by the UTS-46 mapping
        "a" * 9000 + ".com",  # a label too long
        "b\u00fc" * 4000 + ".de",  # a label IDNA refuses
        "x" * 5000 + "!.com",  # an invalid label
        "[" + "1:" * 4000 + "]",  # not an IPv6 address
    ],
)
def test_a_refused_host_is_shown_shortened_in_its_message(host: str) -> None:
    """However long the host, the message that refuses it stays short: an 8 KB host aliased
    into thousands of webhooks printed megabytes of problems."""
    with pytest.raises(UrlError) as caught:
        parse_webhook_url(f"https://{host}/hook")
    assert len(str(caught.value)) < 400, str(caught.value)[:500]
