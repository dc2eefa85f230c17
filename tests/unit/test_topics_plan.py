"""Topic plans: the source, one topic per rung with retention covering the ladder, dead letters."""

from __future__ import annotations

from pathlib import Path

from bridge.config.loader import load_config
from bridge.kafka.topics import DAY_MS, plan_topics


def test_plan_covers_source_rungs_and_dead_letters() -> None:
    config = load_config(Path("config/test.yaml"))
    plans = plan_topics(config)
    assert [p.name for p in plans] == [
        config.topics.source,
        *config.delay_topics,
        config.parked_topic,
        config.dead_letter_topic,
    ]
    assert {p.partitions for p in plans} == {config.topics.partitions}
    delay = [p for p in plans if p.role.startswith("delay")]
    assert all(int(p.settings["retention.ms"]) >= DAY_MS for p in delay)
    assert int(plans[-1].settings["retention.ms"]) > int(plans[0].settings["retention.ms"])
