"""A real Apicurio Registry (Confluent-compatible API) for the integration tests.

The server (a Quarkus app, the ``all`` tar.gz assembly of ``io.apicurio:apicurio-registry-app``)
comes from Maven Central through Maven (``deploy/registry/pom.xml``) into the git-ignored cache,
once. It runs on 127.0.0.1 on a free port with in-memory H2 storage and a small heap, and logs to
a file in its home folder. The Confluent-compatible API is under :data:`CCOMPAT_PATH`.
"""

from __future__ import annotations

import argparse
import base64
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from devtools.devkafka import (
    CACHE,
    REPO_ROOT,
    BrokerError,
    check_prerequisites,
    free_port,
    stop_process,
)

POM = REPO_ROOT / "deploy" / "registry" / "pom.xml"
CCOMPAT_PATH = "/apis/ccompat/v7"
START_TIMEOUT_S = 60.0


class RegistryError(Exception):
    """The development registry cannot be fetched, started or stopped; the message says why."""


def apicurio_version() -> str:
    """The Apicurio Registry version ``deploy/registry/pom.xml`` pins."""
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = ElementTree.parse(POM).findtext(
        "m:properties/m:apicurio.version", namespaces=namespace
    )
    if not version:
        raise RegistryError(f"{POM} does not set the apicurio.version property")
    return version.strip()


def apicurio_runner() -> Path:
    """The server's runner jar, fetched and unpacked into ``.cache/apicurio/<version>/`` once.

    The download and unpacking happen in a staging folder that is renamed into place only when
    complete, so a failed fetch leaves no half-filled cache behind.
    """
    version = apicurio_version()
    target = CACHE / "apicurio" / version
    runner = target / f"apicurio-registry-app-{version}-runner.jar"
    if runner.is_file():
        return runner
    if shutil.which("mvn") is None:
        raise RegistryError("Maven is required to fetch Apicurio Registry: install maven")
    try:
        check_prerequisites()  # Java 17+
    except BrokerError as exc:
        raise RegistryError(str(exc)) from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"apicurio-{version}-", dir=target.parent))
    started = time.monotonic()
    try:
        # dependency:copy of the artifact alone: its parent POM is not on Maven Central.
        download = staging / "download"
        result = subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-Dstyle.color=never",
                "-f",
                str(POM),
                "dependency:copy",
                f"-DoutputDirectory={download}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        archive = download / f"apicurio-registry-app-{version}-all.tar.gz"
        if result.returncode != 0 or not archive.is_file():
            output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr).splitlines()
            error = next(
                (line for line in output if "ERROR" in line), output[-1] if output else "?"
            )
            raise RegistryError(f"fetching Apicurio Registry {version} failed: {error[:400]}")
        size_mb = archive.stat().st_size / 1e6
        with tarfile.open(archive) as tar:
            tar.extractall(staging / "app", filter="data")
        if not (staging / "app" / runner.name).is_file():
            raise RegistryError(f"{archive.name} holds no {runner.name}")
        shutil.rmtree(target, ignore_errors=True)
        try:
            (staging / "app").rename(target)
        except OSError:
            if not runner.is_file():  # not another process's complete fetch
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(
        f"fetched Apicurio Registry {version} ({size_mb:.0f} MB) in {elapsed:.1f}s", file=sys.stderr
    )
    return runner


@dataclass
class Registry:
    """One Apicurio Registry process with in-memory storage; its files live in ``home``."""

    home: Path
    users: Mapping[str, str] | None = None  # name: password; every request must then carry one
    base_url: str | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_file(self) -> Path:
        return self.home / "registry.log"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API's base URL (for ``schemas.registry_url``)."""
        if self.base_url is None:
            raise RegistryError("the registry is not running")
        return self.base_url + CCOMPAT_PATH

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the registry's log, for error messages."""
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> str:
        """Start the registry (or report the running one) and return its base URL."""
        if self.base_url is not None and self._process is not None and self._process.poll() is None:
            return self.base_url
        runner = apicurio_runner()
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "tmp").mkdir(exist_ok=True)
        port = free_port()
        command = [
            "java",
            "-Xms64m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Djava.io.tmpdir={self.home / 'tmp'}",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={port}",
            "-Dapicurio.storage.kind=sql",
            "-Dapicurio.storage.sql.kind=h2",
            *self._auth_properties(),
            "-jar",
            str(runner),
        ]
        with self.log_file.open("wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True
            )
        base_url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_ready(
                base_url + CCOMPAT_PATH + "/subjects",
                self._process,
                START_TIMEOUT_S,
                next(iter(self.users.items()), None) if self.users else None,
            )
        except RegistryError as exc:
            self.stop()
            raise RegistryError(f"{exc}\n--- registry log tail ---\n{self.log_tail()}") from exc
        self.base_url = base_url
        elapsed = time.monotonic() - started
        pid = self._process.pid
        print(f"registry ready at {base_url} in {elapsed:.1f}s (pid {pid})", file=sys.stderr)
        return base_url

    def _auth_properties(self) -> list[str]:
        """Quarkus properties requiring HTTP basic authentication of every request, by the
        ``users`` given (plain-text passwords: a throwaway registry for tests)."""
        if not self.users:
            return []
        return [
            "-Dquarkus.http.auth.basic=true",
            "-Dquarkus.security.users.embedded.enabled=true",
            "-Dquarkus.security.users.embedded.plain-text=true",
            *(f"-Dquarkus.security.users.embedded.users.{n}={p}" for n, p in self.users.items()),
            "-Dquarkus.http.auth.permission.all.paths=/*",
            "-Dquarkus.http.auth.permission.all.policy=authenticated",
        ]

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the registry cleanly (SIGTERM, then SIGKILL after ``timeout``)."""
        process, self._process, self.base_url = self._process, None, None
        if process is not None:
            stop_process(process, timeout)


def _wait_until_ready(
    url: str,
    process: subprocess.Popen[bytes],
    timeout: float,
    user: tuple[str, str] | None = None,
) -> None:
    """Wait until ``GET url`` (as ``user``, name and password, if given) answers 200."""
    deadline = time.monotonic() + timeout
    last_error = "no answer"
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RegistryError(
                f"the registry exited with status {process.returncode} during start"
            )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
                last_error = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            exc.close()  # its response holds the socket until closed (a warning if collected)
            last_error = f"HTTP {exc.code}"
        except OSError as exc:  # still starting: connection refused or reset
            last_error = str(exc)
        time.sleep(0.1)
    raise RegistryError(
        f"the registry did not answer GET {url} within {timeout:.0f}s ({last_error})"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.devregistry fetch``: fetch the registry into the cache, print it."""
    parser = argparse.ArgumentParser(prog="python -m devtools.devregistry", description=__doc__)
    parser.add_argument("command", choices=["fetch"])
    parser.parse_args(argv)
    try:
        print(apicurio_runner())
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
