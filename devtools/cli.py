"""``python -m devtools``: the development tools' command line (not part of the product).

``demo`` (broker, bridge, sample receiver and producer together), ``bench`` (the benchmark, with
its own options: ``python -m devtools bench --help``), ``receive`` (the sample receiver),
``produce`` (the sample producer) and ``config-reference`` (the README's configuration reference,
``--write`` to update it). Exit codes as ``bridge``'s: 0 success, 1 failure, 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import KafkaException

from bridge.cli import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    config_argument,
    load_config_argument,
    run_command,
    run_event_loop,
)


def cmd_receive(args: argparse.Namespace) -> int:
    """Run the sample receiver until Ctrl-C."""
    from devtools.sample_receiver import SampleReceiver, describe_endpoints, parse_path_count, serve

    config = load_config_argument(args)
    try:
        flaky = dict(parse_path_count(text) for text in args.flaky)
    except ValueError as exc:
        raise CliError(str(exc), hint="e.g. --flaky /webhooks/flaky:2", code=EXIT_USAGE) from exc
    color = args.color or (sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    receiver = SampleReceiver.from_config(config, flaky=flaky, down=set(args.down), color=color)
    unknown = (set(flaky) | set(args.down)) - set(receiver.endpoints)
    if unknown:
        raise CliError(
            f"no webhook of {config.path} has the path(s) {', '.join(sorted(unknown))}",
            code=EXIT_USAGE,
        )

    def ready() -> None:
        print(f"sample receiver on http://{args.host}:{args.port}, verifying:", flush=True)
        print(describe_endpoints(receiver), flush=True)

    # SIGTERM ends it like Ctrl-C: as PID 1 of a container the kernel drops a signal the process
    # has no handler for.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run_event_loop(serve(receiver, args.host, args.port, ready))
    except OSError as exc:
        raise CliError(str(exc), hint="choose another --port") from exc
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def cmd_produce(args: argparse.Namespace) -> int:
    """Produce sample or JSON-described transactions to the source topic."""
    from devtools.sample_producer import SampleError, produce, random_records, records_from_json

    config = load_config_argument(args)
    if args.json:
        try:
            records = list(records_from_json(Path(args.json)))
        except (OSError, SampleError, ValueError) as exc:
            raise CliError(
                f"cannot read transactions from {args.json}: {exc}", code=EXIT_USAGE
            ) from exc
    else:
        accounts = args.account or sorted({w.account for w in config.webhooks}) or ["acct_demo"]
        records = list(random_records(args.count, accounts, args.seed))

    def progress(done: int) -> None:
        if sys.stderr.isatty():
            print(f"\rproduced {done}/{len(records)}", end="", file=sys.stderr, flush=True)

    try:
        count = produce(config, records, rate=args.rate, progress=progress)
    except (RuntimeError, KafkaException) as exc:
        raise CliError(str(exc), hint="check kafka.bootstrap_servers and the source topic") from exc
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"produced {count} transaction(s) to {config.topics.source}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo (see README)."""
    from devtools.demo import main as demo_main

    return demo_main(args.count, args.rate)


def cmd_bench(_args: argparse.Namespace) -> int:
    """The benchmark with its defaults (``main`` passes ``bridge bench`` options through)."""
    from devtools.bench import main as bench_main

    return bench_main([])


def cmd_config_reference(args: argparse.Namespace) -> int:
    """Print the README's configuration reference, or write it into README.md."""
    from devtools.config_reference import main as config_reference_main

    return config_reference_main(args.write)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every development command."""
    parser = argparse.ArgumentParser(
        prog="python -m devtools",
        description="Development tools of the transaction webhook bridge (not in the product).",
    )
    config_parent = config_argument()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    receive = sub.add_parser(
        "receive",
        parents=[config_parent],
        help="sample receiver: verify webhooks and print them",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  python -m devtools receive -c config/demo.yaml --port 8765\n"
        "  python -m devtools receive -c config/demo.yaml --flaky /webhooks/flaky:2 \\\n"
        "      --down /webhooks/down",
    )
    receive.add_argument("--host", default="127.0.0.1", help="address to listen on")
    receive.add_argument("--port", type=int, default=8765, help="port to listen on (8765)")
    receive.add_argument(
        "--flaky",
        action="append",
        default=[],
        metavar="/PATH:N",
        help="fail the first N tries of each delivery on PATH (503)",
    )
    receive.add_argument(
        "--down",
        action="append",
        default=[],
        metavar="/PATH",
        help="always fail deliveries on PATH (503)",
    )
    receive.add_argument("--color", action="store_true", help="colour even without a terminal")
    receive.set_defaults(func=cmd_receive)

    produce = sub.add_parser(
        "produce",
        parents=[config_parent],
        help="sample producer: transactions to the source topic",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  python -m devtools produce -c config/demo.yaml --count 100 --rate 20\n"
        "  python -m devtools produce -c config/demo.yaml --json transactions.jsonl\n"
        "JSON fields (camelCase): transactionId, accountHolderId, status (SUCCEEDED|FAILED),\n"
        "method, provider, account, amount, fees, label, partnerId, performedAt (ISO 8601),\n"
        "stateData (object), failureCode, failureMessage.",
    )
    produce.add_argument("--count", type=int, default=10, help="random transactions (10)")
    produce.add_argument("--rate", type=float, default=None, help="per second (default: at once)")
    produce.add_argument(
        "--account",
        action="append",
        help="account holder id (repeatable; default: the accounts of the configured webhooks)",
    )
    produce.add_argument("--seed", type=int, default=None, help="random seed, for repeatable runs")
    produce.add_argument("--json", metavar="FILE", help="JSON array or JSON lines of transactions")
    produce.set_defaults(func=cmd_produce)

    demo = sub.add_parser("demo", help="broker, bridge, sample receiver and producer, together")
    demo.add_argument("--count", type=int, default=30, help="transactions to produce (30)")
    demo.add_argument("--rate", type=float, default=10.0, help="transactions per second (10)")
    demo.set_defaults(func=cmd_demo)

    reference = sub.add_parser(
        "config-reference",
        help="the README's configuration reference, from the key declarations",
    )
    reference.add_argument(
        "--write", action="store_true", help="write it into README.md instead of printing it"
    )
    reference.set_defaults(func=cmd_config_reference)

    bench = sub.add_parser(
        "bench",
        help="throughput, latency, retries, isolation, memory (python -m devtools bench --help)",
        add_help=False,
    )
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the development command line; returns the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["bench"]:  # the benchmark has its own options
        from devtools.bench import main as bench_main

        return bench_main(arguments[1:])
    return run_command(build_parser().parse_args(arguments))
