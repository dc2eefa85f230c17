"""Configuration load at scale: a generator of valid configuration files with N webhooks, and a
scenario timing ``python -m bridge check -c FILE --offline`` on them (wall seconds and the peak RSS
of the child, median and spread over rounds).

``python -m devtools.bench_config [--sizes 1000,10000] [--rounds 3] [--workdir DIR]`` prints the
scenario's result as JSON; ``write_config(path, n)`` alone writes a file (``--write FILE -n N``).

The webhooks vary the way a large deployment does, written half quoted in flow style, half in plain
block style sharing an anchored list through aliases: several accounts, hosts shared by a few
webhooks each, non-ASCII (IDNA) host names, public IP literals with and without a port, both
events or one, secrets inline, ``whsec_`` or from the environment (:data:`SECRET_ENV`), the
``secret`` signature with its own ``standard_webhooks_secret``, per-webhook timeouts, concurrency
and TLS version, disabled webhooks.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "schemas"
SIZES = (1_000, 10_000, 50_000, 100_000)
SECRET_ENV = "BENCH_CONFIG_SECRET"
"""The environment variable some generated webhooks read their secret from (``${...}``)."""
SECRET_VALUE = "bench-secret-from-the-environment"
"""The value :func:`scenario_config_load` gives :data:`SECRET_ENV`."""

_IDNA_WORDS = ("bücher", "café", "straße", "münchen", "日本", "пример")
_TLDS = ("com", "net", "io", "de", "example")


def _token(seed: str, length: int = 32) -> str:
    """A deterministic printable secret (URL-safe base64 of a hash)."""
    digest = hashlib.sha256(seed.encode()).digest() * 2
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")[:length]


def _whsec(seed: str) -> str:
    return "whsec_" + base64.b64encode(hashlib.sha256(seed.encode()).digest()[:24]).decode()


def _host(index: int) -> str:
    """The host of webhook ``index``: about four webhooks share a host; some are IDNA names,
    some public IPv4 or IPv6 literals."""
    group = index // 4
    kind = group % 20
    if kind == 7:
        return f"93.184.{group % 251}.{1 + group % 250}"
    if kind == 13:
        return f"[2606:2800:220:{group % 65535:x}::{1 + group % 9}]"
    tld = _TLDS[group % len(_TLDS)]
    if kind in (3, 11):
        word = _IDNA_WORDS[group % len(_IDNA_WORDS)]
        return f"{word}-{group}.{tld}"
    return f"hooks.shop-{group}.{tld}"


def webhook_yaml(index: int) -> str:
    """One webhook entry (a YAML list item, indented under ``webhooks:``). Written the two ways
    people write YAML: even entries with every string quoted and flow lists, odd ones in plain
    block style (scalars unquoted, resolved by their text), their two events an alias of the list
    anchored in the first of them (so the document is a graph, walked for its aliases)."""
    host = _host(index)
    port = f":{8443 + index % 3}" if index % 10 == 1 else ""
    url = f"https://{host}{port}/webhooks/{index}?source=bridge"
    if index % 17 == 5:
        url = f"http://{host}/notify/{index}"
    both = bool(index % 3)
    quoted: Callable[[str], str]
    if index % 2 == 0:
        quoted = '"{}"'.format
        events = (
            ' ["transaction.success", "transaction.failed"]' if both else ' ["transaction.failed"]'
        )
    else:
        quoted = str
        if not both:
            events = "\n      - transaction.failed"
        elif index == _FIRST_PLAIN_BOTH:
            events = " &both\n      - transaction.success\n      - transaction.failed"
        else:
            events = " *both"
    lines = [
        f"  - id: {quoted(f'wh-{index:06d}')}",
        f"    account: {quoted(f'acct_{index // 7:05d}')}",
        f"    url: {quoted(url)}",
        f"    events:{events}",
    ]
    style = index % 9
    if style == 0:
        lines.append(f"    secret: {quoted(f'${{{SECRET_ENV}}}')}")
    elif style == 1:
        lines.append(f"    secret: {quoted(_whsec(f'current-{index}'))}")
        if index % 2:
            lines.append(f"    previous_secret: {quoted(_whsec(f'previous-{index}'))}")
    elif style == 2 and url.startswith("https://"):
        lines.append(f"    signature: {quoted('secret')}")
        lines.append(f"    secret: {quoted(_token(f'header-{index}', 40))}")
        lines.append(f"    standard_webhooks_secret: {quoted(_whsec(f'standard-{index}'))}")
    else:
        lines.append(f"    secret: {quoted(_token(f'inline-{index}'))}")
    if index % 5 == 0:
        lines.append(f"    timeout_seconds: {2 + index % 8}.5")
    if index % 6 == 0:
        lines.append(f"    concurrency: {1 + index % 64}")
    if index % 11 == 0:
        lines.append(f"    tls_min_version: {quoted('TLSv1.3')}")
    if index % 23 == 0:
        lines.append("    enabled: false")
    return "\n".join(lines) + "\n"


_FIRST_PLAIN_BOTH = 1
"""The first entry in plain style with both events: it anchors the list the others alias."""


def config_text(webhooks: int, schemas: Path = SCHEMAS) -> str:
    """A complete, valid configuration file with ``webhooks`` webhooks."""
    head = f"""\
# Generated by devtools/bench_config.py: {webhooks} webhooks.
kafka:
  bootstrap_servers: "localhost:9092"
  group_id: "bench-config"
  properties:
    socket.keepalive.enable: "true"
schemas:
  mode: "embedded"
  directory: {json.dumps(str(schemas))}
topics:
  source: "transactions.outcomes"
retry:
  attempts: 5
delivery:
  timeout_seconds: 10.0
  concurrency_per_webhook: 32
  allowed_networks: ["10.20.0.0/16"]
metrics:
  port: 0
logging:
  format: "json"
  level: "info"
webhooks:
"""
    if not webhooks:
        return head.replace("webhooks:\n", "webhooks: []\n")
    return head + "".join(webhook_yaml(index) for index in range(webhooks))


def write_config(path: Path, webhooks: int, schemas: Path = SCHEMAS) -> Path:
    """Write a valid configuration file with ``webhooks`` webhooks to ``path``; return it.
    Load it with :data:`SECRET_ENV` set (any non-empty value) in the environment."""
    path.write_text(config_text(webhooks, schemas), encoding="utf-8")
    return path


_CHECK_REPORTING_PEAK = """
import sys
from pathlib import Path
from bridge.cli import main
try:
    code = main(["check", "-c", sys.argv[1], "--offline"])
finally:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            sys.stderr.write("peak_kb " + line.split()[1] + "\\n")
sys.exit(code)
"""
"""``bridge check -c FILE --offline`` that reports its own peak RSS (VmHWM, kept per address
space: ``ru_maxrss`` would start from the size of the parent that spawned it) on stderr last."""


def _run_check(path: Path, environ: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds (process start included), CPU seconds (user + system) and peak RSS in MB of
    one ``bridge check -c PATH --offline`` (through :data:`_CHECK_REPORTING_PEAK`); ``os.wait4``
    reads that child's own CPU (RUSAGE_CHILDREN would add every child reaped so far)."""
    command = [sys.executable, "-c", _CHECK_REPORTING_PEAK, str(path)]
    with tempfile.TemporaryFile() as errors:
        started = time.monotonic()
        child = subprocess.Popen(
            command, env=environ, cwd=REPO, stdout=subprocess.DEVNULL, stderr=errors
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        said = errors.read().decode("utf-8", "replace")
    if child.returncode != 0:
        raise RuntimeError(f"bridge check exited with {child.returncode} on {path}: {said[-2000:]}")
    peaks = [line.split()[1] for line in said.splitlines() if line.startswith("peak_kb ")]
    peak = int(peaks[-1]) / 1024 if peaks else 0.0
    return wall, usage.ru_utime + usage.ru_stime, peak


def _resident_mb(path: Path, environ: dict[str, str]) -> float:
    """The resident set in MB of a process that imported the loader, loaded ``path`` and
    collected its garbage: what the configuration costs to hold, parse buffers freed."""
    command = [sys.executable, "-m", "devtools.bench_config", "--resident", str(path)]
    result = subprocess.run(
        command, env=environ, cwd=REPO, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"loading {path} failed: {result.stderr[-2000:]}")
    return float(result.stdout.strip())


def _resident_after_load(path: Path) -> float:
    """(In the child) load ``path`` as ``bridge run`` does (the parse in a process of its own),
    collect garbage, and return VmRSS in MB."""
    import gc

    from bridge.config.reload import load_isolated

    config = load_isolated(path)
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
            break
    else:
        rss = 0.0
    del config
    return rss


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def scenario_config_load(
    workdir: Path, sizes: tuple[int, ...] = SIZES, rounds: int = 3
) -> dict[str, Any]:
    """``python -m bridge check -c FILE --offline`` as a subprocess, ``rounds`` times per size.

    Returns, per size (a string key), the median, min and max of the wall seconds (process start
    included), of the CPU seconds (user + system: steadier than wall on a shared machine) and of
    the child's peak RSS in MB, the file's size, every round, and what holding the loaded
    configuration costs: the resident set after the load and a garbage collection, and the bytes
    per webhook over a process that loaded a configuration without webhooks.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, SECRET_ENV: SECRET_VALUE}
    environ.pop("BRIDGE_CONFIG", None)
    results: dict[str, Any] = {}
    empty = _resident_mb(write_config(workdir / "bridge-0.yaml", 0), environ)
    for size in sizes:
        path = write_config(workdir / f"bridge-{size}.yaml", size)
        walls: list[float] = []
        cpus: list[float] = []
        peaks: list[float] = []
        for _ in range(rounds):
            wall, cpu, peak = _run_check(path, environ)
            walls.append(wall)
            cpus.append(cpu)
            peaks.append(peak)
        resident = _resident_mb(path, environ)
        results[str(size)] = {
            "webhooks": size,
            "file_bytes": path.stat().st_size,
            "resident_mb": round(resident, 1),
            "bytes_per_webhook": round((resident - empty) * 1024 * 1024 / size),
            "wall_s": _spread(walls),
            "cpu_s": _spread(cpus),
            "peak_rss_mb": _spread(peaks),
            "rounds": [
                {"wall_s": round(w, 3), "cpu_s": round(c, 3), "peak_rss_mb": round(p, 1)}
                for w, c, p in zip(walls, cpus, peaks, strict=True)
            ],
        }
    return {"scenario": "config_load", "rounds": rounds, "sizes": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.bench_config", description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-config"))
    parser.add_argument("--write", type=Path, help="only write a file with -n webhooks")
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--resident", type=Path, help=argparse.SUPPRESS)  # _resident_mb's child
    args = parser.parse_args(argv)
    if args.resident:
        print(round(_resident_after_load(args.resident), 2))
        return 0
    if args.write:
        write_config(args.write, args.n)
        print(f"{args.write}: {args.n} webhooks (set {SECRET_ENV} to load it)")
        return 0
    sizes = tuple(int(size) for size in args.sizes.split(","))
    started = time.monotonic()
    result = scenario_config_load(args.workdir, sizes, args.rounds)
    result["total_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
