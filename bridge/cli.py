"""The ``bridge`` command line (also ``python -m bridge``).

Exit codes: 0 success; 1 the command ran and failed (a delivery not received, Kafka unreachable);
2 bad usage or invalid configuration.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

from bridge import __version__
from bridge.config.loader import collector_paused, load_config
from bridge.core.errors import ConfigError, clipped, printable
from bridge.core.settings import Config
from bridge.core.urls import UrlError, parse_webhook_url, shown_authority

if TYPE_CHECKING:
    from bridge.config.reload import Primer
    from bridge.ops.dlq import DeadLetter, Selection

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS = 0.001, 3600.0
MAX_AGE_DIGITS = 12  # (10**12 seconds is 31,000 years: past 1970 whatever the unit)
MAX_USAGE_MESSAGE = 300  # characters of a usage error, the values it echoes included
MAX_COUNT = 10**9
T = TypeVar("T")
CONFIG_ENV = "BRIDGE_CONFIG"
REGISTRY_HINT = (
    "check schemas.registry_username and schemas.registry_password (or registry_password_file)"
)


class CliError(Exception):
    """A failure to report as one clear line (with a hint) and an exit code."""

    def __init__(self, message: str, hint: str = "", code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.hint = hint
        self.code = code


def _color(text: str, code: str, stream: object = sys.stdout) -> str:
    isatty = getattr(stream, "isatty", lambda: False)()
    if not isatty or os.environ.get("NO_COLOR"):
        return text
    return f"\033[{code}m{text}\033[0m"


def _table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """``rows`` under ``header`` in left-aligned columns two spaces apart (one format string for
    every line: ``bridge check`` prints one row per webhook, 100,000 of them at scale). Cells
    are :func:`printable`: no value can write a control sequence or a line of its own."""
    cells = zip(*rows, strict=True) if rows else [()] * len(header)  # (column by column)
    columns = [_printable_cells([title, *each]) for title, each in zip(header, cells, strict=True)]
    widths = [max(map(len, column)) for column in columns]
    line = "  ".join(f"{{:<{width}}}" for width in widths).format
    return "\n".join([line(*row).rstrip() for row in zip(*columns, strict=True)])


def _printable_cells(values: Sequence[object]) -> list[str]:
    """``values`` as text, each :func:`printable` (one test for the whole column, as nearly
    every column is printable already)."""
    cells = list(map(str, values))
    return cells if "".join(cells).isprintable() else list(map(printable, cells))


def load_config_argument(args: argparse.Namespace) -> Config:
    """The configuration named by ``--config`` or ``$BRIDGE_CONFIG`` (CliError if neither)."""
    return load_config(config_path(args))


def config_path(args: argparse.Namespace) -> str:
    """The path given by ``--config`` or ``$BRIDGE_CONFIG`` (CliError if neither)."""
    path: str | None = args.config or os.environ.get(CONFIG_ENV)
    if not path:
        raise CliError(
            "no configuration given",
            hint=f"pass --config FILE|DIR or set {CONFIG_ENV} (see config/bridge.example.yaml)",
            code=EXIT_USAGE,
        )
    return path


def parse_time(text: str, now: float | None = None) -> int:
    """A time filter as unix ms: ISO 8601 (``2026-03-14T09:00:00Z``) or an age (``90m``) that
    reaches back no further than 1970 (an age of thousands of digits is refused unread)."""
    now = time.time() if now is None else now
    age = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if age:
        digits, unit = age.groups()
        if len(digits) > MAX_AGE_DIGITS:
            seconds = math.inf
        else:
            seconds = int(digits) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
        if seconds > now:
            raise argparse.ArgumentTypeError(f"{_given(text)} reaches back before 1970")
        return int((now - seconds) * 1000)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{_given(text)} is neither an ISO 8601 time nor an age like 30m, 2h, 7d"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def seconds_argument(text: str) -> float:
    """``--timeout``: a number of seconds from :data:`MIN_TIMEOUT_SECONDS` to
    :data:`MAX_TIMEOUT_SECONDS` (not ``nan``, ``inf``, ``1e300`` or ``1e-320``, which no socket
    or Kafka call takes)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not MIN_TIMEOUT_SECONDS <= value <= MAX_TIMEOUT_SECONDS:  # (nan compares false)
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from {MIN_TIMEOUT_SECONDS:g} to "
            f"{MAX_TIMEOUT_SECONDS:g}, got {_given(text)}"
        )
    return value


def count_argument(text: str) -> int:
    """``--limit``: a whole number from 0 to :data:`MAX_COUNT`."""
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) > MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 0 to {MAX_COUNT:,}, got {_given(text)}"
        )
    return int(text)


def operator_url(text: str) -> str:
    """``status --url``: the operator address of a bridge, ``http(s)://HOST[:PORT][/PATH]`` or
    ``HOST:PORT`` (http), judged as a webhook URL is (:func:`parse_webhook_url`: a valid host and
    port, no whitespace or control character within, no userinfo) once the whitespace around it
    is stripped, as it will be requested. The error never echoes the URL: it may hold a
    password."""
    text = text.strip()
    url = text if "://" in text else f"http://{text}"
    try:
        parts = parse_webhook_url(url)
    except UrlError as exc:
        if exc.reason == "userinfo":
            raise argparse.ArgumentTypeError(
                "must not contain user:password@ (the operator port takes no credentials)"
            ) from None
        raise argparse.ArgumentTypeError(f"not an http(s)://HOST:PORT address: {exc}") from None
    return f"{parts.scheme}://{parts.authority}{parts.target}"


def _given(text: str) -> str:
    """A value given on the command line, for an error message: quoted, escaped, shortened."""
    return repr(clipped(text, 40))


_USERINFO: Final = re.compile(r"(://)[^/?#@]*@")


class UsageParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the argument at fault (and
    where the usage is), exit code 2; subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: MESSAGE (see `PROG --help`)`` on stderr and exit 2. What argparse
        echoes of the command line is made safe: a URL's userinfo masked (``unrecognized
        arguments: http://user:pw@host``), control characters escaped (:func:`printable`: no
        argument writes an escape sequence to the terminal), the message cut at
        :data:`MAX_USAGE_MESSAGE` characters."""
        message = printable(_USERINFO.sub(r"\1***@", message))
        if len(message) > MAX_USAGE_MESSAGE:
            message = f"{message[: MAX_USAGE_MESSAGE - 3]}..."
        self.exit(EXIT_USAGE, f"error: {message} (see `{self.prog} --help`)\n")


# ---- commands ----------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    """Consume and deliver until SIGTERM/SIGINT."""
    from bridge.config.reload import load_isolated_primed
    from bridge.kafka.security import KafkaFatalError
    from bridge.ops import logs

    # The service's modules are imported while a child process reads the configuration: the
    # wait for the child (a system call, without the interpreter lock) and the imports overlap.
    imports = threading.Thread(target=_import_service, name="import-service", daemon=True)
    imports.start()
    try:
        config, primer = load_isolated_primed(config_path(args))  # no parse leftovers held
    finally:
        imports.join()
    logs.configure(config.logging.format, config.logging.level)
    if config.schemas.mode == "registry" and not _registry_admits(config):
        return EXIT_FAILED
    try:
        clean = run_event_loop(_run_app(config, primer))
    except KafkaFatalError as exc:  # logged as kafka.start_failed or kafka.producer_failed
        # Said here and ended at once: the Kafka clients' threads may still be inside
        # librdkafka, and tearing them down at interpreter exit crashed the process (SIGSEGV).
        logging.shutdown()  # (the log's lines first: they are written by a thread)
        print(f"error: {exc}\nhint: {exc.hint}", file=sys.stderr, flush=True)
        os._exit(EXIT_FAILED)
    if not clean:
        # A step of the shutdown was cut at the grace deadline (the broker unreachable, say):
        # its thread may still be blocked in librdkafka, and waiting for it at interpreter exit
        # would outlive the grace period. Everything that could be settled is; exit now.
        logging.shutdown()
        os._exit(EXIT_OK)
    return EXIT_OK


def _import_service() -> None:
    """Import what ``bridge run`` runs, ahead of need. A failure is left for the import that
    needs the module, which reports it where it matters."""
    try:
        import uvloop  # noqa: F401

        import bridge.app  # noqa: F401
    except Exception:
        return


def _registry_admits(config: Config) -> bool:
    """At start: False (said, with a hint) when the schema registry refuses the credentials,
    which no retry mends. A registry that cannot answer now is only logged: the records that
    need it hold their partitions until it does."""
    refused, unavailable = _probe_registry(config)
    if refused is not None:
        logging.getLogger("bridge.app").error(
            "registry.refused", extra={"fields": {"error": refused}}
        )
        _drain_log()  # (its line first: the log is written by a thread)
        print(f"error: {refused}\nhint: {REGISTRY_HINT}", file=sys.stderr, flush=True)
        return False
    if unavailable is not None:
        logging.getLogger("bridge.app").warning(
            "registry.unavailable", extra={"fields": {"error": unavailable, "at": "start"}}
        )
    return True


def _probe_registry(config: Config) -> tuple[str | None, str | None]:
    """Ask the schema registry for its subjects with the configured credentials (``bridge
    check``, and ``bridge run`` at start): why it refused them, or why it cannot answer (each
    None when not so)."""
    from bridge.codec.build import registry_client
    from bridge.codec.registry import RegistryRefusedError
    from bridge.core.errors import RegistryUnavailableError

    with registry_client(config) as client:
        try:
            client.probe()
        except RegistryRefusedError as exc:
            return str(exc), None
        except RegistryUnavailableError as exc:
            return None, str(exc)
    return None, None


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where it is installed (a third faster on the delivery path)."""
    try:
        import uvloop
    except ImportError:
        import asyncio

        return asyncio.run(main)
    return uvloop.run(main)


async def _run_app(config: Config, primer: Primer | None = None) -> bool:
    """Run the service; True when its shutdown finished every step within the grace period."""
    from bridge.app import App

    app = App(config, primer=primer)
    await app.run()
    return app.clean


def cmd_check(args: argparse.Namespace) -> int:
    """Validate the configuration and schemas, print the webhooks, and reach Kafka."""
    from bridge.codec.build import build_decoder

    with collector_paused():  # (its table of 100,000 webhooks took a second more without)
        config = load_config_argument(args)
        build_decoder(config)
        events = {each: ",".join(sorted(each)) for each in {w.events for w in config.webhooks}}
        rows = [
            (
                w.id,
                w.account,
                events[w.events],
                shown_authority(w.url),
                w.signature,
                "yes" if w.enabled else "no",
            )
            for w in config.webhooks
        ]
        print(f"{printable(str(config.path))}: valid; {len(config.webhooks)} webhook(s)")
        if rows:
            print(_table(rows, ["ID", "ACCOUNT", "EVENTS", "HOST", "SCHEME", "ENABLED"]))
    print(
        f"topics: source {config.topics.source}, {len(config.delay_topics)} delay rung(s), "
        f"parking {config.parked_topic}, dead letters {config.dead_letter_topic}"
    )
    if args.offline:
        return EXIT_OK
    metadata = reach_kafka(config, args.timeout)
    if config.schemas.mode == "registry":
        _check_registry(config)
    needed = [
        config.topics.source,
        *config.delay_topics,
        config.parked_topic,
        config.dead_letter_topic,
    ]
    missing = [t for t in needed if t not in metadata.topics]
    servers = printable(config.kafka.bootstrap_servers)
    print(f"kafka: {len(metadata.brokers)} broker(s) reachable at {servers}")
    if missing:
        raise CliError(
            f"missing topics: {', '.join(missing)}", hint="run `bridge topics` to create them"
        )
    return EXIT_OK


def reach_kafka(config: Config, timeout: float = 10.0) -> Any:
    """The cluster's metadata, or a one-line CliError at once when the cluster refuses the
    credentials or certificates (rather than each command's own timeout), or after ``timeout``
    when it does not answer."""
    from bridge.kafka.security import KafkaSecurityError, probe_cluster

    try:
        return probe_cluster({**config.kafka_settings(), "log_level": 0}, timeout)
    except KafkaSecurityError as exc:
        raise CliError(str(exc), hint=exc.hint) from exc
    except Exception as exc:
        raise CliError(
            f"Kafka at {config.kafka.bootstrap_servers} is unreachable: {exc}",
            hint="check kafka.bootstrap_servers or KAFKA_BOOTSTRAP_SERVERS",
        ) from exc


def _check_registry(config: Config) -> None:
    """``bridge check``: the schema registry answers, with the configured credentials."""
    refused, unavailable = _probe_registry(config)
    if refused is not None:
        raise CliError(refused, hint=REGISTRY_HINT)
    if unavailable is not None:
        raise CliError(unavailable, hint="check schemas.registry_url")
    from bridge.codec.registry import display_url

    print(f"schema registry: answering at {display_url(config.schemas.registry_url or '')}")


def cmd_topics(args: argparse.Namespace) -> int:
    """Create the source, delay and dead-letter topics (or print the plan with --dry-run)."""
    from bridge.kafka.topics import apply_plan, kafka_reason, plan_topics

    config = load_config_argument(args)
    plans = plan_topics(config)
    rows = [
        [
            p.name,
            p.role,
            str(p.partitions),
            str(p.replication_factor),
            str(int(p.settings["retention.ms"]) // 3_600_000) + "h",
        ]
        for p in plans
    ]
    print(_table(rows, ["TOPIC", "ROLE", "PARTITIONS", "REPLICAS", "RETENTION"]))
    if args.dry_run:
        return EXIT_OK
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    reach_kafka(config)
    admin = AdminClient({**config.kafka_settings(), "log_level": 0})
    try:
        report = apply_plan(admin, plans)
    except KafkaException as exc:
        raise CliError(
            f"Kafka at {config.kafka.bootstrap_servers}: {kafka_reason(exc)}",
            hint="check kafka.bootstrap_servers or KAFKA_BOOTSTRAP_SERVERS",
        ) from exc
    for name in report.created:
        print(f"created {name}")
    for name in report.unchanged:
        print(f"exists  {name}")
    for problem in report.differences:
        print(_color(f"differs {problem} (left unchanged)", "33"))
    for problem in report.failures:
        print(_color(f"failed  {problem}", "31"))
    return EXIT_FAILED if report.differences or report.failures else EXIT_OK


def cmd_test_webhook(args: argparse.Namespace) -> int:
    """Send one signed test delivery to a webhook and print whether it counts as received."""
    from bridge.ops.testdelivery import send_test_delivery

    config = load_config_argument(args)
    webhook = next((w for w in config.webhooks if w.id == args.webhook_id), None)
    if webhook is None:
        known = ", ".join(w.id for w in config.webhooks) or "none"
        raise CliError(
            f"no webhook {args.webhook_id!r} in {config.path}",
            hint=f"known: {known}",
            code=EXIT_USAGE,
        )
    result = run_event_loop(send_test_delivery(config, webhook))
    verdict = _color("received", "32") if result.outcome.received else _color("NOT received", "31")
    print(
        f"webhook {webhook.id}: {result.outcome.describe()} in "
        f"{result.outcome.duration * 1000:.0f} ms -> {verdict}"
    )
    print(f"webhook-id {result.message_id}")
    return EXIT_OK if result.outcome.received else EXIT_FAILED


def _selection(args: argparse.Namespace) -> Selection:
    from bridge.ops.dlq import Selection

    return Selection(args.webhook, args.reason, args.since, args.until)


def _dead_letters(config: Config) -> list[DeadLetter]:
    """Every dead letter, or a clear error when the topic cannot be read."""
    from confluent_kafka import KafkaException

    from bridge.ops.dlq import read_dead_letters

    try:
        return list(read_dead_letters(config))
    except LookupError as exc:
        raise CliError(str(exc).strip("'\""), hint="run `bridge topics` first") from exc
    except (KafkaException, TimeoutError) as exc:
        raise CliError(
            f"cannot read {config.dead_letter_topic} at {config.kafka.bootstrap_servers}: {exc}",
            hint="check kafka.bootstrap_servers or KAFKA_BOOTSTRAP_SERVERS",
        ) from exc


def cmd_dlq_list(args: argparse.Namespace) -> int:
    """Print dead letters as a table."""

    config = load_config_argument(args)
    selection = _selection(args)
    reach_kafka(config)
    now = time.time_ns() // 1_000_000
    rows = [letter.row(now) for letter in _dead_letters(config) if selection.matches(letter)]
    if args.limit:
        rows = rows[-args.limit :]
    print(_table(rows, ["AT", "KIND", "WEBHOOK", "REASON", "ATTEMPTS", "LAST", "AGE"]))
    print(f"{len(rows)} dead letter(s)")
    return EXIT_OK


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    """Re-inject selected dead letters at attempt 0."""
    from bridge.ops.dlq import replay

    config = load_config_argument(args)
    if not (args.all or args.webhook or args.reason or args.since or args.until):
        raise CliError(
            "say which dead letters to replay",
            hint="use --all, or filter with --webhook, --reason, --since, --until",
            code=EXIT_USAGE,
        )
    selection = _selection(args)
    reach_kafka(config)
    letters = [letter for letter in _dead_letters(config) if selection.matches(letter)]
    if not letters:
        print("no dead letters match")
        return EXIT_OK

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\rreplaying {done}/{total}", end="", file=sys.stderr, flush=True)

    try:
        count = replay(config, letters, progress)
    except RuntimeError as exc:
        raise CliError(
            str(exc), hint="check the broker, then replay the same selection again"
        ) from exc
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"replayed {count} of {len(letters)} dead letter(s)")
    return EXIT_OK if count == len(letters) else EXIT_FAILED


def cmd_status(args: argparse.Namespace) -> int:
    """Fetch ``/status`` from a running bridge and print it: a table, or the JSON (``--json``)."""
    from bridge.ops.status import (
        StatusError,
        fetch_status,
        render_status,
        status_json,
        status_view,
    )

    base = args.url or _status_base(args)
    try:
        body = fetch_status(base, args.timeout)
        view = status_view(body)
        text = status_json(body) if args.json else render_status(view)
    except StatusError as exc:
        raise CliError(
            str(exc),
            hint="is `bridge run` listening there? pass --url http://HOST:PORT "
            "(its metrics.host and metrics.port)",
        ) from None
    print(text)
    return EXIT_OK


def _status_base(args: argparse.Namespace) -> str:
    """The operator address of the configuration given (``-c``/``$BRIDGE_CONFIG``), on this
    machine; the default port on this machine without one."""
    from bridge.ops.status import DEFAULT_URL

    if not (args.config or os.environ.get(CONFIG_ENV)):
        return DEFAULT_URL
    metrics = load_config_argument(args).metrics
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(metrics.host, metrics.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{metrics.port}"


# ---- parser ------------------------------------------------------------------------------------


def config_argument() -> UsageParser:
    """The ``-c/--config`` option, as a parent parser for the subcommands that read the file."""
    parent = UsageParser(add_help=False)
    parent.add_argument(
        "-c", "--config", help=f"configuration file or directory (default: ${CONFIG_ENV})"
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = UsageParser(
        prog="bridge",
        description="Kafka-to-webhook bridge for transaction notifications.",
        epilog="Exit codes: 0 success, 1 failure, 2 bad usage or invalid configuration.",
    )
    parser.add_argument("--version", action="version", version=f"bridge {__version__}")
    config_parent = config_argument()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", parents=[config_parent], help="consume and deliver (the service)")
    run.set_defaults(func=cmd_run)

    check = sub.add_parser(
        "check",
        parents=[config_parent],
        help="validate config and schemas, list webhooks, reach Kafka",
    )
    check.add_argument("--offline", action="store_true", help="do not contact Kafka")
    check.add_argument(
        "--timeout", type=seconds_argument, default=10.0, help="Kafka timeout in seconds"
    )
    check.set_defaults(func=cmd_check)

    topics = sub.add_parser(
        "topics", parents=[config_parent], help="create the source, delay and dead-letter topics"
    )
    topics.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    topics.set_defaults(func=cmd_topics)

    test = sub.add_parser(
        "test-webhook", parents=[config_parent], help="send one signed test delivery to a webhook"
    )
    test.add_argument("webhook_id", metavar="ID", help="the webhook's id in the configuration")
    test.set_defaults(func=cmd_test_webhook)

    status = sub.add_parser(
        "status",
        parents=[config_parent],
        help="show the webhooks failing, stalled or busy in a running bridge (its /status)",
    )
    status.add_argument(
        "--url",
        type=operator_url,
        help="the bridge's operator address, e.g. http://127.0.0.1:9464 (default: metrics.host "
        "and metrics.port of the configuration, else http://127.0.0.1:9464)",
    )
    status.add_argument("--json", action="store_true", help="print the JSON as served")
    status.add_argument("--timeout", type=seconds_argument, default=10.0, help="seconds to wait")
    status.set_defaults(func=cmd_status)

    dlq = sub.add_parser("dlq", help="list or replay dead letters")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    filters = UsageParser(add_help=False, parents=[config_parent])
    filters.add_argument("--webhook", help="only this webhook id")
    filters.add_argument("--reason", help="only this reason (e.g. retries_exhausted, truncated)")
    filters.add_argument(
        "--since", type=parse_time, help="dead-lettered at or after (ISO time or age: 2h)"
    )
    filters.add_argument(
        "--until", type=parse_time, help="dead-lettered at or before (ISO time or age)"
    )
    dlq_list = dlq_sub.add_parser("list", parents=[filters], help="print dead letters as a table")
    dlq_list.add_argument(
        "--limit", type=count_argument, default=0, help="only the last N (0: all)"
    )
    dlq_list.set_defaults(func=cmd_dlq_list)
    dlq_replay = dlq_sub.add_parser(
        "replay", parents=[filters], help="re-inject dead letters at attempt 0"
    )
    dlq_replay.add_argument("--all", action="store_true", help="replay every dead letter")
    dlq_replay.set_defaults(func=cmd_dlq_replay)
    return parser


EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code. As the process's own command line (``argv``
    None), every command but ``run`` ends at once on SIGTERM (:func:`end_on_sigterm`)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if argv is None and args.func is not cmd_run:
        end_on_sigterm()
    return run_command(args)


def end_on_sigterm() -> None:
    """Make SIGTERM end this process at once with exit code 143, whatever the main thread is
    doing (for the one-shot commands; ``run`` drains on SIGTERM instead).

    As PID 1 of a container the kernel ignores every signal the process has no handler for, so
    without one ``docker stop`` or a pod's deletion waits out the grace period and then kills.
    A Python handler would only run once the main thread is back in Python, which a blocking call
    into librdkafka (a metadata request against an unreachable cluster, say) delays for its whole
    timeout. So SIGTERM is blocked in this thread, before any other thread starts (threads inherit
    the mask, librdkafka's too), and a thread of its own waits for it: nothing these commands do
    needs draining (a replay cut short is replayed again; it is at least once)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        signal.sigwait({signal.SIGTERM})
        try:
            print("error: terminated (SIGTERM)", file=sys.stderr, flush=True)
        finally:
            os._exit(EXIT_TERMINATED)

    threading.Thread(target=wait, name="sigterm", daemon=True).start()


def run_command(args: argparse.Namespace) -> int:
    """Run the subcommand ``args.func``; errors become one clear line and an exit code."""
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except ConfigError as exc:
        _drain_log()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        _drain_log()
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {printable(exc.hint)}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`bridge dlq list | head`): say nothing more, and keep Python's
        # final flush of stdout from failing again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _drain_log() -> None:
    """Write the log's queued lines (``bridge run`` logs through a thread), so an error printed
    next comes after them."""
    for handler in logging.getLogger().handlers:
        handler.flush()


if __name__ == "__main__":
    raise SystemExit(main())
