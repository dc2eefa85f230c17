"""HTTPS in the benchmark (issue 21): the raw HTTPS ceiling, the bridge delivering over HTTPS with
keep-alive and with a connection per request, and its memory under TLS connection churn.

The receiver is ``devtools.bench_receiver`` serving the same application over TLS too, with a
certificate for ``127.0.0.1`` issued by a private CA made for the run (:func:`make_certificates`:
with the ``cryptography`` package when it is installed, else the ``openssl`` command; ECDSA
P-256 keys). The bridge trusts that CA through its configuration (each webhook's
``tls_ca_file``), never by turning verification off; the reference loops trust it the same way.
Paths ``/ok/...`` keep connections alive, ``/close/...`` answer with ``Connection: close``.

The functions take a :class:`devtools.bench.Stage` and return plain dicts for the results file;
:func:`run_https` runs them all and :data:`HTTPS_TARGETS` judges them. ``python -m
devtools.bench_https`` runs them alone (its own broker unless ``KAFKA_BOOTSTRAP_SERVERS`` is set).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.core.mapping import to_notification
from devtools.bench import (
    CONCURRENCY,
    REPO,
    Stage,
    _median_of,
    _say,
    _wait,
    bench_broker,
    broker_state,
    peak_rss_mb,
    process_cpu_seconds,
    render,
    stop_bench_broker,
)
from devtools.devkafka import CACHE, free_port
from devtools.samples import make_record

CHURN_RSS_TARGET_MB = 150.0
RAW_KEYS = ("requests_per_s", "cpu_per_1000_s")
BRIDGE_KEYS = ("seconds", "deliveries_per_s", "steady_per_s", "peak_rss_mb", "cpu_per_1000_s")
CHURN_CHECKPOINTS = (1_000, 10_000, 50_000, 100_000)


# ---- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """A private CA (``ca_file``, the certificate only) and the receiver's key and chain in one PEM
    file (``server_file``), made by ``made_with``."""

    ca_file: Path
    server_file: Path
    made_with: str


def make_certificates(directory: Path, use_openssl: bool = False) -> Certificates:
    """A CA and a server certificate for 127.0.0.1 and localhost, valid for two days, in
    ``directory``: with ``cryptography`` when it is installed (and ``use_openssl`` is false), else
    with the ``openssl`` command."""
    directory.mkdir(parents=True, exist_ok=True)
    if not use_openssl:
        try:
            return _with_cryptography(directory)
        except ImportError:
            pass
    return _with_openssl(directory)


def _with_cryptography(directory: Path) -> Certificates:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bridge bench CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file = directory / "bench-ca.pem"
    server_file = directory / "bench-server.pem"
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    server_file.write_bytes(key_pem + cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    return Certificates(ca_file, server_file, "cryptography")


def _with_openssl(directory: Path) -> Certificates:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("neither the cryptography package nor the openssl command is available")
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        work = Path(scratch)
        extensions = work / "server.ext"
        extensions.write_text(
            "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
            "basicConstraints = critical, CA:FALSE\n"
            "extendedKeyUsage = serverAuth\n"
            "authorityKeyIdentifier = keyid\n"
        )

        def run(*args: str) -> None:
            subprocess.run([openssl, *args], check=True, capture_output=True, cwd=work)

        run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
        run(
            "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2",
            "-subj", "/CN=bridge bench CA", "-out", "ca.pem",
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "server.key")
        run("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.p8")
        run("req", "-new", "-key", "server.p8", "-subj", "/CN=127.0.0.1", "-out", "server.csr")
        run(
            "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-sha256", "-days", "2", "-extfile", "server.ext",
            "-out", "server.crt",
        )  # fmt: skip
        ca_file = directory / "bench-ca.pem"
        server_file = directory / "bench-server.pem"
        ca_pem = (work / "ca.pem").read_bytes()
        ca_file.write_bytes(ca_pem)
        server_file.write_bytes(
            (work / "server.p8").read_bytes() + (work / "server.crt").read_bytes() + ca_pem
        )
    return Certificates(ca_file, server_file, "openssl")


# ---- the TLS receiver --------------------------------------------------------------------------


@dataclass
class TlsReceiver:
    """The stage's receiver, also serving TLS on ``port`` with ``certs`` (the plain HTTP port, its
    statistics and log are the stage's as before)."""

    stage: Stage
    certs: Certificates
    port: int = field(default_factory=free_port)

    def start(self, fail_first: int = 5) -> None:
        """(Re)start the stage's receiver with TLS on as well."""
        stage = self.stage
        stage.stop_receiver()
        stage.receiver = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devtools.bench_receiver",
                "--port",
                str(stage.receiver_port),
                "--out",
                str(stage.workdir / "receiver.jsonl"),
                "--fail-first",
                str(fail_first),
                "--tls-port",
                str(self.port),
                "--tls-cert",
                str(self.certs.server_file),
            ],
        )
        _wait(lambda: stage._get("/__stats") is not None, 15, "the TLS receiver to listen")

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def hook(self, hook_id: str, path: str) -> dict[str, Any]:
        """A webhook of ``acct_bench`` for ``path`` over TLS, trusting the run's CA."""
        return {
            "id": hook_id,
            "account": "acct_bench",
            "url": self.url(path),
            "tls_ca_file": str(self.certs.ca_file),
        }


def connection_path(close: bool, name: str) -> str:
    """The receiver's path for ``name``: a connection per request, or kept alive."""
    return f"/close/{name}" if close else f"/ok/{name}"


# ---- summaries ---------------------------------------------------------------------------------


def with_spread(rounds: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """:func:`devtools.bench._median_of` (first round's settings, medians of ``keys``, every
    round) plus ``spread``: the least and the greatest value of each key over the rounds."""
    summary = _median_of(rounds, keys)
    summary["spread"] = {
        key: [min(r[key] for r in rounds), max(r[key] for r in rounds)] for key in keys
    }
    return summary


def rss_mb(pid: int) -> float:
    """The process's resident set size now (VmRSS) in MB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


# ---- scenarios ---------------------------------------------------------------------------------


LOOPS = ("uvloop", "asyncio")
"""The event loops, and so the TLS layers, the raw loops are measured on: uvloop's own TLS
transport (the bridge's loop) and asyncio's (``sslproto``, the standard loop's)."""


def scenario_raw_https(
    receiver: TlsReceiver, count: int, body: bytes, close: bool, client: str, loop: str = "uvloop"
) -> dict[str, Any]:
    """A tight loop POSTing ``body`` over TLS with the bridge's concurrency, with the bridge's own
    HTTP client (``client="bridge"``, TLS sessions resumed as in the bridge) or aiohttp
    (``"aiohttp"``, no resumption), on ``loop`` (one of :data:`LOOPS`: uvloop's TLS transport or
    asyncio's). Requests/s and this process's CPU seconds per 1,000 requests."""
    import uvloop

    url = receiver.url(connection_path(close, f"raw-{client}"))
    headers = {"Content-Type": "application/json"}

    async def with_bridge_client() -> None:
        from bridge.core.destinations import DestinationPolicy
        from bridge.core.webhook import TlsSettings
        from bridge.http.client import HttpClient
        from bridge.http.resolver import SafeResolver
        from bridge.http.tls import make_context

        context = make_context(TlsSettings(ca_file=str(receiver.certs.ca_file)))
        http = HttpClient(SafeResolver(DestinationPolicy(allow_private=True)))
        remaining = count

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await http.post(url, headers, body, 30.0, context)

        try:
            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        finally:
            await http.close()

    async def with_aiohttp() -> None:
        import ssl

        import aiohttp

        context = ssl.create_default_context(cafile=str(receiver.certs.ca_file))
        connector = aiohttp.TCPConnector(ssl=context, limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector) as session:
            remaining = count

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))

    clients = {"bridge": with_bridge_client, "aiohttp": with_aiohttp}
    runners = {"uvloop": uvloop.run, "asyncio": asyncio.run}
    ran_on = ""

    async def measured() -> None:
        nonlocal ran_on  # the loop it really ran on ("uvloop.Loop" is uvloop's, else asyncio's)
        ran_on = type(asyncio.get_running_loop()).__module__.split(".")[0]
        await clients[client]()

    cpu = time.process_time()
    started = time.perf_counter()
    runners[loop](measured())
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    receiver.stage.dump()
    return {
        "client": client,
        "loop": ran_on,
        "connection": "close" if close else "keep-alive",
        "requests": count,
        "requests_per_s": round(count / elapsed),
        "cpu_per_1000_s": round(cpu / count * 1000, 3),
        "concurrency": CONCURRENCY,
    }


def raw_https_ceiling(
    receiver: TlsReceiver, count: int, body: bytes, close: bool, rounds: int
) -> dict[str, Any]:
    """The raw HTTPS ceiling: each available client on each of :data:`LOOPS` ``rounds`` times
    (alternately), summarised per client and loop (``bridge`` and ``aiohttp`` on uvloop,
    ``bridge-asyncio`` and ``aiohttp-asyncio`` on asyncio's loop: the TLS layers the bridge could
    use behind its client); the ceiling (``requests_per_s``) is the best one's median."""
    clients = ["bridge"]
    try:
        import aiohttp  # noqa: F401

        clients.append("aiohttp")
    except ImportError:
        pass
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for name in clients:
            for loop in LOOPS:
                key = name if loop == "uvloop" else f"{name}-{loop}"
                one = scenario_raw_https(receiver, count, body, close, name, loop)
                runs.setdefault(key, []).append(one)
    per_client = {}
    for name, done in runs.items():
        summary = with_spread(done, RAW_KEYS)
        per_client[name] = {
            **{key: summary[key] for key in RAW_KEYS},
            "spread": summary["spread"],
            "round_requests_per_s": [r["requests_per_s"] for r in done],
        }
    best = max(per_client, key=lambda name: per_client[name]["requests_per_s"])
    return {
        "connection": "close" if close else "keep-alive",
        "requests": count,
        "concurrency": CONCURRENCY,
        "requests_per_s": per_client[best]["requests_per_s"],
        "best_client": best,
        "clients": per_client,
    }


def scenario_bridge_https(
    receiver: TlsReceiver,
    records: int,
    close: bool,
    checkpoints: tuple[int, ...] = (),
) -> dict[str, Any]:
    """The bridge through a backlog of ``records`` to one webhook over TLS, keep-alive or a
    connection per request: deliveries/s from its start to the last 2xx (``deliveries_per_s``,
    as the plain throughput scenario) and from the first 2xx to the last (``steady_per_s``), peak
    RSS (VmHWM), the bridge's CPU seconds per 1,000 deliveries once delivering (``cpu_s``: all
    of them, start-up included), and the RSS when the receiver had counted each of
    ``checkpoints`` deliveries (sampled every 0.2 s)."""
    stage = receiver.stage
    topic = stage.new_topics()
    stage.produce_backlog(topic, records, "acct_bench")
    hooks = [receiver.hook("https", connection_path(close, "bridge"))]
    rss_at: dict[str, float] = {}
    pending = sorted(checkpoint for checkpoint in checkpoints if checkpoint <= records)
    first: list[tuple[int, float]] = []  # deliveries and CPU seconds when deliveries were seen
    with stage.bridge(topic, hooks) as process:
        started = stage.bridge_started

        def done() -> bool:
            received = stage.received()
            if received and not first:
                first.append((received, process_cpu_seconds(process.pid)))
            while pending and received >= pending[0]:
                rss_at[str(pending.pop(0))] = round(rss_mb(process.pid), 1)
            return received >= records

        _wait(done, 3600, f"{records} deliveries over HTTPS", 0.2, process)
        peak = peak_rss_mb(process.pid)
        cpu = process_cpu_seconds(process.pid)
    # CPU per delivery from the first deliveries seen on: the start-up (imports, joining the
    # group) is not the cost of a delivery
    seen, cpu_then = first[0]
    per_1000 = (cpu - cpu_then) / (records - seen) * 1000 if records > seen else 0.0
    arrivals = [entry[0] for entry in stage.dump() if entry[3] == 200]
    elapsed = max(arrivals) - started
    steady = max(arrivals) - min(arrivals)
    result: dict[str, Any] = {
        "records": records,
        "connection": "close" if close else "keep-alive",
        "seconds": round(elapsed, 2),
        "deliveries_per_s": round(records / elapsed),
        "steady_per_s": round(records / steady) if steady > 0 else 0,
        "peak_rss_mb": round(peak, 1),
        "cpu_per_1000_s": round(per_1000, 3),
        "cpu_s": round(cpu, 2),
    }
    if checkpoints:
        result["rss_mb_at"] = rss_at
    return result


def bridge_https_rounds(
    receiver: TlsReceiver, records: int, close: bool, rounds: int
) -> dict[str, Any]:
    """:func:`scenario_bridge_https` ``rounds`` times: medians, spread, every round."""
    return with_spread(
        [scenario_bridge_https(receiver, records, close) for _ in range(rounds)], BRIDGE_KEYS
    )


def scenario_https_churn(receiver: TlsReceiver, records: int) -> dict[str, Any]:
    """Memory under TLS connection churn: ``records`` deliveries over HTTPS to a receiver that
    closes after each answer; peak RSS (target < 150 MB) and the RSS along the way."""
    result = scenario_bridge_https(receiver, records, True, CHURN_CHECKPOINTS)
    result["target_mb"] = CHURN_RSS_TARGET_MB
    return result


# ---- run ---------------------------------------------------------------------------------------


@dataclass
class HttpsSizes:
    """How big the HTTPS scenarios are."""

    raw_requests: int = 50_000  # keep-alive, per client and round
    raw_close_requests: int = 10_000  # a connection per request, per client and round
    backlog: int = 100_000  # the bridge, keep-alive
    close_backlog: int = 20_000  # the bridge, a connection per request
    churn_records: int = 100_000  # memory under churn
    rounds: int = 3


HTTPS_QUICK = HttpsSizes(
    raw_requests=2_000,
    raw_close_requests=500,
    backlog=2_000,
    close_backlog=500,
    churn_records=1_000,
    rounds=1,
)


def run_https(stage: Stage, sizes: HttpsSizes, fail_first: int = 5) -> dict[str, Any]:
    """Every HTTPS scenario. Restarts the stage's receiver with TLS on as well (plain HTTP is
    served as before, with ``fail_first``) and leaves it running."""
    certs = make_certificates(stage.workdir / "tls")
    receiver = TlsReceiver(stage, certs)
    receiver.start(fail_first)
    body = to_notification(make_record("tx-raw", "acct")).body
    results: dict[str, Any] = {}
    for close, raw_count, backlog in (
        (False, sizes.raw_requests, sizes.backlog),
        (True, sizes.raw_close_requests, sizes.close_backlog),
    ):
        suffix = "close" if close else "keepalive"
        _say(f"https ({suffix}): the raw ceiling, {sizes.rounds} round(s) per client")
        results[f"raw_https_{suffix}"] = raw_https_ceiling(
            receiver, raw_count, body, close, sizes.rounds
        )
        _say(f"https ({suffix}): the bridge through {backlog} records, {sizes.rounds} round(s)")
        results[f"https_{suffix}"] = bridge_https_rounds(receiver, backlog, close, sizes.rounds)
    _say(f"https: memory under churn, {sizes.churn_records} deliveries with Connection: close")
    results["https_churn"] = scenario_https_churn(receiver, sizes.churn_records)
    results["https_certificates"] = {"made_with": certs.made_with, "key": "ECDSA P-256"}
    return results


HTTPS_TARGETS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "HTTPS keep-alive throughput >= 80% of the raw HTTPS ceiling": lambda r: (
        r["https_keepalive"]["deliveries_per_s"] >= 0.8 * r["raw_https_keepalive"]["requests_per_s"]
    ),
    "HTTPS connection-per-request throughput >= 80% of the raw HTTPS ceiling": lambda r: (
        r["https_close"]["deliveries_per_s"] >= 0.8 * r["raw_https_close"]["requests_per_s"]
    ),
    "peak RSS under TLS connection churn < 150 MB": lambda r: (
        r["https_churn"]["peak_rss_mb"] < CHURN_RSS_TARGET_MB
    ),
}


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.bench_https``: the HTTPS scenarios alone."""
    parser = argparse.ArgumentParser(prog="python -m devtools.bench_https", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--churn-only", action="store_true", help="only the memory scenario")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "https.json")
    args = parser.parse_args(argv)
    sizes = HTTPS_QUICK if args.quick else HttpsSizes()
    workdir = CACHE / "bench-https"
    workdir.mkdir(parents=True, exist_ok=True)
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    broker = None if external else bench_broker("bench-https-broker")
    bootstrap = external or broker.start()  # type: ignore[union-attr]
    stage = Stage(bootstrap, workdir)
    try:
        first_join = round(stage.join_first_group(), 3)
        if args.churn_only:
            receiver = TlsReceiver(stage, make_certificates(workdir / "tls"))
            receiver.start()
            results = {"https_churn": scenario_https_churn(receiver, sizes.churn_records)}
        else:
            results = run_https(stage, sizes)
        results["broker"] = {
            "first_group_join_s": first_join,
            "state": "external" if broker is None else broker_state(broker),
        }
    finally:
        stage.stop_receiver()
        if broker is not None:
            stop_bench_broker(broker)
    results["targets"] = {}
    for name, check in HTTPS_TARGETS.items():
        try:
            results["targets"][name] = bool(check(results))
        except KeyError:
            continue
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(render({"machine": {"cpus": os.cpu_count()}, **results}))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
