"""A host name whose name server never answers holds up no other webhook's name lookups.

Real components: the delivery client's own resolver (c-ares) in a process of its own, whose
``/etc/resolv.conf`` and ``/etc/hosts`` are the test's (bind-mounted in a private mount namespace:
nothing outside that process sees them). Its name server is a UDP socket on a loopback address of
the test's choosing that reads every query and never answers; ``good.test`` is in its hosts file.
The same run with the system resolver (``getaddrinfo`` in the event loop's shared threads) is
the control: it shows the hazard is real here, so the first test cannot pass by accident.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SILENT_NAMES = 20  # distinct names, each looked up once
CALLERS = 50  # concurrent callers of one more silent name

PROBE = r"""
import asyncio, json, socket, sys, threading, time
import uvloop
from bridge.core.destinations import DestinationPolicy
from bridge.http.resolver import QUERY_TRIES, SafeResolver, system_lookup

server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind((sys.argv[1], 53))
tcp = socket.create_server((sys.argv[1], 53))
queries, tcp_accepts = [], []

def big_answer(query):
    # big.test: a truncated answer (TC set) of 20 A records (none for AAAA)
    end = 12
    while query[end]:
        end += 1 + query[end]
    end += 5  # the root label, then type and class
    a_query = query[end - 4:end - 2] == b"\x00\x01"
    records = [bytes([192, 0, 2, n]) for n in range(1, 21)] if a_query else []
    header = query[:2] + bytes.fromhex("8380") + (1).to_bytes(2, "big")
    header += len(records).to_bytes(2, "big") + bytes(4)
    answers = b"".join(b"\xc0\x0c" + bytes.fromhex("0001000100000e100004") + r for r in records)
    return header + query[12:end] + answers

def serve_udp():
    while True:
        query, peer = server.recvfrom(4096)
        queries.append(query)
        if b"\x03big\x04test" in query:
            server.sendto(big_answer(query), peer)  # everything else: never answered

def serve_tcp():
    while True:
        connection, _ = tcp.accept()
        tcp_accepts.append(1)
        connection.close()

threading.Thread(target=serve_udp, daemon=True).start()
threading.Thread(target=serve_tcp, daemon=True).start()

async def main():
    lookup = system_lookup if sys.argv[2] == "system" else None
    resolver = SafeResolver(DestinationPolicy(allow_private=True), lookup)
    silent = [asyncio.ensure_future(resolver.resolve(f"silent-{n}.test", 443))
              for n in range(int(sys.argv[3]))]
    shared = [asyncio.ensure_future(resolver.resolve("shared.test", 443))
              for _ in range(int(sys.argv[4]))]
    await asyncio.sleep(0.2)  # every silent lookup is under way
    started = time.monotonic()
    try:
        good = await resolver.resolve("good.test", 443)
    except OSError as exc:
        good = str(exc)
    good_s = time.monotonic() - started
    report = {"good": good, "good_s": good_s, "tries": QUERY_TRIES}
    if sys.argv[2] != "system":
        outcomes = await asyncio.gather(*shared, return_exceptions=True)
        report["shared_errors"] = sorted({type(o).__name__ + ": " + str(o) for o in outcomes})
        report["shared_queries"] = sum(b"shared" in q for q in queries)
        started = time.monotonic()
        again = await asyncio.gather(resolver.resolve("shared.test", 443),
                                     return_exceptions=True)
        report["again_s"] = time.monotonic() - started
        report["again"] = type(again[0]).__name__
        report["big"] = await resolver.resolve("big.test", 443)
        report["tcp_accepts"] = len(tcp_accepts)
    print(json.dumps(report), flush=True)
    resolver.close()
    import os; os._exit(0)  # the system resolver's threads are still blocked

uvloop.run(main())
"""


def probe(tmp_path: Path, mode: str) -> dict:
    server = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {server}\noptions timeout:3 attempts:1\n")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 good.test\n")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    mounts = (
        'mount --bind "$0" /etc/resolv.conf && mount --bind "$1" /etc/hosts && shift && exec "$@"'
    )
    command = [
        *("unshare", "--mount", "--propagation", "private", "sh", "-c", mounts),
        *(str(resolv), str(hosts), sys.executable, str(script), server, mode),
        *(str(SILENT_NAMES), str(CALLERS)),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_silent_name_server_holds_up_no_other_lookup(tmp_path: Path) -> None:
    report = probe(tmp_path, "ares")
    assert report["good"] == ["127.0.0.1"]
    assert report["good_s"] < 0.5, report
    # fifty callers, one lookup: A and AAAA, asked QUERY_TRIES times each
    assert 1 <= report["shared_queries"] <= 2 * report["tries"], report
    assert report["shared_errors"] == ["gaierror: [Errno 12] Timeout while contacting DNS servers"]
    assert report["again"] == "gaierror" and report["again_s"] < 0.05, report  # remembered
    # A truncated answer is taken as it is, never asked again over TCP (where a name can answer
    # with thousands of addresses), and at most sixteen addresses are kept.
    assert report["big"] == [f"192.0.2.{n}" for n in range(1, 17)], report
    assert report["tcp_accepts"] == 0, report


def test_control_the_system_resolver_is_held_up_by_silent_names(tmp_path: Path) -> None:
    """Why the resolver is not the system's: the same silent names hold up the hosts-file name
    for seconds (its threads are all waiting for the silent server)."""
    report = probe(tmp_path, "system")
    assert report["good_s"] > 1.0, report  # resolved late, or not within the lookup deadline
