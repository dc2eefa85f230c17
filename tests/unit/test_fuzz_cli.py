"""Fuzzing the command line: any argv parses or exits with a usage message, never a traceback.

``build_parser().parse_args`` either returns the parsed arguments or exits 0 (``--help``,
``--version``) or 2 (a usage error, with a message); malformed input to ``main`` exits 2 with one
line naming what is wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
TOKENS = [
    "run",
    "check",
    "topics",
    "test-webhook",
    "dlq",
    "list",
    "replay",
    "bench",
    "-c",
    "--config",
    "--offline",
    "--timeout",
    "--dry-run",
    "--webhook",
    "--reason",
    "--since",
    "--until",
    "--limit",
    "--all",
    "-h",
    "--help",
    "--version",
    "--",
    "-",
    "",
    "config/test.yaml",
    "30m",
    "2h",
    "7d",
    "0s",
    "-5m",
    "2026-03-14T09:00:00Z",
    "2026-03-14T09:00:00+23:59",
    "0001-01-01T00:00:00+05:00",
    "9999-12-31T23:59:59-05:00",
    "nan",
    "inf",
    "-1",
    "1e400",
    "99999999999999999999",
]
AGES = st.builds(
    "{}{}".format,
    st.integers(min_value=0, max_value=10**400),
    st.sampled_from(["s", "m", "h", "d"]),
)
ARGV = st.lists(st.one_of(st.sampled_from(TOKENS), AGES, st.text(max_size=12)), max_size=8)


def parse_quietly(argv: Sequence[str]) -> argparse.Namespace | int:
    """Parse ``argv``: the namespace, or the exit code argparse asked for (output swallowed)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(argv)
        except SystemExit as exit_:
            code = exit_.code
    assert code in (0, 2), f"exit code {code!r} for {argv!r}"
    if code == 2:
        assert "error:" in err.getvalue(), f"a usage error says what is wrong: {argv!r}"
    return code


@settings(max_examples=200, deadline=None)
@given(argv=ARGV)
@example(argv=["dlq", "list", "--since", "9" * 400 + "d"])  # an age past any date
@example(argv=["dlq", "replay", "--until", "0001-01-01T00:00:00+05:00"])
@example(argv=["check", "--timeout", "1e400"])
@example(argv=["dlq", "list", "--since", "1" * 5000 + "s"])  # past int()'s digit limit
def test_any_argv_parses_or_exits_with_usage(argv: list[str]) -> None:
    parsed = parse_quietly(argv)
    if isinstance(parsed, argparse.Namespace):
        assert callable(parsed.func)


def test_an_age_too_large_for_a_date_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["dlq", "list", "--since", "9" * 400 + "d"])
    assert exit_.value.code == 2
    assert "--since" in capsys.readouterr().err


def run_main(argv: list[str]) -> int:
    """``main(argv)``'s exit code, whether returned or raised by argparse."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["check", "--offline", "-c", "{missing}"], "cannot read the file"),
        (["check", "--offline", "-c", "{folder}"], "no configuration file in the directory"),
        (["check", "--offline", "-c", "{files}"], "{list}:1: the top level"),
        (["check", "--offline", "-c", "{binary}"], "{binary}"),
        (["check", "--offline", "-c", "{empty}"], "{empty}"),
        (["check", "--offline", "-c", "{list}"], "{list}"),
        (["test-webhook", "nope", "-c", "config/test.yaml"], "no webhook 'nope'"),
        (["dlq", "replay", "-c", "config/test.yaml"], "say which dead letters to replay"),
        (["dlq", "list", "--since", "yesterday"], "--since"),
        (["dlq", "list", "--limit", "many"], "--limit"),
        (["check", "--timeout", "soon"], "--timeout"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_malformed_input_exits_2_with_one_clear_message(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {
        "missing": tmp_path / "missing.yaml",
        "folder": tmp_path / "no-yaml-here",
        "files": tmp_path,  # a configuration directory: its files' problems, each named
        "binary": tmp_path / "binary.yaml",
        "empty": tmp_path / "empty.yaml",
        "list": tmp_path / "list.yaml",
    }
    files["folder"].mkdir()
    files["binary"].write_bytes(b"\xff\xfe\x00 not text")
    files["empty"].write_text("")
    files["list"].write_text("- just\n- a list\n")
    argv = [arg.format(**files) for arg in argv]

    with contextlib.chdir(REPO):
        assert run_main(argv) == 2
    err = capsys.readouterr().err
    assert said.format(**files) in err
    assert "Traceback" not in err
    assert err.startswith(("error:", "usage:")), err
