"""Messages for people: a configuration error is printable lines, whatever its file's name."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.core.errors import ConfigError, printable


def test_printable_escapes_what_a_terminal_would_obey() -> None:
    assert printable("acct_123 +221 caf\u00e9") == "acct_123 +221 caf\u00e9"
    assert printable("a\x1b[2J\r\n\x07\x85") == "a\\x1b[2J\\r\\n\\x07\\x85"
    assert printable("\u202egnp.exe \u200b\u2028\ud800\udcff") == (
        "\\u202egnp.exe \\u200b\\u2028\\ud800\\udcff"
    )


@given(st.text())
def test_printable_gives_a_printable_line_that_it_leaves_as_it_is(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable() and printable(shown) == shown


def test_a_config_error_is_one_line_per_problem() -> None:
    error = ConfigError("/etc/b\nridge", ["/etc/b\nridge/a\x1b.yaml: bad"])
    assert str(error).splitlines() == [
        "/etc/b\\nridge: 1 problem(s) in the configuration:",
        "  - /etc/b\\nridge/a\\x1b.yaml: bad",
    ]
    assert error.path == "/etc/b\nridge"  # the path itself, for callers that open it
