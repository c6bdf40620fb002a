"""Partition leaders moved and a broker replaced during a real micro-batch, on librdkafka's mock
Kafka cluster (3 brokers in this process; Spark's Python workers reach it over TCP), with real
Spark and the real Iceberg catalog. DuckDB reconciles the table with the producer's delivery
reports (:func:`devtools.rehearsal.run.reconcile`).
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from devtools.rehearsal.mock import LeaderMover
from devtools.rehearsal.run import Traffic, reconcile, table_declaration
from devtools.services.mockcluster import API_KEYS, MockCluster
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.errors import BrokerUnavailableError, LakeError
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata


@pytest.fixture()
def cluster():
    with MockCluster(3) as mc:
        yield mc


def test_the_mock_cluster_serves_what_the_write_path_asks_for(cluster, unique):
    topic = f"events.{unique}"
    cluster.create_topic(topic, 3, 3)
    kafka = KafkaMetadata(KafkaConfig(cluster.bootstrap_servers, {}, 10))
    assert kafka.partitions(topic) == [0, 1, 2]  # Metadata, once a controller is named
    assert all(w.low == 0 == w.high for w in kafka.watermarks(topic).values())  # ListOffsets
    kafka.commit_group_offsets("g", topic, {0: 0, 2: 0})  # OffsetCommit
    assert kafka.group_offsets("g", topic) == {0: 0, 2: 0}  # OffsetFetch of named partitions
    with pytest.raises(LakeError, match="DescribeConfigs"):  # the retention sensor's call: a clear error
        kafka.retention_ms(topic)


def test_watermarks_are_asked_again_while_leaders_move(cluster, unique, caplog):
    topic = f"events.{unique}"
    cluster.create_topic(topic, 3, 3)
    kafka = KafkaMetadata(KafkaConfig(cluster.bootstrap_servers, {}, 10))
    mover = LeaderMover(cluster, topic, 3, interval_s=0.05, replace_every=10, detect_s=0.2, down_s=0.5)
    mover.start()
    try:
        with caplog.at_level(logging.INFO, logger="kafka_iceberg.kafka.admin"):
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:  # a failure raises BrokerUnavailableError here
                assert set(kafka.watermarks(topic)) == {0, 1, 2}
                time.sleep(0.02)
    finally:
        mover.stop()
    assert mover.rounds and mover.replacements and not mover.errors
    assert any("a partition leader moved" in r.getMessage() for r in caplog.records), "no request hit a moved leader"


def test_the_group_mirror_commits_while_brokers_are_replaced_and_fails_cleanly_without_a_broker(cluster, unique):
    """Through a consumer of the group (kafka_iceberg/kafka/groups.py): each commit while every broker in turn
    goes down either lands or raises BrokerUnavailableError within its timeout, and the group takes the next
    commit once they are back (through the admin API, the leader_moves rehearsal aborted inside librdkafka,
    and here the commit after the replacements timed out). Without any broker both calls fail cleanly."""
    topic = f"events.{unique}"
    cluster.create_topic(topic, 3, 3)
    kafka = KafkaMetadata(KafkaConfig(cluster.bootstrap_servers, {}, 2))
    mover = LeaderMover(cluster, topic, 3, interval_s=0.1, replace_every=2, detect_s=0.2, down_s=0.8)
    mover.start()
    landed, refused, offset, t0 = 0, 0, 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 60 and (time.monotonic() - t0 < 8 or len(mover.replacements) < 4):
            offset += 1
            try:
                kafka.commit_group_offsets(f"g.{unique}", topic, {0: offset, 1: offset})
                landed += 1
            except BrokerUnavailableError:
                refused += 1
    finally:
        mover.stop()
    assert len(mover.replacements) >= 4 and not mover.errors
    assert landed > 0 and landed + refused == offset
    kafka.commit_group_offsets(f"g.{unique}", topic, {0: offset + 1, 1: offset + 1})
    assert kafka.group_offsets(f"g.{unique}", topic, [0, 1, 2]) == {0: offset + 1, 1: offset + 1}

    gone = KafkaMetadata(KafkaConfig("127.0.0.1:1", {"log_level": 0}, 2))
    with pytest.raises(BrokerUnavailableError, match="within 2 s"):
        gone.commit_group_offsets("g", topic, {0: 5})
    with pytest.raises(BrokerUnavailableError, match="within 2 s"):
        gone.group_offsets("g", topic, [0])


def test_a_micro_batch_while_every_leader_moves_and_a_broker_is_replaced(spark, lake_env, catalog, cluster, unique):
    decl = table_declaration(unique, f"events.{unique}", 100_000)
    spec, topic = parse_table_spec(decl), decl["topic"]
    cluster.create_topic(topic, 3, 3)
    # small fetches from slow brokers: the read takes dozens of fetches, so moves land in the middle of it
    settings = load_settings(
        env={
            **lake_env,
            "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap_servers,
            "KAFKA_CLIENT_CONFIG": json.dumps({"max.partition.fetch.bytes": "4096"}),
        }
    )
    config = KafkaConfig(cluster.bootstrap_servers, {}, settings.kafka_timeout_s)
    traffic = Traffic(config, topic, rate=1500, bad_every=97)
    traffic.start()
    time.sleep(2)
    traffic.stop()
    assert not traffic.errors and len(traffic.expected()) > 1000
    for broker in (1, 2, 3):
        cluster.set_rtt(broker, 30)
    cluster.track_requests()
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    mover = LeaderMover(
        cluster,
        topic,
        3,
        interval_s=0.1,
        replace_every=3,
        detect_s=0.2,
        down_s=0.6,
        wait_for=lambda: bool(cluster.requests(API_KEYS["Fetch"])),
    )

    def hook(point: str) -> None:
        if point == "after_branch":  # the read starts next; the mover begins at its first Fetch
            mover.start()
        elif point == "after_read":
            mover.stop()

    outcome: object
    try:
        outcome = run_micro_batch(
            spark, settings, spec, commit_id=f"{unique}-moves", kafka=kafka, catalog=catalog, crash_hook=hook
        )
    except LakeError as exc:  # a clean failure is allowed; anything else fails the test
        outcome = exc
    finally:
        if mover.is_alive():
            mover.stop()
    fetches = [t for _, _, t in cluster.requests(API_KEYS["Fetch"])]
    print(
        f"\nleader-move rounds {len(mover.rounds)}, {mover.rounds_while(fetches, 2.0)} between fetches; "
        f"replacements {mover.replacements}; outcome: {outcome!r}"
    )
    assert not mover.errors
    assert mover.rounds_while(fetches, 2.0) >= 1, "every partition's leader moved while the batch was reading"
    assert mover.replacements, "a broker went down and came back during the read"

    for broker in (1, 2, 3):
        cluster.set_rtt(broker, 0)
    highs = {p: w.high for p, w in kafka.watermarks(topic).items()}
    for n in range(3):  # the next micro-batch catches up (one is enough: the bound exceeds the backlog)
        if read_state(catalog, spec.identifier).offsets == highs:
            break
        run_micro_batch(spark, settings, spec, commit_id=f"{unique}-after-{n}", kafka=kafka, catalog=catalog)
    assert read_state(catalog, spec.identifier).offsets == highs
    tally = reconcile(catalog, spec, traffic.expected())
    assert (tally.lost, tally.duplicates, tally.mismatched, tally.unexpected) == (0, 0, 0, 0), tally.examples
    assert tally.in_table + tally.quarantined == tally.produced and tally.quarantined > 0
