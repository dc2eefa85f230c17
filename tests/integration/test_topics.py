"""``bridge topics`` against the real broker: the plan, creation, idempotence, differences."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tests.kafka_helpers import QUIET, create_topics, unique_name

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 3
DAY_MS = 24 * 3600 * 1000
# Retention each role should get: a week of source records, four weeks of dead letters, and for a
# delay rung the ladder's whole span (200 + 400 ms with the retry section below) plus a day.
SOURCE_RETENTION_MS = 7 * DAY_MS
DEAD_LETTER_RETENTION_MS = 28 * DAY_MS
DELAY_RETENTION_MS = 600 + DAY_MS
PARKED_RETENTION_MS = 30_000 + DAY_MS  # the default park delay plus a day


def write_config(directory: Path, bootstrap: str, source: str, replication_factor: int = 1) -> Path:
    """A configuration whose topics are named after ``source`` (two delay rungs)."""
    path = directory / "bridge.yaml"
    document = {
        "kafka": {"bootstrap_servers": bootstrap},
        "topics": {
            "source": source,
            "partitions": PARTITIONS,
            "replication_factor": replication_factor,
        },
        "retry": {"attempts": 2, "first_delay_ms": 200, "increment_ms": 200},
        "schemas": {"directory": str(REPO / "schemas")},
        "webhooks": [],
    }
    path.write_text(yaml.safe_dump(document))
    return path


def bridge_topics(config: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m bridge topics`` as an operator would."""
    return subprocess.run(
        [sys.executable, "-m", "bridge", "topics", "--config", str(config), *options],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def expected_topics(source: str) -> dict[str, int]:
    """Every topic the configuration above needs, with its planned retention."""
    return {
        source: SOURCE_RETENTION_MS,
        f"{source}.retry.1": DELAY_RETENTION_MS,
        f"{source}.retry.2": DELAY_RETENTION_MS,
        f"{source}.parked": PARKED_RETENTION_MS,
        f"{source}.dlq": DEAD_LETTER_RETENTION_MS,
    }


def existing_partitions(bootstrap: str, names: list[str]) -> dict[str, int]:
    """Partition count of each of ``names`` that exists (all-topic metadata: never auto-creates)."""
    topics = AdminClient({"bootstrap.servers": bootstrap, **QUIET}).list_topics(timeout=30).topics
    return {name: len(topics[name].partitions) for name in names if name in topics}


def retention_ms(bootstrap: str, names: list[str]) -> dict[str, int]:
    """The ``retention.ms`` the broker reports for each topic."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    described = admin.describe_configs(resources, request_timeout=30)
    return {
        resource.name: int(future.result(timeout=30)["retention.ms"].value)
        for resource, future in described.items()
    }


def test_dry_run_prints_the_plan_and_creates_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    source = unique_name("topics-dry")
    config = write_config(tmp_path, kafka_bootstrap, source)

    result = bridge_topics(config, "--dry-run")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for name, retention in expected_topics(source).items():
        (row,) = [line.split() for line in lines if line.split()[:1] == [name]]
        # Columns from the right (the role has spaces): partitions, replicas, retention.
        assert row[-3:] == [str(PARTITIONS), "1", f"{retention // 3_600_000}h"], row
    assert "created" not in result.stdout
    assert existing_partitions(kafka_bootstrap, list(expected_topics(source))) == {}


def test_creates_every_topic_with_planned_partitions_and_retention(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    source = unique_name("topics-new")
    config = write_config(tmp_path, kafka_bootstrap, source)
    wanted = expected_topics(source)

    result = bridge_topics(config)

    assert result.returncode == 0, result.stderr
    for name in wanted:
        assert f"created {name}" in result.stdout
    assert existing_partitions(kafka_bootstrap, list(wanted)) == dict.fromkeys(wanted, PARTITIONS)
    assert retention_ms(kafka_bootstrap, list(wanted)) == wanted


def test_running_twice_is_idempotent(kafka_bootstrap: str, tmp_path: Path) -> None:
    source = unique_name("topics-twice")
    config = write_config(tmp_path, kafka_bootstrap, source)
    assert bridge_topics(config).returncode == 0

    again = bridge_topics(config)

    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout
    for name in expected_topics(source):
        assert f"exists  {name}" in again.stdout
    wanted = expected_topics(source)
    assert existing_partitions(kafka_bootstrap, list(wanted)) == dict.fromkeys(wanted, PARTITIONS)


def test_existing_topic_with_fewer_partitions_is_reported_and_left_unchanged(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    source = unique_name("topics-small")
    create_topics(kafka_bootstrap, [source], partitions=1)
    config = write_config(tmp_path, kafka_bootstrap, source)

    result = bridge_topics(config)

    assert result.returncode != 0
    (report,) = [line for line in result.stdout.splitlines() if line.startswith("differs")]
    assert source in report and f"1 partitions, fewer than the {PARTITIONS} planned" in report
    assert existing_partitions(kafka_bootstrap, [source]) == {source: 1}


def test_topics_the_broker_refuses_are_reported_without_a_traceback(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    source = unique_name("topics-refused")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap, **QUIET})
    brokers = len(admin.list_topics(timeout=30).brokers)
    config = write_config(tmp_path, kafka_bootstrap, source, replication_factor=brokers + 1)

    result = bridge_topics(config)

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed")]
    assert len(failed) == len(expected_topics(source))
    for name in expected_topics(source):
        assert any(f" {name}: " in line and "replication" in line.lower() for line in failed)
    assert existing_partitions(kafka_bootstrap, list(expected_topics(source))) == {}
