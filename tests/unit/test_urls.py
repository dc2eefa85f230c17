"""The shared webhook URL rules: every refusal names the fault and never echoes credentials."""

from __future__ import annotations

import pytest

from bridge.core.urls import UrlError, WebhookUrl, parse_webhook_url


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
