"""Command-line parsing: time filters, usage errors and exit codes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from bridge.cli import _table, build_parser, main, parse_time
from tests.ports import refused_port


def test_parse_time_accepts_ages_and_iso_times() -> None:
    assert parse_time("90m", now=10_000.0) == (10_000 - 5400) * 1000
    assert parse_time("2026-03-14T09:26:53Z") == 1_773_480_413_000
    assert parse_time("2026-03-14T10:26:53+01:00") == 1_773_480_413_000


def test_parse_time_rejects_nonsense_with_a_hint() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="age like 30m"):
        parse_time("yesterday")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'1{37}\.\.\.' reaches back before 19"):
        parse_time("1" * 5000 + "s")
    assert parse_time("1" * 12 + "s", now=2e12) == (2_000_000_000_000 - 111_111_111_111) * 1000


def test_missing_config_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BRIDGE_CONFIG", raising=False)
    assert main(["check", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "no configuration given" in err and "hint:" in err


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


class _StatusServer:
    """A local HTTP server answering ``/status`` with ``body`` (as a running bridge would)."""

    def __init__(self, body: dict[str, object]) -> None:
        import http.server
        import json
        import threading

        payload = json.dumps(body).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                found = self.path == "/status"
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload if found else b"{}")

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


STATUS_BODY: dict[str, object] = {
    "time": 1000.0,
    "webhooks": [
        {
            "id": "down",
            "failing_since": 940.0,
            "active": 2,
            "limit": 32,
            "waiting": 0,
            "stalled": False,
            "credit": 97.0,
            "out_of_credit": False,
        }
    ],
    "needing_attention": 1,
    "listed": 1,
    "left_out": 0,
    "totals": {"in_flight": 2, "max_in_flight": 1000, "webhooks_failing": 1},
    "config": {"path": "bridge.yaml", "webhooks": 2, "generation": 1, "applied_at": 900.0},
}


def test_status_prints_the_running_bridges_view_as_a_table_or_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    server = _StatusServer(STATUS_BODY)
    try:
        assert main(["status", "--url", server.url]) == 0
        table = capsys.readouterr().out
        assert main(["status", "--url", server.url + "/status", "--json"]) == 0
        raw = capsys.readouterr().out
    finally:
        server.close()
    assert "1 webhook(s) need attention (1 failing)" in table
    assert ["down", "failing", "1m00s", "2", "32", "0", "97"] in [
        line.split() for line in table.splitlines()
    ]
    assert json.loads(raw) == STATUS_BODY


def test_status_of_a_bridge_that_does_not_answer_exits_1_with_a_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with refused_port() as port:
        assert main(["status", "--url", f"http://127.0.0.1:{port}", "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}/status" in err and "hint:" in err and "Traceback" not in err


def test_status_finds_the_operator_port_in_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = _StatusServer(STATUS_BODY)
    port = server.url.rsplit(":", 1)[1]
    config = tmp_path / "bridge.yaml"
    config.write_text(f"metrics:\n  host: 0.0.0.0\n  port: {port}\nwebhooks: []\n")
    monkeypatch.delenv("BRIDGE_CONFIG", raising=False)
    try:
        assert main(["status", "-c", str(config)]) == 0
    finally:
        server.close()
    assert "down" in capsys.readouterr().out


def test_the_service_imports_ahead_of_need_leave_a_failure_to_the_import_that_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``bridge run`` imports the service's modules while the child reads the configuration; a
    module that cannot be imported there raises nothing on that thread."""
    import sys

    from bridge.cli import _import_service

    monkeypatch.setitem(sys.modules, "bridge.app", None)  # importing it raises ImportError
    _import_service()  # returns, raising nothing
    with pytest.raises(ImportError):
        import bridge.app  # noqa: F401


def test_a_table_pads_each_column_to_its_widest_cell_and_strips_line_ends() -> None:
    rows = [["wh-1", 7, ""], ["a-much-longer-id", None, "x"]]
    assert _table(rows, ["ID", "N", "LAST"]).splitlines() == [
        "ID                N     LAST",
        "wh-1              7",
        "a-much-longer-id  None  x",
    ]
    assert _table([], ["ONE", "TWO"]) == "ONE  TWO"
    with pytest.raises(ValueError):  # a row with a cell too few is a bug, not a short line
        _table([["a", "b"], ["c"]], ["X", "Y"])


def test_check_shows_the_host_connected_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host written with other full stops is shown as the host the bridge connects to."""
    path = tmp_path / "b.yaml"
    path.write_text(
        "webhooks:\n  - id: w\n    account: a\n    events: [transaction.success]\n"
        "    url: 'https://Hooks\uff0eexample\u3002com:8443/h'\n    secret: s3cr3t-value\n",
        encoding="utf-8",
    )
    assert main(["check", "--offline", "-c", str(path)]) == 0
    assert "hooks.example.com:8443" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["status", "--timeout", "inf"], "--timeout"),
        (["status", "--timeout", "1e300"], "--timeout"),
        (["status", "--timeout", "nan"], "--timeout"),
        (["status", "--timeout", "-1"], "--timeout"),
        (["status", "--timeout", "0"], "--timeout"),
        (["status", "--timeout", "soon"], "--timeout"),
        (["check", "--offline", "--timeout", "inf"], "--timeout"),
        (["check", "--timeout", "1e400"], "--timeout"),
        (["status", "--url", "http://127.0.0.1:abc"], "--url"),
        (["status", "--url", "http://127.0.0.1:0"], "--url"),
        (["status", "--url", "http://127.0.0.1:65536"], "--url"),
        (["status", "--url", "http://a b:1"], "--url"),
        (["status", "--url", "http://127.0.0.1:9464\n/x"], "--url"),
        (["status", "--url", "http://127.0.0.1:9464/\x1b[2J"], "--url"),
        (["status", "--url", "file:///etc/passwd"], "--url"),
        (["status", "--url", "ftp://127.0.0.1:21"], "--url"),
        (["status", "--url", "http://alice:hunter2@127.0.0.1:9464"], "--url"),
        (["status", "--url", "alice:hunter2@127.0.0.1:9464"], "--url"),
        (["status", "--url", "http://alice:hunter2@127.0.0.1:x"], "--url"),
        (["status", "http://alice:hunter2@127.0.0.1:9464"], "unrecognized arguments"),
        (["dlq", "list", "--limit", "-1"], "--limit"),
        (["dlq", "list", "--limit", "1e3"], "--limit"),
        (["dlq", "list", "--limit", "9" * 5000], "--limit"),
        (["status", "--timeout", "1e-320"], "--timeout"),
        (["status", "--timeout", "0.0009"], "--timeout"),
        (["status", "--url", " http://a b:1 "], "--url"),
        (["status", "--url", "\x1b[2J127.0.0.1:9464"], "--url"),
        (["dlq", "list", "--since", "1" * 5000 + "s"], "--since"),
        (["dlq", "list", "--since", "1" * 13 + "s"], "--since"),
        (["dlq", "replay", "--until", "9" * 5000 + "x"], "--until"),
        (["dlq", "list", "--since", "\x1b]0;pwned\x07" * 500], "--since"),
        (["check", "--x\x1b]0;pwned\x07"], "unrecognized arguments: --x\\x1b]0;pwned\\x07"),
        (["check", "--x" + "\x1b[2J" * 5000], "unrecognized arguments"),
        (["check", *["--y"] * 5000], "unrecognized arguments"),
        (["bogus\x1b[31m" + "x" * 5000], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_them(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and named in err, err
    assert err[:-1].isprintable() and len(err) < 400, "no escape sequence, nothing echoed whole"
    assert "Traceback" not in err and "hunter2" not in err and "alice" not in err, err


@pytest.mark.parametrize(
    ("given", "requested"),
    [
        ("127.0.0.1:9464", "http://127.0.0.1:9464/"),
        ("http://[::1]:9464/status", "http://[::1]:9464/status"),
        ("https://Bridge.Example", "https://bridge.example/"),
        (" 127.0.0.1:9464", "http://127.0.0.1:9464/"),  # (pasted with the space around it)
        ("\thttp://[::1]:9464/status \n", "http://[::1]:9464/status"),
    ],
)
def test_status_url_is_taken_as_it_will_be_requested(given: str, requested: str) -> None:
    args = build_parser().parse_args(["status", "--url", given, "--timeout", "0.5"])
    assert (args.url, args.timeout) == (requested, 0.5)


def test_a_timeout_says_its_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["status", "--timeout", "1e-320"])
    assert "from 0.001 to 3600, got '1e-320'" in capsys.readouterr().err
    assert build_parser().parse_args(["status", "--timeout", "0.001"]).timeout == 0.001


def test_table_cells_cannot_write_control_sequences_or_lines() -> None:
    hostile = "acct\x1b[2J\x1b]0;owned\x07\r\nfake  row\u202e\u2028"
    table = _table([("w1", hostile), ("w2", "plain")], ["ID", "ACCOUNT"])
    lines = table.split("\n")
    assert len(lines) == 3 and all(line.isprintable() for line in lines)
    assert "acct\\x1b[2J\\x1b]0;owned\\x07\\r\\nfake  row\\u202e\\u2028" in lines[1]


def test_a_problem_line_is_one_printable_line_whatever_the_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a\x1b[2J\n  - fake.yaml").write_text("webhooks: {\n", encoding="utf-8")
    assert main(["check", "--offline", "-c", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.isprintable() for line in err), err
    assert err[1].startswith(f"  - {tmp_path}/a\\x1b[2J\\n  - fake.yaml:2: invalid YAML")


@pytest.mark.parametrize("command", ["check", "run"])
def test_schema_files_that_cannot_be_read_end_check_and_run_with_the_configurations_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO among the schema files (a plain open() would wait for ever) and a file that is not
    JSON: ``bridge check`` and ``bridge run`` (before any Kafka client starts: its broker is a
    refused port) exit 2 naming the configuration, the field and each file, no traceback."""
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    reader = Path("schemas/transaction_outcome.avsc")
    (schemas / reader.name).write_bytes(reader.read_bytes())
    os.mkfifo(schemas / "fifo.avsc")
    (schemas / "cut.avsc").write_text('{"type": ')
    config = tmp_path / "bridge.yaml"
    config.write_text(
        f"kafka:\n  bootstrap_servers: 127.0.0.1:{refused_port()}\n"
        f"schemas:\n  directory: {schemas}\n"
        "webhooks:\n  - id: shop\n    account: a\n    events: [transaction.success]\n"
        "    url: https://a.example/h\n    secret: a-secret-of-thirty-two-characters\n"
    )
    args = [command, "-c", str(config)] + (["--offline"] if command == "check" else [])
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"error: {config}: 2 problem(s) in the configuration:",
        f"  - field 'schemas.directory': {schemas / 'cut.avsc'}: not JSON: Expecting value "
        "(line 1, column 10)",
        f"  - field 'schemas.directory': {schemas / 'fifo.avsc'}: not a regular file (a FIFO)",
    ]
