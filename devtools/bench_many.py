"""Many webhooks (issue 21): 10,000 webhooks across 3,000 accounts, records spread over the
accounts, 500 distinct receiver host names, beside one webhook taking the same number of
deliveries.

The host names (``h0.bench.test`` to ``h499.bench.test``) resolve to 127.0.0.1 through a hosts
file of the run's own: the bridge runs in a mount namespace of its own (``unshare --mount``) in
which that file is bind-mounted over ``/etc/hosts``; nothing outside that process sees it, and
no name leaves the machine. The bridge pools connections per host name, so it keeps 500 pools
(and up to its in-flight limit of connections) to the one receiver.

Many and one run in turn, :attr:`ManySizes.rounds` times. Reported, as medians with every round
kept: deliveries/s of each run (from the bridge's start to the last 2xx: judged), the same
from the first 2xx (``steady``: without the start, which at 10,000 webhooks includes loading
them), their ratios, CPU seconds per 1,000 deliveries (the bridge's, and the receiver's, which
shares the host's cores with it), peak RSS, the file descriptors the
bridge held at the end, the seconds its cyclic garbage collector ran (``bridge_gc_*``), and the
median of the rounds' ratios (each round's many against the one run next to it).
"""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.bench import (
    Stage,
    _median_of,
    _say,
    _wait,
    collector_figures,
    peak_rss_mb,
    process_cpu_seconds,
)

HOSTS = 500
ACCOUNTS = 3000
WEBHOOKS = 10_000
DOMAIN = "bench.test"  # a reserved top-level name (RFC 2606): never a real host


@dataclass
class ManySizes:
    """How big the many-webhooks scenario is."""

    records: int = 30_000  # about 100,000 deliveries (3.33 webhooks per account)
    rounds: int = 3  # many, then one, in turn
    webhooks: int = WEBHOOKS
    accounts: int = ACCOUNTS
    hosts: int = HOSTS


MANY_QUICK = ManySizes(records=1_000, webhooks=1_000, accounts=300, hosts=50, rounds=1)


def hosts_file(path: Path, hosts: int) -> Path:
    """A hosts file naming ``hosts`` receiver hosts, every one 127.0.0.1."""
    lines = ["127.0.0.1 localhost"]
    lines += [f"127.0.0.1 h{n}.{DOMAIN}" for n in range(hosts)]
    path.write_text("\n".join(lines) + "\n")
    return path


def private_hosts(path: Path) -> tuple[str, ...]:
    """A command prefix running the command with ``path`` as its /etc/hosts (alone)."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(path))


def _run(
    stage: Stage,
    topic: str,
    hooks: list[dict[str, Any]],
    expected: int,
    wrap: tuple[str, ...] = (),
) -> dict[str, Any]:
    assert stage.receiver is not None
    receiver, receiver_before = stage.receiver.pid, process_cpu_seconds(stage.receiver.pid)
    with stage.bridge(topic, hooks, wrap=wrap) as process:
        started = stage.bridge_started  # not before: writing 10,000 webhooks' file is not its start
        _wait(lambda: stage.received() >= expected, 900, f"{expected} deliveries", 0.2, process)
        cpu = process_cpu_seconds(process.pid)
        receiver_cpu = process_cpu_seconds(receiver) - receiver_before
        rss = peak_rss_mb(process.pid)
        fds = len(os.listdir(f"/proc/{process.pid}/fd"))
        collector = collector_figures(stage.bridge_metrics_port)
    log = stage.dump()
    answered = [entry[0] for entry in log if entry[3] == 200]
    first, last = min(answered), max(answered)
    elapsed = last - started
    hosts = {entry[1].split("/")[2] for entry in log if entry[1].startswith("/ok/")}
    return {
        "webhooks": len(hooks),
        "deliveries": expected,
        "seconds": round(elapsed, 2),
        "deliveries_per_s": round(expected / elapsed),
        # the start (configuration load, group join) left out: first 2xx to last
        "first_2xx_after_s": round(first - started, 2),
        "steady_deliveries_per_s": round(len(answered) / max(last - first, 1e-3)),
        "cpu_per_1000_s": round(cpu / expected * 1000, 3),
        "receiver_cpu_per_1000_s": round(receiver_cpu / expected * 1000, 3),
        "peak_rss_mb": round(rss, 1),
        "open_fds_at_end": fds,
        **collector,
        "hosts_seen": len(hosts),
    }


MANY_KEYS = (
    "seconds",
    "deliveries_per_s",
    "first_2xx_after_s",
    "steady_deliveries_per_s",
    "cpu_per_1000_s",
    "receiver_cpu_per_1000_s",
    "peak_rss_mb",
    "gc_seconds",
    "gc_collections",
    "gc_full_collections",
)


def scenario_many(stage: Stage, sizes: ManySizes) -> dict[str, Any]:
    """The bridge with ``sizes.webhooks`` webhooks over ``sizes.hosts`` host names, then with one
    webhook taking the same number of deliveries, in turn ``sizes.rounds`` times: the host's
    speed drifts by tens of percent within a minute, so each ratio compares neighbours, and the
    figures are medians with every round kept."""
    rng = random.Random(21)
    per_account: dict[str, int] = {}
    hooks = []
    for n in range(sizes.webhooks):
        account = f"acct_{n % sizes.accounts:05d}"
        per_account[account] = per_account.get(account, 0) + 1
        host = f"h{n % sizes.hosts}.{DOMAIN}"
        url = f"http://{host}:{stage.receiver_port}/ok/{host}/{n}"
        hooks.append({"id": f"w{n:05d}", "account": account, "url": url})
    accounts = sorted(per_account)
    chosen = [rng.choice(accounts) for _ in range(sizes.records)]
    expected = sum(per_account[a] for a in chosen)
    wrap = private_hosts(hosts_file(stage.workdir / "bench-hosts", sizes.hosts))
    single = [{"id": "one", "account": "acct_one", "url": stage.url("/ok/one")}]

    many: list[dict[str, Any]] = []
    one: list[dict[str, Any]] = []
    for number in range(1, sizes.rounds + 1):
        _say(
            f"many, round {number}/{sizes.rounds}: {sizes.webhooks} webhooks, "
            f"{sizes.hosts} hosts, {expected} deliveries"
        )
        topic = stage.new_topics()
        stage.produce_records(topic, chosen)
        stage.dump()
        many.append(_run(stage, topic, hooks, expected, wrap))
        _say(f"many, round {number}/{sizes.rounds}: one webhook, {expected} deliveries")
        topic = stage.new_topics()
        stage.produce_backlog(topic, expected, "acct_one")
        stage.dump()
        one.append(_run(stage, topic, single, expected))
    pairs = list(zip(many, one, strict=True))
    ratios = [m["deliveries_per_s"] / max(o["deliveries_per_s"], 1) for m, o in pairs]
    steady = [m["steady_deliveries_per_s"] / max(o["steady_deliveries_per_s"], 1) for m, o in pairs]
    return {
        "many_webhooks": {
            **_median_of(many, MANY_KEYS),
            "accounts": sizes.accounts,
            "hosts": sizes.hosts,
        },
        "many_baseline_one": _median_of(one, MANY_KEYS),
        "many_ratio": round(statistics.median(ratios), 2),
        "many_ratio_rounds": [round(r, 2) for r in ratios],
        "many_steady_ratio": round(statistics.median(steady), 2),
    }


MANY_TARGETS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "10,000 webhooks on 500 hosts: deliveries/s within 20% of one webhook": lambda r: (
        r["many_ratio"] >= 0.8
    ),
}
