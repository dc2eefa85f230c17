"""Command-line parsing: time filters, usage errors and exit codes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bridge.cli import build_parser, main, parse_time


def test_parse_time_accepts_ages_and_iso_times() -> None:
    assert parse_time("90m", now=10_000.0) == (10_000 - 5400) * 1000
    assert parse_time("2026-03-14T09:26:53Z") == 1_773_480_413_000
    assert parse_time("2026-03-14T10:26:53+01:00") == 1_773_480_413_000


def test_parse_time_rejects_nonsense_with_a_hint() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="age like 30m"):
        parse_time("yesterday")


def test_missing_config_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BRIDGE_CONFIG", raising=False)
    assert main(["check", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "no configuration file given" in err and "hint:" in err


def test_invalid_config_exits_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("webhooks:\n  - id: x\n    url: ftp://nowhere\n")
    assert main(["check", "--offline", "-c", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


def test_version_and_unknown_command() -> None:
    with pytest.raises(SystemExit) as version:
        build_parser().parse_args(["--version"])
    assert version.value.code == 0
    with pytest.raises(SystemExit) as unknown:
        build_parser().parse_args(["frobnicate"])
    assert unknown.value.code == 2


def test_check_offline_prints_webhooks_without_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--offline", "-c", "config/test.yaml"]) == 0
    out = capsys.readouterr().out
    assert "test-both" in out and "127.0.0.1:18080" in out
    assert "test-secret" not in out


@pytest.mark.parametrize(
    "webhook",
    [
        "secret: !!int hunter2-not-a-number",
        "secret: !!float hunter2-x\n    url: https://a.example/h",
        "secret: !!bool hunter2-maybe",
        "secret: !!timestamp hunter2-nope",
        "secret: !!python/object:os.system hunter2",
        "secret: hunter2-inline-value\n    url: 'http://[::1/x'",
        "secret: hunter2-inline-value\n    url: 'https://alice:hunter2-pw@a.example/h'",
        "secret: hunter2-inline-value\n    url: 'https://a..example.com/hook'",
    ],
)
def test_check_reports_hostile_input_without_traceback_or_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], webhook: str
) -> None:
    bad = tmp_path / "bad.yaml"
    head = "webhooks:\n  - id: shop\n    account: a\n    events: [transaction.success]\n"
    text = f"{head}    {webhook}\n"
    if "url:" not in webhook:
        text += "    url: https://a.example/h\n"
    bad.write_text(text)
    assert main(["check", "--offline", "-c", str(bad)]) == 2
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert f"{bad}:" in output and "webhook 'shop': field '" in output
    assert "Traceback" not in output
    assert "hunter2" not in output
