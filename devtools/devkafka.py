"""A real single-node Apache Kafka broker (KRaft) for development, tests and the demo.

The broker jars come from Maven Central through Maven (``deploy/kafka/pom.xml``) into a git-ignored
cache, once. The broker runs on 127.0.0.1 on free ports with a small heap and logs to a file.
Used by ``deploy/kafka/broker.py`` (the script), the test fixtures and ``python -m devtools demo``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

REPO_ROOT = Path(__file__).resolve().parents[1]
POM = REPO_ROOT / "deploy" / "kafka" / "pom.xml"
CACHE = Path(os.environ.get("BRIDGE_CACHE_DIR", REPO_ROOT / ".cache"))
KAFKA_METADATA_URL = (
    "https://repo.maven.apache.org/maven2/org/apache/kafka/kafka_2.13/maven-metadata.xml"
)
MIN_JAVA = 17
START_TIMEOUT_S = 90.0
SCRAM_MECHANISM = "SCRAM-SHA-512"
BROKER_USER = "broker"
"""The secured broker's own SCRAM identity (inter-broker traffic), a super user."""
PRINCIPAL_RULES = "RULE:^(?:.*,)?CN=([^,]+)(?:,.*)?$/$1/,DEFAULT"
"""A client certificate's principal is its CN (``User:bridge``, not the whole DN)."""
_SCRAM_TEXT = re.compile(r"[A-Za-z0-9._~-]+")


class BrokerError(Exception):
    """The development broker cannot be fetched, started or stopped; the message says why."""


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]


def check_prerequisites() -> None:
    """Fail with one clear line when Java 17+ or Maven is missing."""
    if shutil.which("java") is None:
        raise BrokerError(f"Java {MIN_JAVA}+ is required: install a JDK (e.g. openjdk-17-jdk)")
    version_text = _run(["java", "-version"]).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if match is None:
        raise BrokerError(f"cannot read the Java version from: {version_text.strip()[:200]}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise BrokerError(f"Java {MIN_JAVA}+ is required, found Java {major}: install a newer JDK")
    if shutil.which("mvn") is None:
        raise BrokerError("Maven is required to fetch the Kafka broker jars: install maven")


def _available_versions() -> list[str]:
    """Kafka 4.x versions published on Maven Central, newest first."""
    try:
        with urllib.request.urlopen(KAFKA_METADATA_URL, timeout=30) as response:
            tree = ElementTree.fromstring(response.read())
    except OSError as exc:
        raise BrokerError(f"Maven Central is unreachable ({exc}); cannot fetch Kafka") from exc
    versions = [v.text or "" for v in tree.iter("version")]
    stable = [v for v in versions if re.fullmatch(r"4\.\d+\.\d+", v)]
    return sorted(stable, key=lambda v: tuple(int(p) for p in v.split(".")), reverse=True)


def kafka_libs() -> Path:
    """Return the folder of broker jars, fetching the newest 4.x that resolves on first use."""
    root = CACHE / "kafka"
    marker = root / "VERSION"
    if marker.exists():
        libs = root / marker.read_text().strip() / "libs"
        if libs.is_dir():
            return libs
    check_prerequisites()
    root.mkdir(parents=True, exist_ok=True)
    failures = []
    for version in _available_versions():
        staging = Path(tempfile.mkdtemp(prefix=f"kafka-{version}-", dir=root))
        started = time.monotonic()
        result = _run(
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(POM),
                f"-Dkafka.version={version}",
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
            ]
        )
        if result.returncode == 0 and any(staging.glob("kafka_2.13-*.jar")):
            target = root / version
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            staging.rename(target / "libs")
            marker.write_text(version + "\n")
            print(f"fetched Kafka {version} in {time.monotonic() - started:.1f}s", file=sys.stderr)
            return target / "libs"
        shutil.rmtree(staging, ignore_errors=True)
        last_line = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["?"]
        failures.append(f"{version}: {last_line[0][:300]}")
        if "Could not transfer" in result.stdout + result.stderr:
            break  # the network, not the version: trying older versions will not help
    raise BrokerError(
        "no Kafka 4.x version resolved from Maven Central:\n  " + "\n  ".join(failures)
    )


def stop_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM a child process, SIGKILL it if it is still running after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def kafka_uuid() -> str:
    """A Kafka Uuid as its tools write one: 16 random bytes, URL-safe base64 without padding,
    never starting with ``-`` (Kafka's ``Uuid.randomUuid`` draws again then: the storage tool's
    ``-t`` would take such an id for an option, and one cluster start in 64 failed so)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class BrokerSecurity:
    """The TLS identity, the trusted CAs and the SCRAM users of a secured broker.

    A broker given one listens, next to its plaintext listener (loopback, for the tooling: its
    anonymous principal is a super user), on ``SASL_SSL`` (SCRAM-SHA-512 required) and on ``SSL``
    (a client certificate required: mutual TLS). Inter-broker traffic goes over ``SASL_SSL`` as
    :data:`BROKER_USER`. With ``authorizer`` the StandardAuthorizer is on: other principals need
    ACLs (``User:NAME`` for SCRAM users, ``User:CN`` for client certificates).
    """

    key_pem: bytes
    """The broker's private key, PEM in any form (written out as unencrypted PKCS#8)."""
    cert_chain_pem: bytes
    """The broker's certificate (valid for 127.0.0.1), then the CAs that issued it."""
    trusted_pem: bytes
    """CAs the broker trusts: for client certificates, and its own (inter-broker) connections."""
    scram_users: Mapping[str, str] = field(default_factory=dict)
    """SCRAM-SHA-512 users (name: password) created when the storage is formatted."""
    authorizer: bool = True
    broker_password: str = field(default_factory=lambda: secrets.token_urlsafe(18), repr=False)

    def check(self) -> None:
        """Refuse names and passwords that the storage tool's ``--add-scram`` cannot carry."""
        for name, password in {BROKER_USER: self.broker_password, **self.scram_users}.items():
            if not (_SCRAM_TEXT.fullmatch(name) and _SCRAM_TEXT.fullmatch(password)):
                raise BrokerError(
                    f"SCRAM user {name!r}: names and passwords are limited to [A-Za-z0-9._~-]"
                )

    def scram_arguments(self) -> list[str]:
        """``--add-scram`` arguments of ``kafka-storage format`` for every user."""
        arguments = []
        for name, password in {BROKER_USER: self.broker_password, **self.scram_users}.items():
            arguments += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
        return arguments

    def write_stores(self, folder: Path) -> tuple[Path, Path]:
        """Write the PEM key store (key and chain) and trust store; return their paths."""
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key(self.key_pem, password=None)
        pkcs8 = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        folder.mkdir(parents=True, exist_ok=True)
        keystore, truststore = folder / "broker-keystore.pem", folder / "truststore.pem"
        keystore.write_bytes(pkcs8 + self.cert_chain_pem)
        keystore.chmod(0o600)
        truststore.write_bytes(self.trusted_pem)
        return keystore, truststore

    def properties(self, folder: Path) -> list[str]:
        """The broker settings of the secured listeners (stores written to ``folder``)."""
        keystore, truststore = self.write_stores(folder)
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{BROKER_USER}" password="{self.broker_password}";'
        )
        lines = [
            f"sasl.enabled.mechanisms={SCRAM_MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={SCRAM_MECHANISM}",
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config={jaas}",
            "listener.name.ssl.ssl.client.auth=required",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={truststore}",
            f"ssl.principal.mapping.rules={PRINCIPAL_RULES}",
        ]
        if self.authorizer:
            lines += [
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # The broker's own SCRAM identity, and the plaintext controller and tooling
                # listeners (loopback only) whose principal is ANONYMOUS.
                f"super.users=User:{BROKER_USER};User:ANONYMOUS",
            ]
        return lines


@dataclass
class Broker:
    """A single-node KRaft broker whose state lives in ``home`` (pid, ports, data, logs).

    With ``security`` it also listens on ``SASL_SSL`` and ``SSL`` (see :class:`BrokerSecurity`
    and :meth:`address`); without, it has one plaintext listener (and its controller's).
    """

    home: Path
    heap: tuple[str, ...] = ("-Xms128m", "-Xmx512m")
    security: BrokerSecurity | None = None
    quorum: Quorum | None = None  # a node of a multi-node cluster (see :class:`Cluster`)
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def bootstrap_file(self) -> Path:
        return self.home / "bootstrap"

    def pid(self) -> int | None:
        """The running broker's pid, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def bootstrap(self) -> str | None:
        """The bootstrap address of the running broker (its plaintext listener), or None."""
        if self.pid() is None or not self.bootstrap_file.exists():
            return None
        return self.bootstrap_file.read_text().strip()

    def address(self, listener: str) -> str:
        """The address of one listener of the running broker: ``PLAINTEXT``, and with
        ``security`` also ``SASL_SSL`` (SCRAM-SHA-512) and ``SSL`` (mutual TLS)."""
        ports_file = self.home / "ports"
        if self.pid() is None or not ports_file.exists():
            raise BrokerError(f"the broker in {self.home} is not running")
        ports = dict(zip(_LISTENERS, ports_file.read_text().split(), strict=False))
        if listener not in ports or listener == "CONTROLLER":
            raise BrokerError(f"the broker in {self.home} has no {listener} listener for clients")
        return f"127.0.0.1:{ports[listener]}"

    def _write_properties(self, ports: list[int]) -> Path:
        data = self.home / "data"
        props = self.home / "server.properties"
        broker_port, controller_port = ports[:2]
        listeners = {"PLAINTEXT": broker_port, "CONTROLLER": controller_port}
        advertised = {"PLAINTEXT": broker_port}
        inter_broker = "PLAINTEXT"
        security: list[str] = []
        if self.security is not None:
            sasl_port, ssl_port = ports[2:4]
            listeners.update(SASL_SSL=sasl_port, SSL=ssl_port)
            advertised.update(SASL_SSL=sasl_port, SSL=ssl_port)
            inter_broker = "SASL_SSL"
            security = self.security.properties(self.home / "tls")
        protocols = {name: "PLAINTEXT" if name == "CONTROLLER" else name for name in listeners}
        quorum = self.quorum
        replicas = 1 if quorum is None else len(quorum.voters)
        isr = min(2, replicas)
        voters = (
            [f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}"]
            if quorum is None
            else [f"controller.quorum.voters={quorum.voters_text()}"]
        )
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={1 if quorum is None else quorum.node_id}",
                    *voters,
                    "listeners=" + ",".join(f"{n}://127.0.0.1:{p}" for n, p in listeners.items()),
                    "advertised.listeners="
                    + ",".join(f"{n}://127.0.0.1:{p}" for n, p in advertised.items()),
                    "controller.listener.names=CONTROLLER",
                    f"inter.broker.listener.name={inter_broker}",
                    "listener.security.protocol.map="
                    + ",".join(f"{n}:{p}" for n, p in protocols.items()),
                    *security,
                    f"log.dirs={data}",
                    "num.partitions=1",
                    "auto.create.topics.enable=false",
                    f"offsets.topic.replication.factor={replicas}",
                    "offsets.topic.num.partitions=5",
                    f"transaction.state.log.replication.factor={replicas}",
                    f"transaction.state.log.min.isr={isr}",
                    f"share.coordinator.state.topic.replication.factor={replicas}",
                    f"share.coordinator.state.topic.min.isr={isr}",
                    f"default.replication.factor={replicas}",
                    f"min.insync.replicas={isr}",
                    "group.initial.rebalance.delay.ms=0",
                    "log.retention.check.interval.ms=60000",
                    "",
                ]
            )
        )
        log4j = self.home / "log4j2.properties"
        log4j.write_text(
            "\n".join(
                [
                    "status = warn",
                    "appender.file.type = File",
                    "appender.file.name = FILE",
                    f"appender.file.fileName = {self.log_file}",
                    "appender.file.layout.type = PatternLayout",
                    "appender.file.layout.pattern = [%d] %p %m (%c)%n",
                    "rootLogger.level = INFO",
                    "rootLogger.appenderRef.file.ref = FILE",
                    "logger.kafka.name = kafka",
                    "logger.kafka.level = INFO",
                    "",
                ]
            )
        )
        return props

    def _java(self, libs: Path, main: str, *args: str) -> list[str]:
        # The broker's heap and GC log; the short-lived storage tool keeps the JVM's defaults.
        broker = main == "kafka.Kafka"
        gc_log = f"-Xlog:gc:file={self.home / 'gc.log'}:time,uptime:filecount=2,filesize=10M"
        return [
            "java",
            *(self.heap if broker else ()),
            "-XX:+UseG1GC",
            *([gc_log] if broker else []),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile=file:{self.home / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's log and console output, for error messages."""
        parts = []
        for path in (self.log_file, self.home / "broker.out"):
            if path.exists():
                parts.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(parts[-lines:])

    def start(self, fresh: bool = True, port: int | None = None) -> str:
        """Start the broker (or report the running one) and return its bootstrap address.

        ``fresh`` wipes the data of a broker that is not running (a stale data dir); a restart
        of a stopped broker with ``fresh=False`` keeps its data and ports.
        """
        running = self.bootstrap()
        if running is not None:
            print(f"broker already running at {running} (pid {self.pid()})", file=sys.stderr)
            return running
        libs = kafka_libs()
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        ports_file = self.home / "ports"
        if fresh or not ports_file.exists():
            shutil.rmtree(self.home / "data", ignore_errors=True)
            if self.security is not None:
                self.security.check()
            count = 2 if self.security is None else len(_LISTENERS)
            if self.quorum is not None:
                ports = list(self.quorum.ports)
            else:
                ports = [port or free_port(), *(free_port() for _ in range(count - 1))]
            ports_file.write_text(" ".join(map(str, ports)) + "\n")
            broker_port = ports[0]
            props = self._write_properties(ports)
            if self.quorum is not None:  # every node of a cluster is formatted with its id
                cid, standalone = self.quorum.cluster_id, []
            else:  # the id the storage tool's random-uuid would print, without starting a JVM
                cid, standalone = kafka_uuid(), ["--standalone"]
            scram = [] if self.security is None else self.security.scram_arguments()
            fmt = _run(
                self._java(
                    libs,
                    "kafka.tools.StorageTool",
                    "format",
                    *standalone,
                    "-t",
                    cid,
                    "-c",
                    str(props),
                    *scram,
                )
            )
            if fmt.returncode != 0:
                raise BrokerError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        else:
            broker_port = int(ports_file.read_text().split()[0])
            props = self.home / "server.properties"
        bootstrap = f"127.0.0.1:{broker_port}"
        with (self.home / "broker.out").open("w") as out:
            process = subprocess.Popen(
                self._java(libs, "kafka.Kafka", str(props)),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._process = process
        self.pid_file.write_text(str(process.pid))
        try:
            _wait_until_ready(bootstrap, process, START_TIMEOUT_S)
        except BrokerError as exc:
            self.stop()
            raise BrokerError(f"{exc}\n--- broker log tail ---\n{self.log_tail()}") from exc
        self.bootstrap_file.write_text(bootstrap + "\n")
        elapsed = time.monotonic() - started
        print(f"broker ready at {bootstrap} in {elapsed:.1f}s (pid {process.pid})", file=sys.stderr)
        return bootstrap

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker cleanly (SIGTERM, then SIGKILL after ``timeout``)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout):
                os.kill(pid, signal.SIGKILL)
                self._wait_exit(pid, timeout)
        self._forget()

    def kill(self) -> None:
        """Kill the broker abruptly (SIGKILL), keeping its data, as a crash would."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            self._wait_exit(pid, 30.0)
        self._forget()

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        """Wait until the broker process has exited; False if it still runs after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None:
                if self._process.poll() is not None:
                    return True
            else:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return True
            time.sleep(0.05)
        return False

    def _forget(self) -> None:
        self._process = None
        self.pid_file.unlink(missing_ok=True)
        self.bootstrap_file.unlink(missing_ok=True)


_LISTENERS = ("PLAINTEXT", "CONTROLLER", "SASL_SSL", "SSL")
"""The listeners in the order of their ports in the ``ports`` file."""


@dataclass(frozen=True)
class Quorum:
    """One node's place in a multi-node KRaft cluster: its id, its ports (client, controller)
    and every node's controller address (static voters)."""

    node_id: int
    ports: tuple[int, int]
    voters: tuple[tuple[int, int], ...]  # (node id, controller port) of every node
    cluster_id: str

    def voters_text(self) -> str:
        return ",".join(f"{node}@127.0.0.1:{port}" for node, port in self.voters)


@dataclass
class Cluster:
    """Three (by default) combined broker and controller nodes on loopback ports: replication
    factor 3 and ``min.insync.replicas`` 2 for every topic by default, the internal topics too.
    Each node is a :class:`Broker` whose state lives in ``home/node-<id>``; a node is killed,
    stopped and started again by itself (its data and ports kept)."""

    home: Path
    size: int = 3
    heap: tuple[str, ...] = ("-Xms128m", "-Xmx384m")
    nodes: dict[int, Broker] = field(default_factory=dict)

    def start(self) -> str:
        """Format and start every node at once (a node is ready only with a quorum); return the
        bootstrap list."""
        ports = {node: (free_port(), free_port()) for node in range(1, self.size + 1)}
        voters = tuple((node, controller) for node, (_, controller) in ports.items())
        cluster_id = kafka_uuid()
        self.nodes = {
            node: Broker(
                self.home / f"node-{node}",
                heap=self.heap,
                quorum=Quorum(node, pair, voters, cluster_id),
            )
            for node, pair in ports.items()
        }
        errors: list[BaseException] = []

        def start(broker: Broker) -> None:
            try:
                broker.start()
            except BaseException as exc:  # reported below, once every node has been tried
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(b,)) for b in self.nodes.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self.stop()
            raise BrokerError(f"the cluster did not start: {errors[0]}")
        return self.bootstrap()

    def bootstrap(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(
            f"127.0.0.1:{b.quorum.ports[0]}" for b in self.nodes.values() if b.quorum is not None
        )

    def active_controller(self) -> int | None:
        """The node id of the active controller (the quorum's leader), as the nodes that run
        record it in their ``quorum-state`` file; None while no leader is known."""
        for broker in self.nodes.values():
            if broker.pid() is None:
                continue
            state = broker.home / "data" / "__cluster_metadata-0" / "quorum-state"
            try:
                leader = json.loads(state.read_text()).get("leaderId", -1)
            except (OSError, ValueError):
                continue
            if isinstance(leader, int) and leader > 0:
                return leader
        return None

    def stop(self) -> None:
        """Stop every node (in parallel: a node stopping alone waits for the others)."""
        threads = [threading.Thread(target=b.stop) for b in self.nodes.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def group_positions(
    bootstrap: str, group: str, topics: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """Per partition of ``topics`` (``topic/partition``): ``group``'s committed offset (the low
    watermark where nothing is committed) and the high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        partitions = []
        for topic in topics:
            metadata = consumer.list_topics(topic, timeout=10).topics[topic]
            partitions += [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
        positions = {}
        for tp in consumer.committed(partitions, timeout=10):
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            positions[f"{tp.topic}/{tp.partition}"] = (tp.offset if tp.offset >= 0 else low, high)
        return positions
    finally:
        consumer.close()


def _wait_until_ready(bootstrap: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until a metadata request to the broker succeeds."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000, "log_level": 0})
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BrokerError(f"the broker exited with status {process.returncode} during start")
        try:
            metadata = admin.list_topics(timeout=2)
            if metadata.brokers:
                return
        except Exception as exc:  # the broker is still starting; any error means "not yet"
            last_error = exc
        time.sleep(0.2)
    raise BrokerError(f"the broker did not answer within {timeout:.0f}s ({last_error})")


def main(argv: list[str] | None = None) -> int:
    """``deploy/kafka/broker.py start|stop|status|fetch``: manage the development broker."""
    parser = argparse.ArgumentParser(prog="broker.py", description=__doc__)
    parser.add_argument("command", choices=["start", "stop", "status", "fetch"])
    parser.add_argument(
        "--home",
        type=Path,
        default=CACHE / "broker",
        help="state folder (pid, ports, data, logs); default .cache/broker",
    )
    parser.add_argument("--port", type=int, default=None, help="broker port (default: a free one)")
    args = parser.parse_args(argv)
    broker = Broker(args.home)
    try:
        if args.command == "fetch":
            print(kafka_libs())
        elif args.command == "start":
            print(broker.start(port=args.port))
        elif args.command == "stop":
            broker.stop()
            print("broker stopped", file=sys.stderr)
        else:
            address = broker.bootstrap()
            print(address or "not running")
            return 0 if address else 1
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
