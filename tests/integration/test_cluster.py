"""A three-node KRaft cluster (``devtools.devkafka.Cluster``: combined broker and controller
nodes on loopback ports, replication factor 3, ``min.insync.replicas`` 2) losing brokers while
two bridge replicas deliver, checked against the fault ledger like ``test_faults.py``.

One scenario, four faults in a row while records stream in and retries are in flight: the leader
of a source partition killed (SIGKILL) and started again; the active controller killed and
started again; a rolling restart of all three nodes; one node killed and, during that loss, one
of the two bridge replicas killed and started again. Every (record, webhook) pair must end
received or dead-lettered, duplicates only from work in flight at a fault (same ``webhook-id``),
and the replica that is never killed stays ready (``/readyz`` 200) through every loss of one node.
During every loss the replicas' metrics show what an SRE watches then, the group's figures read
from the cluster whoever holds the partitions (a lost group coordinator can leave no replica
holding a source partition for a while): the lag on the source, the commit age of its partitions
(bounded: one node of three down holds no commit for long) and the depth of the retry ladder.
About two minutes on two cores, most of it nodes starting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from devtools.devkafka import Cluster
from tests.bridge_harness import BridgeProcess, BridgeSetup, setups, webhook
from tests.integration.test_faults import (
    COMMIT_WINDOW_S,
    FAST_FAILOVER,
    QUICK_LADDER,
    alive,
    assert_no_traceback,
    report,
    settle,
    stream_records,
)
from tests.kafka_helpers import QUIET, wait_for
from tests.ledger import (
    Ledger,
    StreamProducer,
    encoded,
    fault_seed,
    longest_redo_lag,
    receiver_requests,
    scenario_rng,
    timeline,
    unexplained_duplicates,
)
from tests.receiver import Receiver, fail_first

pytestmark = pytest.mark.integration

Setup = Callable[..., BridgeSetup]

DOWN_S = 5.0
"""How long a killed or stopped node stays down before it is started again."""
COMMIT_AGE_LIMIT_S = 60.0
"""The longest a source partition's commit may be held back while one node of three is down
(leaders move within seconds; the slowest delivery here takes well under one)."""


def watched(bridges: list[BridgeProcess], source: str) -> dict[str, float]:
    """What the live replicas' /metrics say now about the group, read from the cluster whoever
    holds the partitions (every replica reports the same figures: the largest is taken): the
    lag on the source (summed over its partitions), the largest commit age of a source
    partition, and the depth of the retry ladder (summed over its rungs); a figure missing from
    every replica is absent (no replica could read it from the cluster)."""
    seen: dict[str, float] = {}
    per_series: dict[tuple[str, str], float] = {}
    for bridge in list(bridges):
        if not alive(bridge):
            continue
        text = bridge.metrics()
        if not text:
            seen["unanswered"] = seen.get("unanswered", 0.0) + 1
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "bridge_group_ladder_depth":
                    key = ("ladder_depth", sample.labels["rung"])
                elif sample.name in GROUP_FIGURES and sample.labels["topic"] == source:
                    key = (GROUP_FIGURES[sample.name], sample.labels["partition"])
                else:
                    continue
                per_series[key] = max(per_series.get(key, 0.0), sample.value)
    for (figure, _), value in per_series.items():
        so_far = seen.get(figure, 0.0)
        seen[figure] = max(so_far, value) if figure == "commit_age_s" else so_far + value
    return seen


GROUP_FIGURES = {"bridge_group_lag": "lag", "bridge_group_commit_age_seconds": "commit_age_s"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    owned = Cluster(tmp_path_factory.mktemp("cluster"))
    owned.start()
    try:
        yield owned
    finally:
        owned.stop()


@pytest.fixture
def cluster_setup(cluster: Cluster, tmp_path: Path) -> Iterator[Setup]:
    yield from setups(cluster.bootstrap(), tmp_path)


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    """The node id leading ``topic``'s ``partition`` now."""
    metadata = AdminClient({"bootstrap.servers": bootstrap, **QUIET}).list_topics(topic, 10)
    return int(metadata.topics[topic].partitions[partition].leader)


def replica_counts(bootstrap: str, topic: str) -> set[int] | None:
    """How many replicas the partitions of ``topic`` have; None while the node asked does not
    know the topic yet."""
    metadata = AdminClient({"bootstrap.servers": bootstrap, **QUIET}).list_topics(topic, 10)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return None
    return {len(partition.replicas) for partition in found.partitions.values()}


def in_sync(bootstrap: str, topics: list[str]) -> bool:
    """Whether every partition of ``topics`` has all three replicas in sync."""
    metadata = AdminClient({"bootstrap.servers": bootstrap, **QUIET}).list_topics(timeout=10)
    known = [metadata.topics.get(topic) for topic in topics]
    return all(found is not None and found.partitions for found in known) and all(
        len(partition.isrs) == 3
        for found in known
        if found is not None
        for partition in found.partitions.values()
    )


@pytest.mark.timeout(600)
def test_broker_losses_in_a_three_node_cluster_lose_nothing(
    cluster: Cluster,
    cluster_setup: Setup,
    receiver: Receiver,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = fault_seed()
    rng = scenario_rng(seed, "cluster")
    receiver.behaviours["/flaky"] = fail_first(1, 503)  # every pair goes through a retry rung
    hooks = [
        webhook("steady", "acct_a", receiver.url("/steady")),
        webhook("flaky", "acct_a", receiver.url("/flaky")),
    ]
    setup = cluster_setup(
        hooks,
        partitions=3,
        retry=QUICK_LADDER,
        kafka=FAST_FAILOVER,
        topics={"replication_factor": 3},
    )
    bootstrap = setup.bootstrap
    # (a node other than the controller learns of a new topic a moment later)
    replicas = wait_for(
        lambda: replica_counts(bootstrap, setup.source),
        30,
        message=f"{setup.source} in the metadata of the node asked",
    )
    assert replicas == {3}, "bridge topics made the source topic with three replicas"
    records = stream_records(rng, 400, ["acct_a", "acct_nobody"])
    ledger = Ledger(hooks)
    ledger.expect(records)
    replicas_running = [setup.start_bridge(), setup.start_bridge()]
    stream = StreamProducer(bootstrap, setup.source, encoded(records), 100.0)
    stream.start()
    faults: list[float] = []
    topics = [setup.source, setup.delay_topic(1)]

    ready_during_losses = []  # the replica never killed, every half second of every loss
    during_losses: list[dict[str, float]] = []  # what the metrics said then

    def watch(figures: dict[str, float]) -> None:
        """Note the largest of each figure the metrics show now (a rebalance after a lost
        coordinator may leave a replica without source partitions for a moment)."""
        now = watched(replicas_running, setup.source)
        ready_during_losses.append(replicas_running[1].http("/readyz"))
        for name, value in now.items():
            figures[name] = max(value, figures.get(name, 0.0))
        figures["samples"] = figures.get("samples", 0.0) + 1
        figures["samples_with_all"] = figures.get("samples_with_all", 0.0) + all(
            figure in now for figure in ("lag", "commit_age_s", "ladder_depth")
        )

    watching: list[dict[str, float]] = []  # the figures of the loss going on, if any
    done_watching = threading.Event()

    def watch_losses() -> None:  # every half second, the node's start included
        while not done_watching.wait(0.5):
            if watching:
                watch(watching[0])

    watcher = threading.Thread(target=watch_losses, name="watch-losses", daemon=True)
    watcher.start()

    def down_and_up(node: int, stop: Callable[[], None], during: Callable[[], None]) -> None:
        faults.append(time.time())
        stop()
        figures: dict[str, float] = {}
        watching.append(figures)
        time.sleep(DOWN_S)
        during()
        cluster.nodes[node].start(fresh=False)
        faults.append(time.time())
        wait_for(lambda: in_sync(bootstrap, topics), 90, message=f"node {node} back in sync")
        watching.clear()
        during_losses.append(figures)

    time.sleep(rng.uniform(2.0, 4.0))
    leader = leader_of(bootstrap, setup.source, 0)
    down_and_up(leader, cluster.nodes[leader].kill, lambda: None)  # 1. a partition leader
    controller = cluster.active_controller()
    assert controller is not None
    down_and_up(controller, cluster.nodes[controller].kill, lambda: None)  # 2. the controller
    for node in sorted(cluster.nodes):  # 3. a rolling restart
        down_and_up(node, cluster.nodes[node].stop, lambda: None)
    lost = rng.choice(sorted(cluster.nodes))
    crashed = replicas_running[0]

    def crash_and_restart_a_replica() -> None:  # 4. a replica crashes during a broker loss
        crashed.kill()
        replicas_running.append(setup.start_bridge())

    down_and_up(lost, cluster.nodes[lost].kill, crash_and_restart_a_replica)
    stream.join()
    done_watching.set()

    verdict = settle(setup, ledger, lambda: receiver_requests(receiver), timeout=180)
    requests = receiver_requests(receiver)
    produced = ledger.produced_at(stream.produced_at)
    unexplained = unexplained_duplicates(requests, faults, produced, COMMIT_WINDOW_S)
    report(
        capsys,
        verdict.summary(
            "cluster",
            seed,
            faults=len(faults) // 2,
            nodes=len(cluster.nodes),
            unexplained=len(unexplained),
            redo_lag_s=round(longest_redo_lag(requests, faults, produced), 2),
            max_lag=max(figures.get("lag", 0) for figures in during_losses),
            max_commit_age_s=max(figures.get("commit_age_s", 0) for figures in during_losses),
            max_ladder_depth=max(figures.get("ladder_depth", 0) for figures in during_losses),
            losses_without_figures=sum(
                any(f not in figures for f in ("lag", "commit_age_s", "ladder_depth"))
                for figures in during_losses
            ),
            readiness_samples=len(ready_during_losses),
            least_share_with_figures=min(
                round(figures["samples_with_all"] / figures["samples"], 2)
                for figures in during_losses
            ),
        ),
    )
    verdict.assert_sound()
    assert unexplained == [], "duplicates not explained by a fault:\n" + timeline(
        requests, unexplained[:5], faults, produced
    )
    assert [status for status, _ in ready_during_losses] == [200] * len(ready_during_losses), (
        f"/readyz while one node of three was down: {ready_during_losses} (the cluster stays "
        "reachable, so the bridge stays ready)"
    )
    # The group's figures show during every loss: they are read from the cluster, whoever holds
    # the partitions (after a lost group coordinator no replica may hold a source partition for
    # up to ~25 s; librdkafka's own figures, of the partitions held, were absent then).
    for figure in ("lag", "commit_age_s", "ladder_depth"):
        assert all(figure in seen for seen in during_losses), (
            f"the group's {figure} missing from the metrics during a loss: {during_losses}"
        )
    assert all(seen.get("commit_age_s", 0.0) < COMMIT_AGE_LIMIT_S for seen in during_losses), (
        f"a source partition's commit held back for long while one node was down: {during_losses}"
    )
    for bridge in replicas_running[1:]:
        assert alive(bridge), f"a bridge replica died:\n{bridge.log_tail(40)}"
        assert_no_traceback(bridge)
