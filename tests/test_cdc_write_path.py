"""Upsert tables (``mode: upsert``) through the real write path: TableWriter plans, reads from
the real broker, merges into the attempt branch and publishes with the conditional fast-forward."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.cdc.changes import POSITION, CrossPartitionKeyError
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.ops.checks import duplicate_free
from tests.helpers import make_spec


def produce(kafka_config, topic: str, records, partition: int = 0) -> None:
    producer = Producer(kafka_config.client_conf())
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def event(i: int, amount: float) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "amount": amount, "event_time": "2023-11-14T10:00:00Z"}).encode()


def upsert_spec(name: str, topic: str, **overrides):
    return make_spec(
        name,
        topic,
        mode="upsert",
        key=["id"],
        partition_by=[],
        bad_records={"policy": "quarantine", "max_quarantine_rate": 1.0},
        **{"cdc": "none", **overrides},
    )


def test_plain_upserts_through_the_write_path(
    spark, settings, catalog, kafka_config, topic_factory, writer_factory, unique
):
    topic = topic_factory(unique, partitions=2)
    spec = upsert_spec(unique, topic)
    writer = writer_factory(spec)
    produce(
        kafka_config,
        topic,
        [
            (b"1", event(1, 1.0)),
            (b"2", event(2, 2.0)),
            (b"1", event(1, 1.5)),
            (b"3", event(3, 3.0)),
            (None, event(9, 9.0)),
        ],
    )
    produce(kafka_config, topic, [(b"4", event(4, 4.0))], partition=1)
    first = writer.execute(writer.plan(), "run-1")
    assert first.committed and first.quarantined == 1
    produce(kafka_config, topic, [(b"3", None), (b"2", event(2, 2.5)), (b"5", event(5, 5.0)), (b"5", None)])
    second = writer.execute(writer.plan(), "run-2")
    assert second.committed
    table = f"{settings.catalog.name}.{spec.identifier}"
    got = {r["id"]: r["amount"] for r in spark.table(table).collect()}
    assert got == {1: 1.5, 2: 2.5, 4: 4.0}
    state = read_state(catalog, spec.identifier)
    assert state.offsets == {0: 9, 1: 1}
    assert {r[0] for r in spark.sql(f"SELECT content FROM {table}.delete_files").collect()} == {1}
    props = dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect())
    assert props["write.update.mode"] == "merge-on-read" and props["format-version"] == "2"
    dead = spark.table(f"{settings.catalog.name}.{spec.bad_records.dead_letter_identifier}").collect()
    assert [(r["offset"], r["error_kind"]) for r in dead] == [(4, "missing_key")]
    outcome = duplicate_free(spark, table, spec, catalog.load_table(spec.identifier))
    assert outcome.passed and outcome.figures["duplicate_keys"] == 0
    # the merged rows keep the Kafka coordinates of their last change
    assert {r["id"]: r["_kafka_offset"] for r in spark.table(table).collect()} == {1: 2, 2: 6, 4: 0}
    # key 1's rows came from partition 0; a change from partition 1 without a source position cannot be ordered
    produce(kafka_config, topic, [(b"1", event(1, 7.0))], partition=1)
    with pytest.raises(
        CrossPartitionKeyError, match=r"id=1 \(change at partition 1 offset 1, row at partition 0 offset 2\)"
    ):
        writer.execute(writer.plan(), "run-3")
    assert read_state(catalog, spec.identifier).offsets == {0: 9, 1: 1}
    assert {r["id"]: r["amount"] for r in spark.table(table).collect()} == {1: 1.5, 2: 2.5, 4: 4.0}
    spark.sql(f"INSERT INTO {table} SELECT * FROM {table} WHERE id = 4")  # a second row for key 4
    outcome = duplicate_free(spark, table, spec, catalog.load_table(spec.identifier))
    assert (
        not outcome.passed
        and outcome.figures["duplicate_keys"] == 1
        and "keys (id) in more than one row" in outcome.summary
    )


def dbz(op: str, i: int, amount: float, lsn: int) -> bytes:
    """A Debezium change event (JsonConverter without schemas) of row ``i`` at source position ``lsn``."""
    row = {"id": i, "name": f"n{i}", "amount": amount, "event_time": "2023-11-14T10:00:00Z"}
    before, after = (row, None) if op == "d" else (None, row)
    return json.dumps({"op": op, "before": before, "after": after, "source": {"lsn": lsn}}).encode()


def key(i: int) -> bytes:
    return json.dumps({"id": i}).encode()


def test_debezium_changes_reordered_across_partitions_and_batches(
    spark, settings, catalog, kafka_config, topic_factory, writer_factory, unique
):
    """Key 1's newest change is read first (partition 0, micro-batch 1), its older one later (partition 1,
    micro-batch 2) and its creation is re-sent after both; key 2 the other way round: each key ends at
    its newest change by source.lsn. Then the position column is dropped, as on a table made before
    positions were kept, and the write path adds it back in the next micro-batch."""
    topic = topic_factory(unique, partitions=2)
    spec = upsert_spec(unique, topic, cdc="debezium")
    writer = writer_factory(spec)
    table = f"{settings.catalog.name}.{spec.identifier}"

    def amounts():
        return {r["id"]: r["amount"] for r in spark.table(table).collect()}

    produce(kafka_config, topic, [(key(1), dbz("c", 1, 1.0, 100)), (key(1), dbz("u", 1, 3.0, 300))])
    produce(kafka_config, topic, [(key(3), dbz("c", 3, 30.0, 120))])
    produce(kafka_config, topic, [(key(2), dbz("c", 2, 2.0, 110)), (key(2), dbz("u", 2, 2.1, 400))], partition=1)
    assert writer.execute(writer.plan(), "run-1").committed
    assert amounts() == {1: 3.0, 2: 2.1, 3: 30.0}
    produce(kafka_config, topic, [(key(1), dbz("u", 1, 2.0, 200))], partition=1)
    produce(
        kafka_config,
        topic,
        [
            (key(2), dbz("u", 2, 9.9, 350)),
            (key(3), dbz("d", 3, 30.0, 500)),
            (key(3), None),
            (key(1), dbz("c", 1, 1.0, 100)),
        ],
    )
    second = writer.execute(writer.plan(), "run-2")
    assert second.committed and second.quarantined == 0
    assert amounts() == {1: 3.0, 2: 2.1}
    assert {r["id"]: r[POSITION]["lsn"] for r in spark.table(table).collect()} == {1: 300, 2: 400}
    assert read_state(catalog, spec.identifier).offsets == {0: 7, 1: 3}
    assert duplicate_free(spark, table, spec, catalog.load_table(spec.identifier)).passed
    spark.sql(f"ALTER TABLE {table} DROP COLUMN {POSITION}")
    produce(kafka_config, topic, [(key(2), dbz("u", 2, 5.0, 600)), (key(4), dbz("c", 4, 4.0, 601))])
    assert writer.execute(writer.plan(), "run-3").committed
    assert amounts() == {1: 3.0, 2: 5.0, 4: 4.0}
    assert {r["id"]: r[POSITION] and r[POSITION]["lsn"] for r in spark.table(table).collect()} == {
        1: None,
        2: 600,
        4: 601,
    }
    produce(kafka_config, topic, [(key(4), dbz("u", 4, 0.5, 550))], partition=1)  # older than the new row
    assert writer.execute(writer.plan(), "run-4").committed
    assert amounts() == {1: 3.0, 2: 5.0, 4: 4.0}


def test_upsert_declaration_errors():
    with pytest.raises(ConfigError, match="mode upsert needs 'key'"):
        make_spec("x", "t", mode="upsert", cdc="none")
    with pytest.raises(ConfigError, match="not supported with mode: upsert"):
        make_spec("x", "t", mode="upsert", key=["id"], cdc="none", unknown_fields="evolve")
    assert make_spec("x", "t").upsert is None
