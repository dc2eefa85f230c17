"""Topic provisioning for ``bridge topics``: the source, every delay rung and the dead-letter topic.

Plans are pure (config -> wanted topics); applying a plan creates what is missing and reports, never
changes, an existing topic whose partitions or settings differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from bridge.core.retry import RetryPolicy
from bridge.core.settings import Config

DAY_MS = 24 * 3600 * 1000
SOURCE_RETENTION_MS = 7 * DAY_MS
DEAD_LETTER_RETENTION_MS = 28 * DAY_MS
DELAY_RETENTION_SLACK_MS = DAY_MS


@dataclass(frozen=True)
class TopicPlan:
    """One topic the bridge needs, with its partitions, replication and settings."""

    name: str
    role: str
    partitions: int
    replication_factor: int
    settings: dict[str, str] = field(default_factory=dict)


def plan_topics(config: Config) -> list[TopicPlan]:
    """The topics of the configuration: source, one per rung, dead letters.

    Delay topics keep records for the whole ladder's span plus a day of slack (so a bridge that
    was down for hours still finds its retries); dead letters are kept four weeks.
    """
    topics = config.topics
    span_ms = RetryPolicy.from_config(config).span_ms()
    common = {"min.insync.replicas": str(min(2, topics.replication_factor))}
    plans = [
        TopicPlan(
            topics.source,
            "source",
            topics.partitions,
            topics.replication_factor,
            {**common, "retention.ms": str(SOURCE_RETENTION_MS)},
        ),
    ]
    for rung, name in enumerate(config.delay_topics, start=1):
        plans.append(
            TopicPlan(
                name,
                f"delay rung {rung}",
                topics.partitions,
                topics.replication_factor,
                {**common, "retention.ms": str(span_ms + DELAY_RETENTION_SLACK_MS)},
            )
        )
    plans.append(
        TopicPlan(
            config.parked_topic,
            "parked deliveries",
            topics.partitions,
            topics.replication_factor,
            {
                **common,
                "retention.ms": str(config.retry.park_delay_ms + DELAY_RETENTION_SLACK_MS),
            },
        )
    )
    plans.append(
        TopicPlan(
            config.dead_letter_topic,
            "dead letters",
            topics.partitions,
            topics.replication_factor,
            {**common, "retention.ms": str(DEAD_LETTER_RETENTION_MS)},
        )
    )
    return plans


def kafka_reason(exc: KafkaException) -> str:
    """The broker's or librdkafka's own words for a failed admin request."""
    error = exc.args[0] if exc.args else None
    return str(error.str()) if isinstance(error, KafkaError) else str(exc)


@dataclass
class TopicReport:
    """What applying a plan did: created, already right, differing (left unchanged), or failed."""

    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def apply_plan(admin: AdminClient, plans: list[TopicPlan], timeout: float = 30.0) -> TopicReport:
    """Create missing topics; compare existing ones with the plan and report differences.

    A topic the broker refuses to create is reported in ``failures``; the others still proceed.
    Raises KafkaException when the cluster cannot be listed or described.
    """
    report = TopicReport()
    existing = admin.list_topics(timeout=timeout).topics
    missing = [plan for plan in plans if plan.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(
                    p.name,
                    num_partitions=p.partitions,
                    replication_factor=p.replication_factor,
                    config=p.settings,
                )
                for p in missing
            ],
            operation_timeout=timeout,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                report.failures.append(f"{name}: {kafka_reason(exc)}")
            else:
                report.created.append(name)
    present = [plan for plan in plans if plan.name in existing]
    if present:
        resources = [ConfigResource(ResourceType.TOPIC, plan.name) for plan in present]
        described = admin.describe_configs(resources, request_timeout=timeout)
        configs = {res.name: future.result(timeout=timeout) for res, future in described.items()}
        for plan in present:
            found = len(existing[plan.name].partitions)
            problems = []
            if found < plan.partitions:
                problems.append(f"{found} partitions, fewer than the {plan.partitions} planned")
            for key, wanted in plan.settings.items():
                entry = configs[plan.name].get(key)
                if entry is not None and entry.value != wanted:
                    problems.append(f"{key}={entry.value} (planned {wanted})")
            if problems:
                report.differences.append(f"{plan.name}: " + "; ".join(problems))
            else:
                report.unchanged.append(plan.name)
    return report
